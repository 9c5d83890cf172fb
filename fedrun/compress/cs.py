"""FL-CS / FL-FREQ compressor: first-m DCT coefficients, zero-filled inverse, and L1 reconstruction.

Paper 000, Sec. III-C: a client sends ``C(Δw, m) = ΦΔw`` (Eq. (3) with Ψ = I), Φ the first
``m = ceil(r·n)`` rows of the orthonormal DCT-II; the server averages the messages (C is linear),
and decodes either by the zero-filled inverse DCT ``Φᵀy`` (FL-FREQ) or by BPDN, Eq. (4) (FL-CS).

Scalable variant ("Scalable reconstruction"): the update is shuffled by a permutation fixed by a shared
seed (the same in every round) and cut into ``P`` chunks; chunk ``p`` holds ``n_p = n // P + (1 if p < n % P
else 0)`` consecutive shuffled entries, zero-padded at its end to the common length ``c``, and is compressed to
its first ``m_p = m // P + (1 if p < m % P else 0)`` DCT coefficients: exactly ``m`` numbers in total,
chunk 0's first. ``c = ceil(n/P)`` rounded up to the next 5-smooth length (``pad_to_fast_len``, on by default
for ``P > 1``): the FFT of a length with a large prime factor is 5–12× slower (n = 61,706 = 2·30,853 for
LeNet-5). Pad entries are known zeros, never variables of the reconstruction. Each chunk is reconstructed
independently — FISTA does all chunks at once (one batched DCT over ``[P, c]``); OWL-QN solves them one
after another. Both solve the same block-diagonal BPDN with one common λ.

With ``P = 1`` and no shuffling/padding (the defaults), Φ is exactly the first ``m`` rows of the ``n``-point
orthonormal DCT-II, so ``ΦΦᵀ = I_m``. With padding, ``ΦΦᵀ ≠ I`` but still ``‖Φ‖₂ <= 1`` (FISTA's step 1 holds).
"""

from __future__ import annotations

import scipy.fft
import torch

from fedrun.compress.dct import dct, idct, transform_flops
from fedrun.compress.l1 import OWLQN_MEMORY, BPDNSolution, bpdn, bpdn_budget, lambda_max
from fedrun.compress.masks import _check_last_dim, num_kept, shared_permutation

DEFAULT_LAM_REL = 0.05
"""Default λ / λ_max for :meth:`DCTCompressor.reconstruct` (λ_max = ‖Φᵀy‖_∞, above which s = 0).

Scale-free: the same value works whatever the update's magnitude. Chosen with
``scripts/bench_compress.py --sweep-lambda`` on real FL updates (average of 10 Fashion-MNIST client updates
of LeNet-5, n = 61,706, and of a 114k-parameter CNN; FISTA, 300 iterations): in the one regime where BPDN
beats the zero-filled decoder — shuffled chunks at r = 0.2 — the error is lowest at lam_rel = 0.05
(rel. error 0.886 / 0.856 vs 0.896 / 0.894 for zero-fill; 0.89–0.94 at 0.01–0.2). At r <= 0.1 every
lam_rel in [0.005, 0.5] gives a relative error of 0.95–1.15: these updates are not sparse enough for
m = 0.05·n low-frequency measurements, and λ hardly matters there. Under DP noise of known std σ on each
coefficient of y, the classical choice λ ≈ σ·√(2 ln n) is better: pass it as ``λ / lambda_max(y)``."""

SOLVERS = ("fista", "owlqn")


class DCTCompressor:
    """Linear compressor ``x ∈ R^n -> Φx ∈ R^m`` (first m DCT-II rows, optionally shuffled and chunked).

    Args:
        n: length of the flat model update, ``n >= 1``.
        r: compression ratio ``0 < r <= 1``; ``m = ceil(r·n)``.
        chunks: number of chunks ``P`` of the scalable variant, ``1 <= P <= m``.
        seed: shared seed of the shuffling permutation (fixed across rounds).
        shuffle: apply the shared permutation before chunking. ``None`` (default) shuffles iff ``P > 1``,
            as in the paper; FL-FREQ must not shuffle (it relies on the DCT's energy compaction).
        pad_to_fast_len: zero-pad every chunk to a 5-smooth length for a fast FFT. ``None`` (default): iff ``P > 1``.
        device: device of the index tensors; inputs must live there.
    """

    def __init__(self, n: int, r: float, chunks: int = 1, seed: int = 0, shuffle: bool | None = None,
                 pad_to_fast_len: bool | None = None, device: torch.device | str | None = None) -> None:
        self.m = num_kept(n, r)
        if not 1 <= chunks <= self.m:
            raise ValueError(f"chunks={chunks}; allowed: 1 <= chunks <= m={self.m} (each chunk needs a coefficient)")
        self.n, self.r, self.chunks, self.seed = n, r, chunks, seed
        self.shuffle = chunks > 1 if shuffle is None else bool(shuffle)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.chunk_n = _split(n, chunks)  # n_p: real entries per chunk
        self.chunk_m = _split(self.m, chunks)  # m_p: coefficients per chunk, summing to m
        fast = chunks > 1 if pad_to_fast_len is None else bool(pad_to_fast_len)
        self.chunk_len = scipy.fft.next_fast_len(self.chunk_n[0], real=True) if fast else self.chunk_n[0]  # c
        self._order = shared_permutation(n, seed, self.device) if self.shuffle else torch.arange(n, device=self.device)
        self._src, self._dst = self._layout()
        self._pad = None  # [P, c] True on pad slots, when there are any
        if self.chunks * self.chunk_len > n:
            self._pad = torch.arange(self.chunk_len, device=self.device) >= torch.tensor(self.chunk_n, device=self.device)[:, None]
        self._keep = None  # [P, max m_p] mask of the transmitted coefficients, when the m_p differ
        if len(set(self.chunk_m)) > 1:
            self._keep = torch.arange(self.chunk_m[0], device=self.device) < torch.tensor(self.chunk_m, device=self.device)[:, None]

    def _layout(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Gather indices: ``src`` [P·c] (n = a pad zero) fills the chunks, ``dst`` [n] reads them back."""
        if not self.shuffle and self.chunks * self.chunk_len == self.n:
            return None, None  # the chunks are x itself, reshaped
        src = torch.full((self.chunks, self.chunk_len), self.n, dtype=torch.long, device=self.device)
        dst = torch.empty(self.n, dtype=torch.long, device=self.device)
        for p, (_, coords) in enumerate(self._chunk_coords()):
            src[p, : coords.numel()] = coords
            dst[coords] = p * self.chunk_len + torch.arange(coords.numel(), device=self.device)
        return src.flatten(), dst

    def _chunk_coords(self) -> list[tuple[int, torch.Tensor]]:
        """(offset in y, original coordinates) of every chunk, in chunk order."""
        out, start, offset = [], 0, 0
        for n_p, m_p in zip(self.chunk_n, self.chunk_m):
            out.append((offset, self._order[start : start + n_p]))
            start, offset = start + n_p, offset + m_p
        return out

    # -- the linear operator Φ and its adjoint --------------------------------------------------------
    def compress(self, x: torch.Tensor) -> torch.Tensor:
        """``C(x, m) = Φx``: ``x[..., n] -> [..., m]`` (batched over clients; paper 000, Eq. (3))."""
        _check_last_dim(x, self.n, "x")
        return self._chunk_forward(self._to_chunks(x))

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """``Φᵀy``: ``y[..., m] -> [..., n]``, zero-filled inverse DCT of every chunk, unshuffled."""
        _check_last_dim(y, self.m, "y")
        return self._from_chunks(idct(self._unpack(y), self.chunk_len))

    def _chunk_forward(self, z: torch.Tensor) -> torch.Tensor:
        """Φ in the chunk domain: ``z[..., P, c] -> [..., m]`` (first m_p DCT coefficients of each chunk)."""
        coefs = dct(z, self.chunk_m[0])  # [..., P, max m_p]
        return coefs.flatten(-2) if self._keep is None else coefs[..., self._keep]

    def _chunk_adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """Φᵀ in the chunk domain, zero on the pad slots (so pads never become variables)."""
        z = idct(self._unpack(y), self.chunk_len)
        return z if self._pad is None else z.masked_fill(self._pad, 0.0)

    def _unpack(self, y: torch.Tensor) -> torch.Tensor:
        """``y[..., m] -> [..., P, max m_p]``, zeros where a chunk has fewer coefficients."""
        if self._keep is None:
            return y.unflatten(-1, (self.chunks, self.chunk_m[0]))
        coefs = y.new_zeros(*y.shape[:-1], *self._keep.shape)
        coefs[..., self._keep] = y
        return coefs

    def zero_fill(self, y: torch.Tensor) -> torch.Tensor:
        """FL-FREQ's decoder: the zero-filled inverse DCT, i.e. ``Φᵀy`` (:meth:`adjoint`)."""
        return self.adjoint(y)

    def _to_chunks(self, x: torch.Tensor) -> torch.Tensor:
        if self._src is not None:
            # index n reads the appended zero; index_select is ~2× faster than x[..., idx] on [K, n] here
            x = torch.index_select(torch.nn.functional.pad(x, (0, 1)), -1, self._src)
        return x.unflatten(-1, (self.chunks, self.chunk_len))

    def _from_chunks(self, z: torch.Tensor) -> torch.Tensor:
        flat = z.flatten(-2)
        return flat if self._dst is None else torch.index_select(flat, -1, self._dst)

    def lambda_max(self, y: torch.Tensor) -> float:
        """``‖Φᵀy‖_∞``: the λ above which the BPDN solution is 0 (``lam_rel`` is relative to it)."""
        _check_last_dim(y, self.m, "y")
        return lambda_max(self.adjoint, y)

    def transform_flops(self) -> float:
        """T: one application of Φ or Φᵀ, P transforms of the chunk length c (:func:`transform_flops`)."""
        return self.chunks * transform_flops(self.chunk_len)

    def reconstruct_flops(self, solver: str, lam_rel: float, max_iter: int, base: float = 0.0) -> float:
        """``base`` (the caller's own work, added first) + an upper bound of :meth:`reconstruct_with_info`'s work from the
        iteration budget, never its data-dependent count. With T = :meth:`transform_flops`, N = P·c entries in the
        chunk domain and (S, I) = :func:`bpdn_budget`:

        * FISTA: (3 + 2S)·(T + 2N) + (I + 1)·T + I·(T + 15N) — Φᵀ and |·|-max for λ_max (caller, reconstruct, path)
          and per stage for λ_max and Φᵀy; per iteration Φ, Φᵀ and 15 ops per entry (gradient step 2, soft threshold
          4, step 1, restart test 2, momentum 2, two norms 4); Φs once after.
        * OWL-QN (per chunk, length c, T_c = 2.5·c·log₂c + 4c, memory M = 6): 2(T + 2N) + T
          + P·[(1 + 2S)·(T_c + 2c) + I·(2T_c + (4M + 13)·c)] — one objective-and-gradient evaluation per iteration
          (the line search's first trial step: a model, not a bound) and L-BFGS's two-loop recursion 4Mc."""
        P, c = self.chunks, self.chunk_len
        T, N = self.transform_flops(), float(P * c)
        S, I = bpdn_budget(lam_rel, max_iter)
        if solver == "fista":
            return base + (3 + 2 * S) * (T + 2 * N) + (I + 1) * T + I * (T + 15 * N)
        Tc, M = transform_flops(c), OWLQN_MEMORY
        return base + 2 * (T + 2 * N) + T + P * ((1 + 2 * S) * (Tc + 2 * c) + I * (2 * Tc + (4 * M + 13) * c))

    # -- FL-CS decoder ------------------------------------------------------------------------------
    def reconstruct(self, y: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The solution ``s`` of :meth:`reconstruct_with_info` (same arguments)."""
        return self.reconstruct_with_info(y, *args, **kwargs).s

    def reconstruct_with_info(self, y: torch.Tensor, lam_rel: float = DEFAULT_LAM_REL, solver: str = "fista",
                              max_iter: int = 300, tol: float = 1e-4, warm_start: torch.Tensor | None = None
                              ) -> BPDNSolution:
        """BPDN reconstruction ``argmin_s ½‖y − Φs‖² + λ‖s‖₁`` (paper 000, Eq. (4)) with ``λ = lam_rel·‖Φᵀy‖_∞``,
        and the iterations it took (summed over chunks for OWL-QN).

        Args:
            y: aggregated measurements ``[m]``.
            lam_rel: λ relative to λ_max = ‖Φᵀy‖_∞ (:meth:`lambda_max`), ``lam_rel > 0``; for ``lam_rel >= 1``
                the solution is 0. A scheme that wants an absolute λ (e.g. from the DP noise level) passes
                ``λ / compressor.lambda_max(y)``.
            solver: ``"fista"`` (torch, any device, all chunks at once) or ``"owlqn"`` (PyLBFGS, CPU, chunk by chunk).
            max_iter: iteration budget (per chunk for OWL-QN).
            tol: relative stopping tolerance (see :func:`fedrun.compress.l1.bpdn`).
            warm_start: previous solution ``[n]``; starts the solver there (and skips the λ continuation).
        Returns:
            ``s`` of shape ``[n]``, ``y``'s dtype and device, and the iteration count.
        """
        _check_last_dim(y, self.m, "y")
        if y.ndim != 1:
            raise ValueError(f"y.shape={tuple(y.shape)}; allowed: [m={self.m}] (reconstruct one aggregate)")
        if not (0.0 < lam_rel < float("inf")):
            raise ValueError(f"lam_rel={lam_rel}; allowed: 0 < lam_rel < inf")
        if solver not in SOLVERS:
            raise ValueError(f"solver={solver!r}; allowed: {SOLVERS}")
        if warm_start is not None:
            _check_last_dim(warm_start, self.n, "warm_start")
        lam_max = self.lambda_max(y)
        if lam_rel >= 1.0 or lam_max == 0.0:  # λ >= λ_max: s = 0 is the solution
            return BPDNSolution(y.new_zeros(self.n), 0)
        lam = lam_rel * lam_max
        if solver == "fista":  # all chunks at once, iterating on z[P, c]: no gathers inside the loop
            x0 = None if warm_start is None else self._to_chunks(warm_start)
            sol = bpdn(self._chunk_forward, self._chunk_adjoint, y, lam, "fista", x0, max_iter, tol)
            return BPDNSolution(self._from_chunks(sol.s), sol.iterations)
        if self.chunks == 1:
            return bpdn(self.compress, self.adjoint, y, lam, "owlqn", warm_start, max_iter, tol)
        return self._owlqn_by_chunk(y, lam, warm_start, max_iter, tol)

    def _owlqn_by_chunk(self, y: torch.Tensor, lam: float, warm_start: torch.Tensor | None, max_iter: int,
                        tol: float) -> BPDNSolution:
        s = y.new_zeros(self.n)
        iterations = 0
        for (offset, coords), m_p in zip(self._chunk_coords(), self.chunk_m):
            pad = self.chunk_len - coords.numel()

            def forward(u: torch.Tensor, m_p: int = m_p, pad: int = pad) -> torch.Tensor:
                return dct(torch.nn.functional.pad(u, (0, pad)), m_p)

            def adjoint(v: torch.Tensor, n_p: int = coords.numel()) -> torch.Tensor:
                return idct(v, self.chunk_len)[..., :n_p]

            x0 = None if warm_start is None else warm_start[coords]
            sol = bpdn(forward, adjoint, y[offset : offset + m_p], lam, "owlqn", x0, max_iter, tol)
            s[coords] = sol.s
            iterations += sol.iterations
        return BPDNSolution(s, iterations)


def _split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal integers, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if p < extra else 0) for p in range(parts)]
