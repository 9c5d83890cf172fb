"""Count sketch and the FedSKETCH unsketch operators PRIVIX, HEAVYMIX and HEAPRIX (paper 002).

A count sketch (paper 002, Alg. 1) with ``t = rows`` arrays of ``k = cols`` bins maps ``x ∈ R^d`` to
``S(x) ∈ R^{t×k}`` with ``S[j, h_j(i)] += s_j(i)·x_i``. The hashes are shared by all participants: they
are a pure function of an integer seed, so devices and server agree without sending them. ``S`` is linear,
``S(a) + S(b) = S(a + b)`` and ``S(c·a) = c·S(a)``, so the server can average sketches instead of vectors.

Operators (names and algorithm numbers from paper 002):

* ``privix``   Alg. 2, ``x̃_i = median_j s_j(i)·S[j, h_j(i)]`` — unbiased (see ``CountSketch.privix``).
* ``heavymix`` Alg. 3, keep the ``m`` coordinates with the largest ``|x̃_i|``, zero elsewhere — biased.
* ``heaprix``  Alg. 4, ``HEAVYMIX[S(x)] + PRIVIX[S(x − HEAVYMIX[S(x)])]``; with the optional second
  exchange of exact heavy values (SketchedSGD, Ivkin et al. 2019) — protocol in ``CountSketch.heaprix``.

Hash family and memory
----------------------
Buckets and signs come from the Carter–Wegman 2-universal family over the Mersenne prime
``p = 2^31 − 1``, one independent coefficient pair per row and per hash kind:

    h_j(i) = ((a_j·i + b_j) mod p) mod k,      s_j(i) = 1 − 2·(((c_j·i + e_j) mod p) mod 2),

with ``a_j, c_j ∈ [1, p)`` and ``b_j, e_j ∈ [0, p)`` drawn from a private CPU ``torch.Generator`` seeded
from ``seed`` (the caller's torch/numpy RNG state is never touched; the coefficients, hence the hashes,
are identical on every device). The paper asks for pairwise independent ``h_j`` and ``s_j`` (Alg. 1): this
family gives that up to O(1/p) (``E[s_j(i)s_j(l)] = −1/p`` for ``i ≠ l``). All arithmetic is exact in
int64 (``a·i + b < 2^62``), on CPU and CUDA alike. Why not random tables: storing ``h`` and ``s`` as
int64 ``[t, d]`` costs 16·t·d bytes (1.6 GB for d = 1M, t = 50) and must be drawn on the CPU to be
device-independent; the universal hash is four integers per row and can be evaluated on the fly, chunk
by chunk, at any coordinate (``heaprix`` sketches its ``m`` heavy coordinates without touching the other
``d − m``). For speed the hashes are cached when ``rows·dim <= 2^24`` (or ``cache_hashes=True``): int32 flat bin
indices ``j·k + h_j(i)`` plus int8 signs for PRIVIX, and the sketch as a sparse CSR matrix with int32
indices for ``sketch`` — 13 bytes per (row, coordinate): 39 MB for LeNet-5 with t = 50. Larger sketches
(e.g. d = 1M, t = 20 or 50) recompute the hashes chunk by chunk on every call (slower, no memory).
"""

from __future__ import annotations

import math
import statistics
import warnings

import torch

from fedrun.compress.masks import generator

MERSENNE_PRIME: int = 2**31 - 1
"""The prime ``p`` of the hash family; coordinates must satisfy ``dim < p``."""

_CACHE_LIMIT = 1 << 24  # cache the hashes when rows·dim <= this (13 bytes each: <= 218 MB)
_CSR_MIN = 1 << 16  # sketch through the CSR matrix when rows·dim >= this (it has a ~10 ms first-call cost)
_CHUNK_ELEMENTS = 1 << 22  # work tensors of at most ~this many float32 elements (16 MB) per chunk


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}; allowed: an int")
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f" <= {high}"
        raise ValueError(f"{name}={value}; allowed: {low} <= {name}{upper}")
    return value


def compression_ratio(dim: int, rows: int, cols: int) -> float:
    """Uplink compression ``d / (t·k)`` of a ``t × k`` float32 sketch of a ``d``-vector (float32 too).

    Paper 002, Sec. 7: ``(t, k) = (20, 40)`` and ``(50, 100)`` on LeNet-5 "correspond to a 75× and 12×
    compression ratio" — exact for d = 60,000; the classic LeNet-5 has d = 61,706 (77.13× and 12.34×).
    """
    _check_int("dim", dim, 1)
    _check_int("rows", rows, 1)
    _check_int("cols", cols, 1)
    return dim / (rows * cols)


def sketch_epsilon(rows: int, cols: int, length: int, sigma: float, bound_C: float, alpha: float) -> float:
    """ε of a ``rows × cols`` count sketch of a ``length``-vector (paper 002, Theorem 1, from Li et al.).

    ``ε = t·ln(1 + q)`` with ``q = α C² m(m−1) / (σ²(l−2)) · (1 + ln(l − m))``, in the paper's notation
    ``t = rows`` arrays, ``m = cols`` bins, ``l = length``. The theorem holds only under the paper's
    Assumption 1 — the entries of the sketched vector are i.i.d. ``N(0, σ²)`` and bounded, ``|x_i| <= C``
    (with high probability) — and only "with high probability"; it is not a worst-case DP guarantee for
    arbitrary model updates, and it assumes no exact values are ever released (so it does not cover the
    two-exchange HEAPRIX/SketchedSGD variant).

    The side condition is strict: ``α = 4`` maximises its slack, so it can hold only if
    ``C/σ <= 1/(4·sqrt(m(m−1)(1+ln(l−m))/(l−2)))`` — for LeNet-5 (l = 60,000) ``C/σ <= 0.448`` at
    (t, m) = (20, 40) and ``<= 0.178`` at (50, 100), where ε = t·ln(1.25) = 4.46 and 11.2. Gaussian entries
    are bounded by such a C with high probability only if ``C >= ~4σ``, so for the paper's sketch sizes
    the theorem gives no ε at all.

    Choice: when the theorem's side condition ``q <= 1/2 − 1/α`` fails the theorem says nothing, and this
    function raises ``ValueError`` naming the violated condition and its two sides (rather than returning
    ``math.inf``, which a table could silently print as a result). Callers sweeping a grid can catch it.

    Raises:
        ValueError: ``rows < 1``, ``cols < 1``, ``length <= max(2, cols)`` (``ln(l − m)`` and ``l − 2``
            must be defined and positive), non-positive or non-finite ``sigma``, ``bound_C`` or ``alpha``,
            or the side condition above.
    """
    _check_int("rows", rows, 1)
    _check_int("cols", cols, 1)
    _check_int("length", length, max(3, cols + 1))
    for name, value in (("sigma", sigma), ("bound_C", bound_C), ("alpha", alpha)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r}; allowed: a finite number > 0")
    m, l = cols, length
    q = alpha * bound_C**2 * m * (m - 1) / (sigma**2 * (l - 2)) * (1.0 + math.log(l - m))
    limit = 0.5 - 1.0 / alpha
    if q > limit:
        raise ValueError(
            f"Theorem 1 condition violated: alpha*C^2*m(m-1)/(sigma^2(l-2))*(1+ln(l-m)) = {q:.6g} > "
            f"1/2 - 1/alpha = {limit:.6g} (rows={rows}, cols={cols}, length={length}, sigma={sigma}, "
            f"bound_C={bound_C}, alpha={alpha}); allowed: the left side <= the right side"
        )
    return rows * math.log1p(q)


#: Assumption 1 of paper 002 (from Li et al.): |x_i| <= C "with a large probability"; the default C/σ
#: makes all l i.i.d. N(0, σ²) entries lie within ±C with probability >= 1 − this (union bound).
ASSUMPTION_FAILURE = 0.05


def default_c_over_sigma(length: int, failure: float = ASSUMPTION_FAILURE) -> float:
    """C/σ such that ``length`` i.i.d. N(0, σ²) entries all satisfy |x_i| <= C w.p. >= 1 − failure."""
    return statistics.NormalDist().inv_cdf(1.0 - failure / (2.0 * length))


def theorem1(rows: int, cols: int, length: int, c_over_sigma: float | None, alpha: float,
             exact_values: bool) -> tuple[float | None, dict[str, str]]:
    """Paper 002, Theorem 1 for one released ``rows × cols`` sketch: ``(ε, tags)``, ε None unless its assumptions and
    condition hold; tags ``sketch_epsilon_assumption`` and ``sketch_epsilon_status`` say which (and ``sketch.rows``,
    ``sketch.cols``). ``c_over_sigma`` None: the default C/σ; ``exact_values``: a second exchange releases exact
    coordinates (not covered by the theorem)."""
    c_sigma = c_over_sigma if c_over_sigma is not None else default_c_over_sigma(length)
    origin = "given" if c_over_sigma is not None else (
        f"default: all {length} entries within ±C w.p. >= {1 - ASSUMPTION_FAILURE:g}")
    assumption = (f"paper 002 Theorem 1 (Li et al.), Assumption 1: the {length} entries of the sketched update are "
                  f"i.i.d. N(0, σ²) and bounded, |x_i| <= C, C/σ = {c_sigma:.4g} ({origin}), α = {alpha:g}; "
                  f"holds with high probability, per released sketch (no composition over rounds); "
                  f"not a worst-case DP guarantee")
    epsilon = None
    if exact_values:
        status = ("not available: exact heavy-coordinate values are released in a second exchange; "
                  "Theorem 1 covers a release of the sketch only")
    else:
        try:
            epsilon = sketch_epsilon(rows, cols, length, sigma=1.0, bound_C=c_sigma, alpha=alpha)
            status = "valid"
        except ValueError as exc:
            status = f"not available: {exc}"
    return epsilon, {"sketch_epsilon_assumption": assumption[:4900], "sketch_epsilon_status": status[:4900],
                     "sketch.rows": str(rows), "sketch.cols": str(cols)}


def privix_flops(dim: int, rows: int) -> float:
    """Modelled operations of PRIVIX over all ``d`` coordinates: A = d·t·(1 + ⌈log₂t⌉) — t sign multiplies and a sort
    of t values for the median (an operation is a float add, multiply or compare; index and memory moves are free)."""
    return float(dim * rows * (1 + math.ceil(math.log2(rows))))


def heavy_flops(dim: int, rows: int, m: int) -> float:
    """B, the heavy hitters ``H`` = top-m of |PRIVIX[S]|: A + d·(1 + ⌈log₂m⌉) (|·| and a heap of m)."""
    return privix_flops(dim, rows) + dim * (1 + math.ceil(math.log2(max(m, 1))))


def unsketch_flops(dim: int, rows: int, cols: int, method: str, m: int, exact_values: bool) -> float:
    """Modelled operations of ``CountSketch.unsketch``, with A and B of :func:`privix_flops` and :func:`heavy_flops`:

    * PRIVIX: A.
    * HEAPRIX, sketch-only values (Alg. 4): B + 2mt (S(h) of the m heavy values) + tk (S − S(h)) + A + m (h added).
    * HEAPRIX, exact values: B (H, computed once by the second exchange's query) + 2mt + tk + A (values on H are
      the exact ones)."""
    t, k = rows, cols
    if method == "privix":
        return privix_flops(dim, t)
    return heavy_flops(dim, t, m) + 2 * m * t + t * k + privix_flops(dim, t) + (0 if exact_values else m)


def _median_last(values: torch.Tensor) -> torch.Tensor:
    """Median over the last dimension; for an even count the midpoint of the two middle values.

    ``torch.median`` returns the lower of the two middle values, which is a biased estimate of the centre
    of a symmetric distribution; the midpoint is what keeps PRIVIX unbiased for even ``t`` (e.g. 20, 50).
    """
    t = values.shape[-1]
    if t % 2 == 1:
        return values.median(dim=-1).values
    top = values.topk(t // 2 + 1, dim=-1, largest=True, sorted=True).values
    return 0.5 * (top[..., -1] + top[..., -2])


class CountSketch:
    """A ``rows × cols`` count sketch of ``dim``-vectors with hashes fixed by ``seed`` (paper 002, Alg. 1).

    Args:
        dim: ``d``, the length of the sketched vectors, ``1 <= d < 2^31 − 1``.
        rows: ``t``, the number of hash arrays (the median in PRIVIX is over these), ``>= 1``.
        cols: ``k``, the number of bins per array (the paper's ``m`` in Theorem 1), ``>= 1``.
        seed: the shared seed, ``0 <= seed < 2^63``; same seed, same hashes on every participant and device.
        device: where the cached hashes live and where inputs must be (float32 tensors).
        cache_hashes: keep the hashes in memory (13 bytes per (row, coordinate)); default: when
            ``rows·dim <= 2^24``. Results are equal either way (up to float summation order).
        chunk_elements: size budget (float32 elements) of the work tensors of one chunk of coordinates.

    Attributes ``dim, rows, cols, seed, device`` are read-only by convention. ``nbytes`` is the size of one
    float32 sketch, ``4·t·k`` — what a device uploads per sketch.
    """

    def __init__(self, dim: int, rows: int, cols: int, seed: int, device: torch.device | str = "cpu", *,
                 cache_hashes: bool | None = None, chunk_elements: int = _CHUNK_ELEMENTS) -> None:
        self.dim = _check_int("dim", dim, 1, MERSENNE_PRIME - 1)
        self.rows = _check_int("rows", rows, 1)
        self.cols = _check_int("cols", cols, 1, MERSENNE_PRIME)
        self.seed = _check_int("seed", seed, 0, 2**63 - 1)
        self.chunk_elements = _check_int("chunk_elements", chunk_elements, 1)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        # Private CPU generator keyed by the text "fedrun.count_sketch:<seed>": the caller's RNG is untouched and the
        # coefficients do not depend on the device.
        gen = generator("fedrun.count_sketch", seed)
        coeffs = torch.empty(rows, 4, dtype=torch.int64)
        for col, low in enumerate((1, 0, 1, 0)):  # a_j, b_j (bucket), c_j, e_j (sign)
            coeffs[:, col] = torch.randint(low, MERSENNE_PRIME, (rows,), generator=gen, dtype=torch.int64)
        self._coeffs_cpu = coeffs
        self._coeffs = coeffs.to(self.device)
        self._row_offset = torch.arange(rows, dtype=torch.int64, device=self.device) * cols
        if cache_hashes is None:
            cache_hashes = rows * dim <= _CACHE_LIMIT
        # int32 indices unless a flat bin index or a nonzero count would not fit
        self._index_dtype = torch.int32 if max(rows * cols, rows * dim) < 2**31 else torch.int64
        self._flat_cache: torch.Tensor | None = None  # int32 [d, t]: j·k + h_j(i)  (for PRIVIX)
        self._sign_cache: torch.Tensor | None = None  # int8 [d, t]: s_j(i)
        self._matrix: torch.Tensor | None = None  # sparse CSR [t·k, d], int32 indices (for sketch)
        if cache_hashes:
            flat, sign = self._hash_range(0, dim)
            self._flat_cache = flat.to(self._index_dtype)
            self._sign_cache = sign.to(torch.int8)
            if self.device.type in ("cpu", "cuda") and rows * dim >= _CSR_MIN:
                self._matrix = self._sketch_matrix(flat, sign)

    # ------------------------------------------------------------------ hashes
    @property
    def hash_coefficients(self) -> torch.Tensor:
        """CPU int64 ``[t, 4]``: ``(a_j, b_j, c_j, e_j)`` of ``h_j`` and ``s_j`` (see the module docstring)."""
        return self._coeffs_cpu.clone()

    def _hash_at(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat bin ``j·k + h_j(i)`` (int64) and sign ``s_j(i)`` (float32), both ``[n, t]``, at ``coords``."""
        i = coords.to(device=self.device, dtype=torch.int64).unsqueeze(-1)  # [n, 1]
        a, b, c, e = self._coeffs.unbind(dim=1)  # each [t]
        # In place where possible: these [n, t] int64 passes dominate when the hashes are not cached.
        bucket = a * i
        bucket += b
        bucket.remainder_(MERSENNE_PRIME).remainder_(self.cols)
        bucket += self._row_offset
        parity = c * i
        parity += e
        parity.remainder_(MERSENNE_PRIME).bitwise_and_(1)
        return bucket, parity.to(torch.float32).mul_(-2.0).add_(1.0)

    def _sketch_matrix(self, flat: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """The sketch as a sparse ``[t·k, d]`` CSR matrix ``A`` (``S(x) = A·x``), rows = flat bins."""
        t, k = self.rows, self.cols
        flat = flat.reshape(-1)  # entry e = i·t + j
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=t * k)
        crow = torch.zeros(t * k + 1, dtype=torch.int64, device=self.device)
        crow[1:] = torch.cumsum(counts, dim=0)
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support", category=UserWarning)
            return torch.sparse_csr_tensor(
                crow.to(self._index_dtype),
                torch.div(order, t, rounding_mode="floor").to(self._index_dtype),
                sign.reshape(-1)[order],
                size=(t * k, self.dim),
                check_invariants=False,  # valid by construction (sorted rows, in-range columns)
            )

    def _hash_range(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._flat_cache is not None and self._sign_cache is not None:
            return (
                self._flat_cache[start:stop].to(torch.int64),
                self._sign_cache[start:stop].to(torch.float32),
            )
        return self._hash_at(torch.arange(start, stop, dtype=torch.int64, device=self.device))

    def hashes(self, start: int = 0, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Buckets ``h_j(i)`` (int64 in ``[0, k)``) and signs ``s_j(i)`` (float32 ±1), both ``[t, stop−start]``.

        Row ``j``, column ``i − start``; for inspection and tests (the operators use them internally).
        """
        stop = self.dim if stop is None else stop
        _check_int("start", start, 0, self.dim)
        _check_int("stop", stop, start, self.dim)
        flat, sign = self._hash_range(start, stop)
        return (flat - self._row_offset).T.contiguous(), sign.T.contiguous()

    # ------------------------------------------------------------------ sizes
    @property
    def nbytes(self) -> int:
        """Bytes of one float32 sketch: ``4·t·k``."""
        return 4 * self.rows * self.cols

    @property
    def compression_ratio(self) -> float:
        """``d / (t·k)``: float32 vector bytes over sketch bytes (see ``compression_ratio``)."""
        return compression_ratio(self.dim, self.rows, self.cols)

    @property
    def default_num_heavy(self) -> int:
        """Default ``m`` for HEAVYMIX/HEAPRIX: ``min(k, d)``, the number of columns.

        Why ``m = k``: paper 002's HEAVYMIX lemma needs a sketch of size Θ(m·log(d/δ)), i.e. ``t = Θ(log(d/δ))``
        rows of ``k = Θ(m)`` columns — a sketch with ``k`` bins per row can single out about ``k`` heavy
        coordinates (each row's estimate has error ~ ‖x_tail‖₂/√k, so at most ~k coordinates can stand
        above it). The second HEAPRIX exchange then costs ``4m = 4k`` bytes per device, ``1/t`` of the
        sketch itself. Pass ``m`` explicitly to trade accuracy against that extra upload.

        Measured (``scripts/bench_sketch.py --accuracy``; relative L2 error on standard-Cauchy vectors,
        d = 60,000, 5 seeds; HEAPRIX sketch-only / with exact heavy values):

        ======  ======  ==============  ==============  ==============
        t×k     PRIVIX  m = k/4         m = k/2         m = k
        ======  ======  ==============  ==============  ==============
        20×40   1.819   1.301 / 1.324   1.365 / 1.209   1.693 / 1.147
        50×100  0.440   0.338 / 0.341   0.276 / 0.283   0.265 / 0.244
        ======  ======  ==============  ==============  ==============

        With exact heavy values the error falls as ``m`` grows, so ``m = k`` is right for that mode. The
        sketch-only mode (paper's Alg. 4) is best near ``m = k/4 … k/2`` at (20, 40), and with few rows
        it can lose to PRIVIX at ``m = k`` (t = 5, k = 50, d = 2,000, magnitudes 1/i: 2.10 vs 1.15):
        each heavy estimate's error is subtracted in all ``t`` rows at once. Schemes using the
        sketch-only mode should expose ``m`` and consider ``k // 2``.
        """
        return min(self.cols, self.dim)

    # ------------------------------------------------------------------ validation helpers
    def _check_tensor(self, name: str, x: torch.Tensor, shapes: str, ok: bool) -> None:
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}={type(x).__name__}; allowed: a torch.Tensor")
        if x.dtype != torch.float32:
            raise ValueError(f"{name}.dtype={x.dtype}; allowed: torch.float32")
        if x.device != self.device:
            raise ValueError(f"{name}.device={x.device}; allowed: {self.device} (the sketch's device)")
        if not ok:
            raise ValueError(f"{name}.shape={tuple(x.shape)}; allowed: {shapes}")

    def _check_sketch(self, S: torch.Tensor) -> torch.Tensor:
        """Validate ``S`` ([t, k] or [K, t, k]) and return it as ``[K, t·k]``."""
        t, k = self.rows, self.cols
        ok = isinstance(S, torch.Tensor) and S.dim() in (2, 3) and tuple(S.shape[-2:]) == (t, k)
        self._check_tensor("S", S, f"[{t}, {k}] or [K, {t}, {k}]", ok)
        return S.reshape(-1, t * k)

    def _check_m(self, m: int | None) -> int:
        return self.default_num_heavy if m is None else _check_int("m", m, 1, self.dim)

    def _chunk(self, batch: int) -> int:
        return max(1, self.chunk_elements // (max(batch, 1) * self.rows))

    # ------------------------------------------------------------------ Alg. 1: sketch
    def sketch(self, x: torch.Tensor) -> torch.Tensor:
        """Count sketch ``S(x)`` (paper 002, Alg. 1): ``[d] → [t, k]`` or a batch ``[K, d] → [K, t, k]``.

        The whole batch is one operation, no loop over clients or rows: with cached hashes (and
        ``t·d >= 2^16``) a sparse-dense product ``A·Xᵀ`` with the CSR sketch matrix ``A`` (``t·d`` nonzeros
        ``s_j(i)`` at ``(j·k + h_j(i), i)``; 4–10× faster than scatter on CPU for 25 clients); otherwise a
        scatter-add over the flattened bin index ``j·k + h_j(i)``, per chunk of coordinates. Linear in ``x``.
        """
        d, t, k = self.dim, self.rows, self.cols
        ok = isinstance(x, torch.Tensor) and x.dim() in (1, 2) and x.shape[-1] == d
        self._check_tensor("x", x, f"[{d}] or [K, {d}]", ok)
        xb = x.reshape(-1, d)
        batch = xb.shape[0]
        if self._matrix is not None:  # cached hashes: one sparse-dense product for the whole batch
            return (self._matrix @ xb.T).T.contiguous().reshape(*x.shape[:-1], t, k)
        out = torch.zeros(batch, t * k, dtype=torch.float32, device=self.device)
        step = self._chunk(batch)
        for start in range(0, d, step):
            stop = min(d, start + step)
            flat, sign = self._hash_range(start, stop)  # [c, t]
            contrib = xb[:, start:stop, None] * sign  # [K, c, t]
            index = flat.reshape(1, -1).expand(batch, -1)
            out.scatter_add_(1, index, contrib.reshape(batch, -1))
        return out.reshape(*x.shape[:-1], t, k)

    def _sketch_sparse(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``S(h)`` for ``h`` with ``values`` ([K, m]) at ``indices`` ([K, m]) and zeros elsewhere → [K, t·k]."""
        batch, m = values.shape
        flat, sign = self._hash_at(indices.reshape(-1))  # [K·m, t]
        contrib = values.reshape(-1, 1) * sign
        out = torch.zeros(batch, self.rows * self.cols, dtype=torch.float32, device=self.device)
        out.scatter_add_(1, flat.reshape(batch, m * self.rows), contrib.reshape(batch, m * self.rows))
        return out

    # ------------------------------------------------------------------ Alg. 2: PRIVIX
    def _privix_flat(self, S_flat: torch.Tensor) -> torch.Tensor:
        batch = S_flat.shape[0]
        out = torch.empty(batch, self.dim, dtype=torch.float32, device=self.device)
        step = self._chunk(batch)
        for start in range(0, self.dim, step):
            stop = min(self.dim, start + step)
            flat, sign = self._hash_range(start, stop)  # [c, t]
            est = S_flat.index_select(1, flat.reshape(-1)).reshape(batch, stop - start, self.rows) * sign
            out[:, start:stop] = _median_last(est)
        return out

    def privix(self, S: torch.Tensor) -> torch.Tensor:
        """PRIVIX (paper 002, Alg. 2): ``x̃_i = median_j s_j(i)·S[j, h_j(i)]``; ``[t, k] → [d]`` or ``[K, t, k] → [K, d]``.

        For an even ``t`` the median is the midpoint of the two middle values (``torch.median``'s lower
        median would be biased). Unbiasedness, over the random choice of the hashes (the seed), ``x`` fixed:
        each row's estimate is ``x_i + s_j(i)·Z_j`` with ``Z_j = Σ_{l≠i, h_j(l)=h_j(i)} s_j(l)·x_l``. For
        ``t = 1`` it is exactly unbiased given pairwise independent signs (here up to O(1/p)). For ``t > 1``
        the median is unbiased when the row noises ``s_j(i)·Z_j`` are independent across rows and each
        symmetric about 0 (then the median of ``x_i + noise`` is symmetric about ``x_i``); independent rows
        hold here (independent coefficients per row), symmetry holds exactly for fully random signs and
        approximately for this 2-universal family. Checked statistically in tests/unit/test_sketch.py.
        """
        S_flat = self._check_sketch(S)
        return self._privix_flat(S_flat).reshape(*S.shape[:-2], self.dim)

    # ------------------------------------------------------------------ Alg. 3: HEAVYMIX
    def _top_m(self, est: torch.Tensor, m: int) -> torch.Tensor:
        return est.abs().topk(m, dim=-1, sorted=False).indices.sort(dim=-1).values

    def heavy_hitters(self, S: torch.Tensor, m: int | None = None) -> torch.Tensor:
        """Indices of the ``m`` largest ``|PRIVIX[S]_i|`` (paper 002, Alg. 3, heavy set), in ascending order.

        ``[t, k] → LongTensor[m]``, ``[K, t, k] → [K, m]``. Default ``m``: ``default_num_heavy`` (= k).
        Ascending order is canonical: two participants that find the same set list it the same way, which
        is the order in which devices send exact values in the second HEAPRIX exchange. Deviation from the
        paper: Alg. 3 keeps ``{i : x̃_i² >= ‖x̃‖²/m}`` and fills up to ``m`` with random coordinates; this is
        the deterministic top-``m`` of SketchedSGD (Ivkin et al. 2019), needing no extra shared randomness.
        """
        S_flat = self._check_sketch(S)
        m = self._check_m(m)
        idx = self._top_m(self._privix_flat(S_flat), m)
        return idx.reshape(*S.shape[:-2], m)

    def _heavy_part(self, S: torch.Tensor, m: int | None, values: torch.Tensor | None, indices: torch.Tensor | None,
                    values_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """Validate; return ``(S_flat [K, t·k], H [K, m], values on H [K, m], output shape)``."""
        S_flat = self._check_sketch(S)
        m = self._check_m(m)
        batch = S_flat.shape[0]
        lead = tuple(S.shape[:-2])
        want = f"{list(lead) + [m]}"
        if indices is not None:
            if not (isinstance(indices, torch.Tensor) and tuple(indices.shape) == lead + (m,)):
                shape = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
                raise ValueError(f"indices.shape={shape}; allowed: {want} (m={m} per sketch)")
            if indices.dtype not in (torch.int32, torch.int64) or indices.device != self.device:
                raise ValueError(
                    f"indices.dtype={indices.dtype}, device={indices.device}; allowed: int32/int64 on {self.device}"
                )
            idx = indices.reshape(batch, m).to(torch.int64)
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.dim):
                raise ValueError(f"indices in [{int(idx.min())}, {int(idx.max())}]; allowed: 0 <= index < {self.dim}")
            if m > 1 and bool((idx.sort(dim=-1).values.diff(dim=-1) == 0).any()):
                raise ValueError("indices contain duplicates; allowed: m distinct coordinates per sketch")
        if values is not None:
            ok = isinstance(values, torch.Tensor) and tuple(values.shape) == lead + (m,)
            self._check_tensor(values_name, values, want + f" (aligned with heavy_hitters(S, m={m}))", ok)
        est = self._privix_flat(S_flat) if indices is None or values is None else None
        if indices is None:
            idx = self._top_m(est, m)
        heavy = values.reshape(batch, m) if values is not None else est.gather(1, idx)
        return S_flat, idx, heavy, lead + (self.dim,)

    def heavymix(self, S: torch.Tensor, m: int | None = None, exact_values: torch.Tensor | None = None, *,
                 indices: torch.Tensor | None = None) -> torch.Tensor:
        """HEAVYMIX (paper 002, Alg. 3): the heavy set keeps its values, every other coordinate is 0.

        ``[t, k] → [d]`` (``[K, t, k] → [K, d]``). Heavy set ``H = heavy_hitters(S, m)``, or ``indices`` when
        given (e.g. already computed, or broadcast by the server). Values on ``H``: the PRIVIX estimates
        (the paper's one-exchange, sketch-only version) or ``exact_values`` ([m] / [K, m], in the order of
        ``H``) obtained by a second exchange with the devices, as in SketchedSGD (Ivkin et al. 2019).
        Biased: ``E[HEAVYMIX] ≠ x`` (coordinates outside ``H`` are dropped).
        """
        _, idx, heavy, shape = self._heavy_part(S, m, exact_values, indices, "exact_values")
        out = torch.zeros(idx.shape[0], self.dim, dtype=torch.float32, device=self.device)
        out.scatter_(1, idx, heavy)
        return out.reshape(shape)

    # ------------------------------------------------------------------ Alg. 4: HEAPRIX
    def heaprix(self, S: torch.Tensor, m: int | None = None, exact_heavy_values: torch.Tensor | None = None, *,
                indices: torch.Tensor | None = None) -> torch.Tensor:
        """HEAPRIX (paper 002, Alg. 4): ``h + PRIVIX[S − S(h)]`` with ``h`` the heavy part; ``[t, k] → [d]``.

        By linearity ``S(x) − S(h) = S(x − h)``, so the residual sketch is computed locally from ``S`` and
        ``h`` (only the ``m`` heavy coordinates are re-sketched) and needs no extra upload.

        Two modes:

        * ``exact_heavy_values=None`` (paper's Alg. 4, one exchange, private in the sense of Theorem 1):
          ``h = HEAVYMIX[S]`` with the sketch estimates, result ``h + PRIVIX[S − S(h)]`` on all coordinates.
          Note: the paper's unbiasedness argument (induced compressor) assumes the second compressor uses
          randomness independent of the first; here both use the same hashes, so it holds only approximately.
        * ``exact_heavy_values`` given ([m] / [K, m], aligned with ``heavy_hitters(S, m)`` or ``indices``):
          ``h`` = those values on ``H``, 0 elsewhere; the residual ``x − h`` is known to be exactly 0 on
          ``H``, so the result is ``h`` on ``H`` and ``PRIVIX[S − S(h)]`` on the rest.

        Federated two-exchange protocol (the round of :mod:`fedrun.schemes.sketch`; float32, weights ``w_j``): device j
        uploads ``S(x_j)`` (``4·t·k`` bytes, ``cs.nbytes``; a simulation sketches all at once, ``cs.sketch(X)``); the
        server broadcasts ``S̄ = Σ_j w_j·S(x_j) = S(x̄)``; everyone computes ``H = cs.heavy_hitters(S̄, m)``, a
        deterministic function of ``S̄`` and the seed, so nothing is sent (where hardware may break ties in ``|x̃|``
        differently the server sends ``H`` too, ``4·m`` bytes as int32, and everyone passes ``indices=H``); device j
        uploads ``x_j[H]`` (``4·m`` bytes) and the server broadcasts ``v̄ = Σ_j w_j·x_j[H] = x̄[H]`` (same weights);
        everyone computes ``Φ = cs.heaprix(S̄, m, exact_heavy_values=v̄, indices=H)``. Per device and round:
        ``4·(t·k + m)`` bytes up and down, ``4·k·(t + 1)`` at the default ``m = k``. The exact values are not covered
        by the sketch's ε (``sketch_epsilon``); without them (``exact_heavy_values=None``) this is the paper's
        single-exchange HEAPRIX. SketchedSGD uses the same exchanges and keeps only ``h``
        (``cs.heavymix(S̄, m, v̄, indices=H)``).
        """
        S_flat, idx, heavy, shape = self._heavy_part(S, m, exact_heavy_values, indices, "exact_heavy_values")
        residual = S_flat - self._sketch_sparse(idx, heavy)
        out = self._privix_flat(residual)
        if exact_heavy_values is None:
            out.scatter_add_(1, idx, heavy)
        else:
            out.scatter_(1, idx, heavy)
        return out.reshape(shape)

    def unsketch(self, S: torch.Tensor, method: str, m: int, heavy: torch.Tensor | None = None,
                 values: torch.Tensor | None = None) -> torch.Tensor:
        """``privix(S)`` or ``heaprix(S, m)`` of S [t, k] or [K, t, k]; HEAPRIX on the heavy set ``heavy`` [m] (one
        for the whole batch), with its exact values ``values`` if given."""
        if method == "privix":
            return self.privix(S)
        if heavy is None:
            return self.heaprix(S, m)
        if S.dim() == 3:
            heavy = heavy.unsqueeze(0).expand(S.shape[0], -1).contiguous()
        return self.heaprix(S, m, exact_heavy_values=values, indices=heavy)
