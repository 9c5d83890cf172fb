"""FL-STD = FedAvg (McMahan et al. 2017; paper 000 Alg. 1).

Server update w_t = w_{t−1} + η_g · Σ_{k∈K} (|D_k| / Σ_{j∈K} |D_j|) Δw_k over the selected clients
(η_g = ``server_lr`` = 1 in paper 000). The whole float32 update travels each way. Every hook is the codec base's.
"""

from __future__ import annotations

from fedrun.schemes.base import Scheme


class FedAvg(Scheme):
    """FL-STD: the uncompressed baseline of paper 000."""

    dp_modes = ("off", "client", "local")  # local DP noises the update; FedAvg sends it as it is

