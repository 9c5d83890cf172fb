"""Paper 002's report (fedrun/reports/fedsketch.py) end to end on a synthetic export of both figure sweeps.

The synthetic runs are shaped like the real ones: each is a copy of a committed FedSGD run
(the seed-0 FedSGD τ = 2, 5 runs of results/fedsketch/runs/fedsketch-*: every param, tag and metric a real run
logs, MLflow names) with what the sweep job changes (scheme, its sketch size and decoder, τ, η, seed, split, rounds,
workers per round, bytes, accuracy); the three committed runs themselves are the seed-0 runs of their jobs. Then
``python -m fedrun.report fedsketch --root <tmp>`` builds the markdown, the three figures and README.md's claims
block; ``--check`` passes on what it wrote. No MLflow, no training (seconds).
"""

from __future__ import annotations

import copy
import posixpath
import random
import re
import shutil
from pathlib import Path

import pytest

from fedrun import export as ex
from fedrun.report import main
from fedrun.reports import REPORTS
from fedrun.reports.common import README, markers

REPO = Path(__file__).resolve().parents[2]


def link(path: str) -> str:
    """``path`` (relative to the repository) as the claims file links it: relative to the claims file's folder."""
    return posixpath.relpath(path, posixpath.dirname(README) or ".")
COMMITTED = [REPO / "results" / "fedsketch" / "runs" / f"fedsketch-{split}" for split in ("homogeneous", "heterogeneous")]
D = 61706  # LeNet-5's parameters (tag fedrun.num_parameters)
SEEDS = (0, 1, 2)

# the jobs of conf/experiment/fedsketch_{homogeneous,heterogeneous}.yaml: (scheme, unsketch, (t, k), τ)
SIZES = ((20, 40), (50, 100))
JOBS = {
    "homogeneous": [("fedsgd", None, None, t) for t in (1, 2, 5)]
    + [("sketchedsgd", None, s, 1) for s in SIZES]
    + [("fedsketch", u, s, t) for u in ("privix", "heaprix") for s in SIZES for t in (1, 2, 5)],
    "heterogeneous": [("fedsgd", None, None, t) for t in (1, 5)]
    + [("sketchedsgd", None, s, 1) for s in SIZES]
    + [("fedsketch", u, s, t) for u in ("privix", "heaprix") for s in SIZES for t in (1, 5)]
    + [("fedsketchgate", "privix", (20, 40), 1), ("fedsketchgate", "heaprix", (20, 40), 1),
       ("fedsketchgate", "heaprix", (50, 100), 1)],
}
LR = {"fedsgd": 0.1, "sketchedsgd": 1.0, "fedsketch": 0.1, "fedsketchgate": 0.01}
TARGET = {"fedsgd": "fedrun.schemes.sketch.FedSGD", "sketchedsgd": "fedrun.schemes.sketchedsgd.SketchedSGD",
          "fedsketch": "fedrun.schemes.sketch.FedSketch", "fedsketchgate": "fedrun.schemes.sketch.FedSketchGate"}
# final test accuracy the synthetic runs scatter around: FedSGD per split and τ, the others relative to it.
# Chosen so that the claims have clear verdicts: (50, 100) within 2 points of FedSGD, HEAPRIX above PRIVIX,
# and (unlike the paper) τ = 5 above τ = 1 under heterogeneity
FEDSGD = {("homogeneous", 1): 0.80, ("homogeneous", 2): 0.948, ("homogeneous", 5): 0.976,
          ("heterogeneous", 1): 0.77, ("heterogeneous", 5): 0.952}
OFFSET = {("privix", (50, 100)): -0.008, ("heaprix", (50, 100)): -0.003,
          ("privix", (20, 40)): -0.06, ("heaprix", (20, 40)): -0.03}


def _bytes(scheme: str, unsketch: str | None, size, workers: int) -> tuple[float, float]:
    """(uplink, downlink) bytes of one round, as fedrun's ledger counts them (fedrun/schemes/sketch.py,
    sketchedsgd.py): FedSGD 4d up per participant and the model down to each; FedSKETCH 4tk (+ 4k HEAPRIX) up per
    participant and the same down to all 50; SketchedSGD 4tk + 4k up, 4k to the participants, 8k to all 50."""
    if scheme == "fedsgd":
        return 4.0 * D * workers, 4.0 * D * workers
    t, k = size
    if scheme == "sketchedsgd":
        return (4.0 * t * k + 4 * k) * workers, 4.0 * k * workers + 8.0 * k * 50
    msg = 4.0 * t * k + (4 * k if unsketch == "heaprix" else 0)
    return msg * workers, msg * 50


def _synthetic_runs(rng: random.Random) -> tuple[list[dict], list[tuple[str, str, int, float]]]:
    # the committed seed-0 FedSGD runs at τ = 2, 5 (real runs, real bytes) among the synthetic ones
    real, real_points = [], []
    for path in COMMITTED:
        rs, pts = ex.read_export(path)
        keep = [r for r in rs if r["status"] == "FINISHED" and r.get("params.scheme.name") == "fedsgd"
                and r["params.seed"] == "0" and r["params.local_steps"] in ("2", "5")]
        ids = {r["run_id"] for r in keep}
        real += keep
        real_points += [p for p in pts if p[0] in ids]
    assert len(real) == 3   # homogeneous τ = 2, 5; heterogeneous τ = 5
    template = next(r for r in real if r["experiment"] == "fedsketch-homogeneous")
    by_job = {(r["experiment"], r["params.local_steps"]): r for r in real}
    runs, points, i = list(real), list(real_points), 0
    for split, jobs in JOBS.items():
        experiment = f"fedsketch-{split}"
        for scheme, unsketch, size, tau in jobs:
            for seed in SEEDS:
                if seed == 0 and scheme == "fedsgd" and (experiment, str(tau)) in by_job:
                    continue  # a committed run: the seed-0 run of this job
                i += 1
                rid = f"{i:032x}"
                gate = scheme == "fedsketchgate"
                # SketchedSGD as it ran: η = 1, re-run at 0.3 where η = 1 diverged ((50, 100); heterogeneous)
                lr = 0.3 if scheme == "sketchedsgd" and (split == "heterogeneous" or size == (50, 100)) else LR[scheme]
                rounds, workers = (40, 50) if gate else (80, 25)
                up, down = _bytes(scheme, unsketch, size, workers)
                if scheme == "fedsgd":
                    acc = FEDSGD[(split, tau)]
                elif scheme == "sketchedsgd":
                    acc = 0.3 if split == "homogeneous" else 0.15
                elif gate:
                    acc = FEDSGD[(split, 1)] - 0.005
                else:
                    acc = FEDSGD[(split, tau)] + OFFSET[(unsketch, size)]
                acc = round(acc + rng.gauss(0, 0.003), 4)
                r = copy.deepcopy(template)
                r.update({"run_id": rid, "experiment": experiment, "run_name": f"{scheme}-mnist seed={seed}",
                          "start_time": 1_800_000_000_000 + 200_000 * i, "end_time": 1_800_000_120_000 + 200_000 * i,
                          "params.seed": str(seed), "params.local_steps": str(tau), "params.lr": str(lr),
                          "params.rounds": str(rounds), "params.tracking.experiment": experiment,
                          "params.scheme.name": scheme, "params.scheme._target_": TARGET[scheme],
                          "params.scheme.server_lr": "10.0" if gate else "1.0",
                          "tags.scheme": scheme, "tags.fedrun.config_hash": f"{rng.getrandbits(64):016x}",
                          "tags.mlflow.runName": f"{scheme}-mnist seed={seed}",
                          "metrics.test_accuracy": acc, "metrics.summary/best_test_accuracy": acc + 0.002,
                          "metrics.summary/best_round": 70.0, "metrics.summary/rounds_completed": float(rounds),
                          "metrics.sampling/clients": float(workers), "metrics.uplink_bytes": up,
                          "metrics.downlink_bytes": down, "metrics.uplink_bytes_total": up * rounds,
                          "metrics.downlink_bytes_total": down * rounds, "metrics.summary/uplink_bytes_final": up * rounds,
                          "metrics.summary/downlink_bytes_final": down * rounds,
                          "metrics.summary/uplink_bytes_at_best": up * 70, "metrics.cost_bits": 8 * up})
                if split == "heterogeneous":
                    r.update({"params.partition.name": "shards", "params.partition.classes_per_client": "2",
                              "params.partition.distinct_classes": "False", "tags.partition": "shards"})
                if gate:
                    r.update({"params.sampler._target_": "fedrun.sampling.AllSampler", "params.scheme.hashes": "per_round"})
                if size is not None:
                    r.update({"params.scheme.rows": str(size[0]), "params.scheme.cols": str(size[1]),
                              "params.scheme.num_heavy": "None", "params.scheme.weighting": "uniform"})
                    if scheme != "sketchedsgd":
                        r.update({"params.scheme.unsketch": unsketch, "params.scheme.heavy_values": "exact"})
                    else:
                        r["params.scheme.momentum"] = "0.9"
                runs.append(r)
                for step in range(10, rounds + 1, 10):
                    points.append((rid, "test_accuracy", step, acc * (0.7 + 0.3 * step / rounds)))
    # a diverged run (FAILED, no summary): left out of the tables, counted in the runs line
    failed = copy.deepcopy(runs[-1])
    failed.update({"run_id": f"{i + 1:032x}", "status": "FAILED", "params.seed": "3", "metrics.test_accuracy": ""})
    failed = {k: v for k, v in failed.items() if not k.startswith("metrics.summary/")}
    runs.append(failed)
    # a run that diverged (FAILED with the divergence reason): a result at its η, scored at its last accuracy
    diverged = dict(failed, run_id=f"{i + 2:032x}", **{"params.seed": "4", "metrics.test_accuracy": 0.1,
                                                      "tags.fedrun.failure_reason": "the run diverged at round 20: "
                                                      "NaN/inf in the global model or the training loss"})
    runs.append(diverged)
    return runs, points


def _root(tmp_path: Path, splits=("homogeneous", "heterogeneous")) -> Path:
    """A repository-like folder: the report's text (its template), a README with the block's markers, the synthetic
    exports."""
    root = tmp_path / "repo"
    (root / "results" / "fedsketch").mkdir(parents=True)
    for f in ("figures.template.md", "claims.csv", "paper_numbers.csv"):   # text, quotes, numbers
        shutil.copy(REPO / "results" / "fedsketch" / f, root / "results" / "fedsketch")
    start, end = markers("fedsketch")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# README\n\n- **002 (FedSKETCH)**: text.\n\n{start}\n{end}\n\nThe end.\n")
    runs, points = _synthetic_runs(random.Random(0))
    for split in splits:
        experiment = f"fedsketch-{split}"
        mine = [r for r in runs if r["experiment"] == experiment]
        ids = {r["run_id"] for r in mine}
        a, b = ex.encode(mine, ex.thin([p for p in points if p[0] in ids], 10))
        runs_file, metrics_file = ex.paths(root / "results" / "fedsketch" / "runs" / experiment)
        runs_file.parent.mkdir(parents=True, exist_ok=True)
        runs_file.write_bytes(a)
        metrics_file.write_bytes(b)
    return root


def test_the_report_builds_both_figures_tables_and_claims_from_the_exports(tmp_path, capsys):
    root = _root(tmp_path)
    assert main(["fedsketch", "--root", str(root)]) == 0
    out = root / "results" / "fedsketch"
    md = (out / "figures.md").read_text()
    for svg in ("figure1_homogeneous.svg", "figure2_heterogeneous.svg", "figure2_gate.svg"):
        assert (out / svg).read_bytes().startswith(b"<?xml") and f"]({svg})" in md
    assert not (out / "fedsketch.md").exists()  # the old, unregenerable results are not touched

    # every run placed: 32 cells × 3 seeds and one diverged run; the FAILED run that did not diverge (a crash) left
    # out and said so; the
    # expected η = 1 cells of SketchedSGD that diverged and the retry cells at the next smaller η (here: not
    # synthesized) are counted as without runs
    assert "Cells: 41 expected; 1 with ≥ 4 seeds, 31 with 1–3, 9 without runs." in md   # the diverged seed 4
    assert ("Runs: 98 in the exports `results/fedsketch/runs/fedsketch-homogeneous.runs.csv.gz`, "
            "`results/fedsketch/runs/fedsketch-heterogeneous.runs.csv.gz`; 97 in the tables (left out: 1 not "
            "matching outcome = finished/diverged)") in md
    # the accuracy table: one section per figure, a column triple per τ present in it; FedSGD at every τ
    assert "### Figure 1: homogeneous (i.i.d.)" in md and "### Figure 2: heterogeneous (1–2 classes per worker)" in md
    assert ("| method | decoder | sketch (t, k) | η | τ = 1 · final | τ = 1 · best | τ = 1 · diverged | τ = 2 · final | "
            "τ = 2 · best | τ = 2 · diverged | τ = 5 · final | τ = 5 · best | τ = 5 · diverged |") in md
    fig1 = md.split("### Figure 1")[1].split("### Figure 2")[0]
    assert ("| FedSGD |  |  | 0.1 | 0.799 ± 0.004 (3) | 0.801 ± 0.004 (3) | 0% | 0.947 ± 0.002 (3) | 0.948 ± 0.002 (3) "
            "| 0% | 0.976 ± 0.001 (3) | 0.977 ± 0.001 (3) | 0% |") in fig1  # seed 0 of τ = 2, 5: the committed runs
    assert "| FS | HEAPRIX | (50, 100) | 0.1 | 0.797 ± 0.005 (3) | " in fig1
    assert "| SketchedSGD |  | (20, 40) | 1 | 0.302 ± 0.006 (3) | 0.304 ± 0.006 (3) | 0% | – | – | – | – | – | – |" in fig1
    fig2 = md.split("## Bytes")[0].split("### Figure 2")[1]
    # the diverged seed is in its cell at its last accuracy (0.1), and counted: 1 of 4 diverged
    assert "| FSGATE | HEAPRIX | (50, 100) | 0.01 | 0.596 ± 0.331 (4) | 0.764 ± 0.000 (3) | 25% | – | – | – |" in fig2
    # the bytes table: counted bytes, measured compression beside the paper's 75× / 12×
    assert "| FedSGD |  |  | 9 | 80 | 25 | 246,824 | 1.0× |  | 493.65 | 493.65 |" in md
    assert "| FS | PRIVIX | (20, 40) | 9 | 80 | 25 | 3,200 | 77.1× | 75× | 6.40 | 12.80 |" in md
    assert "| FS | HEAPRIX | (20, 40) | 9 | 80 | 25 | 3,360 | 73.5× | 75× | 6.72 | 13.44 |" in md
    assert "| FSGATE | HEAPRIX | (50, 100) | 4 | 40 | 50 | 20,400 | 12.1× | 12× | 40.80 | 40.80 |" in md

    # claims from the registry (results/fedsketch/claims.csv): the rule's verdicts with their numbers, p × 2 looks
    claims = md.split("## The claims")[1].split("## The paper's numbers")[0]
    assert ("- S24. more local steps hurt under heterogeneity: τ = 1 above τ = 5 (FS-PRIVIX, (20, 40)): **not met** — "
            "τ = 1 0.709 ± 0.002 (n=3) − τ = 5 0.893 ± 0.001 (n=3): difference -0.184 (95 % CI") in claims
    assert "p = 3.3e-05 × 2 looks" in claims and "Welch df = 2," in claims
    assert "- S7. FS-HEAPRIX above FS-PRIVIX (homogeneous, (20, 40), τ = 2): **inconclusive** — HEAPRIX 0.916" in claims
    # "within 2 points" is an equivalence (TOST against ±0.02), not "at most 2 points below"
    assert ("- S1. FS-PRIVIX at (50, 100) within ±2 points of FedSGD at the same τ (homogeneous, τ = 2): "
            "**inconclusive** — FS PRIVIX (50, 100) 0.944 ± 0.003 (n=3) − FedSGD") in claims
    assert "claimed in +0 ± 0.02" in claims and "seeds per cell for 80 % power" in claims
    assert "- S19. SketchedSGD above FS-PRIVIX at the small sketch (20, 40) (homogeneous, τ = 1): **not met**" in claims
    assert "- S21. FS-PRIVIX diverges at (20, 40) with τ = 5 (homogeneous)" in claims
    assert ("- B1. uplink saving of FS-PRIVIX (20, 40) over FedSGD ≥ 1 − 1/75 (75×, counted bytes per worker and "
            "round, Figure 1: homogeneous (i.i.d.)): **true by construction** — saving 98.7 % (threshold 98.7 %)") in claims
    assert ("- B2. uplink saving of FS-HEAPRIX (20, 40) over FedSGD ≥ 1 − 1/75 (75×, counted bytes per worker and "
            "round, Figure 1: homogeneous (i.i.d.)): **false by construction** — saving 98.6 % (threshold 98.7 %)") in claims
    assert ("Paper: \"empirically we see that in the heterogeneous setting, more local updates τ tend to undermine "
            "the learning performance, especially with small sketch size\" (line 199).") in claims
    verdicts = re.findall(r"^- .*?: \*\*([^*]+)\*\* — ", claims, re.M)
    assert len(verdicts) == claims.count("\n- ") == 55  # every registry row of the report
    assert set(verdicts) == {"met", "not met", "inconclusive", "not attempted", "true by construction",
                             "false by construction"}  # counted bytes: decided without a test, never "met"
    assert ("| (20, 40) | uplink compression against the float32 update (measured) | 75× | line 193 (\"these two "
            "choices of sketch size correspond to a 75× and 12× compression ratio\") | read (stated) |") in md

    # the claims file's block: the same verdicts
    text = (root / README).read_text()
    line = next(x for x in claims.splitlines() if x.startswith("- S24. more local steps hurt"))
    assert line.split(": **")[0] + " [secondary]: **not met**\n" in text   # verdict only (the numbers stay there)
    assert f"Claims checked by [figures.md]({link('results/fedsketch/figures.md')})" in text
    assert text.count("\n- ") == 55 + 1  # every claim line, and the README's own item
    assert text.startswith("# README\n\n- **002 (FedSKETCH)**: text.\n\n") and text.endswith("\n\nThe end.\n")

    capsys.readouterr()
    assert main(["fedsketch", "--root", str(root), "--check"]) == 0  # built again: the same bytes
    assert "up to date" in capsys.readouterr().out


def test_with_only_one_figure_exported_the_report_says_which_export_is_missing(tmp_path, capsys):
    """Both sweeps make one report: until both are exported, the report (and so its regeneration test,
    tests/integration/test_report_regenerates.py) cannot be built; the command says which file is missing."""
    root = _root(tmp_path, splits=("homogeneous",))
    assert main(["fedsketch", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "results/fedsketch/runs/fedsketch-heterogeneous.runs.csv.gz not found" in err and "\n" not in err
    assert not (root / "results" / "fedsketch" / "figures.md").exists()


def test_the_report_names_its_two_sweeps_and_every_claim_quotes_the_paper():
    assert [(e.path, e.experiment, e.every) for e in REPORTS["fedsketch"][1]] == [
        ("results/fedsketch/runs/fedsketch-homogeneous", "fedsketch-homogeneous", 10),
        ("results/fedsketch/runs/fedsketch-heterogeneous", "fedsketch-heterogeneous", 10)]
    assert (REPO / README).read_text().count(markers("fedsketch")[0]) == 1
    claims = (REPO / "results" / "fedsketch" / "figures.md").read_text().split("## The claims")[1]
    for line in claims.split("## The paper's numbers")[0].splitlines():
        if line.startswith("- "):  # every claim quotes the paper and says where
            assert re.search(r" Paper: .+ \(lines? \d+[^)]*\)\.", line), line


@pytest.mark.parametrize("experiment", ["fedsketch_homogeneous", "fedsketch_heterogeneous"])
def test_the_report_reads_the_tracking_experiment_of_its_sweep(experiment):
    from omegaconf import OmegaConf

    raw = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    names = [e.experiment for e in REPORTS["fedsketch"][1]]
    assert raw.tracking.experiment in names and str(raw.hydra.sweeper.params.seed) == "0,1,2,3,4"
