#!/usr/bin/env bash
# `spdrank demo --tiny` on the code of an earlier commit (REV, default 1ee8fff: main before the
# ranking methods moved into spdrank.methods.base) and on the working tree; prints each run's
# results table without its latencies, then whether the two are identical. Both run as
# `python -m spdrank`, so the earlier code's own entry point is the one that runs.
#
#   bash docs/refactor-check/demo_tiny.sh > docs/refactor-check/demo-tiny.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${REV:-1ee8fff}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git archive "$REV" src | tar -x -C "$WORK"
table() {  # the metrics of every ranker in a bench results.json, latencies left out
  .venv/bin/python - "$1" <<'PY'
import json, sys
rankers = json.load(open(sys.argv[1]))["rankers"]
for name in sorted(rankers):
    metrics = rankers[name]["metrics"]
    cells = " ".join(f"{m}={metrics[m]['mean']:.6f}" for m in sorted(metrics)
                     if isinstance(metrics[m], dict) and metrics[m].get("mean") is not None)
    print(f"{name}: valid={rankers[name]['valid_pct']} {cells}")
PY
}
for side in before after; do
  src=$([ "$side" = before ] && echo "$WORK/src" || echo src)
  OMP_NUM_THREADS=2 PYTHONPATH=$src .venv/bin/python -m spdrank demo --tiny --dir "$WORK/demo-$side" \
    --device cpu > "$WORK/$side.log" 2>&1
  table "$WORK/demo-$side/report/results.json" > "$WORK/$side.txt"
  echo "## $side ($([ "$side" = before ] && echo "$REV" || echo "working tree at $(git rev-parse --short HEAD)"))"
  cat "$WORK/$side.txt"
done
if diff -q "$WORK/before.txt" "$WORK/after.txt" >/dev/null; then echo "IDENTICAL"; else echo "DIFFERENT"; fi
