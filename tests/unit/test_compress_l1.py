"""BPDN solvers (fedrun.compress.l1): recovery, noise robustness, optimality (KKT), solver agreement.

The sensing operator is the first m rows of the n-point orthonormal DCT-II — a *low-pass*, structured
matrix, not a random one. Recovery from it is a super-resolution problem: it works when the spikes of the
sparse vector are separated by a few times n/m and fails for clustered supports (see
``test_clustered_support_is_not_recovered``). ``sparse_spikes`` therefore draws well-separated supports.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrun.compress.dct import dct, dct_matrix, idct
from fedrun.compress.l1 import bpdn, bpdn_objective, fista, lambda_max, lambda_path, owlqn, soft_threshold

N, M, U = 1024, 256, 10
SEPARATION = 4 * N // M  # minimum spike distance, in samples


def sparse_spikes(n: int, count: int, separation: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` spikes of magnitude in [1, 2] and random sign, pairwise at least ``separation`` apart."""
    while True:
        pos = torch.randint(separation, n - separation, (count,), generator=gen).sort().values
        if count == 1 or int(pos.diff().min()) >= separation:
            break
    x = torch.zeros(n, dtype=torch.float64)
    x[pos] = (torch.randint(0, 2, (count,), generator=gen) * 2 - 1) * (1 + torch.rand(count, generator=gen, dtype=torch.float64))
    return x


def forward(s: torch.Tensor) -> torch.Tensor:
    return dct(s, M)


def adjoint(v: torch.Tensor) -> torch.Tensor:
    return idct(v, N)


def rel_err(s: torch.Tensor, x: torch.Tensor) -> float:
    return float((s - x).norm() / x.norm())


@pytest.fixture(scope="module")
def spikes() -> torch.Tensor:
    return sparse_spikes(N, U, SEPARATION, torch.Generator().manual_seed(1))


@pytest.mark.parametrize("solver", ["fista", "owlqn"])
def test_exact_recovery_without_noise(spikes: torch.Tensor, solver: str) -> None:
    y = forward(spikes)
    lam = 3e-4 * lambda_max(adjoint, y)  # the BPDN bias is ~ lam_rel·‖x‖, so a small λ is needed for 1e-3
    sol = bpdn(forward, adjoint, y, lam, solver, max_iter=3000, tol=1e-8)
    assert rel_err(sol.s, spikes) < 1e-3
    assert sol.iterations < 3000


@pytest.mark.parametrize("solver", ["fista", "owlqn"])
@pytest.mark.parametrize("noise", [0.01, 0.1])
def test_error_is_a_bounded_multiple_of_the_noise(spikes: torch.Tensor, solver: str, noise: float) -> None:
    gen = torch.Generator().manual_seed(2)
    clean = forward(spikes)
    z = torch.randn(M, generator=gen, dtype=torch.float64)
    z *= noise * clean.norm() / z.norm()
    sigma = float(z.norm()) / math.sqrt(M)
    lam = sigma * math.sqrt(2 * math.log(N))  # the usual noise-level choice of λ
    sol = bpdn(forward, adjoint, clean + z, lam, solver, max_iter=3000, tol=1e-8)
    # Measured ≈ 3·‖z‖ (bias-dominated); a stable decoder (Candès–Romberg–Tao) stays within C·‖z‖.
    assert float((sol.s - spikes).norm()) <= 6.0 * float(z.norm())


def kkt_violation(s: torch.Tensor, y: torch.Tensor, lam: float) -> tuple[float, float]:
    """(max |Φᵀ(y − Φs)| / λ − 1, max over the support of |Φᵀ(y − Φs) − λ·sign(s)| / λ), with explicit Φ."""
    phi = dct_matrix(N, M)
    g = phi.T @ (y - phi @ s)
    support = s != 0
    on_support = (g[support] - lam * s[support].sign()).abs().max() / lam if support.any() else torch.tensor(0.0)
    return float(g.abs().max() / lam - 1), float(on_support)


@pytest.mark.parametrize("solver", ["fista", "owlqn"])
@pytest.mark.parametrize("lam_rel", [0.05, 0.2])
def test_solution_satisfies_kkt_conditions(spikes: torch.Tensor, solver: str, lam_rel: float) -> None:
    gen = torch.Generator().manual_seed(3)
    y = forward(spikes) + 0.05 * torch.randn(M, generator=gen, dtype=torch.float64)
    lam = lam_rel * lambda_max(adjoint, y)
    sol = bpdn(forward, adjoint, y, lam, solver, max_iter=3000, tol=1e-10)
    above, on_support = kkt_violation(sol.s, y, lam)
    assert above <= 1e-3 and on_support <= 1e-3
    assert int((sol.s != 0).sum()) > 0


@pytest.mark.parametrize("lam_rel", [0.01, 0.05, 0.5])
def test_owlqn_and_fista_reach_the_same_minimum(spikes: torch.Tensor, lam_rel: float) -> None:
    gen = torch.Generator().manual_seed(4)
    y = forward(spikes) + 0.02 * torch.randn(M, generator=gen, dtype=torch.float64)
    lam = lam_rel * lambda_max(adjoint, y)
    f_fista = bpdn_objective(forward, y, bpdn(forward, adjoint, y, lam, "fista", max_iter=3000, tol=1e-8).s, lam)
    f_owlqn = bpdn_objective(forward, y, bpdn(forward, adjoint, y, lam, "owlqn", max_iter=3000, tol=1e-8).s, lam)
    assert f_owlqn == pytest.approx(f_fista, rel=1e-6)
    assert f_fista < bpdn_objective(forward, y, torch.zeros(N, dtype=torch.float64), lam)


def test_objective_against_explicit_formula(spikes: torch.Tensor) -> None:
    phi = dct_matrix(N, M)
    y = phi @ spikes + 0.1
    s = spikes * 0.5
    expected = 0.5 * float(((y - phi @ s) ** 2).sum()) + 0.3 * float(s.abs().sum())
    assert bpdn_objective(forward, y, s, 0.3) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("solver", [fista, owlqn])
def test_lambda_at_or_above_lambda_max_gives_zero(spikes: torch.Tensor, solver) -> None:
    y = forward(spikes)
    sol = solver(forward, adjoint, y, 1.01 * lambda_max(adjoint, y), max_iter=100)
    assert float(sol.s.abs().max()) < 1e-12 * float(spikes.abs().max())
    assert torch.equal(solver(forward, adjoint, torch.zeros(M, dtype=torch.float64), 1.0).s, torch.zeros(N, dtype=torch.float64))


@pytest.mark.parametrize("solver", ["fista", "owlqn"])
def test_solution_is_scale_equivariant(spikes: torch.Tensor, solver: str) -> None:
    """BPDN(c·y, c·λ) = c·BPDN(y, λ): the solvers normalise, so tiny updates are solved as well as big ones."""
    y, lam = forward(spikes), 0.01 * lambda_max(adjoint, forward(spikes))
    big = bpdn(forward, adjoint, y, lam, solver, tol=1e-8, max_iter=2000).s
    tiny = bpdn(forward, adjoint, 1e-6 * y, 1e-6 * lam, solver, tol=1e-8, max_iter=2000).s
    assert rel_err(tiny * 1e6, big) < 1e-4


def test_warm_start_from_the_solution_stops_at_once(spikes: torch.Tensor) -> None:
    y = forward(spikes)
    lam = 0.01 * lambda_max(adjoint, y)
    cold = bpdn(forward, adjoint, y, lam, "fista", max_iter=3000, tol=1e-6)
    warm = bpdn(forward, adjoint, y, lam, "fista", x0=cold.s, max_iter=3000, tol=1e-6)
    assert warm.iterations < max(5, cold.iterations // 10)
    assert rel_err(warm.s, cold.s) < 1e-5


def test_solvers_keep_dtype_and_device(spikes: torch.Tensor) -> None:
    y = forward(spikes.float())
    for solver in ("fista", "owlqn"):
        s = bpdn(forward, adjoint, y, 0.01 * lambda_max(adjoint, y), solver, max_iter=50).s
        assert s.dtype == torch.float32 and s.device == y.device and s.shape == (N,)


def test_clustered_support_is_not_recovered() -> None:
    """Documented limitation of first-m DCT rows: 10 adjacent spikes are not recovered, 10 separated ones are."""
    x = torch.zeros(N, dtype=torch.float64)
    x[500:510] = torch.linspace(1.0, 2.0, 10, dtype=torch.float64) * torch.tensor([1.0, -1.0] * 5, dtype=torch.float64)
    y = forward(x)
    sol = bpdn(forward, adjoint, y, 3e-4 * lambda_max(adjoint, y), "fista", max_iter=1000, tol=1e-8)
    assert rel_err(sol.s, x) > 0.1


def test_soft_threshold_and_lambda_path() -> None:
    v = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0])
    torch.testing.assert_close(soft_threshold(v, 1.0), torch.tensor([-2.0, 0.0, 0.0, 0.0, 2.0]))
    assert lambda_path(1.0, 0.05, 0.3) == pytest.approx([0.3, 0.09, 0.05])
    assert lambda_path(1.0, 0.5, 0.3) == [0.5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lam": 0.0}, r"lam=0.0; allowed: 0 < lam < inf"),
        ({"lam": float("nan")}, r"lam=nan; allowed"),
        ({"max_iter": 0}, r"max_iter=0; allowed: max_iter >= 1"),
        ({"tol": 0.0}, r"tol=0.0; allowed: 0 < tol < 1"),
        ({"solver": "lbfgs"}, r"solver='lbfgs'; allowed: \('fista', 'owlqn'\)"),
        ({"continuation": 1.0}, r"continuation=1.0; allowed: None or 0 < continuation < 1"),
        ({"x0": torch.zeros(N + 1, dtype=torch.float64)}, r"x0.shape=\(1025,\); allowed: \(1024,\)"),
        ({"y": torch.zeros(2, M, dtype=torch.float64)}, r"y.shape=\(2, 256\); allowed: one non-empty dimension"),
        ({"y": torch.full((M,), float("inf"), dtype=torch.float64)}, r"y has non-finite entries"),
    ],
)
def test_bad_input_raises_value_error(kwargs: dict, match: str) -> None:
    args = {"y": torch.ones(M, dtype=torch.float64), "lam": 0.1} | kwargs
    with pytest.raises(ValueError, match=match):
        bpdn(forward, adjoint, **args)
