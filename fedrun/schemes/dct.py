"""FL-FREQ and FL-CS (paper 000, Kerkouche et al.): clients send the first m = ceil(r·n) DCT coefficients.

Both use the linear compressor ``C(Δw, m) = ΦΔw`` of :class:`fedrun.compress.cs.DCTCompressor` (Φ = first m rows
of the orthonormal DCT-II; Eq. (3) with Ψ = I): each selected client uploads 4·m bytes; the server aggregates in
the m-dim domain (client-level DP clips each m-vector to S there) and decodes:

* **FL-FREQ** [inferred baseline]: the zero-filled inverse DCT ``s_t = Φᵀy_t`` (unshuffled, one chunk: it relies
  on the DCT's energy compaction of the update's low frequencies). No momentum, no error feedback. With r = 1,
  Φ is the full orthonormal DCT and FL-FREQ is FL-STD.
* **FL-CS** (Alg. 3): the server keeps momentum u and the accumulated compression error e, both in the m-dim
  compressed domain (lines 8–13; error feedback after Karimireddy et al. 2019)::

      y_t = Σ_k (|D_k| / Σ_j |D_j|) C(Δw_k)         (line 8; DP: the noisy clipped sum / qN)
      u_t = ρ·u_{t−1} + y_t                          (line 9, momentum ρ)
      p_t = u_t + e_{t−1}                            (line 10, error-compensated direction)
      s_t = D(p_t) = argmin_s ½‖p_t − Φs‖² + λ‖s‖₁  (line 11, Eq. (4), BPDN: FISTA or OWL-QN)
      e_t = p_t − C(s_t)                             (line 12, what the reconstruction did not deliver)
      w_t = w_{t−1} + η_g·s_t                        (line 13)

  with the paper's scalable variant: the update is shuffled by a permutation fixed for the run (shared seed) and
  cut into P chunks, each compressed to m/P coefficients and reconstructed independently.

λ = ``lam_rel``·‖Φᵀp_t‖_∞ (scale-free). Under client-level DP, ``lam_noise = κ`` raises it to at least κ·σ_p·√(2 ln n),
σ_p the std of the DP noise carried by each coefficient of p_t through the momentum, σ_p = (σS/qN)·√(Σ_{i<t} ρ^{2i})
(the noise left in e is ignored). ``max_iter`` is a hyper-parameter, not only a budget: on real updates an early-stopped
FISTA estimate beat the exact BPDN solution (``fedrun/compress/cs.py``). Options: conf/scheme/fl_cs.yaml, fl_freq.yaml.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.compress.cs import SOLVERS, DCTCompressor
from fedrun.compress.l1 import bpdn_budget
from fedrun.schemes.base import ClientView, Env, Scheme, check
from fedrun.schemes.random import check_ratio
from fedrun.transfer.server import intra_op_threads


#: a run's compressor, built once (each client's codec is set up afresh): a pure, shared transform
_compressor = functools.lru_cache(maxsize=4)(DCTCompressor)


class DCTScheme(Scheme):
    """Shared part of FL-FREQ and FL-CS: the DCT compressor, m, the 4·m-byte upload."""

    compresses = True
    #: no local DP: paper 001's noise is calibrated to the model update (length n), not to m coefficients
    dp_modes = ("off", "client")

    def __init__(self, r: float = 1.0, chunks: int = 1, shuffle: bool | None = None,
                 pad_to_fast_len: bool | None = None, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        self.r = check_ratio(r)
        self.chunks = int(check("chunks", chunks, "an integer P >= 1 (and P <= m)", lambda v: v >= 1,
                                (int, np.integer)))
        opt_bool = dict(allowed="true, false or null", kind=(bool,), null=True)
        self.shuffle = check("shuffle", shuffle, **opt_bool)
        self.pad_to_fast_len = check("pad_to_fast_len", pad_to_fast_len, **opt_bool)

    def setup(self, env: Env) -> None:
        try:
            c = _compressor(env.n, self.r, self.chunks, env.shared_seed(0, "dct_shuffle"), self.shuffle,
                            self.pad_to_fast_len, env.device)
        except ValueError as exc:
            raise ValueError(f"scheme.chunks={self.chunks} with r={self.r:g} and n={env.n}: {exc}") from None
        self.comp, self.n, self.m = c, env.n, c.m
        self.payload_dim, self.compression_ratio = c.m, c.m / env.n
        self.message = Message.of_shape(c.m, kind="dct_coefficients")  # 4·m bytes; the shuffle seed is fixed
        self.tags = {"compression.m": str(c.m), "compression.r": f"{self.r:g}", "compression.chunks": str(c.chunks),
                     "compression.shuffle": str(c.shuffle), "compression.chunk_len": str(c.chunk_len)}

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        return self.comp.compress(updates)


class FreqScheme(DCTScheme):
    """FL-FREQ (module docstring); with ``pad_to_fast_len`` Φ is the first m rows of a longer (5-smooth) DCT."""

    def __init__(self, r: float = 1.0, pad_to_fast_len: bool = False, server_lr: float = 1.0,
                 server_momentum: float = 0.0) -> None:
        super().__init__(r=r, chunks=1, shuffle=False, pad_to_fast_len=bool(pad_to_fast_len), server_lr=server_lr,
                         server_momentum=server_momentum)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        return self.comp.zero_fill(aggregate)

    def server_flops(self, n: int) -> float:
        """The step (:meth:`Scheme.server_flops`) + the zero-filled inverse DCT Φᵀy: T = 2.5·c·log₂c + 4c, c = n (or its
        5-smooth padded length with ``pad_to_fast_len``)."""
        return super().server_flops(n) + self.comp.transform_flops()


class CompressiveSensingScheme(DCTScheme):
    """FL-CS (paper 000, Alg. 3): DCT compression, server momentum + error feedback in R^m, BPDN decoding. State:
    u_t [m], e_t [m] and Σ_{i<t} ρ^{2i} (the DP noise variance carried by u_t, in units of (σS/qN)²). ``max_iter``
    counts FISTA's iterations over all chunks together, OWL-QN's per chunk."""

    state = ("u", "e", "noise_gain")

    def __init__(self, r: float = 1.0, chunks: int = 4, shuffle: bool | None = None,
                 pad_to_fast_len: bool | None = None, solver: str = "fista", lam_rel: float = 0.05,
                 lam_noise: float | None = None, max_iter: int = 20, tol: float = 1e-4, momentum: float = 0.9,
                 error_feedback: bool = True, solver_threads: int | None = 1, server_lr: float = 1.0) -> None:
        super().__init__(r=r, chunks=chunks, shuffle=shuffle, pad_to_fast_len=pad_to_fast_len, server_lr=server_lr)
        if solver not in SOLVERS:
            raise ValueError(f"scheme.solver={solver!r} is unknown; allowed: {', '.join(SOLVERS)}")
        self.solver = solver
        self.lam_rel = float(check("lam_rel", lam_rel, "0 < lam_rel < 1 (λ relative to ‖Φᵀp‖_∞)", lambda v: 0 < v < 1))
        self.lam_noise = check("lam_noise", lam_noise, "null or a number >= 0", lambda v: 0 <= v < math.inf, null=True)
        self.max_iter = int(check("max_iter", max_iter, "an integer >= 1", lambda v: v >= 1, (int, np.integer)))
        self.tol = float(check("tol", tol, "0 < tol < 1", lambda v: 0 < v < 1))
        self.momentum = float(check("momentum", momentum, "0 <= momentum < 1", lambda v: 0 <= v < 1))
        self.error_feedback = check("error_feedback", error_feedback, "true or false", kind=(bool,))
        self.solver_threads = check("solver_threads", solver_threads, "null or an integer >= 1", lambda v: v >= 1,
                                    (int,), null=True)

    def setup(self, env: Env) -> None:
        super().setup(env)
        self.u, self.e = torch.zeros(self.m, device=env.device), torch.zeros(self.m, device=env.device)
        self.noise_gain, self.dp_noise_std = 0.0, env.dp_noise_std
        self.tags.update({"cs.solver": self.solver, "cs.max_iter": str(self.max_iter),
                          "cs.momentum": f"{self.momentum:g}", "cs.error_feedback": str(self.error_feedback)})

    def noise_std(self) -> float:
        """σ_p: std of the client-level DP noise in each coefficient of p_t (0 without DP)."""
        return 0.0 if self.dp_noise_std is None else self.dp_noise_std * math.sqrt(self.noise_gain)

    def lam(self, lam_max: float) -> float:
        """λ of line 11: lam_rel·λ_max, raised to κ·σ_p·√(2 ln n) under DP when lam_noise = κ is set."""
        lam = self.lam_rel * lam_max
        if self.lam_noise is not None and self.dp_noise_std is not None:
            lam = max(lam, self.lam_noise * self.noise_std() * math.sqrt(2.0 * math.log(self.n)))
        return lam

    def solver_bound(self) -> tuple[int, int]:
        """(S, I): the stages and iterations (per chunk for OWL-QN) the decoder runs at most (:func:`bpdn_budget`)."""
        return bpdn_budget(self.lam_rel, self.max_iter)

    def server_flops(self, n: int) -> float:
        """The step (:meth:`Scheme.server_flops`) + an upper bound of FL-CS's decode (lines 9–13): ρ-momentum and
        error feedback 4m (u ← ρu + y, p = u + e, e = p − Φs) + the solver's (:meth:`DCTCompressor.reconstruct_flops`)."""
        decode = self.comp.reconstruct_flops(self.solver, self.lam_rel, self.max_iter, base=4 * self.m)
        return super().server_flops(n) + float(decode)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        t0 = time.perf_counter()
        self.u.mul_(self.momentum).add_(aggregate)  # line 9
        self.noise_gain = self.momentum ** 2 * self.noise_gain + 1.0
        p = self.u + self.e  # line 10
        lam_max = self.comp.lambda_max(p)
        lam = self.lam(lam_max)
        if lam_max == 0.0 or lam >= lam_max:  # s = 0 solves BPDN
            s, iterations = torch.zeros(self.n, device=p.device, dtype=p.dtype), 0
        else:
            with intra_op_threads(self.solver_threads):  # line 11
                sol = self.comp.reconstruct_with_info(p, lam / lam_max, self.solver, self.max_iter, self.tol)
            s, iterations = sol.s, sol.iterations
        delivered = self.comp.compress(s)
        self.e = p - delivered if self.error_feedback else torch.zeros_like(p)  # line 12
        p_norm = float(p.norm())
        self.metrics = {"cs_iterations": float(iterations), "cs_lam_rel": lam / lam_max if lam_max > 0 else math.nan,
                        "cs_residual_ratio": float((p - delivered).norm()) / p_norm if p_norm > 0 else 0.0,
                        "cs_error_norm": float(self.e.norm()), "cs_sparsity": float((s != 0).float().mean()),
                        "cs_decode_seconds": time.perf_counter() - t0}
        return s
