#!/usr/bin/env bash
# How long `spdrank demo` takes from nothing (a fresh --dir), on this machine:
#
#   bash benchmarks/demo_time.sh      # writes benchmarks/results/demo-cpu/ (report.md, demo.log)
#
# The install (`make install`: the venv, the wheels, the bundled backbone's conversion) is not
# timed: it happens once per machine. Everything the demo does is: Beauty build, subset,
# teacher labels, the student's states and training, the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
OUT=${OUT:-benchmarks/results/demo-cpu}
DIR=${DIR:-runs/demo-time}
mkdir -p "$OUT"
rm -rf "$DIR"
# A cache holding only what the install made (the converted backbone), so that nothing a
# previous run fitted (SASRec) is reused.
INSTALLED=${SPDRANK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spdrank}
FRESH=$(mktemp -d)
trap 'rm -rf "$FRESH"' EXIT
ln -s "$(cd "$INSTALLED/backbones" && pwd)" "$FRESH/backbones"
load=$(cut -d' ' -f1-3 /proc/loadavg)
start=$SECONDS
SPDRANK_CACHE=$FRESH "$BIN/spdrank" demo --dir "$DIR" --device cpu > "$OUT/demo.log" 2>&1
wall=$(( SECONDS - start ))
{
  echo "# \`spdrank demo\` from a fresh directory, CPU"
  echo
  echo "One command: \`bash benchmarks/demo_time.sh\` (runs \`spdrank demo --dir $DIR --device cpu\`)"
  echo
  machine_lines
  echo "- load when it started: $load (1, 5, 15 min; 2 cores): above ~0.5, other jobs shared the cores"
  echo "- wall time: $wall s ($(( wall / 60 )) min $(( wall % 60 )) s), the install not included; nothing reused from earlier runs (a fresh spdrank cache but for the install's converted backbone)"
  echo
  echo "The demo's own output, each progress bar at its last state (its results table is in demo-report.md here):"
  echo
  code_block "$(sed 's/.*\r//' "$OUT/demo.log")"
} > "$OUT/report.md"
cp "$DIR/report/report.md" "$OUT/demo-report.md"
echo "spdrank demo: $wall s"
