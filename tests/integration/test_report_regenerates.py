"""Every committed results table and figure regenerates byte-identically from its committed run export alone.

For each report of :data:`fedrun.reports.REPORTS` (``python -m fedrun.report <name>``), its files are built again (no
MLflow) and compared with the committed ones, the claims blocks of docs/results.md included. The same mechanism is then checked
end to end on a synthetic Table III export in a temporary repository: generated twice it gives the same bytes;
``--check`` passes, and fails once a value of the export or a verdict in the claims file changes. Last, the order the registries
promise: every run judging a claim registered before its runs started after the commit that registered it.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import os
import posixpath
import random
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from fedrun import export as ex
from fedrun.report import main, report_files
from fedrun.reports import REPORTS, common
from fedrun.reports.common import README, markers

REPO = Path(__file__).resolve().parents[2]


def link(path: str) -> str:
    """``path`` (relative to the repository) as the claims file links it: relative to the claims file's folder."""
    return posixpath.relpath(path, posixpath.dirname(README) or ".")


_MIXED: dict[str, dict] = {}
_CLAIMED: dict[str, list] = {}   # the report's Report objects that judged claims


@functools.lru_cache(maxsize=None)
def _files(name: str) -> dict[Path, bytes]:
    common.BUILT.clear()
    files = report_files(name, REPO)
    _MIXED[name] = {(rep.name, cell): n for rep in common.BUILT for cell, n in rep.mixed.items()}
    _CLAIMED[name] = [rep for rep in common.BUILT if rep.name == name and getattr(rep, "claimed", None)]
    return files


@pytest.mark.parametrize("name", list(REPORTS))
def test_committed_report_regenerates_byte_identically(name):
    for rel, data in _files(name).items():
        committed = REPO / rel
        assert committed.exists(), f"{rel} is not committed; run python -m fedrun.report {name}"
        assert committed.read_bytes() == data, f"{rel} differs from what the export gives: python -m fedrun.report {name}"


@pytest.mark.parametrize("name", list(REPORTS))
def test_no_cell_pools_two_configurations(name):
    """Two runs whose resolved configs differ (any param but the seed and what does not change results) are two
    cells: no cell of the report holds two configs (FL-RND "on" at η_g = 1 and 3 once shared Table III's cells, the
    η_g = 1 runs dropped as "older repeats")."""
    _files(name)
    assert not _MIXED[name]


def test_every_claims_block_of_the_claims_file_is_a_report_that_writes_it():
    text = (REPO / README).read_text()
    names = re.findall(r"<!-- claims: (\S+) \(generated", text)
    assert names and len(set(names)) == len(names)
    assert sorted(names) == sorted(n for n in REPORTS if Path(README) in _files(n))


# ------------------------------------------------------------------------- a synthetic Table III, end to end
#: the design's η_g per server options and scheme (its runs ran at it; the report reads the same file)
DESIGN_LR = __import__("yaml").safe_load((REPO / "conf/experiment/kerkouche21_table3.yaml").read_text())["server_lr"]

def _synthetic_table3(prefix: Path, seeds=(0, 1, 2), rounds: int = 30) -> None:
    """An export shaped like the Table III sweep's: every (scheme, r, dp, server_opts, seed), with the params,
    tags and summary metrics the report reads and test accuracy every 10 rounds; plus an old run without
    server_opts (the paper's setup) and a FAILED run."""
    rng = random.Random(0)
    runs, points = [], []
    cells = [("fl_std", 1.0)] + [(s, r) for s in ("fl_rnd", "fl_freq", "fl_cs") for r in (0.05, 0.1, 0.2)]
    i = 0
    for scheme, r in cells:
        for dp in ("off", "client"):
            for opts in ("off", "on", None):
                for seed in (seeds if opts is not None else (0,)):
                    i += 1
                    rid = f"{i:032x}"
                    base = {"fl_std": 0.84, "fl_rnd": 0.6, "fl_freq": 0.65, "fl_cs": 0.8}[scheme] + 0.1 * r
                    acc = base - (0.08 if dp == "client" else 0) + (0.03 if opts == "on" else 0) + rng.gauss(0, 0.01)
                    best = 10 * rng.randint(1, rounds // 10)
                    m = math.ceil(r * 114314)
                    run = {"run_id": rid, "experiment": "kerkouche21-table3",
                           "run_name": f"{scheme} r={r:g} {dp} {seed}",
                           "status": "FINISHED", "start_time": 1_700_000_000_000 + 1000 * i,
                           "end_time": 1_700_000_600_000 + 1000 * i,
                           "params.scheme.name": scheme, "params.r": str(r if scheme != "fl_std" else 0.05),
                           "params.seed": str(seed), "params.num_clients": "6000",
                           "tags.scheme": scheme, "tags.dp": dp, "tags.fedrun.num_parameters": "114314",
                           "metrics.summary/best_test_accuracy": acc, "metrics.summary/best_round": float(best),
                           "metrics.summary/cost_bits_at_best": r * 114314 * 32 * best * 0.01,
                           "metrics.summary/uplink_bytes_at_best": 4.0 * m * 60 * best,
                           "metrics.summary/uplink_bytes_final": 4.0 * m * 60 * rounds,
                           "metrics.summary/rounds_completed": float(rounds)}
                    run["params.scheme.server_lr"] = str(DESIGN_LR.get(opts or "paper", {}).get(scheme, 1.0))
                    if opts is not None:
                        run["params.server_opts"] = opts
                    if dp == "client":
                        run.update({"metrics.summary/epsilon_at_best": 0.9, "metrics.summary/epsilon_final": 0.99,
                                    "metrics.dp/noise_multiplier": 1.129, "metrics.dp/clipping_norm": 0.2})
                    runs.append(run)
                    for step in range(10, rounds + 1, 10):
                        points.append((rid, "test_accuracy", step, acc * step / rounds + rng.gauss(0, 0.005)))
    failed = dict(runs[0], run_id=f"{i + 1:032x}", status="FAILED")
    runs.append(failed)
    a, b = ex.encode(runs, points)
    runs_file, metrics_file = ex.paths(prefix)
    runs_file.parent.mkdir(parents=True, exist_ok=True)
    runs_file.write_bytes(a)
    metrics_file.write_bytes(b)


def _root_with_table3(tmp_path: Path) -> Path:
    """A repository-like folder: a synthetic Table III export at its place, the report's text (its template, ending
    in hand-written notes), the paper's words and numbers and the claims file with the block."""
    root = tmp_path / "repo"
    _synthetic_table3(root / "results" / "kerkouche21" / "runs" / "kerkouche21-table3")
    text = (REPO / "results" / "kerkouche21" / "table3.template.md").read_text()
    (root / "results" / "kerkouche21" / "table3.template.md").write_text(text + "\n## Notes\n\nhand-written notes.\n")
    for f in ("claims.csv", "paper_numbers.csv"):   # the paper's words and numbers
        shutil.copy(REPO / "results" / "kerkouche21" / f, root / "results" / "kerkouche21")
    (root / "conf" / "experiment").mkdir(parents=True)  # the design's η_g (server_lr)
    shutil.copy(REPO / "conf" / "experiment" / "kerkouche21_table3.yaml", root / "conf" / "experiment")
    start, end = markers("kerkouche21_table3")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# A README\n\nWhat held:\n\n{start}\nold verdicts\n{end}\n\nThe end.\n")
    return root


def test_a_report_regenerates_from_its_export_alone(tmp_path):
    root = _root_with_table3(tmp_path)
    assert main(["kerkouche21_table3", "--root", str(root)]) == 0
    out = root / "results" / "kerkouche21"
    md, fig = (out / "table3.md").read_text(), (out / "table3_accuracy.svg").read_bytes()
    assert main(["kerkouche21_table3", "--root", str(root), "--check"]) == 0  # built again: the same bytes
    assert (out / "table3_accuracy.svg").read_bytes() == fig and fig.startswith(b"<?xml")

    assert "![test accuracy per round](table3_accuracy.svg)" in md and md.rstrip().endswith("hand-written notes.")
    assert "| FL-STD | 1 | 0.91† |" in md and "† inferred, not stated in the paper" in md
    assert "Cells: 46 expected; 40 with ≥ 3 seeds, 0 with 1–2, 6 without runs." in md  # no momentum-only runs
    assert ("Runs: 141 in the export `results/kerkouche21/runs/kerkouche21-table3.runs.csv.gz`; 140 in the tables "
            "(left out: 1 not matching status = FINISHED)") in md
    # the registry's claims (results/kerkouche21/claims.csv): the synthetic export has seeds 0–2 only, so the primary
    # claims (seeds 1000–1003) have no runs; the secondary ones are decided by the claim test, p × 2 looks
    assert "| P1. With client-level DP (ε = 1), FL-CS at r = 0.05 ends with a higher best test accuracy" in md
    assert "**not attempted** — no runs of FL-CS r = 0.05 server options on, FL-STD r = 1 server options off" in md
    assert ("- S3. FL-CS outperforms FL-RND and FL-FREQ without DP at r = 0.1 [server options off]: **met** — FL-CS "
            "0.803 ± 0.002 (n=3) − FL-RND 0.605 ± 0.008 (n=3)") in md
    assert "Welch df = 2" in md and "× 2 looks" in md and "(the secondary family of 28)" in md
    assert "Code: 0 of these 140 runs were made from a working tree with uncommitted changes" in md
    assert "| scheme | r | server options | server lr | best accuracy | round | Cost r·n·32·Round·C, MB |" in md  # empty columns dropped
    assert "| FL-STD | 1 | server options off | " in md
    assert "| 22.18 | 548.7 | 0.0915 | 0.90 | 0.69 | 0.99 | 1.13 | 0.2 |" in md


def test_check_notices_a_changed_export_and_out_writes_elsewhere(tmp_path, capsys):
    root = _root_with_table3(tmp_path)
    assert main(["kerkouche21_table3", "--root", str(root)]) == 0
    md = (root / "results" / "kerkouche21" / "table3.md").read_bytes()
    assert main(["kerkouche21_table3", "--root", str(root), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "table3.md").read_bytes() == md
    prefix = root / "results" / "kerkouche21" / "runs" / "kerkouche21-table3"
    runs, points = ex.read_export(prefix)
    runs[3]["metrics.summary/best_test_accuracy"] += 0.01
    ex.paths(prefix)[0].write_bytes(ex.encode(runs, points)[0])
    capsys.readouterr()
    assert main(["kerkouche21_table3", "--root", str(root), "--check"]) == 1
    assert "results/kerkouche21/table3.md differs" in capsys.readouterr().err
    assert (root / "results" / "kerkouche21" / "table3.md").read_bytes() == md  # --check writes nothing


def test_readme_verdicts_are_the_claims_and_check_catches_a_hand_edit(tmp_path, capsys):
    """The claims file's block (docs/results.md) is generated from the same claims as the report; a verdict edited by
    hand, or a missing block, is caught."""
    root = _root_with_table3(tmp_path)
    assert main(["kerkouche21_table3", "--root", str(root)]) == 0
    text = (root / README).read_text()
    md = (root / "results" / "kerkouche21" / "table3.md").read_text()
    assert text.startswith("# A README\n\nWhat held:\n\n") and text.endswith("\n\nThe end.\n")
    assert "old verdicts" not in text and f"Claims checked by [table3.md]({link('results/kerkouche21/table3.md')})" in text
    line = "- S3. FL-CS outperforms FL-RND and FL-FREQ without DP at r = 0.1 [server options off]"
    assert line + " [secondary]: **met**\n" in text and line + ": **met** — " in md  # the same verdict in both
    assert text.count("\n- ") == md.split("## The claims")[1].split("\n## ")[0].count("\n- ")
    assert main(["kerkouche21_table3", "--root", str(root), "--check"]) == 0
    (root / README).write_text(text.replace(line + " [secondary]: **met**", line + " [secondary]: **not met**"))
    assert main(["kerkouche21_table3", "--root", str(root), "--check"]) == 1
    assert f"{README} differs from what the export gives" in capsys.readouterr().err
    (root / README).write_text("# A README without the block\n")
    assert main(["kerkouche21_table3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{README} has no claims block for kerkouche21_table3" in err and "\n" not in err


def test_a_missing_export_or_an_unknown_report_is_one_line(tmp_path, capsys):
    root = _root_with_table3(tmp_path)
    shutil.rmtree(root / "results" / "kerkouche21" / "runs")
    assert main(["kerkouche21_table3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedrun report: error:") and "kerkouche21-table3.runs.csv.gz not found" in err
    assert "\n" not in err
    assert main(["table3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no report 'table3'; reports: kerkouche21_table3" in err and "\n" not in err


# ------------------------------------------------------------------- claims registered before the runs judging them
#: what decides a claim (results/README.md's rules): a row whose fields differ here was registered anew
DECISION = ("claim", "config", "comparisons", "value", "test", "bound", "margin", "seeds")
#: the first registry format (aa3bccf, results/correlated/claims.csv): two cells ``left``/``right``, and the values'
#: names before the frame's column names replaced them (2799cf2's amendment: "claim, test, margin and seeds unchanged")
FIRST_FORMAT_VALUES = {"final_accuracy": "final", "uplink_mb": "up_mb"}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def _decision(row: dict) -> dict:
    if "left" in row:
        row = {**row, "comparisons": f"[{row['left']}] - [{row['right']}]",
               "value": FIRST_FORMAT_VALUES.get(row["value"], row["value"])}
    return {k: row[k] for k in DECISION if k in row}


def _history(root: Path, path: str) -> list[tuple[str, int, dict]]:
    """Registry ``path`` in every commit that changed it, oldest first: (commit, its time in s, {id: row})."""
    out = []
    for line in _git(root, "log", "--reverse", "--format=%H %ct", "--", path).stdout.splitlines():
        commit, when = line.split()
        rows = csv.DictReader(io.StringIO(_git(root, "show", f"{commit}:{path}").stdout))
        out.append((commit, int(when), {r["id"]: r for r in rows}))
    return out


def _registered(history: list, row: dict) -> tuple[str, int] | None:
    """(commit, its time in s) of the first commit in ``history`` holding ``row``'s claim with today's decision
    (claim, cells, outcome, test, bound, margin, seeds); None when no commit does."""
    now = _decision(row)
    return next(((commit, when) for commit, when, old in history if row["id"] in old
                 and all(now[k] == v for k, v in _decision(old[row["id"]]).items())), None)


def registered_first(root: Path, reports) -> list[str]:
    """A line per run that judges a claim registered before its runs (a primary claim, or one on confirmatory seeds,
    1000 and up) but started before the commit that first held the claim's registry row as it is now; and per claim
    whose row no commit holds. A secondary claim's cell shared with a primary claim of its report (the registry's
    note says so, e.g. P1's runs at r = 0.05 in paper 000's S41) is checked as the primary claim's."""
    rows = {(r["report"], r["id"]): (str(p.relative_to(root)), r) for p in sorted(root.glob("results/*/claims.csv"))
            for r in csv.DictReader(open(p, newline="", encoding="utf-8"))}
    found, history = [], {}
    for rep in reports:
        checked = [c for c in rep.claimed if c.comps and c.seeds and (c.family == "primary" or min(c.seeds) >= 1000)]
        primary_runs: set = set()
        for c in sorted(checked, key=lambda c: c.family != "primary"):
            path, row = rows[(rep.name, c.id)]
            at = _registered(history.setdefault(path, _history(root, path)), row)
            if at is None:
                found.append(f"{rep.name} {c.id}: no commit of {path} holds this claim as it is now")
                continue
            cells = [rep.typed(cell) for terms, *_ in c.comps for cell, _ in terms]
            runs = pd.concat([rep.match({**cell, rep.seed: tuple(c.seeds)}) for cell in cells]).drop_duplicates("run_id")
            if c.family == "primary":
                primary_runs |= set(runs["run_id"])
            else:
                runs = runs[~runs["run_id"].isin(primary_runs)]
            found += [f"{rep.name} {c.id}: run {run['run_id']} (seed {run[rep.seed]}) started before {at[0][:7]} "
                      f"registered the claim" for _, run in runs.iterrows() if not int(run["start_time"]) > 1000 * at[1]]
    return found


def _full_history() -> bool:
    return _git(REPO, "rev-parse", "--is-shallow-repository").stdout.strip() == "false"


@pytest.mark.parametrize("name", [n for n in REPORTS if n != "tallies"])
def test_confirmatory_runs_started_after_their_claims_were_registered(name):
    """Git history is the evidence of order: every run judging a primary claim (or a claim on seeds 1000 and up)
    started after the commit that first held the claim's registry row as it is now."""
    if not _full_history():
        pytest.skip("needs the project's git history (a full clone)")
    _files(name)
    assert _CLAIMED[name] or name not in ("kerkouche21_table3", "fedsketch", "fbftl", "correlated")
    assert registered_first(REPO, _CLAIMED[name]) == []


def test_a_run_started_before_its_claim_was_registered_is_found(tmp_path):
    """A synthetic Table III with seeds 1000-1003 (runs starting 2023-11-14) in a git repository: with the registry
    committed before them its runs pass; with the registry first committed after them, or a primary claim's margin
    amended after them (an amendment registers the claim anew), each run of the claim is found."""
    root = _root_with_table3(tmp_path)
    prefix = root / "results" / "kerkouche21" / "runs" / "kerkouche21-table3"
    _synthetic_table3(prefix, seeds=(1000, 1001, 1002, 1003))
    registry = root / "results" / "kerkouche21" / "claims.csv"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def commit(date: str) -> None:
        env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = date
        subprocess.run(["git", "add", str(registry)], cwd=root, check=True, env=env)
        subprocess.run(["git", "commit", "-qm", date], cwd=root, check=True, env=env)

    def findings() -> list[str]:
        common.BUILT.clear()
        report_files("kerkouche21_table3", root)
        return registered_first(root, [r for r in common.BUILT if r.name == "kerkouche21_table3"])

    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    commit("2023-01-01T00:00:00Z")
    assert findings() == []
    # P2's margin amended after the runs: P2 is registered at the amendment, its 2 cells × 4 seeds started before it
    registry.write_text(registry.read_text().replace(",magnitude,0.17,0.02,", ",magnitude,0.17,0.03,", 1))
    commit("2024-01-01T00:00:00Z")
    lines = findings()
    assert len(lines) == 8 and all(x.startswith("kerkouche21_table3 P2: run ") for x in lines), lines

    shutil.rmtree(root / ".git")                  # a history where the registry came after every run
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    commit("2024-01-01T00:00:00Z")
    lines = findings()
    assert {x.split(":")[0] for x in lines} == {"kerkouche21_table3 P1", "kerkouche21_table3 P2",
                                                "kerkouche21_table3 P3"} and all("started before" in x for x in lines)
    assert len(lines) == 8 + 8 + 12             # P3: FL-CS on, FL-RND and FL-FREQ off, without DP


def test_every_committed_run_ran_committed_code_of_this_history():
    """Every run of every committed export was made from a clean working tree at a commit of the project's history
    (the export refuses dirty runs unless told otherwise; this checks what was committed)."""
    exports = sorted(REPO.glob("results/*/runs/*.runs.csv.gz"))
    runs = pd.concat([pd.read_csv(p, dtype=str, usecols=["run_id", "tags.git_commit", "tags.git_dirty"])
                      for p in exports])
    assert {str(p.relative_to(REPO)).removesuffix(".runs.csv.gz") for p in exports} == {
        str(e.path) for _, es in REPORTS.values() for e in es}     # every report's exports, no other
    assert (runs["tags.git_dirty"] == "false").all(), runs[runs["tags.git_dirty"] != "false"].head()
    if not _full_history():
        pytest.skip("the commits' ancestry needs the project's git history (a full clone)")
    foreign = [c for c in sorted(set(runs["tags.git_commit"]))
               if _git(REPO, "merge-base", "--is-ancestor", c, "HEAD").returncode != 0]
    assert not foreign, f"runs made from commits outside this history: {foreign}"
