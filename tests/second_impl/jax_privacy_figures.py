"""Run with a Python that has jax-privacy 2.0.0 (not a fedrun dependency: jaxlib alone is ~350 MB): prints, as JSON,
jax_privacy's own optimised banded-Toeplitz and BLT losses and its min-separation sensitivity of the square root of
A, for the cases tests/unit/test_factorization_jax_privacy.py compares with fedrun.privacy.factorization. Imports
nothing from fedrun."""

import json
import sys

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz  # noqa: E402

cases = json.loads(sys.argv[1])
out = {"banded": [], "sqrt_sensitivity": [], "blt": []}
for T, bands in cases["banded"]:
    c = np.asarray(toeplitz.optimize_banded_toeplitz(n=T, bands=bands, max_optimizer_steps=1000), dtype=np.float64)
    out["banded"].append(float(toeplitz.loss(c / c[0], n=T)) * T)  # its mean per-prefix error × ‖c‖², times T
for T, k, b in cases["sqrt_sensitivity"]:
    coef = toeplitz.optimal_max_error_strategy_coefs(T)
    out["sqrt_sensitivity"].append(float(toeplitz.minsep_sensitivity_squared(coef, min_sep=b, max_participations=k,
                                                                             n=T)) ** 0.5)
for T, k, b, d in cases["blt"]:
    blt = buffered_toeplitz.optimize(n=T, min_sep=b, max_participations=k, error="mean", min_buffers=d,
                                     max_buffers=d)
    coef = np.asarray(blt.toeplitz_coefs(T), dtype=np.float64)
    C = np.tril(np.array([[coef[i - j] if i >= j else 0.0 for j in range(T)] for i in range(T)]))
    A = np.tril(np.ones((T, T)))
    err = float(np.linalg.norm(np.linalg.solve(C.T, A.T).T) ** 2)  # ‖A·C⁻¹‖_F²
    sens2 = float(toeplitz.minsep_sensitivity_squared(coef, min_sep=b, max_participations=k, n=T))
    out["blt"].append(sens2 * err)
print(json.dumps(out))
