"""Secure aggregation's cost and field arithmetic (a model: no cryptography is run here).

Protocols: ``secagg`` = Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017 (complete graph); ``secagg_plus`` = Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure
Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020 (k-regular Harary graph). Both run the
semi-honest rounds AdvertiseKeys, ShareKeys, MaskedInputCollection, Unmasking (ConsistencyCheck, the
active-adversary round, is not modelled) — as Flower's SecAgg(+)Workflow (setup, share_keys,
collect_masked_input, unmask) and Google's FCP server (r0..r3) do: 3 exchanges beside the masked upload.

Per client, with d neighbours (d = n−1, or k), K = 33, S = 36, G = 12 + 16 bytes (constants below):

* uplink   = 2K (two public keys) + d·(2S + G) (one AES-GCM ciphertext of 2 shares per neighbour)
             + (d+1)·S (Unmasking: one share per neighbourhood member, itself included)
* downlink = d·2K (neighbours' keys) + d·(2S + G) (the ciphertexts addressed to it)
* server   = n·(2K + 2d(2S+G) + 2dK) + s·(d+1)·S,  s = n − ⌊δn⌋ survivors (the ⌊δn⌋ dropouts drop after
             ShareKeys: they paid the key exchange, send neither masked vector nor Unmasking shares)
* masked vector = ⌈m·bits/8⌉ bytes (not in the three above).  Ids and message framing are not counted.

With K = S = 32 bytes and G = 0 the per-client total is 2n·a_K + (5n−4)·a_S, which with a 26-bit field
(2^10 sums of 16-bit inputs) reproduces Bonawitz et al.'s abstract: 1.73× expansion for 2^10 users, 2^20-dim.

Threshold rules (Google FCP, fcp/secagg/server/secagg_server.cc, by the protocols' authors): the round
proceeds only if at least ⌈n(1−δ)⌉ = n − ⌊δn⌋ clients survive (δ = ``dropout``, the tolerated rate).
SecAgg's Shamir threshold is exactly that.  SecAgg+'s degree k and threshold t come from FCP's
HararyGraphParameterFinder (graph_parameter_finder.cc, ported in :func:`harary_parameters`): the smallest
even k whose graph stays connected after γn corrupt + δn dropped clients with prob. ≥ 1 − 2^-41, and
t = t1 + 1 with Pr[> t1 corrupt neighbours] < 2^-41/n and Pr[< t surviving neighbours] < 2^-20/n
(hypergeometric, γ = ``corrupt``); FCP falls back to the complete graph when no k < n−1 qualifies (small n).
k grows like log n (e.g. γ = .05, δ = .33: k = 28, 72, 86, 96, 102 for n = 10², …, 10⁶).  Each client
shares with k neighbours plus itself (FCP adds the self-edge; Flower's num_shares counts it too).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

KEY_BYTES = 33        # ECDH NIST P-256 public key, compressed (FCP fcp/secagg/shared/ecdh_keys.h, kSize)
SHARE_BYTES = 36      # Shamir share of a 32-byte secret: 9 31-bit subsecrets × 4 bytes (FCP shamir_secret_sharing.cc)
AEAD_BYTES = 12 + 16  # AES-256-GCM 12-byte IV + 16-byte tag (FCP fcp/secagg/shared/aes_gcm_encryption.cc)
ROUND_TRIPS = 3       # AdvertiseKeys, ShareKeys, Unmasking (MaskedInputCollection is the upload itself)
_SMALL = 1e-14        # FCP's kSmall: keeps ⌊rate·n⌋ from losing one to float round-off


@dataclass(frozen=True)
class SecAggCost:
    protocol: str
    clients: int                # cohort size n
    client_uplink_bytes: int    # per surviving client, protocol bytes only (not the masked vector)
    client_downlink_bytes: int  # per client
    server_bytes: int           # all protocol bytes through the server, both directions, s survivors
    masked_vector_bytes: int    # one client's masked input, ⌈m·bits/8⌉
    round_trips: int            # exchanges besides the masked upload
    neighbours: int             # n−1 (secagg) or k (secagg_plus)
    threshold: int              # Shamir threshold t (of n share-holders, or of the k+1 in a neighbourhood)
    min_survivors: int          # n − ⌊δn⌋: fewer survivors abort the round

    @property
    def unmasking_bytes(self) -> int:
        """The Unmasking part of :attr:`client_uplink_bytes`, (d+1)·S: sent only by a client that reaches Unmasking
        (the rest, 2K + d·(2S+G), by every client of the cohort)."""
        return (self.neighbours + 1) * SHARE_BYTES


def _hypergeom_pmf(total: int, marked: int, sampled: int) -> torch.Tensor:
    """P[X = x], x = 0..sampled, X = marked items among ``sampled`` drawn without replacement from ``total``."""
    x = torch.arange(sampled + 1, dtype=torch.float64)
    ok = (x <= marked) & (sampled - x <= total - marked)
    lg = lambda v: torch.lgamma(torch.as_tensor(v, dtype=torch.float64).clamp(min=0) + 1)  # noqa: E731
    logp = (lg(marked) + lg(total - marked) + lg(sampled) + lg(total - sampled) - lg(total)
            - lg(x) - lg(sampled - x) - lg(marked - x) - lg(total - marked - sampled + x))
    return torch.where(ok, logp.exp(), torch.zeros_like(logp))


@functools.lru_cache(maxsize=256)
def harary_parameters(clients: int, corrupt: float, dropout: float) -> tuple[int, int] | None:
    """SecAgg+ (k, t) for the semi-honest server, as FCP's HararyGraphParameterFinder; None: use the full graph."""
    n, bad_c, bad_d = clients, math.floor((corrupt + _SMALL) * clients), math.floor((dropout + _SMALL) * clients)
    alive = math.ceil((1 - dropout - _SMALL) * n)
    log_eps = -41 * math.log(2)  # 40-bit security split over two bad events
    for k in range(2, n - 1, 2):
        bad = bad_c + bad_d  # disconnection needs k/2 consecutive bad nodes at two gaps (union bound)
        if k <= bad and (math.log(n) + math.log(n - k - 1) - math.log(2) + math.lgamma(bad + 1)
                         + math.lgamma(n - k + 1) - math.lgamma(n + 1) - math.lgamma(bad - k + 1)) >= log_eps:
            continue
        adv = _hypergeom_pmf(n, bad_c, k)
        tail = adv.flip(0).cumsum(0).flip(0)  # tail[x] = P[X ≥ x]
        above = torch.cat([tail[1:], tail.new_zeros(1)])  # P[X > t]
        t1 = int(torch.nonzero(above < 2.0 ** -41 / n)[0])
        cdf = _hypergeom_pmf(n, alive, k).cumsum(0)
        t2 = int(torch.nonzero(cdf >= 2.0 ** -20 / n)[0])
        if t2 > t1:
            return k, max(t1 + 1, 2)
    return None


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def secagg_cost(protocol: str, clients: int, dim: int, bits: int, dropout: float = 0.0,
                corrupt: float = 0.05) -> SecAggCost:
    """Closed-form protocol cost of one round (formulas in the module docstring).

    ``dropout`` δ: the dropout rate the round must tolerate; ``corrupt`` γ: the fraction of clients that
    may collude with the server (default 5%, Bell et al.'s abstract); semi-honest: γ + δ ≤ 0.9 (FCP).
    """
    _need(protocol in ("secagg", "secagg_plus"), f"protocol={protocol!r}: allowed 'secagg' or 'secagg_plus'")
    for name, v, lo in (("clients", clients, 2), ("dim", dim, 1), ("bits", bits, 1)):
        _need(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name}={v!r}: must be an int ≥ {lo}")
    _need(bits <= 64, f"bits={bits}: must be ≤ 64")
    for name, v in (("dropout", dropout), ("corrupt", corrupt)):
        _need(isinstance(v, (int, float)) and 0 <= v < 1, f"{name}={v!r}: must be in [0, 1)")
    _need(dropout + corrupt <= 0.9, f"dropout + corrupt = {dropout + corrupt:g}: must be ≤ 0.9 (semi-honest)")
    n = clients
    min_survivors = n - math.floor((dropout + _SMALL) * n)
    params = harary_parameters(n, float(corrupt), float(dropout)) if protocol == "secagg_plus" else None
    if params is None:  # complete graph: Shamir threshold = minimum survivors (FCP CheckFullGraphParameters)
        d, t = n - 1, min_survivors
        _need(t >= 2, f"dropout={dropout}: leaves threshold {t} for clients={n}; Shamir needs ≥ 2")
        floor_t = math.ceil(corrupt * n)
        _need(t > floor_t, f"corrupt={corrupt}: threshold {t} must exceed ⌈γn⌉ = {floor_t}")
    else:
        d, t = params
    cipher = 2 * SHARE_BYTES + AEAD_BYTES
    up = 2 * KEY_BYTES + d * cipher + (d + 1) * SHARE_BYTES
    down = d * 2 * KEY_BYTES + d * cipher
    server = n * (2 * KEY_BYTES + 2 * d * cipher + 2 * d * KEY_BYTES) + min_survivors * (d + 1) * SHARE_BYTES
    return SecAggCost(protocol, n, up, down, server, math.ceil(dim * bits / 8), ROUND_TRIPS, d, t, min_survivors)


def round_fails(cost: SecAggCost, survivors: int) -> bool:
    """True when fewer than ``cost.min_survivors`` clients reach Unmasking: the server aborts (FCP).

    For SecAgg+ this is the global count only: a neighbourhood falling below t despite it has probability
    < 2^-20 per round for random dropouts (how t was chosen), which this model treats as never.
    """
    _need(isinstance(survivors, int) and 0 <= survivors <= cost.clients,
          f"survivors={survivors!r}: must be an int in [0, {cost.clients}]")
    return survivors < cost.min_survivors


class FieldQuantizer:
    """Linear codec into Z_{2^bits}: q = round(clip(x)·scale) mod 2^bits; sums decode by the centred lift.

    scale = L/clip with L = ⌊(2^(bits−1) − 1)/max_clients⌋, so |q| ≤ L and the sum of max_clients encodings
    lies in [−(2^(bits−1) − 1), 2^(bits−1) − 1]: max_clients·clip·scale < 2^(bits−1), so no wrap survives
    the centred lift.
    Error: |decoded sum − Σ clip(x)| ≤ count·0.5/scale per coordinate (:meth:`bound`), before float32 output.
    """

    def __init__(self, bits: int, clip: float, max_clients: int):
        _need(isinstance(bits, int) and 8 <= bits <= 62, f"bits={bits!r}: must be an int in [8, 62]")
        _need(isinstance(max_clients, int) and max_clients >= 1, f"max_clients={max_clients!r}: must be an int ≥ 1")
        _need(isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0, f"clip={clip!r}: must be > 0")
        need = max_clients.bit_length() + 1
        _need(bits >= need, f"bits={bits}: too few for max_clients={max_clients}: need at least {need}")
        self.bits, self.clip, self.max_clients = bits, float(clip), max_clients
        self.modulus = 1 << bits
        self.level = ((1 << (bits - 1)) - 1) // max_clients  # L
        scale = self.level / self.clip
        while self.clip * scale > self.level:  # float64 round-off must not push clip·scale past L
            scale = math.nextafter(scale, 0.0)
        self.scale = scale
        self.clipped = 0  # coordinates clipped by the latest encode()

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """Float rows [k, m] → int64 in [0, 2^bits); sets :attr:`clipped`."""
        x = rows.detach().to(torch.float64)
        _need(not bool(torch.isnan(x).any()), "rows contain NaN: cannot be encoded")
        self.clipped = int((x.abs() > self.clip).sum())
        q = torch.round(x.clamp(-self.clip, self.clip) * self.scale).to(torch.int64)
        return torch.remainder(q, self.modulus)

    def add(self, acc: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """(acc + encoded) mod 2^bits; both in [0, 2^bits) with bits ≤ 62, so the int64 sum cannot overflow."""
        return torch.remainder(acc + encoded, self.modulus)

    def decode(self, field_sum: torch.Tensor) -> torch.Tensor:
        """Centred lift to (−2^(bits−1), 2^(bits−1)], ÷ scale → float32."""
        v = torch.remainder(field_sum.to(torch.int64), self.modulus)
        v = torch.where(v > self.modulus // 2, v - self.modulus, v)
        return (v.to(torch.float64) / self.scale).to(torch.float32)

    def bound(self, count: int) -> float:
        """Max |decoded sum − Σ clipped values| per coordinate, ``count`` ≤ max_clients summands: count·0.5/scale.

        Each summand is off by at most half a step (round to nearest); the float32 cast of the result adds
        half an ulp at the sum's magnitude on top."""
        _need(isinstance(count, int) and 0 <= count <= self.max_clients,
              f"count={count!r}: must be an int in [0, max_clients={self.max_clients}]")
        return count * 0.5 / self.scale
