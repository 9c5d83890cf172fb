"""Every committed results table and figure regenerates byte-identically from its committed run export alone.

For each spec ``conf/report/<table>.yaml`` whose exports exist under results/, ``python -m fedrun.report
<table>``'s files are built again (no MLflow) and compared with the committed ones. The same mechanism is then
checked end to end on a synthetic Table III export in a temporary folder: generated twice (and in another
folder) it gives the same bytes; ``--check`` passes, and fails once a value of the export changes.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest

from fedrun import export as ex
from fedrun.report import main, report_files, spec_path
from fedrun.reports import readme
from fedrun.reports.spec import load_spec, yaml_load

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted(p.stem for p in (REPO / "conf" / "report").glob("*.yaml"))


def _missing_exports(table: str) -> list[str]:
    """The spec's exports not (wholly) committed under results/."""
    spec = load_spec(spec_path(table, REPO))
    return [e.path for e in spec.exports if not all(p.exists() for p in ex.paths(REPO / e.path))]


@pytest.mark.parametrize("table", SPECS)
def test_committed_report_regenerates_byte_identically(table):
    missing = _missing_exports(table)
    if missing:
        # a report needs every export of its spec (python -m fedrun.report stops at the first missing one, e.g.
        # while only one of paper 002's two sweeps is exported): nothing to regenerate until all are committed,
        # and so no report may be committed before
        spec = load_spec(spec_path(table, REPO))
        assert not (REPO / spec.output).exists(), \
            f"{spec.output} is committed but not its export {', '.join(missing)}: it cannot be regenerated"
        which = "no export" if len(missing) == len(spec.exports) else "not every export"
        pytest.skip(f"conf/report/{table}.yaml: {which} committed under results/ yet (missing {', '.join(missing)})")
    files = report_files(table, REPO)
    for rel, data in files.items():
        committed = REPO / rel
        assert committed.exists(), f"{rel} is not committed; run python -m fedrun.report {table}"
        assert committed.read_bytes() == data, \
            f"{rel} differs from what the export gives: python -m fedrun.report {table}"


# ------------------------------------------------------------------------- a synthetic Table III, end to end
def _synthetic_table3(prefix: Path, seeds=(0, 1, 2), rounds: int = 30) -> None:
    """An export shaped like the Table III sweep's: every (scheme, r, dp, server_opts, seed), with the params,
    tags and summary metrics the spec reads and test accuracy every 10 rounds; plus an old run without
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


def _root_with_table3(tmp_path: Path, figure: str | None) -> Path:
    """A repository-like folder: the real Table III spec, pointed at a synthetic export and a temp output."""
    root = tmp_path / "repo"
    (root / "conf" / "report").mkdir(parents=True)
    raw = yaml_load((REPO / "conf" / "report" / "kerkouche21_table3.yaml").read_text())
    raw["exports"] = [{"path": "results/k/runs/t3", "experiment": "kerkouche21-table3"}]
    raw["output"] = "results/k/table3.md"
    raw["notes"] = "results/k/notes.md"
    if figure:
        raw["figures"][0]["file"] = figure
    else:
        del raw["figures"]
    import yaml

    (root / "conf" / "report" / "t3.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))
    (root / "results" / "k").mkdir(parents=True)
    (root / "results" / "k" / "notes.md").write_text("## Notes\n\nhand-written notes.\n")
    start, end = readme.markers("t3")
    (root / "README.md").write_text(f"# A README\n\nWhat held:\n\n{start}\nold verdicts\n{end}\n\nThe end.\n")
    _synthetic_table3(root / "results" / "k" / "runs" / "t3")
    return root


@pytest.mark.parametrize("figure", ["acc.svg", "acc.png"])
def test_a_report_regenerates_from_its_export_alone(tmp_path, figure):
    root = _root_with_table3(tmp_path, figure)
    assert main(["t3", "--root", str(root)]) == 0
    md = (root / "results" / "k" / "table3.md").read_text()
    fig = (root / "results" / "k" / figure).read_bytes()
    assert main(["t3", "--root", str(root), "--check"]) == 0  # built again: the same bytes
    assert (root / "results" / "k" / figure).read_bytes() == fig

    assert f"![test accuracy per round]({figure})" in md and md.rstrip().endswith("hand-written notes.")
    assert "| FL-STD | 1 | 0.91† |" in md and "† inferred, not stated in the paper" in md
    assert "Cells: 40 expected; 40 with ≥ 3 seeds, 0 with 1–2, 0 without runs." in md
    assert ("Runs: 141 in the export `results/k/runs/t3.runs.csv.gz`; 140 in the tables (left out: 1 not matching "
            "status = FINISHED)") in md
    # the claims read each server-options group; with 3 seeds and clear gaps they are decided
    assert "- with DP, FL-CS at r = 0.05 beats FL-STD-DP [server options on]: **not met**" in md
    assert "- FL-CS outperforms FL-RND and FL-FREQ without DP at r = 0.05 [server options off]: **met**" in md
    assert "[paper's setup]: **inconclusive (fewer than 3 seeds)**" in md
    assert "| scheme | r | server options | best accuracy | round | Cost r·n·32·Round·C, MB |" in md  # drop_empty
    assert "| FL-STD | 1 | server options off | " in md
    assert "| 22.18 | 548.7 | 0.0915 | 0.90 | 0.69 | 0.99 | 1.13 | 0.2 |" in md



def test_check_notices_a_changed_export_and_out_writes_elsewhere(tmp_path, capsys):
    root = _root_with_table3(tmp_path, None)
    assert main(["t3", "--root", str(root)]) == 0
    md = (root / "results" / "k" / "table3.md").read_bytes()
    assert main(["t3", "--root", str(root), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "table3.md").read_bytes() == md
    prefix = root / "results" / "k" / "runs" / "t3"
    runs, points = ex.read_export(prefix)
    runs[3]["metrics.summary/best_test_accuracy"] += 0.01
    ex.paths(prefix)[0].write_bytes(ex.encode(runs, points)[0])
    capsys.readouterr()
    assert main(["t3", "--root", str(root), "--check"]) == 1
    assert "results/k/table3.md differs" in capsys.readouterr().err
    assert (root / "results" / "k" / "table3.md").read_bytes() == md  # --check writes nothing


def test_readme_verdicts_are_the_claims_and_check_catches_a_hand_edit(tmp_path, capsys):
    """README.md's claims block is generated from the same claims as the report; a verdict edited by hand, or a
    missing block, is caught."""
    root = _root_with_table3(tmp_path, None)
    assert main(["t3", "--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    md = (root / "results" / "k" / "table3.md").read_text()
    assert text.startswith("# A README\n\nWhat held:\n\n") and text.endswith("\n\nThe end.\n")
    assert "old verdicts" not in text and "Claims checked by [table3.md](results/k/table3.md)" in text
    line = "- with DP, FL-CS at r = 0.05 beats FL-STD-DP [server options on]: **not met**"
    assert line + "\n" in text and line + " — " in md  # the same verdict in both (the numbers in the report)
    assert text.count("\n- ") == md.split("## The paper's claims")[1].split("## ")[0].count("\n- ")
    assert main(["t3", "--root", str(root), "--check"]) == 0
    (root / "README.md").write_text(text.replace(line, line.replace("**not met**", "**met**")))
    assert main(["t3", "--root", str(root), "--check"]) == 1
    assert "README.md differs from what the export gives" in capsys.readouterr().err
    (root / "README.md").write_text("# A README without the block\n")
    assert main(["t3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "README.md has no claims block for t3" in err and "\n" not in err


def test_every_spec_with_claims_has_its_block_in_the_readme():
    text = (REPO / "README.md").read_text()
    with_claims = [t for t in SPECS if load_spec(spec_path(t, REPO)).claims]
    assert with_claims and sorted(readme.names_in(text)) == sorted(with_claims)


def test_a_missing_export_or_bad_spec_is_one_line(tmp_path, capsys):
    root = _root_with_table3(tmp_path, None)
    shutil.rmtree(root / "results" / "k" / "runs")
    assert main(["t3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedrun report: error:") and "results/k/runs/t3.runs.csv.gz not found" in err
    assert "\n" not in err
    spec = root / "conf" / "report" / "t3.yaml"
    spec.write_text(spec.read_text().replace("rows:\n  - scheme\n  - r\n", "rows:\n  - scheme\n  - ratio\n", 1))
    assert main(["t3", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "t3.yaml: tables[0].rows: 'ratio' is not a dim" in err and "\n" not in err


# ------------------------------------------------------------------- tables made by a script from committed data
def test_the_script_made_tables_regenerate_from_their_committed_data(load_script):
    """The two results tables that are analyses of committed run data rather than spec reports: FL-STD-DP read
    the paper's way (scripts/kerkouche21_stopping.py, from Table III's and the model-size sweep's exports) and
    the privacy audit (scripts/audit_table.py, from its committed records)."""
    import json

    from fedrun.export import load

    stopping = load_script("kerkouche21_stopping")
    out = REPO / "results" / "kerkouche21"
    text = stopping.render(stopping.rows(load(stopping.EXPORTS)))
    assert text == (out / "fl_std_dp_stopping.md").read_text(), \
        "python scripts/kerkouche21_stopping.py --out results/kerkouche21/fl_std_dp_stopping.md"
    audit = load_script("audit_table")
    assert audit.render(json.loads((out / "audit_runs.json").read_text())) == (out / "audit.md").read_text(), \
        "python scripts/audit_table.py"
