"""Property test over the configuration space: every combination of dataset, model, scheme, DP mode and
sampler that belongs together runs 1–2 rounds, or stops with a clear one-line error — never a traceback."""

import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedrun.run as run_module
from fedrun.config import ConfigError
from fedrun.data.dataset import Dataset
from fedrun.run import RunDiverged, run

MODELS = {"mnist": ["lenet5", "fashion_cnn"], "fashion_mnist": ["fashion_cnn", "lenet5"],
          "femnist": ["femnist_cnn", "lenet5"], "lending_club": ["lr"]}
SCHEMES = ["fl_std", "fl_rnd", "fl_freq", "fl_cs", "fedsgd", "fedsketch", "fedsketchgate", "sketchedsgd",
           "ldp_fedavg", "fl", "ftl_full", "ftl_c", "fbftl"]
DP = ["false", "true", "local_laplace", "local_gaussian"]
SAMPLERS = ["poisson", "uniform", "round_robin", "all"]
TRANSFER = {"fl", "ftl_full", "ftl_c", "fbftl"}
OUTCOMES: dict[str, list] = {"ran": [], "refused": []}


N_TRAIN, N_TEST = 2000, 500  # what a combination needs to run or refuse; the full sets cost minutes and GBs


def _cut(d: Dataset) -> Dataset:
    """The first N_TRAIN / N_TEST samples of an image dataset (Lending Club is small: kept whole, every state)."""
    if len(d.y_train) <= 10_000:
        return d
    g = {k: getattr(d, k)[:n] for k, n in (("groups_train", N_TRAIN), ("groups_test", N_TEST))
         if getattr(d, k) is not None}
    return dataclasses.replace(d, x_train=d.x_train[:N_TRAIN], y_train=d.y_train[:N_TRAIN], x_test=d.x_test[:N_TEST],
                               y_test=d.y_test[:N_TEST], **g)


@pytest.fixture(scope="module")
def cached_loader():
    """Load each dataset once for the whole module, cut to a few thousand samples (build() does not modify the
    Dataset; the configuration, not the data size, is under test)."""
    original = run_module.load_dataset
    run_module.load_dataset = functools.lru_cache(maxsize=None)(lambda *a, **k: _cut(original(*a, **k)))
    yield
    run_module.load_dataset = original


@st.composite
def configs(draw):
    dataset = draw(st.sampled_from(sorted(MODELS)))
    scheme = draw(st.sampled_from(SCHEMES))
    dp = draw(st.sampled_from(DP))
    sampler = draw(st.sampled_from(SAMPLERS))
    local_mode = draw(st.sampled_from(["sgd", "gd"]))
    if draw(st.integers(0, 4)) > 0:  # 4 in 5 draws: make the parts belong together (else: anything goes)
        if dp == "true":
            sampler = "poisson"
        elif dp.startswith("local"):
            sampler, local_mode = draw(st.sampled_from(["round_robin", "all"])), "gd"
        if scheme == "fedsketchgate":
            sampler = "all"
    over = [f"dataset={dataset}", f"model={draw(st.sampled_from(MODELS[dataset]))}", f"scheme={scheme}",
            f"dp={dp}", f"sampler={sampler}", f"r={draw(st.sampled_from([0.05, 0.5, 1.0]))}",
            f"local_mode={local_mode}", f"rounds={draw(st.integers(1, 2))}",
            f"seed={draw(st.integers(0, 3))}", "num_clients=8", "sample_rate=0.5", "clients_per_round=3",
            "local_steps=1", "batch_size=8", "lr=0.01", "clipping_norm=0.1", "eval_every=1",
            "checkpoint_every=0"]
    if dp != "false":
        over += ["epsilon=2", "local_clip=1.0"]
        if dp == "local_laplace":
            over += ["local_clip_ord=1"]
    if scheme in TRANSFER:
        over += ["scheme.source_epochs=1", "scheme.source_max_samples=256"]
    if scheme in ("fedsketch", "fedsketchgate"):
        over += ["scheme.rows=2", "scheme.cols=4"] if dataset == "lending_club" else ["scheme.rows=3", "scheme.cols=50"]
    return over


def _check(fast_cfg, tmp_path_factory, monkeypatch, overrides):
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    out = tmp_path_factory.mktemp("run")
    try:
        summary = run(fast_cfg(*overrides), out_dir=out)
    except (ConfigError, RunDiverged) as exc:
        message = str(exc)
        assert message and "\n" not in message.strip(), message
        OUTCOMES["refused"].append((overrides, message))
        return
    assert summary["rounds_completed"] >= 1
    assert (out / "metrics.csv").exists()
    OUTCOMES["ran"].append(overrides)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(overrides=configs())
def test_every_combination_runs_or_fails_clearly(fast_cfg, tmp_path_factory, cached_loader, monkeypatch, overrides):
    _check(fast_cfg, tmp_path_factory, monkeypatch, overrides)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=configs())
def test_many_more_combinations(fast_cfg, tmp_path_factory, cached_loader, monkeypatch, overrides):
    _check(fast_cfg, tmp_path_factory, monkeypatch, overrides)


def test_the_sample_exercised_both_outcomes():
    """The property above must not pass by refusing everything: most drawn combinations run."""
    ran, refused = OUTCOMES["ran"], OUTCOMES["refused"]
    if not ran and not refused:
        pytest.skip("run together with test_every_combination_runs_or_fails_clearly")
    assert len(ran) >= len(refused) / 2, "\n".join(m for _, m in refused)
    schemes = {next(o for o in over if o.startswith("scheme=")) for over in ran}
    assert len(schemes) >= min(3, len(ran)), schemes  # 4 derandomized examples: 3 schemes ran
