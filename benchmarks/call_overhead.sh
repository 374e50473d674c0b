#!/usr/bin/env bash
# The work around the prefill of one ranking call, as two commits' code does it: `spdrank
# bench --latency` at N = 50 (rank() slate by slate, each beside a bare prefill of the same
# prompt) on one checkpoint, a 1-layer SmolLM2 student with the paper's head (frozen, trained
# one step: latency does not depend on what a head learned), the code of BEFORE and AFTER run
# in turns, ROUNDS times each, so a slow spell of a shared machine falls on both alike.
#
#   bash benchmarks/call_overhead.sh 98ca5f3 HEAD     # writes benchmarks/results/call-overhead-cpu/
#
# Each commit's code runs from a worktree of it (git worktree, under $SCRATCH) through this
# checkout's .venv with PYTHONPATH set to the worktree's src/; the checkpoint is trained once by
# AFTER's code and read by both (the checkpoint format is the same). report.md: each run's
# median call, bare prefill and their ratio, and the median of the ratios per commit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BEFORE=${1:?usage: bash benchmarks/call_overhead.sh BEFORE AFTER}
AFTER=${2:?usage: bash benchmarks/call_overhead.sh BEFORE AFTER}
BIN=${BIN:-.venv/bin}
ROUNDS=${ROUNDS:-3}; SLATES=${SLATES:-60}; SIZE=${SIZE:-50}
SCRATCH=${SCRATCH:-/tmp/call-overhead}
OUT=${OUT:-benchmarks/results/call-overhead-cpu}
DATA=$SCRATCH/beauty
mkdir -p "$SCRATCH" "$OUT"
declare -A TREE
for rev in "$BEFORE" "$AFTER"; do
  sha=$(git rev-parse --short "$rev")
  TREE[$rev]=$SCRATCH/tree-$sha
  [ -d "${TREE[$rev]}" ] || git worktree add -f --detach "${TREE[$rev]}" "$sha" >/dev/null
done
as_of() { local rev=$1; shift; PYTHONPATH="${TREE[$rev]}/src" OMP_NUM_THREADS=1 "$BIN/spdrank" "$@"; }
[ -s "$DATA/eval.jsonl" ] || as_of "$AFTER" data beauty --out "$DATA" --negatives uniform --candidates "$SIZE" --no-progress
head -n "$SLATES" "$DATA/eval.jsonl" > "$SCRATCH/eval.jsonl"
[ -s "$SCRATCH/student/model/config.json" ] || as_of "$AFTER" train --slates "$DATA/train.jsonl" \
  --out "$SCRATCH/student" --backbone bundled --layers 1 --frozen --head attn --positions "$SIZE" \
  --target clicks --max-steps 1 --batch-size 2 --eval-every 0 --save-every 0 --no-progress
rows=()
for round in $(seq 1 "$ROUNDS"); do
  for rev in "$BEFORE" "$AFTER"; do
    run=$SCRATCH/bench-$(git rev-parse --short "$rev")-$round
    rm -rf "$run"
    as_of "$rev" bench --slates "$SCRATCH/eval.jsonl" --train "$DATA/train.jsonl" --ranker random \
      --model "spd=$SCRATCH/student" --latency --latency-sizes "$SIZE" --latency-slates "$SLATES" \
      --warmup 3 --out "$run" --no-progress >/dev/null
    rows+=( "$("$BIN/python" -c '
import json, sys
row = next(r for r in json.load(open(sys.argv[1]))["latency"] if r["model"] == "spd")
print(sys.argv[2], sys.argv[3], round(row["total_ms"]["median"], 2), round(row["bare_prefill_ms"], 2),
      round(row["overhead"], 4))' "$run/results.json" "$(git rev-parse --short "$rev")" "$round")" )
  done
done
{
  echo "# One ranking call against a bare prefill, two commits' code"
  echo
  echo "\`bash benchmarks/call_overhead.sh $BEFORE $AFTER\` (ROUNDS=$ROUNDS, SLATES=$SLATES, SIZE=$SIZE):"
  echo "\`spdrank bench --latency\` at N = $SIZE, rank() slate by slate over $SLATES Beauty eval slates,"
  echo "each beside a bare prefill of its prompt; a 1-layer SmolLM2 student, the paper's head, frozen;"
  echo "one torch thread; the commits' code in turns."
  echo
  machine_lines
  echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)${NOTE:+; also running: $NOTE}"
  echo
  echo "| commit | round | call, median ms | bare prefill ms | call / prefill |"
  echo "| --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}" | awk '{ printf "| %s | %s | %s | %s | %.3fx |\n", $1, $2, $3, $4, $5 }'
  echo
  printf '%s\n' "${rows[@]}" | "$BIN/python" -c '
import statistics, sys
by = {}
for line in sys.stdin:
    sha, _, call, _, ratio = line.split()
    by.setdefault(sha, []).append((float(call), float(ratio)))
for sha, runs in by.items():
    print(f"- {sha}: median call {statistics.median(c for c, _ in runs):.2f} ms, median ratio "
          f"{statistics.median(r for _, r in runs):.3f}x over {len(runs)} runs")'
} > "$OUT/report.md"
cat "$OUT/report.md"
