#!/usr/bin/env bash
# The SPD student trained on click labels on Amazon Beauty at CPU scale (issue: the SPD
# student, evidence), evaluated on all 1,118 eval slates next to the non-LLM baselines.
# Every step is resumable: rerun the script and finished steps are skipped.
#
#   bash benchmarks/spd_beauty_clicks_cpu.sh            # writes benchmarks/results/spd-beauty-clicks-cpu/
#
# Scale (chosen to train within 60 minutes on 2 CPU cores): the first 8 of SmolLM2-135M's
# 30 layers, titles cut to 12 tokens, 1,000 training slates, batch 4, one epoch.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
NEG=${NEG:-uniform}
DATA=${DATA:-data-out/beauty-$NEG}
RUN=${RUN:-runs/spd-beauty-clicks-cpu-$NEG}
OUT=${OUT:-benchmarks/results/spd-beauty-clicks-cpu${NEG/uniform/}}
LAYERS=${LAYERS:-8}; ITEM_TOKENS=${ITEM_TOKENS:-12}; SLATES=${SLATES:-1000}; BATCH=${BATCH:-4}
mkdir -p "$OUT"

[ -f "$DATA/manifest.json" ] || $BIN/spdrank data beauty --out "$DATA" --negatives "$NEG" --no-progress

TRAIN=( $BIN/spdrank train --slates "$DATA/train.jsonl" --eval-slates "$DATA/eval.jsonl" --eval-limit 100
        --eval-every 125 --save-every 25 --out "$RUN" --target clicks --head attn
        --layers "$LAYERS" --max-item-tokens "$ITEM_TOKENS" --limit "$SLATES" --batch-size "$BATCH"
        --epochs 1 --lr 2e-4 --head-lr 1e-3 --seed 0 --decoder hungarian )
if [ ! -f "$RUN/train.json" ]; then
  start=$(date +%s)
  "${TRAIN[@]}" --no-progress
  echo $(( $(date +%s) - start )) > "$RUN/wall_s.txt"
fi

EVAL=( $BIN/spdrank eval --slates "$DATA/eval.jsonl" --ranker random --ranker popularity
       --ranker cooccurrence --model "$RUN" --json "$OUT/results.json" --per-slate "$OUT/per_slate.jsonl" --no-progress )
start=$(date +%s)
"${EVAL[@]}" > "$OUT/table.txt"
eval_wall=$(( $(date +%s) - start ))

{
  echo "# SPD student on Amazon Beauty 2014, click labels, CPU scale"
  echo
  machine_lines
  echo "- data: \`spdrank data beauty --negatives $NEG\` (21,245 train / 1,118 eval slates, 50 candidates, history 10)"
  echo "- scale: backbone SmolLM2-135M-Instruct (bundled GGUF Q4_1, dequantized to fp32), first $LAYERS of 30 layers, LoRA r=64 on all linear layers, attention head (2 layers, width 256), titles cut to $ITEM_TOKENS tokens, $SLATES training slates, batch $BATCH, 1 epoch, target = clicks"
  echo "- training wall time: $(cat "$RUN/wall_s.txt" 2>/dev/null || echo '?') s; evaluation wall time: $eval_wall s (all rankers, $(grep -c . "$DATA/eval.jsonl") slates)"
  echo
  echo "Commands:"
  echo
  code_block "bash benchmarks/spd_beauty_clicks_cpu.sh   # NEG=$NEG" "${TRAIN[*]}" "${EVAL[*]}"
  echo
  code_block -f "$OUT/table.txt"
} > "$OUT/report.md"
cat "$OUT/report.md"
