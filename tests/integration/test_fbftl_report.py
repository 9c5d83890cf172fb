"""Paper 003's comparison (fedrun/reports/fbftl.py) built end to end from a synthetic export.

The export has the params, tags and metrics (MLflow names) that a real ``fedrun -m experiment=fbftl_*`` run logs
(read off a rounds=2 run exported with ``python -m fedrun.export``), for both source → target pairs, the four
schemes and three seeds, plus runs the spec must leave out: a shorter trial run, a run that tuned the server lr,
a FAILED run. ``python -m fedrun.report fbftl`` is run on it in a temporary repository (the exports and output at
their places under results/fbftl/); its cells, claims and README block are checked, then ``--check``.
"""

from __future__ import annotations

import posixpath
import random
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from fedrun import export as ex
from fedrun.report import main
from fedrun.reports import REPORTS, fbftl
from fedrun.reports.common import README, markers

REPO = Path(__file__).resolve().parents[2]


def link(path: str) -> str:
    """``path`` (relative to the repository) as the claims file links it: relative to the claims file's folder."""
    return posixpath.relpath(path, posixpath.dirname(README) or ".")
PAIRS = {"fbftl-femnist-mnist": ("femnist", "mnist"), "fbftl-mnist-fashion": ("mnist", "fashion_mnist")}
ACC = {("mnist", "fl"): 0.9561, ("mnist", "ftl_full"): 0.9568, ("mnist", "ftl_c"): 0.7848, ("mnist", "fbftl"): 0.8643,
       ("fashion_mnist", "fl"): 0.7625, ("fashion_mnist", "ftl_full"): 0.8015, ("fashion_mnist", "ftl_c"): 0.6840,
       ("fashion_mnist", "fbftl"): 0.7594}   # the first single-seed comparison (seed 0; git show 979bf0a:results/fbftl/comparison.md)
FULL, HEAD, FEATURES, FROZEN = 61706, 11014, 120, 50692   # LeNet-5 cut at body index 9
ROUNDS, CLIENTS, SAMPLES = 100, 6000, 60000


def _run(i: int, experiment: str, scheme: str, seed: int, rng: random.Random, rounds: int = ROUNDS,
         **params: str) -> tuple[dict, list[tuple[str, str, int, float]]]:
    """One run's record (the keys a real run logs) and its per-round points (every 5th round, as exported)."""
    source, target = PAIRS[experiment]
    rid = f"{i:032x}"
    run = {"run_id": rid, "experiment": experiment, "run_name": f"{scheme}-{target}", "status": "FINISHED",
           "start_time": 1_800_000_000_000 + 60_000 * i, "end_time": 1_800_000_000_000 + 60_000 * i + 50_000,
           "params.scheme.name": scheme, "params.scheme.source_dataset": source, "params.dataset.name": target,
           "params.seed": str(seed), "params.scheme.source_seed": str(seed), "params.rounds": str(rounds),
           "params.num_clients": str(CLIENTS),
           "params.scheme.clients_hold_source": "False", "params.model.name": "lenet5",
           "tags.scheme": scheme, "tags.dataset": target, "tags.model": "lenet5", "tags.dp": "off",
           "tags.fedrun.config_hash": f"{i:016x}", "tags.fedrun.num_parameters": str(HEAD if scheme != "fl" else FULL)}
    if scheme == "fbftl":
        run.update({"params.scheme.tune_lrs": "None", "params.scheme.server_batch_size": "64"})
    run.update(params)
    per_round = 100 + seed            # clients drawn per round (Poisson, the same draws for every scheme of a seed)
    if scheme == "fbftl":
        batches, per_batch, batch_bytes = SAMPLES, FEATURES, 4 * FEATURES + 1
        up = [batches * batch_bytes] * rounds                        # one upload, in round 1
        broadcast = 4.0 * FROZEN                                     # f¹ once
        per_client = 4.0 * FROZEN * CLIENTS
        formula_up, formula_down = SAMPLES * FEATURES * 32.0, 32.0 * FROZEN
    else:
        per_batch = HEAD if scheme == "ftl_c" else FULL
        batch_bytes = 4 * per_batch
        batches = per_round * rounds
        up = [per_round * batch_bytes * (t + 1) for t in range(rounds)]
        broadcast = 4.0 * per_batch * rounds + (4.0 * FROZEN if scheme == "ftl_c" else 0)
        per_client = float(up[-1]) + (4.0 * FROZEN * min(CLIENTS, batches) if scheme == "ftl_c" else 0)
        formula_up, formula_down = 32.0 * per_batch * 100 * rounds, 32.0 * broadcast / 4
    acc = ACC[(target, scheme)] + rng.gauss(0, 0.003)
    steps = sorted({*range(5, rounds + 1, 5), rounds})            # eval_every = 5 and the last round
    curve = [(t, acc * (1 - 0.5 * 0.9 ** t)) for t in steps]
    best_round, best = max(curve, key=lambda p: (p[1], -p[0]))
    run.update({
        "metrics.comm/upload_batches_total": float(batches), "metrics.comm/params_per_batch": float(per_batch),
        "metrics.comm/uplink_bytes_per_batch": float(batch_bytes), "metrics.comm/paper_uplink_bits": formula_up,
        "metrics.comm/paper_downlink_bits": formula_down, "metrics.comm/downlink_broadcast_bytes_total": broadcast,
        "metrics.uplink_bytes_total": float(up[-1]), "metrics.downlink_bytes_total": per_client,
        "metrics.test_accuracy": curve[-1][1], "metrics.summary/best_test_accuracy": best,
        "metrics.summary/best_round": float(best_round), "metrics.summary/rounds_completed": float(rounds),
        "metrics.summary/uplink_bytes_at_best": float(up[best_round - 1]),
        "metrics.summary/uplink_bytes_final": float(up[-1]), "metrics.summary/downlink_bytes_final": per_client,
        "metrics.transfer/cut_layer": 9.0, "metrics.transfer/feature_dim": float(FEATURES)})
    if scheme != "fl":
        run.update({"metrics.transfer/source_test_accuracy": 0.7924 if source == "femnist" else 0.9833,
                    "metrics.transfer/frozen_params": float(FROZEN)})
    if scheme == "fbftl":
        run.update({"metrics.server/lr": 0.1, "metrics.server/epochs": float(rounds),
                    "metrics.leakage/label_leakage_bits": 3.11 + 0.01 * seed,
                    "metrics.leakage/label_leakage_expected_bits": 3.1166, "metrics.leakage/label_prior_bits": 15.4777})
    points = [(rid, "test_accuracy", t, a) for t, a in curve]
    points += [(rid, "uplink_bytes_total", t, float(up[t - 1])) for t in steps]
    return run, points


def _synthetic_exports(root: Path) -> None:
    rng = random.Random(3)
    i = 0
    for experiment in PAIRS:
        runs, points = [], []
        for seed in (0, 1, 2):
            for scheme in ("fl", "ftl_full", "ftl_c", "fbftl"):
                i += 1
                run, pts = _run(i, experiment, scheme, seed, rng)
                runs.append(run)
                points += pts
        if experiment == "fbftl-mnist-fashion":   # runs the report leaves out, each newer than the sweep's
            for extra in (dict(rounds=2), dict(**{"params.scheme.tune_lrs": "[0.01, 0.1]"}), dict(status="FAILED"),
                          dict(seed=1, **{"params.scheme.source_seed": "0"})):   # a source model shared by all seeds
                i += 1
                status, seed = extra.pop("status", "FINISHED"), extra.pop("seed", 0)
                run, pts = _run(i, experiment, "fbftl", seed, rng, **extra)
                run["status"] = status
                run["metrics.test_accuracy"] = 0.1               # would break the FbFTL = FTL-c verdict if kept
                runs.append(run)
                points += pts
        a, b = ex.encode(runs, points)
        runs_file, metrics_file = ex.paths(root / "results" / "fbftl" / "runs" / experiment)
        runs_file.parent.mkdir(parents=True, exist_ok=True)
        runs_file.write_bytes(a)
        metrics_file.write_bytes(b)


def _root(tmp_path: Path) -> Path:
    """A repository-like folder: the exports under results/fbftl/runs/ (as committed) and the claims file
    (``fedrun.reports.common.README``) with the report's claims block."""
    root = tmp_path / "repo"
    (root / "results" / "fbftl").mkdir(parents=True)
    for f in ("table.template.md", "claims.csv", "paper_numbers.csv"):   # text, quotes, numbers
        shutil.copy(REPO / "results" / "fbftl" / f, root / "results" / "fbftl")
    start, end = markers("fbftl")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# A README\n\n- **003 (FbFTL)**: text.\n{start}\n{end}\n\nThe end.\n")
    _synthetic_exports(root)
    return root


def test_the_report_names_the_sweeps_exports():
    exports = REPORTS["fbftl"][1]
    assert [e.experiment for e in exports] == ["fbftl-femnist-mnist", "fbftl-mnist-fashion"]
    for e in exports:
        exp = yaml.safe_load((REPO / "conf" / "experiment" / f"{e.experiment.replace('-', '_')}.yaml").read_text())
        assert exp["tracking"]["experiment"] == e.experiment and exp["skip_finished"] is True
        assert exp["hydra"]["sweeper"]["params"] == {"seed": "0,1,2,3,4,5,6,7,8,9",
                                                     "scheme": "fl,ftl_full,ftl_c,fbftl"}


def test_fbftl_report_from_a_synthetic_export(tmp_path, capsys):
    root = _root(tmp_path)
    assert main(["fbftl", "--root", str(root)]) == 0
    md = (root / "results" / "fbftl" / "table.md").read_text()
    assert (root / "results" / "fbftl" / "table_accuracy.svg").read_bytes().startswith(b"<?xml")
    assert ("Runs: 28 in the exports `results/fbftl/runs/fbftl-femnist-mnist.runs.csv.gz`, "
            "`results/fbftl/runs/fbftl-mnist-fashion.runs.csv.gz`; 24 in the tables (left out: 3 not matching "
            "status = FINISHED, params.scheme.tune_lrs = None/, source_model = per seed, "
            "params.scheme.clients_hold_source = False/; "
            "1 outside the spec's rounds values)") in md
    assert "Cells: 10 expected; 8 with ≥ 3 seeds, 0 with 1–2, 2 without runs." in md   # no 1,200-round FTL-c here
    assert "### target MNIST" in md and "### target Fashion-MNIST" in md
    # uplink: measured bytes × 8 (481 bytes per FbFTL upload: 120 float32 features + a uint8 label), the paper's
    # formula, the paper's own (VGG-16) numbers and its inferred ones
    assert ("| FEMNIST | FbFTL | 60,000 ± 0 (3) | 50,000† | 120 | 4,096‡ | 3.848 | 0.2309 ± 0 (3) | 0.2304 | 6.6 | "
            "1.622 | 1.622 | 9.733 ± 0 (3) |") in md
    assert "| FEMNIST | FL | 10,100 ± 100 (3) |  | 61,706 |  | 1975 | 19.94 ± 0.1975 (3) | 19.75 | 3,216,000 |" in md
    assert "| MNIST | FTL-c | 10,100 ± 100 (3) |  | 11,014 |  | 352.4 | 3.56 ± 0.03524 (3) | 3.524 | 599,000 |" in md
    assert "† inferred, not stated in the paper: one upload per sample" in md
    # accuracy: mean ± std over 3 seeds beside the paper's 85.59 %; the left-out runs (accuracy 0.1) are not in it
    assert "| FEMNIST | FbFTL | 0.8654 ± 0.0016 (3) | 0.8654 ± 0.0016 (3) | 0.8559 | 100 ± 0 (3) | 0.2309 | 0.7924 | 0.1 |" in md
    assert "| MNIST | FbFTL | 0.7574 ± 0.0018 (3) |" in md
    assert "| MNIST | target Fashion-MNIST | 3.120 ± 0.010 (3) | 3.117 | 15.478 |" in md  # label leakage
    # rounds and uplink to the pair's target accuracy, read from the per-round series (FL's synthetic curve first
    # reaches 0.78 at round 10: 100-102 clients × 61,706 float32 × 10 rounds; FbFTL's one upload); a seed that
    # never reaches it is left out (FTL-c on Fashion-MNIST: 2 of 3) and the column of the other pair is dropped
    assert "| source | scheme | first round ≥ 0.78 | uplink to 0.78, Gb |" in md
    assert "| FEMNIST | FL | 10 ± 0 (3) | 1.994 ± 0.01975 (3) |" in md
    assert "| FEMNIST | FbFTL | 20 ± 0 (3) | 0.2309 ± 0 (3) |" in md
    assert "| MNIST | FTL-c | 48 ± 4 (2) | 1.69 ± 0.1022 (2) |" in md
    # claims from the registry (results/fbftl/claims.csv); uplink to the target is censored (log-rank)
    assert ("- S1. FTL-full reaches the target accuracy with less uplink than FL (target MNIST, 0.78): uplink to the "
            "target as a censored outcome") in md and "**inconclusive** — FTL-full: Kaplan–Meier median" in md
    assert ("- B1. FbFTL's uplink ≪ FTL-c's (at least 10× less over the 100 rounds) [target MNIST]: **true by "
            "construction** — saving 93.5 % (threshold 90.0 %)") in md
    assert "- B6. FTL-full's uplink over the 100 rounds equals FL's [target Fashion-MNIST]: **true by construction**" in md
    assert "- S5. FbFTL has the least downlink broadcast [target MNIST]: **met**" in md
    assert ("- S7. FbFTL's final test accuracy equals FTL-c's (within ±2 points; FTL-c: 100 FedAvg rounds, FbFTL: 100 "
            "server epochs on all samples, not the same training) [target Fashion-MNIST]: **not met** — FbFTL 0.757") in md
    assert "- S13. FbFTL's final test accuracy is below FTL-full's [target Fashion-MNIST]: **met**" in md
    assert "- S14. FTL-full's final test accuracy is above FL's [target MNIST]: **inconclusive**" in md
    # the claims file's block: the same verdicts
    text = (root / README).read_text()
    assert text.startswith("# A README\n\n- **003 (FbFTL)**: text.\n") and text.endswith("\n\nThe end.\n")
    line = "- S13. FbFTL's final test accuracy is below FTL-full's [target Fashion-MNIST] [secondary]: **met**"
    assert line + "\n" in text and f"Claims checked by [table.md]({link('results/fbftl/table.md')})" in text
    capsys.readouterr()
    assert main(["fbftl", "--root", str(root), "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def _hash(overrides: list[str], with_hydra: bool = False) -> str:
    """fedrun.config_hash of the job ``overrides`` compose to (as the CLI builds it; no data, no training)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from fedrun.checkpoint import config_hash
    from fedrun.run import prepare

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=with_hydra)
    c = OmegaConf.to_container(cfg, resolve=False)
    hydra_node = c.pop("hydra", None)
    c = OmegaConf.to_container(OmegaConf.create(c), resolve=True)
    if with_hydra:   # a sweep job's config as the run sees it: the hydra node (sweeper params) beside the rest
        c["hydra"] = hydra_node
        assert hydra_node["sweeper"]["params"]["scheme"] == "fl,ftl_full,ftl_c,fbftl"
    prepare(c)
    return config_hash(c)


def test_the_sweep_settings_do_not_change_a_runs_config_hash():
    """hydra.sweeper.params, skip_finished and tracking.experiment name where and how a job runs, not what it runs:
    the hash that skip_finished looks up is the same as before they were added (HEAD's configs: no sweep params,
    skip_finished false, tracking experiment fbftl)."""
    for experiment in ("fbftl_femnist_mnist", "fbftl_mnist_fashion"):
        for scheme in ("fl", "ftl_full", "ftl_c", "fbftl"):
            job = [f"experiment={experiment}", f"scheme={scheme}", "seed=1"]
            before = _hash(job + ["skip_finished=false", "tracking.experiment=fbftl"])
            assert _hash(job) == _hash(job, with_hydra=True) == before


@pytest.mark.parametrize("experiment", ["fbftl_femnist_mnist", "fbftl_mnist_fashion", "fbftl_tuned_femnist_mnist",
                                        "fbftl_tuned_mnist_fashion"])
def test_each_seed_draws_its_own_source_model(experiment):
    """Source training is not reproducible bit for bit across machines and thread counts (fedrun/transfer/source.py):
    one source model for every seed would shift every run of a transfer scheme alike; one per seed averages out."""
    from conftest import compose as compose_job

    for seed in (0, 7):
        job = OmegaConf.to_container(compose_job([f"experiment={experiment}", f"seed={seed}"]), resolve=True)
        assert job["scheme"]["source_seed"] == job["seed"] == seed


def test_the_tuned_sweeps_differ_from_the_fixed_lr_runs_only_by_the_lr_search():
    """experiment=fbftl_tuned_<pair>: FbFTL only, 10 seeds, tracked in fbftl-tuned, and otherwise the FbFTL job of
    experiment=fbftl_<pair> with scheme.tune_lrs set: the report's tuned row compares like with like."""
    from conftest import compose as compose_job

    for pair in ("femnist_mnist", "mnist_fashion"):
        conf = OmegaConf.load(REPO / "conf" / "experiment" / f"fbftl_tuned_{pair}.yaml")
        assert dict(OmegaConf.select(conf, "hydra.sweeper.params")) == {"seed": "0,1,2,3,4,5,6,7,8,9",
                                                                         "scheme": "fbftl"}
        tuned = OmegaConf.to_container(compose_job([f"experiment=fbftl_tuned_{pair}", "scheme=fbftl", "seed=1"]),
                                       resolve=True)
        fixed = OmegaConf.to_container(compose_job([f"experiment=fbftl_{pair}", "scheme=fbftl", "seed=1"]),
                                       resolve=True)
        assert tuned["tracking"]["experiment"] == "fbftl-tuned" and fixed["scheme"]["tune_lrs"] is None
        assert tuned["scheme"]["tune_lrs"] == [0.01, 0.03, 0.1, 0.3]
        tuned["scheme"]["tune_lrs"], tuned["tracking"] = None, fixed["tracking"]
        assert tuned == fixed
    # the report maps the logged text of that list to the tuned row
    assert fbftl.LR_CHOICE[str([0.01, 0.03, 0.1, 0.3])] == "tuned"
