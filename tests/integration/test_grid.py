"""The dataset × scheme grid: ``fedrun dataset=X scheme=Y`` with only those two choices gives a runnable,
sensible configuration, or a one-line refusal that names the pair.

Fast: every pair composes, prints as a readable config (what ``fedrun --cfg job`` shows) and is prepared
(defaults resolved, DP decided, pair checked) before any data is loaded. The one-round run of every pair is
marked ``grid`` (and slow): ``.ci/run`` runs it after the fast suite (``pytest -m grid``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import fedrun.run as run_module
from fedrun.config import ConfigError
from fedrun.run import prepare, run
from conftest import CONF_DIR, compose

DATASETS = sorted(p.stem for p in Path(CONF_DIR, "dataset").glob("*.yaml"))
SCHEMES = sorted(p.stem for p in Path(CONF_DIR, "scheme").glob("*.yaml"))
PAIRS = [(d, s) for d in DATASETS for s in SCHEMES]
TRANSFER = {"fl", "ftl_full", "ftl_c", "fbftl"}
#: pairs that must be refused (the rest must run): compressing or transferring schemes on a linear regression
REFUSED = {("lending_club", s) for s in ("fl_rnd", "fl_freq", "fl_cs", "fedsketch", "fedsketchgate",
                                         "sketchedsgd", "topk", "topk_ef", "fl", "ftl_full", "ftl_c", "fbftl")}


def _pair_config(dataset: str, scheme: str, *extra: str) -> dict:
    cfg = compose([f"dataset={dataset}", f"scheme={scheme}", *extra])
    return OmegaConf.to_container(cfg, resolve=True)


def test_grid_covers_every_config_file():
    assert len(DATASETS) >= 4 and len(SCHEMES) >= 13
    assert REFUSED <= set(PAIRS)


@pytest.mark.parametrize("dataset,scheme", PAIRS)
def test_pair_composes_readably_and_prepares(dataset, scheme, monkeypatch, shared_data):
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    cfg = compose([f"dataset={dataset}", f"scheme={scheme}"])
    text = OmegaConf.to_yaml(cfg)  # what `fedrun --cfg job` prints
    assert f"name: {dataset}" in text and f"name: {scheme}" in text
    c = OmegaConf.to_container(cfg, resolve=True)
    if (dataset, scheme) in REFUSED:
        with pytest.raises(ConfigError) as err:
            prepare(c)
        message = str(err.value)
        assert "\n" not in message and f"scheme={scheme}" in message and f"dataset={dataset}" in message
        return
    notes = prepare(c)
    assert all("\n" not in n for n in notes)
    # what the pair was given belongs to what was named, not to the default experiment of another dataset
    assert c["dataset"]["name"] == dataset and c["scheme"]["name"] == scheme
    model = c["model"]["name"]
    assert model == c["dataset"]["default_model"], (model, dataset)
    if c["dp"] is True:  # client-level DP only with an S tuned for this very model, scheme and r
        table = c["model"]["clipping_norm"][scheme]
        tuned = table if isinstance(table, float) else table[f"{c['r']:g}"]
        assert c["clipping_norm"] == tuned
    else:
        assert c["dp"] is False and any(n.startswith("dp=auto: no DP") for n in notes), notes


def test_default_is_paper_000_headline():
    c = _pair_config("fashion_mnist", "fl_cs")
    default = OmegaConf.to_container(compose([]), resolve=True)
    assert default == c
    prepare(c)
    assert (c["dataset"]["name"], c["scheme"]["name"], c["model"]["name"]) == ("fashion_mnist", "fl_cs", "fashion_cnn")
    assert (c["r"], c["dp"], c["epsilon"], c["clipping_norm"]) == (0.05, True, 1.0, 0.11)
    assert (c["num_clients"], c["sample_rate"]) == (6000, 0.01)


@pytest.mark.parametrize("dataset,scheme,dp,message", [
    ("fashion_mnist", "fbftl", "true", "dp=true is not available with scheme=fbftl: it takes dp=false only"),
    ("fashion_mnist", "sketchedsgd", "true", "scheme=sketchedsgd: it takes dp=false only"),
    ("femnist", "ldp_fedavg", "true", "scheme=ldp_fedavg: it takes dp=false, dp=local_laplace|local_gaussian"),
    ("mnist", "fedsketch", "local_gaussian", "scheme=fedsketch: it takes dp=false, dp=true (client-level)"),
    ("mnist", "fl_std", "true", "dp=true needs clipping_norm=S: model=lenet5 has no S tuned for scheme=fl_std"),
    ("mnist", "ldp_fedavg", "local_gaussian", "needs local_clip=ζ"),
])
def test_explicit_dp_that_does_not_fit_is_refused_in_one_line(dataset, scheme, dp, message):
    with pytest.raises(ConfigError) as err:
        prepare(_pair_config(dataset, scheme, f"dp={dp}"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_explicit_dp_takes_the_model_tuned_values():
    c = _pair_config("lending_club", "ldp_fedavg", "dp=local_laplace", "epsilon=10")
    prepare(c)
    assert (c["local_clip"], c["local_clip_ord"], c["local_mode"], c["epsilon"]) == (150.0, 1, "gd", 10.0)
    assert c["sampler"]["_target_"].endswith("RoundRobinSampler")
    c = _pair_config("fashion_mnist", "fl_rnd", "r=0.1")
    prepare(c)
    assert (c["dp"], c["clipping_norm"]) == (True, 0.13)
    c = _pair_config("fashion_mnist", "fl_rnd", "r=0.3")  # no S tuned at r = 0.3: DP off, said so
    assert any("no clipping norm S tuned for scheme=fl_rnd at r=0.3" in n for n in prepare(c)) and c["dp"] is False
    c = _pair_config("mnist", "fl_std", "dp=true", "clipping_norm=0.5")  # an explicit S is always taken
    prepare(c)
    assert (c["dp"], c["clipping_norm"], c["epsilon"]) == (True, 0.5, 1.0)


def test_prepare_is_idempotent():
    c = _pair_config("fashion_mnist", "fl_cs")
    prepare(c)
    once = dict(c)
    prepare(c)
    assert c == once


# ------------------------------------------------------------------------------------------ one round each
@pytest.fixture(scope="module")
def cached_loader():
    original = run_module.load_dataset
    run_module.load_dataset = functools.lru_cache(maxsize=None)(original)
    yield
    run_module.load_dataset = original


@pytest.mark.slow
@pytest.mark.grid
@pytest.mark.parametrize("dataset,scheme", PAIRS)
def test_pair_runs_one_round_or_refuses(dataset, scheme, cached_loader, shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    extra = []
    if scheme in TRANSFER and (dataset, scheme) not in REFUSED:  # the source model's training size is not what
        extra = ["scheme.source_epochs=1", "scheme.source_max_samples=2000"]  # this test checks (repro tests do)
    c = _pair_config(dataset, scheme, "rounds=1", "tracking=none", "progress=off", "checkpoint_every=0", *extra)
    try:
        summary = run(c, out_dir=tmp_path)
    except ConfigError as exc:
        assert (dataset, scheme) in REFUSED, f"refused: {exc}"
        assert f"scheme={scheme}" in str(exc) and f"dataset={dataset}" in str(exc) and "\n" not in str(exc)
        return
    assert (dataset, scheme) not in REFUSED
    assert summary["rounds_completed"] == 1
