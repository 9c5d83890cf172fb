"""Strategy matrices of correlated-noise mechanisms (matrix factorization of the prefix sums), and their sensitivity
under a participation schema (pure numpy; the privatizer draws its noise from them: fedrun.simulation.ClientDP).

A mechanism for the prefix sums A·G of T rounds' (clipped) contributions factors A = B·C and releases
B·(C·G + Z): the noise B·Z is correlated across rounds. With each client's contribution in a round clipped to S and
Z's entries N(0, σ²S²), it is the Gaussian mechanism on C·G with noise multiplier σ / sens(C), where sens(C) is the
largest ‖C·u‖₂ over the participation patterns u ∈ {0, 1}^T a client may have (Choquette-Choo et al., "Multi-Epoch
Matrix Factorization Mechanisms for Private Machine Learning", ICML 2023, Thm 2.1, for C with CᵀC ≥ 0 entrywise,
where sign patterns of the contributions reduce to 0/1 ones).

* :func:`prefix_sum_matrix` — A, lower-triangular ones (T×T).
* :func:`tree_factorization` — binary-tree aggregation (Honaker 2015; Kairouz et al., "Practical and Private (Deep)
  Learning without Sampling or Shuffling", ICML 2021): C has a row per node of the dyadic tree over 2^⌈log₂T⌉ leaves,
  B sums the ≤ ⌈log₂T⌉ + 1 nodes that cover [1, t]; each round is in ⌈log₂T⌉ + 1 nodes.
* :func:`sqrt_toeplitz` — the square root of A (Fichtenberger, Henzinger, Upadhyay, "Constant Matters: Fine-grained
  Error Bound on Differentially Private Continual Observation", ICML 2023): lower-triangular Toeplitz with the
  coefficients of (1 − x)^(−1/2), c_j = binom(2j, j)/4^j; B = C.
* :func:`banded_toeplitz` — a banded lower-triangular Toeplitz C whose coefficients minimise the total squared error
  of the prefix sums at unit sensitivity (Choquette-Choo et al., ICML 2023 / NeurIPS 2023), by L-BFGS-B.
* :func:`blt` — a buffered-linear-Toeplitz C, c_j = Σ_i ω_i θ_i^(j−1) (Dvijotham, McMahan, Pillutla, Steinke,
  Thakurta, FOCS 2024), its d pairs optimised for the same loss.
* :func:`sensitivity` — sens(C) for at most k participations at least b rounds apart (b-min-separation), exact by
  enumerating the patterns (bounded), or the closed form √k × the largest column norm for a C whose columns at least
  b apart have disjoint supports (a banded C with bands ≤ b), or the largest column norm for one participation.
* :func:`prefix_sensitivities` — the sensitivity of what rounds 1..t have released, for every t.
* :func:`round_noise_matrix` — M = A⁻¹·B: round t adds Σ_r M[t, r]·Z_r to its clipped sum.
* :func:`strategy` — (B, C, banded) by name (:data:`STRATEGIES`).

The loss the optimised strategies minimise is sens(C)² · ‖A·C⁻¹‖_F² = sens(C)² · ‖B‖_F²: the expected total squared
error of the T prefix sums when Z has unit variance per unit of sensitivity. Checked against jax_privacy 2.0.0's
``toeplitz.optimize_banded_toeplitz`` and ``buffered_toeplitz.optimize`` (tests/unit/test_factorization.py).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["prefix_sum_matrix", "tree_factorization", "sqrt_toeplitz", "banded_toeplitz", "blt", "sensitivity",
           "prefix_sensitivities", "round_noise_matrix", "strategy", "STRATEGIES", "MAX_PATTERNS", "BLT_MAX_BUFFERS",
           "BLT_DEFAULT_BUFFERS"]

#: the most participation patterns :func:`sensitivity` enumerates (a larger schema raises instead of running long)
MAX_PATTERNS = 2_000_000


def _rounds(T: int) -> int:
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"rounds={T!r} must be an integer >= 1")
    return int(T)


def prefix_sum_matrix(T: int) -> np.ndarray:
    """A (T×T): row t sums rounds 1..t."""
    return np.tril(np.ones((_rounds(T), T)))


def tree_factorization(T: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, C) with B·C = A for T rounds: C's rows are the nodes of the binary tree over 2^h leaves, h = ⌈log₂T⌉ (each
    node sums the rounds of its dyadic interval; columns for rounds past T are dropped), B's row t takes the nodes of
    the binary decomposition of [1, t]."""
    T = _rounds(T)
    h = max(0, math.ceil(math.log2(T)))
    nodes = [(level, start) for level in range(h + 1) for start in range(0, 2 ** h, 2 ** level)]  # [start, start+2^l)
    index = {node: i for i, node in enumerate(nodes)}
    C = np.zeros((len(nodes), T))
    for i, (level, start) in enumerate(nodes):
        C[i, start:min(start + 2 ** level, T)] = 1.0
    B = np.zeros((T, len(nodes)))
    for t in range(1, T + 1):  # [0, t) as dyadic blocks, largest first (the set bits of t)
        start = 0
        for level in range(h, -1, -1):
            if t - start >= 2 ** level:
                B[t - 1, index[(level, start)]] = 1.0
                start += 2 ** level
    return B, C


def sqrt_toeplitz(T: int) -> np.ndarray:
    """C (T×T) with C·C = A: lower-triangular Toeplitz, C[i, j] = c_{i−j}, c_0 = 1, c_j = c_{j−1}·(2j − 1)/(2j)."""
    T = _rounds(T)
    c = np.ones(T)
    for j in range(1, T):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    i, j = np.indices((T, T))
    return np.where(i >= j, c[np.clip(i - j, 0, T - 1)], 0.0)


def _toeplitz(coef: np.ndarray, T: int) -> np.ndarray:
    """The T×T lower-triangular Toeplitz matrix with first column ``coef`` (zero-padded or cut to T)."""
    c = np.zeros(T)
    c[:min(T, len(coef))] = coef[:T]
    i, j = np.indices((T, T))
    return np.where(i >= j, c[np.clip(i - j, 0, T - 1)], 0.0)


def _schema(participations: int, separation: int) -> tuple[int, int]:
    k, b = participations, separation
    for name, v in (("participations", k), ("separation", b)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")
    return int(k), int(b)


def _sensitivity_weights(T: int, k: int, b: int, width: int) -> np.ndarray:
    """w (length ``width``) with sens² = Σ_i w_i c_i² for a T×T lower-triangular Toeplitz C = toeplitz(c): the
    worst pattern is the first column and every b-th after it, k_eff = min(k, ⌈T/b⌉) of them, column m·b holding
    c_0..c_{T−m·b−1}. Exact when C's bands ≤ b (disjoint supports, and column norms never grow to the right) or
    k_eff = 1."""
    k_eff = min(k, (T - 1) // b + 1)
    i = np.arange(width)
    return sum((i < T - m * b).astype(np.float64) for m in range(k_eff))


def _inverse_series(c: np.ndarray, T: int) -> np.ndarray:
    """The first T coefficients of 1 / c(x) (C⁻¹'s first column), by forward substitution. Only elementwise numpy
    and 1-D dot products in this loop and in the optimisers' objectives: a threaded BLAS call per evaluation costs
    far more than the work at these sizes, and its spinning threads slow everything on a busy machine."""
    n = len(c)
    d = np.zeros(T)
    d[0] = 1.0 / c[0]
    tail = c[1:]
    for m in range(1, T):
        p = min(m, n - 1)
        d[m] = -np.dot(tail[:p], d[m - 1::-1][:p]) / c[0]
    return d


def _toeplitz_loss(c: np.ndarray, T: int, k: int, b: int) -> tuple[float, np.ndarray]:
    """(L, ∂L/∂c) for L = sens(C)² · ‖A·C⁻¹‖_F², C = toeplitz(c) (len(c) ≤ T coefficients, c_0 ≠ 0), sens² the
    b-separated pattern 0, b, 2b, … (exact when len(c) ≤ b, k_eff = 1, or c ≥ 0 nonincreasing).

    With D(x) = 1 / C(x) (C⁻¹'s coefficients d) and e = cumsum(d) (A·C⁻¹'s coefficients, each on T − j diagonal
    entries): F = Σ_j (T − j) e_j². ∂d_n/∂c_i = −(d∗d)_{n−i}, hence ∂e_j/∂c_i = −Q_{j−i}, Q = cumsum(d∗d)."""
    n = len(c)
    d = _inverse_series(c, T)
    e = np.cumsum(d)
    w = T - np.arange(T, dtype=np.float64)
    F = float(np.dot(w, e * e))
    Q = np.cumsum(np.convolve(d, d)[:T])
    we = (w * e)[::-1]
    dF = -2.0 * np.convolve(we, Q)[:T][::-1][:n]  # dF_i = −2 Σ_{j ≥ i} w_j e_j Q_{j−i}
    if n <= b or min(k, (T - 1) // b + 1) == 1:
        sw = _sensitivity_weights(T, k, b, n)
        S = float(np.dot(sw, c * c))
        dS = 2.0 * sw * c
    else:  # nonnegative nonincreasing c: the pattern 0, b, 2b, … (k_eff columns); v = C·u
        k_eff = min(k, (T - 1) // b + 1)
        cc = np.zeros(T)
        cc[:n] = c
        v = np.zeros(T)
        for m in range(k_eff):
            v[m * b:] += cc[:T - m * b]
        S = float(np.dot(v, v))
        dS_full = np.zeros(T)
        for m in range(k_eff):
            dS_full[:T - m * b] += 2.0 * v[m * b:]
        dS = dS_full[:n]
    return S * F, dS * F + S * dF


def _one_blas_thread():
    """BLAS limited to one thread while optimising, where threadpoolctl is importable (it is not a dependency; without
    it nothing changes). L-BFGS-B's internal BLAS calls are tiny: threaded, they cost more than the work, and on a
    busy 2-core machine (two pytest workers) spinning BLAS threads made blt(50, 8) take seconds instead of 0.3 s.
    The results are the same bits either way (these calls are below OpenBLAS's threading thresholds in size)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn, not with numpy/scipy
        from contextlib import nullcontext

        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _minimise(fun, x0: np.ndarray) -> np.ndarray:
    """L-BFGS-B on log(loss) (scale-free), deterministic; returns the best point seen (never worse than x0)."""
    from scipy.optimize import minimize

    best = {"f": math.inf, "x": np.array(x0, dtype=np.float64)}

    def logged(x):
        f, g = fun(x)
        if not (math.isfinite(f) and f > 0 and np.isfinite(g).all()):
            return math.inf, np.zeros_like(x)
        if f < best["f"]:
            best["f"], best["x"] = f, x.copy()
        return math.log(f), g / f

    logged(np.asarray(x0, dtype=np.float64))
    with _one_blas_thread():
        minimize(logged, x0, jac=True, method="L-BFGS-B",
                 options={"maxiter": 5000, "maxfun": 20000, "ftol": 1e-15, "gtol": 1e-11, "maxcor": 30})
    return best["x"]


def banded_toeplitz(T: int, bands: int, participations: int, separation: int) -> np.ndarray:
    """C (T×T): lower-triangular banded Toeplitz, coefficients c_0 = 1, c_1..c_{bands−1} minimising the total squared
    error of the prefix sums at unit sensitivity, sens(C)² · ‖A·C⁻¹‖_F² (Choquette-Choo et al., "Multi-Epoch Matrix
    Factorization Mechanisms for Private Machine Learning", ICML 2023; "(Amplified) Banded Matrix Factorization",
    NeurIPS 2023), by L-BFGS-B with the analytic gradient, started from the truncated :func:`sqrt_toeplitz`
    coefficients (deterministic: no random restarts).

    sens = :func:`sensitivity` (C, k, b, banded=bands): with bands ≤ b (or one participation) the columns of a
    pattern have disjoint supports and it is the closed form, √k × ‖c‖ while the k_eff = min(k, ⌈T/b⌉) columns
    0, b, … all hold every coefficient, sign-free. bands > b with k > 1 is refused (no closed form; the optimiser
    would need the enumeration), as are bands < 1 and bands > T. bands = 1 is the identity (independent noise)."""
    T = _rounds(T)
    k, b = _schema(participations, separation)
    if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)) or not 1 <= bands <= T:
        raise ValueError(f"bands={bands!r} must be an integer in [1, T={T}]")
    bands = int(bands)
    if bands > b and min(k, (T - 1) // b + 1) > 1:
        raise ValueError(f"bands={bands} exceeds separation={b} with participations={k}: bands must be <= {b}")
    if bands == 1:
        return np.eye(T)

    def fun(x):
        L, g = _toeplitz_loss(np.concatenate([[1.0], x]), T, k, b)
        return L, g[1:]

    c = np.concatenate([[1.0], _minimise(fun, sqrt_toeplitz(bands)[1:, 0])])
    return _toeplitz(c, T)


BLT_MAX_BUFFERS = 8


def _blt_coefficients(omega: np.ndarray, theta: np.ndarray, T: int) -> np.ndarray:
    c = np.ones(T)
    if T > 1:
        c[1:] = (theta[None, :] ** np.arange(T - 1)[:, None] * omega[None, :]).sum(1)
    return c


def blt(T: int, buffers: int, participations: int, separation: int) -> np.ndarray:
    """C (T×T): a buffered-linear-Toeplitz strategy (Dvijotham, McMahan, Pillutla, Steinke, Thakurta, "Efficient and
    Near-Optimal Noise Generation for Streaming Differential Privacy", FOCS 2024): lower-triangular Toeplitz with
    c_0 = 1 and c_j = Σ_i ω_i θ_i^(j−1) (j ≥ 1) for ``buffers`` = d pairs, ω_i > 0, θ_i ∈ (0, 1), Σ_i ω_i < 1, the
    pairs minimising sens(C)² · ‖A·C⁻¹‖_F² (as :func:`banded_toeplitz`) by L-BFGS-B with the analytic gradient,
    in the unconstrained coordinates θ_i = 1 / (1 + e^(−x_i)), ω_i = e^(y_i) / (1 + Σ_l e^(y_l)).

    The coefficients are then positive (CᵀC ≥ 0, so :func:`sensitivity` applies) and nonincreasing (c_1 = Σ ω_i < 1
    = c_0, and each geometric term falls), so the worst pattern is k_eff = min(k, ⌈T/b⌉) participations b apart from
    round 1 (as jax_privacy's ``toeplitz.minsep_sensitivity_squared``, which also asks Σ ω_i ≤ 1); for k = 1 it is
    the first column's norm ‖c‖. The optimiser uses that closed form; :func:`sensitivity` enumerates the same value.

    Start (deterministic, no random restarts): decays θ_i = e^(−1/τ_i), τ_i log-spaced over [1/2, T], the scales
    fitted by nonnegative least squares to the :func:`sqrt_toeplitz` coefficients c_1..c_{T−1}; and the optimum
    with d − 1 buffers plus a slow one; the better optimum is kept.

    Not needed here, but the point of the family: C(x) = 1 + Σ_i ω_i x / (1 − θ_i x) is rational of degree d, so
    C⁻¹(x) = Π_i (1 − θ_i x) / P(x) is too, and (with distinct real poles, as in the paper's Lemma 5.2) C⁻¹ is
    itself a BLT with d buffers: round t's noise row of C⁻¹·Z is streamed from d decaying buffers of past noise,
    O(d) memory instead of the T − 1 past rows a general Toeplitz C⁻¹ needs."""
    T = _rounds(T)
    k, b = _schema(participations, separation)
    if isinstance(buffers, bool) or not isinstance(buffers, (int, np.integer)) or not 1 <= buffers <= BLT_MAX_BUFFERS:
        raise ValueError(f"buffers={buffers!r} must be an integer in [1, {BLT_MAX_BUFFERS}]")
    omega, theta = _blt_parameters(T, int(buffers), k, b)
    return _toeplitz(_blt_coefficients(omega, theta, T), T)


def _blt_parameters(T: int, d: int, k: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(ω, θ) of :func:`blt`'s optimum with d buffers."""
    from scipy.optimize import nnls
    from scipy.special import expit

    j = np.arange(T - 1, dtype=np.float64)

    def unpack(z):
        x, y = z[:d], z[d:]
        theta = expit(x)
        top = max(0.0, float(y.max()))
        ey = np.exp(y - top)
        return ey / (math.exp(-top) + ey.sum()), theta

    def pack(omega, theta):
        theta = np.clip(theta, 1e-9, 1 - 1e-9)
        omega = np.maximum(omega, 1e-9)
        omega = omega * min(1.0, 0.999 / omega.sum())
        return np.concatenate([np.log(theta) - np.log1p(-theta), np.log(omega) - math.log1p(-omega.sum())])

    def fun(z):
        omega, theta = unpack(z)
        L, gc = _toeplitz_loss(_blt_coefficients(omega, theta, T), T, k, b)
        if T == 1:
            return L, np.zeros_like(z)
        powers = theta[None, :] ** j[:, None]  # (T−1)×d: θ_i^(j−1) for c_j, j ≥ 1
        dpow = np.zeros_like(powers)
        dpow[1:] = j[1:, None] * powers[:-1]  # ∂θ^(j−1)/∂θ = (j−1) θ^(j−2)
        g_omega = (gc[1:, None] * powers).sum(0)
        g_theta = omega * (gc[1:, None] * dpow).sum(0)
        return L, np.concatenate([g_theta * theta * (1.0 - theta), omega * (g_omega - np.dot(g_omega, omega))])

    tau = np.geomspace(0.5, T, d) if d > 1 else np.array([max(0.5, T / 4.0)])
    theta0 = np.exp(-1.0 / tau)
    omega0 = nnls(theta0[None, :] ** j[:, None], sqrt_toeplitz(T)[1:, 0])[0] if T > 1 else np.full(d, 0.5 / d)
    starts = [pack(omega0, theta0)]
    if d > 1:  # the optimum with one buffer fewer, plus a slow buffer with a small scale
        omega1, theta1 = _blt_parameters(T, d - 1, k, b)
        slow = max(float(theta1.max()), 1.0 - 1.0 / T) ** 0.5 if T > 1 else 0.5
        slow = min(slow, 1 - 1e-6)
        if slow in theta1:
            slow = (slow + 1.0) / 2
        starts.append(pack(np.append(omega1 * 0.98, 0.02 * (1.0 - omega1.sum())), np.append(theta1, slow)))
    best, best_loss = starts[0], math.inf
    for z0 in starts:
        z = _minimise(fun, z0)
        L = fun(z)[0]
        if L < best_loss:
            best, best_loss = z, L
    return unpack(best)


def sensitivity(C: np.ndarray, participations: int, separation: int, *, banded: int | None = None) -> float:
    """max ‖C·u‖₂ over u ∈ {0, 1}^T with at most ``participations`` ones, any two at least ``separation`` apart.

    ``banded`` = β declares that C has β bands (C[i, j] = 0 unless 0 ≤ i − j < β); with β ≤ separation, the
    columns of a pattern have disjoint supports, and the answer is the closed form √(sum of the k largest squared
    norms among columns b apart), which for the usual case is √k × the largest column norm. With one participation
    (k = 1, or T ≤ b) it is the largest column norm. Neither closed form needs a sign condition. Otherwise the
    patterns are enumerated (at most :data:`MAX_PATTERNS`; more raise a ValueError naming the schema), which needs
    CᵀC ≥ 0 entrywise (then more participations never lower ‖C·u‖, and 0/1 patterns are the worst sign patterns;
    a ValueError otherwise)."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2:
        raise ValueError(f"C has shape {C.shape}; expected a matrix")
    T = C.shape[1]
    k, b = int(participations), int(separation)
    if k < 1 or b < 1:
        raise ValueError(f"participations={participations!r} and separation={separation!r} must be >= 1")
    k = min(k, (T - 1) // b + 1)  # at most this many fit
    norms2 = np.einsum("ij,ij->j", C, C)
    if banded is not None:
        beta = int(banded)
        lower = np.tril(np.ones_like(C, dtype=bool), 0) & ~np.tril(np.ones_like(C, dtype=bool), -beta)
        if (C[~lower] != 0).any():
            raise ValueError(f"C is not banded with {beta} bands")
        if beta <= b:  # disjoint supports: ‖C·u‖² = Σ column norms², maximised by a DP over b-separated picks
            return math.sqrt(_best_separated_sum(norms2, k, b))
    if k == 1:  # one participation, of any sign and size ≤ 1: the largest column norm (no sign condition)
        return math.sqrt(float(norms2.max()))
    gram = C.T @ C  # the enumeration below needs CᵀC ≥ 0 (the closed forms above need no sign condition)
    if (gram < -1e-12 * max(1.0, float(np.abs(gram).max()))).any():
        raise ValueError("CᵀC has negative entries: 0/1 participation patterns need not be the worst case")
    count = _pattern_count(T, k, b)
    if count > MAX_PATTERNS:
        raise ValueError(f"sensitivity: {count:.3g} participation patterns (T={T}, k={k}, b={b}) exceed "
                         f"{MAX_PATTERNS}; give banded= for a banded C with bands <= separation")
    return math.sqrt(_enumerated(gram, k, b))


def _enumerated(gram: np.ndarray, k: int, b: int) -> float:
    """max Σ_{p, q ∈ u} gram[p, q] over the patterns u of 1..k rounds, any two at least b apart: the patterns of m + 1
    rounds grown from those of m (each extended by every round ≥ its last + b), each batch's quadratic forms at once."""
    T = gram.shape[0]
    patterns = np.arange(T)[:, None]
    best = float(np.diag(gram).max())
    for _ in range(1, k):
        room = np.maximum(0, T - (patterns[:, -1] + b))
        if not room.any():
            break
        rows = np.repeat(patterns, room, axis=0)
        starts = np.repeat(patterns[:, -1] + b - np.concatenate([[0], np.cumsum(room)[:-1]]), room)
        patterns = np.concatenate([rows, (starts + np.arange(len(rows)))[:, None]], axis=1)
        for chunk in range(0, len(patterns), 1 << 16):
            p = patterns[chunk:chunk + (1 << 16)]
            best = max(best, float(gram[p[:, :, None], p[:, None, :]].sum((1, 2)).max()))
    return best


def _best_separated_sum(values: np.ndarray, k: int, b: int) -> float:
    """max Σ values[i] over at most k indices, any two at least b apart (values ≥ 0): dynamic programming."""
    T = len(values)
    best = np.zeros((k + 1, T + 1))  # best[m, t]: m picks among indices < t
    for m in range(1, k + 1):
        for t in range(1, T + 1):
            take = values[t - 1] + best[m - 1, max(0, t - b)]
            best[m, t] = max(best[m, t - 1], take)
    return float(best[k, T])


def _pattern_count(T: int, k: int, b: int) -> int:
    """Non-empty patterns of at most k of T rounds, any two at least b apart: Σ_m C(T − (m − 1)(b − 1), m)."""
    return sum(math.comb(T - (m - 1) * (b - 1), m) for m in range(1, k + 1) if T - (m - 1) * (b - 1) >= m)


def prefix_sensitivities(C: np.ndarray, participations: int, separation: int, *,
                         banded: int | None = None) -> np.ndarray:
    """s (length T = C's columns): s[t − 1] is the sensitivity of what has been released after rounds 1..t.

    Row r of C is released at round last(r) + 1, last(r) its last nonzero column (a row needs the rounds up to its
    last one; an all-zero row is released at round 1): for a square lower-triangular C with a nonzero diagonal,
    rounds 1..t release rows 0..t−1; for the tree, the nodes whose interval has ended by round t. s[t − 1] is then
    :func:`sensitivity` of the released rows restricted to columns < t (their support), under the same schema, the
    released rows kept in place and the others zeroed so that ``banded`` still describes the matrix. Every row is
    released by round T, so s[−1] = sensitivity(C, …); releases only grow, so s is nondecreasing.

    A square lower-triangular Toeplitz C with nonnegative nonincreasing coefficients (:func:`sqrt_toeplitz`,
    :func:`blt`) takes a closed form instead of T enumerations: its worst pattern is rounds 1, 1 + b, … (as many as
    fit, at most k). For p < q, (CᵀC)[p, q] = Σ_{l ≤ T−1−q} c_l·c_{l+q−p} falls as q or q − p grows, and the
    diagonal as p grows; the i-th round of any pattern is ≥ i·b and the gap between its i-th and j-th ≥ (j − i)·b,
    so each term of Σ_{p,q} (CᵀC)[p, q] is at most the pattern's (as jax_privacy's minsep_sensitivity_squared).
    Enumerating for T = 100, k = 3, b = 10 took 13 s."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[1] < 1:
        raise ValueError(f"C has shape {C.shape}; expected a matrix with at least one column")
    k, b = _schema(participations, separation)
    T = C.shape[1]
    c = C[:, 0]
    if C.shape[0] == T and (c >= 0).all() and (np.diff(c) <= 0).all() and np.array_equal(C, _toeplitz(c, T)):
        out = np.zeros(T)
        for t in range(1, T + 1):  # C restricted to rounds 1..t is the t×t Toeplitz of c_0..c_{t−1}
            v = np.zeros(t)
            for m in range(min(k, (t - 1) // b + 1)):
                v[m * b:] += c[:t - m * b]
            out[t - 1] = math.sqrt(float(np.dot(v, v)))
        return out
    nonzero = C != 0
    last = np.where(nonzero.any(1), T - 1 - np.argmax(nonzero[:, ::-1], axis=1), -1)
    release = np.maximum(last + 1, 1)  # the round (1-based) after which row r is known
    out = np.zeros(T)
    for t in range(1, T + 1):
        rows = release <= t
        if not rows.any():
            continue
        if banded is None:
            sub = C[rows, :t]
        else:  # keep positions (the band is about row − column), drop the rows below the last released one
            top = int(np.flatnonzero(rows).max()) + 1
            sub = np.where(rows[:top, None], C[:top, :t], 0.0)
        out[t - 1] = sensitivity(sub, k, b, banded=banded)
    return out


def round_noise_matrix(B: np.ndarray) -> np.ndarray:
    """M = A⁻¹·B (T × R): row t = B[t] − B[t − 1], row 0 = B[0]. The release B·(C·G + Z) gives round t's sum the
    noise Σ_r M[t, r]·Z_r (the prefix sums of the rounds' noises are B·Z). For a square C with B = A·C⁻¹ it is
    C⁻¹."""
    B = np.asarray(B, dtype=np.float64)
    if B.ndim != 2:
        raise ValueError(f"B has shape {B.shape}; expected a matrix")
    return np.diff(B, axis=0, prepend=np.zeros((1, B.shape[1])))


#: the names :func:`strategy` knows
STRATEGIES = ("independent", "tree", "sqrt_toeplitz", "banded", "blt")

#: :func:`strategy`'s buffers for ``blt`` when none are given (Dvijotham et al. find a handful enough; 3 to 7 is
#: jax_privacy's advice)
BLT_DEFAULT_BUFFERS = 3


def strategy(name: str, T: int, participations: int, separation: int, bands: int | None = None,
             buffers: int | None = None) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(B, C, banded) with B·C = A for T rounds under at most k participations b apart, ``banded`` the value to
    give :func:`sensitivity` / :func:`prefix_sensitivities` (None: C is dense, the patterns are enumerated).

    * ``independent`` — C = I, B = A, banded = 1: i.i.d. noise per round.
    * ``tree`` — :func:`tree_factorization` (C has a row per tree node), banded = None.
    * ``sqrt_toeplitz`` — C = B = A^(1/2) (:func:`sqrt_toeplitz`), banded = None.
    * ``banded`` — :func:`banded_toeplitz` with ``bands`` (required), B = A·C⁻¹, banded = bands.
    * ``blt`` — :func:`blt` with ``buffers`` (None: :data:`BLT_DEFAULT_BUFFERS`), B = A·C⁻¹, banded = None.

    The schema-free ones (independent, tree, sqrt_toeplitz) still check k and b. An unknown name, or bands/buffers
    given to a strategy that takes none, raise a ValueError."""
    from scipy.linalg import solve_triangular

    T = _rounds(T)
    k, b = _schema(participations, separation)
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
    if bands is not None and name != "banded":
        raise ValueError(f"bands={bands!r} is only for the banded strategy, not {name!r}")
    if buffers is not None and name != "blt":
        raise ValueError(f"buffers={buffers!r} is only for the blt strategy, not {name!r}")
    A = prefix_sum_matrix(T)
    if name == "independent":
        return A, np.eye(T), 1
    if name == "tree":
        B, C = tree_factorization(T)
        return B, C, None
    if name == "sqrt_toeplitz":
        C = sqrt_toeplitz(T)
        return C.copy(), C, None
    if name == "banded":
        if bands is None:
            raise ValueError("the banded strategy needs bands (an integer in [1, T], <= separation when k > 1)")
        C = banded_toeplitz(T, bands, k, b)
        banded = int(bands)
    else:
        C = blt(T, BLT_DEFAULT_BUFFERS if buffers is None else buffers, k, b)
        banded = None
    B = solve_triangular(C, A.T, trans="T", lower=True).T  # B = A·C⁻¹: Cᵀ·Bᵀ = Aᵀ
    return B, C, banded
