"""Paper 001 (Fu et al., arXiv 2101.04163), Alg. 1: FedAvg with local DP and the (N/b)·(n_l/n) aggregation.

Each engaged client (round robin, b per global iteration) runs E = ``local_steps`` full-batch gradient
iterations (``local_mode=gd``) with each gradient clipped to ζ (``local_clip``), then — with
``dp=local_laplace|local_gaussian`` — adds noise to what it uploads (:mod:`fedrun.privacy.local_dp`). The server
aggregates with the paper's weights a_l = (N/b)·(n_l/n) (n = Σ over all N clients), an unbiased estimate of
the full-participation average:

    θ_{t+1} = θ_t + η_g · Σ_{l∈P_t} (N/b)(n_l/n) · (θ_l − θ_t + w_l)

Aggregation is done on updates (θ_l − θ_t), which the paper's model aggregation Σ a_l θ_l equals whenever
Σ_{l∈P_t} a_l = 1 (equal client sizes, or b = N). With unequal sizes a round-robin draw has Σ a_l ≠ 1 and
the model form would rescale θ_t itself by Σ a_l; the update form keeps the unbiased estimate of the update
without that random rescaling (the noise item Σ a_l·w_l is the paper's in both forms).
b is the sampler's clients per round (``expected_clients``; ``all``: b = N, a_l = n_l/n).
"""

from __future__ import annotations

from fedrun.schemes.base import Env, Scheme


class LocalDPFedAvg(Scheme):
    """DP-FedAvg of paper 001: FedAvg with the (N/b)·(n_l/n) weights; noise comes from ``dp=local_*``."""

    dp_modes = ("off", "local")  # paper 001: local DP (its (N/b)·(n_l/n) weights are not client-level DP's)
    weighting = "population"  # a_l = (N/b)·(n_l/n) (paper 001, Alg. 1 / the noise item w_t^b)

    def setup(self, env: Env) -> None:
        if env.local_mode != "gd":
            raise ValueError(f"scheme=ldp_fedavg runs E full-batch gradient iterations per client: set "
                             f"local_mode=gd (local_steps = E); got local_mode={env.local_mode}")
        super().setup(env)
