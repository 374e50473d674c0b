#!/usr/bin/env bash
# The non-LLM baselines on the bundled Amazon Beauty 2014 slates, for both negative samplers.
# These rows head every results table: an LLM ranker must beat a popularity count.
#
#   bash benchmarks/baselines_beauty.sh   # writes benchmarks/results/baselines-beauty-{uniform,popularity}/
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
for NEG in uniform popularity; do
  DATA=data-out/beauty-$NEG
  OUT=benchmarks/results/baselines-beauty-$NEG
  mkdir -p "$OUT"
  BUILD=( $BIN/spdrank data beauty --out "$DATA" --negatives "$NEG" --no-progress )
  [ -f "$DATA/manifest.json" ] || "${BUILD[@]}"
  EVAL=( $BIN/spdrank eval --slates "$DATA/eval.jsonl" --ranker random --ranker popularity
         --ranker cooccurrence --json "$OUT/results.json" --no-progress )
  "${EVAL[@]}" > "$OUT/table.txt"
  {
    echo "# Non-LLM baselines on Amazon Beauty 2014 ($NEG negatives)"
    echo
    machine_lines
    echo "- data: 21,245 train / 1,118 eval slates of 50 candidates (target + 49 $NEG negatives), history 10, seed 0; popularity and co-occurrence are counted on the training slates only"
    echo
    code_block "${BUILD[*]}" "${EVAL[*]}"
    echo
    code_block -f "$OUT/table.txt"
  } > "$OUT/report.md"
  cat "$OUT/report.md"
done
