"""FL-FREQ and FL-CS (paper 000, Kerkouche et al.): clients send the first m = ceil(r·n) DCT coefficients.

Both use the linear compressor ``C(Δw, m) = ΦΔw`` of :class:`fedrun.compress.cs.DCTCompressor` (Φ = first m
rows of the orthonormal DCT-II; Eq. (3) with Ψ = I). Each selected client uploads its m float32 coefficients
(4·m bytes); the server aggregates them in the m-dim domain — weighted mean, or with ``dp=true`` client-level
DP there: clip each client's m-vector to S, sum, add N(0, σ²S²), divide by qN — and decodes:

* **FL-FREQ** [inferred baseline]: the zero-filled inverse DCT ``s_t = Φᵀy_t`` (unshuffled, one chunk: it
  relies on the DCT's energy compaction of the update's low frequencies). No momentum, no error feedback.
  With r = 1, Φ is the full orthonormal DCT and FL-FREQ is FL-STD.
* **FL-CS** (Alg. 3): the server keeps momentum u and the accumulated compression error e, both in the
  m-dim compressed domain (lines 8–13; error feedback after Karimireddy et al. 2019)::

      y_t = Σ_k (|D_k| / Σ_j |D_j|) C(Δw_k)         (line 8; DP: the noisy clipped sum / qN)
      u_t = ρ·u_{t−1} + y_t                          (line 9, momentum ρ)
      p_t = u_t + e_{t−1}                            (line 10, error-compensated direction)
      s_t = D(p_t) = argmin_s ½‖p_t − Φs‖² + λ‖s‖₁  (line 11, Eq. (4), BPDN: FISTA or OWL-QN)
      e_t = p_t − C(s_t)                             (line 12, what the reconstruction did not deliver)
      w_t = w_{t−1} + η_g·s_t                        (line 13)

  with the paper's scalable variant: the update is shuffled by a permutation fixed for the run (shared
  seed) and cut into P chunks, each compressed to m/P coefficients and reconstructed independently.

λ = ``lam_rel``·‖Φᵀp_t‖_∞ (scale-free). Under client-level DP, ``lam_noise = κ`` raises it to at least
κ·σ_p·√(2 ln n), σ_p the std of the DP noise carried by each coefficient of p_t through the momentum,
σ_p = (σS/qN)·√(Σ_{i<t} ρ^{2i}) (the noise left in e is ignored). ``max_iter`` is a hyper-parameter, not
only a budget: on real updates an early-stopped FISTA estimate beat the exact BPDN solution
(``fedrun/compress/cs.py``). The reconstruction runs with ``solver_threads`` torch threads (1 by default:
on an oversubscribed CPU more threads made it much slower).
"""

from __future__ import annotations

import math
import time
import numpy as np
import torch

from fedrun.comm import Message
from fedrun.compress.cs import SOLVERS, DCTCompressor
from fedrun.schemes.base import ClientView, Env, Scheme
from fedrun.schemes.random import check_ratio


def _opt_bool(name: str, value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"scheme.{name}={value!r}; allowed: true, false or null")
    return value


class DCTScheme(Scheme):
    """Shared part of FL-FREQ and FL-CS: the DCT compressor, m, the 4·m-byte upload."""

    compresses = True
    #: no local DP: paper 001's noise is calibrated to the model update (length n), not to m coefficients
    dp_modes = ("off", "client")

    def __init__(self, r: float = 1.0, chunks: int = 1, shuffle: bool | None = None,
                 pad_to_fast_len: bool | None = None, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        self.r = check_ratio(r)
        if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
            raise ValueError(f"scheme.chunks={chunks!r}; allowed: an integer P >= 1 (and P <= m)")
        self.chunks = int(chunks)
        self.shuffle = _opt_bool("shuffle", shuffle)
        self.pad_to_fast_len = _opt_bool("pad_to_fast_len", pad_to_fast_len)

    def setup(self, env: Env) -> None:
        try:
            self.comp = c = DCTCompressor(env.n, self.r, chunks=self.chunks, seed=env.shared_seed(0, "dct_shuffle"),
                                          shuffle=self.shuffle, pad_to_fast_len=self.pad_to_fast_len,
                                          device=env.device)
        except ValueError as exc:
            raise ValueError(f"scheme.chunks={self.chunks} with r={self.r:g} and n={env.n}: {exc}") from None
        self.n, self.m = env.n, c.m
        self.payload_dim, self.compression_ratio = c.m, c.m / env.n
        self.message = Message.of_shape(c.m, kind="dct_coefficients")  # 4·m bytes; the shuffle seed is fixed
        self.tags = {"compression.m": str(c.m), "compression.r": f"{self.r:g}", "compression.chunks": str(c.chunks),
                     "compression.shuffle": str(c.shuffle), "compression.chunk_len": str(c.chunk_len)}

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        """Each client: its first m DCT coefficients."""
        return self.comp.compress(updates)


class FreqScheme(DCTScheme):
    """FL-FREQ: first m DCT coefficients, decoded by the zero-filled inverse DCT (one chunk, no shuffling).

    Args:
        r: compression ratio m/n in (0, 1].
        pad_to_fast_len: zero-pad the update to a 5-smooth length before the DCT (faster FFT when n has a
            large prime factor; then Φ is the first m rows of a slightly longer DCT). Default false: Φ is the
            n-point DCT itself, so r = 1 is exactly FL-STD.
        server_lr: η_g.
    """

    def __init__(self, r: float = 1.0, pad_to_fast_len: bool = False, server_lr: float = 1.0,
                 server_momentum: float = 0.0) -> None:
        super().__init__(r=r, chunks=1, shuffle=False, pad_to_fast_len=bool(pad_to_fast_len), server_lr=server_lr,
                         server_momentum=server_momentum)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        return self.comp.zero_fill(aggregate)


class CompressiveSensingScheme(DCTScheme):
    """FL-CS (paper 000, Alg. 3): DCT compression, server momentum + error feedback in R^m, BPDN decoding.

    State: momentum u_t [m], accumulated compression error e_t [m], and Σ_{i<t} ρ^{2i} (the DP noise variance
    carried by u_t, in units of (σS/qN)²).

    Args:
        r: compression ratio m/n in (0, 1].
        chunks: P of the scalable reconstruction (shuffled chunks, each reconstructed independently), 1 <= P <= m.
        shuffle, pad_to_fast_len: layout of the chunks (null: iff P > 1; see DCTCompressor).
        solver: ``fista`` (torch) or ``owlqn`` (the paper's OWL-QN, via PyLBFGS).
        lam_rel: λ / ‖Φᵀp‖_∞, in (0, 1).
        lam_noise: null, or κ >= 0: with client-level DP, λ >= κ·σ_p·√(2 ln n) (module docstring).
        max_iter: solver iterations per round (FISTA: all chunks together; OWL-QN: per chunk).
        tol: relative stopping tolerance of the solver.
        momentum: ρ in [0, 1) of line 9 (0 = none).
        error_feedback: keep e_t = p_t − C(s_t) (lines 10–12); false: e = 0.
        solver_threads: torch threads during the reconstruction (null: leave torch's setting).
        server_lr: η_g of line 13.
    """

    state = ("u", "e", "noise_gain")

    def __init__(self, r: float = 1.0, chunks: int = 4, shuffle: bool | None = None,
                 pad_to_fast_len: bool | None = None, solver: str = "fista", lam_rel: float = 0.05,
                 lam_noise: float | None = None, max_iter: int = 20, tol: float = 1e-4, momentum: float = 0.9,
                 error_feedback: bool = True, solver_threads: int | None = 1, server_lr: float = 1.0) -> None:
        super().__init__(r=r, chunks=chunks, shuffle=shuffle, pad_to_fast_len=pad_to_fast_len, server_lr=server_lr)
        if solver not in SOLVERS:
            raise ValueError(f"scheme.solver={solver!r} is unknown; allowed: {', '.join(SOLVERS)}")
        if isinstance(lam_rel, bool) or not isinstance(lam_rel, (int, float)) or not 0.0 < lam_rel < 1.0:
            raise ValueError(f"scheme.lam_rel={lam_rel!r}; allowed: 0 < lam_rel < 1 (λ relative to ‖Φᵀp‖_∞)")
        if lam_noise is not None and (isinstance(lam_noise, bool) or not isinstance(lam_noise, (int, float))
                                      or not 0.0 <= lam_noise < math.inf):
            raise ValueError(f"scheme.lam_noise={lam_noise!r}; allowed: null or a number >= 0")
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ValueError(f"scheme.max_iter={max_iter!r}; allowed: an integer >= 1")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 < tol < 1.0:
            raise ValueError(f"scheme.tol={tol!r}; allowed: 0 < tol < 1")
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
            raise ValueError(f"scheme.momentum={momentum!r}; allowed: 0 <= momentum < 1")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"scheme.error_feedback={error_feedback!r}; allowed: true or false")
        if solver_threads is not None and (isinstance(solver_threads, bool) or not isinstance(solver_threads, int)
                                           or solver_threads < 1):
            raise ValueError(f"scheme.solver_threads={solver_threads!r}; allowed: null or an integer >= 1")
        self.solver, self.lam_rel, self.lam_noise = solver, float(lam_rel), lam_noise
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.momentum, self.error_feedback = float(momentum), error_feedback
        self.solver_threads = solver_threads

    def setup(self, env: Env) -> None:
        super().setup(env)
        self.u = torch.zeros(self.m, device=env.device)
        self.e = torch.zeros(self.m, device=env.device)
        self.noise_gain = 0.0
        self.dp_noise_std = env.dp_noise_std
        self.tags.update({"cs.solver": self.solver, "cs.max_iter": str(self.max_iter),
                          "cs.momentum": f"{self.momentum:g}", "cs.error_feedback": str(self.error_feedback)})

    # -- lines 9–12 ---------------------------------------------------------------------------------
    def noise_std(self) -> float:
        """σ_p: std of the client-level DP noise in each coefficient of p_t (0 without DP)."""
        return 0.0 if self.dp_noise_std is None else self.dp_noise_std * math.sqrt(self.noise_gain)

    def lam(self, lam_max: float) -> float:
        """λ of line 11: lam_rel·λ_max, raised to κ·σ_p·√(2 ln n) under DP when lam_noise = κ is set."""
        lam = self.lam_rel * lam_max
        if self.lam_noise is not None and self.dp_noise_std is not None:
            lam = max(lam, self.lam_noise * self.noise_std() * math.sqrt(2.0 * math.log(self.n)))
        return lam

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        t0 = time.perf_counter()
        self.u.mul_(self.momentum).add_(aggregate)  # line 9
        self.noise_gain = self.momentum ** 2 * self.noise_gain + 1.0
        p = self.u + self.e  # line 10
        lam_max = self.comp.lambda_max(p)
        lam = self.lam(lam_max)
        iterations = 0
        if lam_max == 0.0 or lam >= lam_max:  # s = 0 solves BPDN
            s = torch.zeros(self.n, device=p.device, dtype=p.dtype)
        else:
            threads = torch.get_num_threads()
            if self.solver_threads is not None:
                torch.set_num_threads(self.solver_threads)
            try:  # line 11
                sol = self.comp.reconstruct_with_info(p, lam / lam_max, self.solver, self.max_iter, self.tol)
            finally:
                torch.set_num_threads(threads)
            s, iterations = sol.s, sol.iterations
        delivered = self.comp.compress(s)
        self.e = p - delivered if self.error_feedback else torch.zeros_like(p)  # line 12
        p_norm = float(p.norm())
        self.metrics = {
            "cs_iterations": float(iterations),
            "cs_lam_rel": lam / lam_max if lam_max > 0 else math.nan,
            "cs_residual_ratio": float((p - delivered).norm()) / p_norm if p_norm > 0 else 0.0,
            "cs_error_norm": float(self.e.norm()),
            "cs_sparsity": float((s != 0).float().mean()),
            "cs_decode_seconds": time.perf_counter() - t0,
        }
        return s
