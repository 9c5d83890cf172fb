#!/usr/bin/env bash
# What a researcher sees in the MLflow UI after a sweep, checked in headless Chromium.
#
# Usage: scripts/ui_check.sh OUT_DIR        (from anywhere; needs `apt-get install -y chromium` once)
#
# Runs a tiny sweep (4 runs of 2 rounds) in a temp folder, takes the URLs fedrun prints (the sweep's last line
# and `python -m fedrun.tracking ui-url`, what `make ui` prints), starts `mlflow ui` on that store, and saves
# screenshots and the rendered page text of: the runs table (runs.png), one run's chart page (run_metrics.png),
# its overview (run.png), the sweep's parent run (sweep.png), and for the record MLflow's own landing pages
# (home.png, experiment_default.png: the GenAI overview the printed URL avoids). Fails (exit 1) if the runs table
# shows the GenAI overview, folds the runs, or misses a run or a key column, or if the run page has no key charts
# or lists a group of diagnostics before them (fedrun logs the diagnostics only with tracking.diagnostics=true).
# Env: PORT (default 5077), FEDRUN_DATA, UI_CHECK_ARGS (extra overrides for the sweep), KEEP=1 keeps the temp dir
# (REUSE=<that dir> checks its store again without a new sweep).
set -euo pipefail
out=$(realpath -m "${1:?usage: scripts/ui_check.sh OUT_DIR}")
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$repo/.venv/bin}
export PORT=${PORT:-5077}
command -v chromium >/dev/null || { echo "ui_check: needs chromium (apt-get install -y chromium)" >&2; exit 2; }
[ -z "${FEDRUN_DATA:-}" ] && [ -f "$repo/../shared/data/README.md" ] && export FEDRUN_DATA=$(realpath "$repo/../shared/data")
mkdir -p "$out"
work=${REUSE:-$(mktemp -d /tmp/fedrun-ui-check.XXXXXX)}
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || [ -n "${REUSE:-}" ] && echo "ui_check: kept $work" || rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

[ -n "${REUSE:-}" ] && echo "ui_check: the store of $work" || echo "ui_check: sweep in $work (2-6 minutes on 2 cores)"
# shellcheck disable=SC2086
if [ -z "${REUSE:-}" ] && ! "$bin/fedrun" -m hydra/launcher=joblib hydra.launcher.n_jobs=2 scheme=fl_cs,fl_rnd r=0.05,0.1 rounds=2 \
    num_clients=600 eval_every=1 progress=off ${UI_CHECK_ARGS:-} >sweep.log 2>&1; then
  tail -30 sweep.log; echo "ui_check: the sweep failed" >&2; exit 1
fi
"$bin/python" -m fedrun.tracking ui-url | tee ui-url.txt
read -r parent fl_cs < <("$bin/python" - <<'EOF'
from mlflow.tracking import MlflowClient
c = MlflowClient("sqlite:///mlflow.db")
runs = [r for e in c.search_experiments() for r in c.search_runs([e.experiment_id])]
print(next(r.info.run_id for r in runs if r.data.tags.get("fedrun.kind") == "sweep"),
      next(r.info.run_id for r in runs if r.info.run_name.startswith("fl_cs")))
EOF
)
runs_url=$(grep -o 'http://[^ ]*/runs?[^ ]*' ui-url.txt | head -1)
run_url=$(grep -o "this run: *http://[^ ]*/runs/$fl_cs?[^ ]*" sweep.log | awk '{print $NF}')  # as the run printed it
[ -n "$runs_url" ] && [ -n "$run_url" ] || { echo "ui_check: fedrun printed no UI URL" >&2; exit 1; }
base=${runs_url%%/#*}
exp_route=$(echo "$runs_url" | grep -o '/experiments/[0-9]*')
metrics_url=$(echo "$run_url" | sed 's#?#/model-metrics?#')

"$bin/mlflow" ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port "$PORT" >ui.log 2>&1 &
server=$!
for _ in $(seq 1 90); do curl -sf "$base/health" >/dev/null 2>&1 && break; sleep 1; done
curl -sf "$base/health" >/dev/null || { tail -20 ui.log; echo "ui_check: mlflow ui did not start" >&2; exit 1; }

chrome() {  # chrome ARGS... : one headless Chromium page load with a fresh profile
  local prof rc
  prof=$(mktemp -d)
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$prof" --window-size="${WINDOW:-1600,1000}" \
    --run-all-compositor-stages-before-draw --virtual-time-budget="${VT:-12000}" "$@" 2>>chromium.log && rc=0 || rc=$?
  rm -rf "$prof"
  return $rc
}
shoot() {  # shoot NAME URL : OUT/NAME.png and OUT/NAME.txt (the page's text)
  local name=$1 url=$2 try
  for try in 1 2 3; do  # a headless screenshot now and then never settles: try again
    rm -f "$out/$name.png"
    chrome --screenshot="$out/$name.png" "$url" >/dev/null && [ -s "$out/$name.png" ] && break
  done
  # the page's text, in a window tall enough that every chart renders (MLflow draws charts only when in view)
  WINDOW=3000,12000 chrome --dump-dom "$url" >"$work/$name.html" || true
  "$bin/python" - "$work/$name.html" >"$out/$name.txt" <<'EOF'
import html, re, sys
s = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", open(sys.argv[1]).read(), flags=re.S)
print(html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", s))).strip())
EOF
  echo "ui_check: $name: $url -> $out/$name.png"
}
shoot home "$base/"
shoot experiment_default "$base/#$exp_route"
shoot runs "$runs_url"
shoot run "$run_url"
shoot run_metrics "$metrics_url"
shoot sweep "$base/#$exp_route/runs/$parent?workflowType=machine_learning"

"$bin/python" - "$out" <<'EOF'
import re, sys
from pathlib import Path
out = Path(sys.argv[1])
text = {p.stem: p.read_text() for p in out.glob("*.txt")}
problems = []
runs = text["runs"]
if "No data available" in runs or "Traces 0" in runs:
    problems.append("runs table: shows the GenAI overview")
m = re.search(r"(\d+) matching runs", runs)
if not m or int(m.group(1)) != 4:
    problems.append(f"runs table: expected 4 matching runs, found {m.group(0) if m else 'none'}")
for name in ("r=0.05", "r=0.1", "fl_cs", "fl_rnd", "test_accuracy", "epsilon", "uplink_bytes_total",
             "summary/best_test_accuracy", "fedrun: runs and key metrics"):
    if name not in runs:
        problems.append(f"runs table: no {name!r}")
if re.search(r"sweep \d", runs):
    problems.append("runs table: the sweep's parent run is listed (runs folded under it?)")
metrics = text["run_metrics"]
for name in ("Model metrics", "test_accuracy", "epsilon", "uplink_bytes_total"):
    if name not in metrics:
        problems.append(f"run charts: no {name!r}")
if "cost_bits" not in text["run"] or "best test accuracy" not in text["run"]:
    problems.append("run overview: no metric values or no description with the key numbers")
if "best test accuracy" not in text["sweep"]:
    problems.append("sweep run: no description listing its runs")
groups = re.findall(r"((?:Model |System )?\S+) \((\d+)\)", metrics)
print("ui_check: chart groups on the run page, in order:", ", ".join(f"{g} ({n})" for g, n in groups))
if [g for g, _ in groups if g not in ("summary", "Model metrics", "System metrics")]:
    problems.append("run charts: groups of diagnostics (MLflow lists them before the key metrics)")
for p in problems:
    print("ui_check: FAIL:", p)
print("ui_check:", "FAILED" if problems else "OK", f"(screenshots and page text in {out})")
sys.exit(1 if problems else 0)
EOF
