"""fedrun's optimised strategies against a second implementation run live: Google DeepMind's jax_privacy 2.0.0, in
its own interpreter (``$JAX_PRIVACY_PYTHON``; .ci/run installs it into a separate venv: jaxlib alone is ~350 MB, too
large for the project's dependencies). Skipped where that interpreter is not given; tests/unit/test_factorization.py
holds the same comparison against figures jax_privacy printed once."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fedrun.privacy.factorization import banded_toeplitz, blt, prefix_sum_matrix, sensitivity, sqrt_toeplitz

PYTHON = os.environ.get("JAX_PRIVACY_PYTHON")
SCRIPT = Path(__file__).resolve().parents[1] / "second_impl" / "jax_privacy_figures.py"
CASES = {"banded": [[50, 2], [50, 10], [200, 50], [24, 6]], "sqrt_sensitivity": [[24, 3, 8], [24, 2, 12], [40, 4, 5]],
         "blt": [[50, 1, 1, 1], [50, 1, 1, 2], [50, 3, 10, 3]]}


def _error(C: np.ndarray) -> float:
    """‖A·C⁻¹‖_F² from dense matrices (a linear solve, no shared code with the optimiser)."""
    A = prefix_sum_matrix(C.shape[0])
    return float(np.linalg.norm(np.linalg.solve(C.T, A.T).T) ** 2)


@pytest.fixture(scope="module")
def theirs():
    if not PYTHON:
        pytest.skip("JAX_PRIVACY_PYTHON is not set (a Python with jax-privacy==2.0.0; .ci/run makes one)")
    out = subprocess.run([PYTHON, str(SCRIPT), json.dumps(CASES)], capture_output=True, text=True, timeout=900,
                         cwd=SCRIPT.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_banded_optima_equal_jax_privacys(theirs):
    """Same family and loss, different optimisers (ours: L-BFGS-B with an analytic gradient; theirs: optax under
    jax): the optimal losses agree to rel 1e-9 (float64 round-off of T² terms is ~1e-12 of them)."""
    for (T, bands), loss in zip(CASES["banded"], theirs["banded"]):
        C = banded_toeplitz(T, bands, 1, 1)
        assert sensitivity(C, 1, 1, banded=bands) ** 2 * _error(C) == pytest.approx(loss, rel=1e-9), (T, bands)


def test_min_separation_sensitivity_of_the_square_root_equals_jax_privacys(theirs):
    """Their closed form against our enumeration of every pattern: rel 1e-12."""
    for (T, k, b), s in zip(CASES["sqrt_sensitivity"], theirs["sqrt_sensitivity"]):
        assert sensitivity(sqrt_toeplitz(T), k, b) == pytest.approx(s, rel=1e-12), (T, k, b)


def test_blt_optima_are_no_worse_than_jax_privacys(theirs):
    """Same family (both keep Σω < 1): ours at most theirs (rel 1e-9) and within 0.1 % of it."""
    for (T, k, b, d), loss in zip(CASES["blt"], theirs["blt"]):
        C = blt(T, d, k, b)
        ours = sensitivity(C, k, b) ** 2 * _error(C)
        assert loss * (1 - 1e-3) <= ours <= loss * (1 + 1e-9), (T, k, b, d)
