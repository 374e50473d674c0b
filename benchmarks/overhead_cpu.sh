#!/usr/bin/env bash
# The work around the prefill, on this CPU: the latency decomposition of two SPD checkpoints at
# N = 20, 50 and 150 (tokenize, prefill, readout, head, assign, rest; the overhead around the
# prefill in ms and over a bare prefill of the same prompt), median over 100 slates, batch 1.
#
#   bash benchmarks/overhead_cpu.sh     # writes benchmarks/results/overhead-cpu/
#
# The checkpoints read the bundled SmolLM2's first 2 layers, frozen, with two upstream
# features and K = 160 positions (so one checkpoint serves every N), expected-rank decoding
# unless said, trained for one step (latency does not depend on what the head learned):
# - spd-k160: the paper's head (attention over the items, width 256, 2 layers), reading each
#   item's last token through 12-token titles;
# - default-k160: what `spdrank train` builds by default: the history head (candidates attend
#   to each other and to the history items) reading each item's words, matched word by word
#   with the history's (tfidf), through 32-token titles;
# - linear-k160: the fewest operations a ranking can take: a linear map of each item's last
#   token (12-token titles) to its K scores, ordered by a sort of each item's best position
#   (argsort). Its time around the prefill is the floor under any head on this machine.
# Run it alone on the machine: it measures latency. Each dtype in DTYPES gets $OUT/DTYPE/: the
# bench report, and micro-NAME.txt / .json, the stages around the prefill timed alone and
# repeated on one thread (benchmarks/overhead_micro.py: min and median, robust to other load).
# Settings from the environment: BIN, DATA, WORK, OUT, LAYERS, SIZES, SLATES, DTYPES, THREADS
# (torch's threads for the bench; the micro-benchmark always runs on one), REPS, WIDTH (the
# heads' width, 256: `spdrank train`'s default), BENCH (0: the micro-benchmark only), MODELS
# (the checkpoints trained and timed, "spd-k160 default-k160" unless set), DECODERS (the
# bench's quality rows; the latency is each checkpoint's own decoder's).
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
DATA=${DATA:-data-out/beauty-features}
WORK=${WORK:-runs/overhead-cpu}
OUT=${OUT:-benchmarks/results/overhead-cpu}
LAYERS=${LAYERS:-2}; SIZES=${SIZES:-20,50,150}; SLATES=${SLATES:-100}
DTYPES=${DTYPES:-float32 bfloat16}; THREADS=${THREADS:-1}; REPS=${REPS:-300}
WIDTH=${WIDTH:-256}; BENCH=${BENCH:-1}; MODELS=${MODELS:-spd-k160 default-k160}
DECODERS=${DECODERS:-expected_rank}
parse_dry_run benchmarks/overhead_cpu.sh "the script's header" "$@"
# Each checkpoint's flags beyond the shared ones (COMMON, below).
declare -A HEAD=(
  [spd-k160]="--head attn --readout last --max-item-tokens 12 --decoder expected_rank"
  [default-k160]="--decoder expected_rank"
  [linear-k160]="--head linear --readout last --max-item-tokens 12 --decoder argsort"
)
for NAME in $MODELS; do
  [ -n "${HEAD[$NAME]+set}" ] || { echo "MODELS: unknown checkpoint $NAME (known: ${!HEAD[*]})" >&2; exit 2; }
done
[ "$DRY" = 1 ] || mkdir -p "$OUT"

step data "$DATA/manifest.json" \
  "$BIN/spdrank" data beauty --out "$DATA" --features --no-progress
COMMON=(--slates "$DATA/train.jsonl" --limit 8 --target clicks --positions 160 --frozen
  --layers "$LAYERS" --features popularity,cooccurrence --batch-size 4
  --max-steps 1 --eval-every 0 --seed 0 --device cpu --no-progress --head-width "$WIDTH")
BENCH_MODELS=()
for NAME in $MODELS; do
  # shellcheck disable=SC2086  # the head's flags split into words
  step "checkpoint-$NAME" "$WORK/$NAME/train.json" \
    "$BIN/spdrank" train "${COMMON[@]}" --out "$WORK/$NAME" ${HEAD[$NAME]}
  BENCH_MODELS+=(--model "$NAME=$WORK/$NAME")
done
for DTYPE in $DTYPES; do
  [ "$DRY" = 1 ] || mkdir -p "$OUT/$DTYPE"
  [ "$BENCH" = 1 ] && TIMINGS="$OUT/timings.tsv" OMP_NUM_THREADS=$THREADS step "bench-$DTYPE" "$OUT/$DTYPE/report.md" \
    "$BIN/spdrank" bench --slates "$DATA/eval.jsonl" --limit "$SLATES" \
    "${BENCH_MODELS[@]}" --decoders "$DECODERS" --dtype "$DTYPE" \
    --device cpu --latency --latency-sizes "$SIZES" --latency-slates "$SLATES" --seed 0 \
    --out "$OUT/$DTYPE" \
    --title "The work around the prefill: SmolLM2 x $LAYERS layers, $DTYPE, CPU, batch 1, $THREADS thread(s)" \
    --no-progress
  for NAME in $MODELS; do
    TIMINGS="$OUT/timings.tsv" OMP_NUM_THREADS=1 step "micro-$DTYPE-$NAME" "$OUT/$DTYPE/micro-$NAME.json" \
      "$BIN/python" benchmarks/overhead_micro.py --model "$WORK/$NAME" \
      --slates "$DATA/eval.jsonl" --limit "$SLATES" --sizes "$SIZES" --dtype "$DTYPE" \
      --reps "$REPS" --out "$OUT/$DTYPE/micro-$NAME.json"
  done
done
