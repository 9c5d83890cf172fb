"""Label leakage of FbFTL's shuffled (features, label) upload: the entropy analysis of paper 003.

Setting (paper 003, last section, "how random shuffling preserves the clients' privacy"): N classes; each of
U clients uploads one batch of K labels, drawn i.i.d. from the label distribution y (default the uniform
y0 = [1/N, ..., 1/N]). The order inside a batch carries no information, so a batch is its *type*
b = (n_1, ..., n_N), the count of each label, with sum_a n_a = K. The upload is shuffled: the adversary sees
the multiset of the U batch types, S = s with s(b) = number of clients whose batch has type b, but not which
client sent which batch.

Equation numbers. The shared text of the paper has its displayed equations stripped. The numbers below count
the places where a display stands in that text; the in-text references "(4)" (FTL-c uplink payload) and "(5)"
(the payload inequality) agree with that count. They assume the four downlink payloads form one display (10);
if they are numbered separately, add 3 to every number here. The quantities are:

- (11) number of batch types            |B| = C(N + K - 1, K)
- (12) presumed batch law under y0       p^a_{0,b} = K! / (N^K prod_a n_{a,b}!)
- (13) uncertainty without prior         H^a(B | Y = y0) = -sum_b p^a_{0,b} log p^a_{0,b}
- (14) presumed batch law under y        p^a_{y,b} = K! / prod_a n_{a,b}! * prod_a y_a^{n_{a,b}}
- (15) uncertainty before the query      H^a(B | Y = y) = -sum_b p^a_{y,b} log p^a_{y,b}
- (16) presumed law after the query      P^a_{B|s}(b) = s(b) / U
- (17) uncertainty after the query       H^a(B | S = s) = -sum_b (s(b)/U) log (s(b)/U)
- (18) prior and query together          H^a(B | Y = y, S = s) = H^a(B | S = s)
       (the paper: with both, the presumed distribution "depends only on the frequency of each batch type")
- (19) privacy leakage                   L(y, s) = H^a(B | Y = y) - H^a(B | Y = y, S = s)
                                                 = H^a(B | Y = y) - H^a(B | S = s)

Choices where the text is open (kept the same everywhere in this module):

- "Uncertainty" is the Shannon entropy of the adversary's presumed distribution (the text calls (13) "the
  entropy"), not the surprisal -log P(b) of one client's actual batch.
- The "original setting before query" uses the prior with the true y, (15); (13) is the special case y = y0.
- The leakage of one observation s is (19) and may be negative (e.g. N = 2, K = 2, U = 3, s = one batch of
  each type: H^a(B|S=s) = log2 3 > 1.5 = H^a(B|Y=y0)). Its expectation over s ~ Multinomial(U, P^a_{B|y}) is
  >= 0 (concavity of entropy) and non-increasing in U, tending to 0 as U -> infinity, the paper's limit.
- All entropies are in bits (log base 2).
- The expectation over s is not in the paper; it is what "leakage at U clients" means for a table.

Exact expectation. The plug-in entropy (17) is a sum over types of h(s(b)/U), h(x) = -x log2 x, and each
s(b) is marginally Binomial(U, p_b); so E[H^a(B|S)] = sum_b sum_{k=0}^U Bin(k; U, p_b) h(k/U), exactly, in
|B|(U + 1) terms (fewer: types with equal p_b share one sum). ``method="enumerate"`` instead sums over all
C(U + |B| - 1, |B| - 1) outcomes s of the multinomial; it is the independent reference for small cases.
Monte Carlo draws s ~ Multinomial(U, P^a_{B|y}) from the caller's generator and returns mean and standard
error.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, xlog1py, xlogy

MAX_BATCH_TYPES = 2_000_000  # batch_types() materialises a |B| x N table; refuse beyond this
METHODS = ("auto", "exact", "enumerate", "monte_carlo")
_LOG2 = math.log(2.0)
_CHUNK_ELEMENTS = 4_000_000  # work arrays are cut to about this many float64 elements (~32 MB)


@dataclass(frozen=True)
class LeakageEstimate:
    """Expected leakage E_s[L(y, s)] in bits, eq. (19) averaged over s ~ Multinomial(U, P^a_{B|y}).

    ``method`` is ``"exact"`` (binomial marginals), ``"enumerate"`` (all outcomes) or ``"monte_carlo"``;
    ``stderr`` is 0.0 for the exact methods; ``log10_outcomes`` = log10 C(U + |B| - 1, |B| - 1), the number
    of possible observations s (a log: the count itself can have thousands of digits); ``num_samples`` is the
    Monte Carlo sample count (0 when exact).
    """

    mean: float
    stderr: float
    method: str
    log10_outcomes: float
    num_samples: int = 0

    @property
    def exact(self) -> bool:
        return self.method != "monte_carlo"


# --------------------------------------------------------------------------------------------- validation
def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _check_label_distribution(label_distribution: object, num_classes: int) -> np.ndarray:
    if label_distribution is None:
        return np.full(num_classes, 1.0 / num_classes)
    y = np.asarray(label_distribution, dtype=float)
    if y.shape != (num_classes,):
        raise ValueError(
            f"label_distribution must have shape ({num_classes},) (one probability per class), got {y.shape}"
        )
    if not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError(f"label_distribution must be finite and >= 0, got {y.tolist()}")
    if abs(y.sum() - 1.0) > 1e-9:
        raise ValueError(f"label_distribution must sum to 1 (within 1e-9), got sum {y.sum()!r}")
    return y


def _check_type_counts(type_counts: object) -> np.ndarray:
    s = np.asarray(type_counts)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"type_counts must be a non-empty 1-D array (one count per batch type), got shape {s.shape}")
    if not np.issubdtype(s.dtype, np.number) or np.issubdtype(s.dtype, np.complexfloating):
        raise ValueError(f"type_counts must be numeric counts, got dtype {s.dtype}")
    if not np.all(np.isfinite(s)) or np.any(s < 0) or np.any(s != np.round(s)):
        raise ValueError(f"type_counts must be non-negative integers, got {s.tolist()[:20]}")
    s = s.astype(np.int64)
    if s.sum() < 1:
        raise ValueError("type_counts must sum to U >= 1 (at least one client's batch), got sum 0")
    return s


# ------------------------------------------------------------------------------------------ batch types
def num_batch_types(num_classes: int, batch_size: int) -> int:
    """|B| = C(N + K - 1, K): unordered batches of K labels from N classes, eq. (11)."""
    n = _check_int("num_classes", num_classes, 1)
    k = _check_int("batch_size", batch_size, 1)
    return math.comb(n + k - 1, k)


def batch_types(num_classes: int, batch_size: int) -> np.ndarray:
    """All batch types b = (n_1, ..., n_N), sum n_a = K, as an int64 array of shape (|B|, N), eq. (11).

    Order: the multisets of labels in lexicographic order (first row (K, 0, ..., 0), last (0, ..., 0, K)).
    Every array indexed by batch type in this module uses this order.
    """
    m = num_batch_types(num_classes, batch_size)
    if m > MAX_BATCH_TYPES:
        raise ValueError(
            f"|B| = C(N+K-1, K) = {m} batch types for num_classes={num_classes}, batch_size={batch_size}; "
            f"at most {MAX_BATCH_TYPES} are supported"
        )
    # bars late = many of label 0 first: lexicographic order of the multisets
    return _compositions(int(batch_size), int(num_classes))[::-1].copy()


def batch_distribution(
    num_classes: int, batch_size: int, label_distribution: np.ndarray | None = None
) -> np.ndarray:
    """P^a_{B|y}: multinomial probability of each batch type, eqs. (12) (y = y0) and (14).

    p_b = K! / prod_a n_{a,b}! * prod_a y_a^{n_{a,b}}, in the order of :func:`batch_types`; default y = y0.
    """
    types = batch_types(num_classes, batch_size)
    y = _check_label_distribution(label_distribution, int(num_classes))
    log_p = gammaln(batch_size + 1) - gammaln(types + 1).sum(axis=1) + xlogy(types, y).sum(axis=1)
    return np.exp(log_p)


def type_counts_from_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The observation s of eq. (16): how many clients uploaded each batch type.

    ``labels`` has shape (U, K), one row of integer labels in [0, num_classes) per client (row order and
    order within a row are irrelevant, as after shuffling). Returns an int64 array of length |B| in the
    order of :func:`batch_types`.
    """
    n = _check_int("num_classes", num_classes, 1)
    lab = np.asarray(labels)
    if lab.ndim != 2 or lab.shape[0] < 1 or lab.shape[1] < 1:
        raise ValueError(f"labels must have shape (U, K) with U, K >= 1 (one batch per row), got {lab.shape}")
    if not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers in [0, {n}), got dtype {lab.dtype}")
    if lab.min() < 0 or lab.max() >= n:
        raise ValueError(f"labels must lie in [0, {n}), got min {lab.min()} and max {lab.max()}")
    u, k = lab.shape
    per_client = np.zeros((u, n), dtype=np.int64)
    np.add.at(per_client, (np.repeat(np.arange(u), k), lab.ravel()), 1)
    index = {tuple(row): i for i, row in enumerate(batch_types(n, k).tolist())}
    s = np.zeros(len(index), dtype=np.int64)
    for row in per_client.tolist():
        s[index[tuple(row)]] += 1
    return s


# ------------------------------------------------------------------------------------------- entropies
def entropy_bits(probabilities: np.ndarray) -> float:
    """Shannon entropy -sum p log2 p in bits of a probability vector (0 log 0 = 0)."""
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"probabilities must be a non-empty 1-D array, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-9:
        raise ValueError(f"probabilities must be finite, >= 0 and sum to 1 (within 1e-9), got sum {p.sum()!r}")
    return float(-xlogy(p, p).sum() / _LOG2)


def prior_entropy(num_classes: int, batch_size: int, label_distribution: np.ndarray | None = None) -> float:
    """H^a(B | Y = y) in bits, the uncertainty before the query, eq. (15); eq. (13) for y = y0 (default)."""
    return entropy_bits(batch_distribution(num_classes, batch_size, label_distribution))


def shuffled_entropy(type_counts: np.ndarray) -> float:
    """H^a(B | S = s) = H^a(B | Y = y, S = s) in bits: entropy of the frequencies s(b)/U, eqs. (16)-(18)."""
    s = _check_type_counts(type_counts)
    return entropy_bits(s / s.sum())


def leakage(
    type_counts: np.ndarray,
    num_classes: int,
    batch_size: int,
    label_distribution: np.ndarray | None = None,
) -> float:
    """Privacy leakage of one observation s in bits, eq. (19).

    L(y, s) = H^a(B | Y = y) - H^a(B | Y = y, S = s) = H^a(B | Y = y) - H^a(B | S = s), with ``type_counts``
    = s in the order of :func:`batch_types` (length |B|, summing to U). Can be negative for one s; see the
    module docstring.
    """
    m = num_batch_types(num_classes, batch_size)
    s = _check_type_counts(type_counts)
    if s.size != m:
        raise ValueError(
            f"type_counts must have one entry per batch type, |B| = {m} for num_classes={num_classes}, "
            f"batch_size={batch_size}; got length {s.size}"
        )
    return prior_entropy(num_classes, batch_size, label_distribution) - shuffled_entropy(s)


# ---------------------------------------------------------------------------------- expected leakage
def num_outcomes(num_clients: int, num_types: int) -> int:
    """Number of possible observations s: C(U + |B| - 1, |B| - 1) ways to spread U batches over |B| types."""
    u = _check_int("num_clients", num_clients, 1)
    m = _check_int("num_types", num_types, 1)
    return math.comb(u + m - 1, m - 1)


def _log10_outcomes(u: int, m: int) -> float:
    return float((gammaln(u + m) - gammaln(u + 1) - gammaln(m)) / math.log(10.0))


def asymptotic_leakage(
    num_classes: int, batch_size: int, num_clients: int, label_distribution: np.ndarray | None = None
) -> float:
    """Large-U approximation (m - 1) / (2 U ln 2) bits of the expected leakage, m = #{b : p_b > 0}.

    This is the Miller-Madow bias of the plug-in entropy (17); it holds for U much larger than m (not in the
    paper; a reference for the U -> infinity limit the paper states).
    """
    u = _check_int("num_clients", num_clients, 1)
    m = int(np.count_nonzero(batch_distribution(num_classes, batch_size, label_distribution)))
    return (m - 1) / (2.0 * u * _LOG2)


def _h_bits(k: np.ndarray, u: int) -> np.ndarray:
    x = k / u
    return -xlogy(x, x) / _LOG2


def _expected_plugin_entropy_exact(p: np.ndarray, u: int) -> float:
    """E[H^a(B|S)] = sum_b sum_k Bin(k; U, p_b) h(k/U), grouping types with equal p_b."""
    values, multiplicity = np.unique(p[p > 0], return_counts=True)
    k = np.arange(u + 1, dtype=float)
    h = _h_bits(k, u)
    log_binom = gammaln(u + 1) - gammaln(k + 1) - gammaln(u - k + 1)
    rows = max(1, _CHUNK_ELEMENTS // (u + 1))
    total = 0.0
    for start in range(0, values.size, rows):
        q = values[start : start + rows, None]
        pmf = np.exp(log_binom + xlogy(k, q) + xlog1py(u - k, -q))
        total += float(multiplicity[start : start + rows] @ (pmf @ h))
    return total


def _compositions(total: int, parts: int) -> np.ndarray:
    """All count vectors of length ``parts`` summing to ``total`` (stars and bars), shape (C, parts)."""
    if parts == 1:
        return np.full((1, 1), total, dtype=np.int64)
    c = math.comb(total + parts - 1, parts - 1)
    bars = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(total + parts - 1), parts - 1)),
        dtype=np.int64,
        count=c * (parts - 1),
    ).reshape(c, parts - 1)
    edges = np.concatenate(
        [np.full((c, 1), -1, np.int64), bars, np.full((c, 1), total + parts - 1, np.int64)], axis=1
    )
    return np.diff(edges, axis=1) - 1


def _expected_plugin_entropy_enumerated(p: np.ndarray, u: int) -> float:
    """E[H^a(B|S)] = sum over every outcome s of Mult(s; U, p) H(s/U)."""
    outcomes = _compositions(u, p.size)
    log_pmf = gammaln(u + 1) - gammaln(outcomes + 1).sum(axis=1) + xlogy(outcomes, p).sum(axis=1)
    return float(np.exp(log_pmf) @ _h_bits(outcomes, u).sum(axis=1))


def _plugin_entropy_samples(p: np.ndarray, u: int, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    support = p[p > 0]
    support = support / support.sum()
    rows = max(1, _CHUNK_ELEMENTS // support.size)
    out = np.empty(num_samples)
    for start in range(0, num_samples, rows):
        n = min(rows, num_samples - start)
        s = rng.multinomial(u, support, size=n)
        out[start : start + n] = _h_bits(s, u).sum(axis=1)
    return out


def expected_leakage(
    num_classes: int,
    batch_size: int,
    num_clients: int,
    label_distribution: np.ndarray | None = None,
    *,
    method: str = "auto",
    rng: np.random.Generator | None = None,
    num_samples: int = 2000,
    max_exact_terms: int = 20_000_000,
    max_outcomes: int = 1_000_000,
) -> LeakageEstimate:
    """E_s[L(y, s)] in bits, eq. (19) averaged over s ~ Multinomial(U, P^a_{B|y}) (U = ``num_clients``).

    ``method``:
      - ``"exact"``: binomial marginals, n_p (U + 1) terms where n_p = number of distinct p_b (see module doc);
      - ``"enumerate"``: sums over all ``num_outcomes(U, |B|)`` observations s; refuses more than
        ``max_outcomes`` of them;
      - ``"monte_carlo"``: ``num_samples`` draws of s from ``rng``; returns mean and standard error;
      - ``"auto"`` (default): ``"exact"`` when n_p (U + 1) <= ``max_exact_terms``, else ``"monte_carlo"``.
        It never picks ``"enumerate"``: that gives the same number as ``"exact"`` at a far higher cost, and is
        kept as the reference the tests check ``"exact"`` against.
    Monte Carlo needs ``rng`` (a ``np.random.Generator``); the exact methods ignore it.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    u = _check_int("num_clients", num_clients, 1)
    n_samples = _check_int("num_samples", num_samples, 2)
    max_terms = _check_int("max_exact_terms", max_exact_terms, 0)
    max_out = _check_int("max_outcomes", max_outcomes, 1)
    p = batch_distribution(num_classes, batch_size, label_distribution)
    log10_outcomes = _log10_outcomes(u, p.size)
    h_prior = entropy_bits(p)

    if method == "auto":
        distinct = np.unique(p[p > 0]).size
        method = "exact" if distinct * (u + 1) <= max_terms else "monte_carlo"

    if method == "exact":
        return LeakageEstimate(h_prior - _expected_plugin_entropy_exact(p, u), 0.0, "exact", log10_outcomes)
    if method == "enumerate":
        if log10_outcomes > math.log10(max_out) + 1e-9 or num_outcomes(u, p.size) > max_out:
            raise ValueError(
                f"method='enumerate' needs C(U+|B|-1, |B|-1) = 10^{log10_outcomes:.1f} outcomes for U={u}, "
                f"|B|={p.size}; max_outcomes allows at most {max_out}"
            )
        mean = h_prior - _expected_plugin_entropy_enumerated(p, u)
        return LeakageEstimate(mean, 0.0, "enumerate", log10_outcomes)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"Monte Carlo needs rng, a np.random.Generator; got {type(rng).__name__}")
    samples = h_prior - _plugin_entropy_samples(p, u, n_samples, rng)
    stderr = float(samples.std(ddof=1) / math.sqrt(n_samples))
    return LeakageEstimate(float(samples.mean()), stderr, "monte_carlo", log10_outcomes, n_samples)
