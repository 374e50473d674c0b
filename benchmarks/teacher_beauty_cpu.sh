#!/usr/bin/env bash
# Teachers and their students on Amazon Beauty at CPU scale (issue: the autoregressive teacher).
#
#   bash benchmarks/teacher_beauty_cpu.sh [cooccurrence] [smollm2]
#       # writes benchmarks/results/teacher-beauty-cpu/; the teachers to run (default: both);
#       # the report covers every teacher whose runs are complete
#   REASONING=0 bash benchmarks/teacher_beauty_cpu.sh smollm2
#       # the same without SmolLM2's reasoning-mode labels (its students need only direct mode)
#   SERVERS=2 THREADS=1 bash benchmarks/teacher_beauty_cpu.sh smollm2
#       # two one-thread llama.cpp servers behind one `spdrank teacher` (the fastest on 2 cores)
#
# 1. The bundled SmolLM2-135M-Instruct labels EVAL_N eval slates in direct and in reasoning
#    mode, and the first SMOLLM2_TRAIN_N of the TRAIN_N train slates in direct mode (a slate
#    costs ~15 s on 2 idle cores, ~30 s on one), through llama.cpp's OpenAI-compatible
#    server (the `openai` backend, as a vLLM server would be used). The co-occurrence baseline
#    (`ranker:cooccurrence`, a teacher that carries signal) labels the same slates.
# 2. The teachers' own quality, status counts, decode passes and latency, next to the baselines.
# 3. Per teacher, the SPD student (attention head + Hungarian), FIRST and scalar+argsort, each
#    trained on `teacher` and on `teacher+clicks` targets from the same slates, evaluated on the
#    labelled eval slates: quality, and fidelity to that teacher (Kendall tau, top-1 agreement).
#
# Every step is resumable: labels are appended as they come, finished runs are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
NEG=${NEG:-uniform}
DATA=${DATA:-data-out/beauty-$NEG}
WORK=${WORK:-runs/teacher-beauty-cpu}
OUT=${OUT:-benchmarks/results/teacher-beauty-cpu}
EVAL_N=${EVAL_N:-200}; TRAIN_N=${TRAIN_N:-200}; SMOLLM2_TRAIN_N=${SMOLLM2_TRAIN_N:-50}
ITEM_TOKENS=${ITEM_TOKENS:-12}; REASONING_TOKENS=${REASONING_TOKENS:-512}
LAYERS=${LAYERS:-2}; EPOCHS=${EPOCHS:-1}; BATCH=${BATCH:-2}; LORA_R=${LORA_R:-16}
JOBS=${JOBS:-2}  # student trainings in parallel, one thread each (OpenMP threads stall when shared)
RUN_TEACHERS=( "${@:-cooccurrence smollm2}" ); RUN_TEACHERS=( ${RUN_TEACHERS[*]} )
wants() { [[ " ${RUN_TEACHERS[*]} " == *" $1 "* ]]; }
PORT=${PORT:-8765}; THREADS=${THREADS:-$(nproc)}  # threads per llama.cpp server
SERVERS=${SERVERS:-1}  # llama.cpp servers on PORT, PORT+1, ...: one request each, one spdrank process
# (on 2 cores, SERVERS=2 THREADS=1 labels nearly twice as fast as one server on 2 threads)
REASONING=${REASONING:-1}  # 0: skip SmolLM2's reasoning-mode labels (the slowest part) this time
mkdir -p "$OUT" "$WORK"
start_all=$(date +%s)

[ -f "$DATA/manifest.json" ] || $BIN/spdrank data beauty --out "$DATA" --negatives "$NEG" --no-progress
[ -s "$WORK/eval.jsonl" ] || head -n "$EVAL_N" "$DATA/eval.jsonl" > "$WORK/eval.jsonl"
[ -s "$WORK/train.jsonl" ] || head -n "$TRAIN_N" "$DATA/train.jsonl" > "$WORK/train.jsonl"
[ -s "$WORK/train-smollm2.jsonl" ] || head -n "$SMOLLM2_TRAIN_N" "$WORK/train.jsonl" > "$WORK/train-smollm2.jsonl"

# -- 1. labels ---------------------------------------------------------------------------------
SERVER_PIDS=()
stop_server() {
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}
trap stop_server EXIT
BASE_URLS=()
for i in $(seq 0 $(( SERVERS - 1 ))); do BASE_URLS+=( --base-url "http://127.0.0.1:$(( PORT + i ))/v1" ); done
start_server() {
  [ "${#SERVER_PIDS[@]}" = 0 ] || return 0
  GGUF=$($BIN/python -c 'from spdrank.backbone.gguf import bundled_gguf; print(bundled_gguf())')
  local port
  for i in $(seq 0 $(( SERVERS - 1 ))); do
    port=$(( PORT + i ))
    if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; then
      echo "port $port is already serving: stop that server or set PORT" >&2; exit 1
    fi
    $BIN/python -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$port" \
      --n_ctx 4096 --n_threads "$THREADS" --model_alias smollm2 > "$WORK/llama-server.$i.log" 2>&1 &
    SERVER_PIDS+=($!)
  done
  for i in $(seq 0 $(( SERVERS - 1 ))); do
    port=$(( PORT + i ))
    for _ in $(seq 120); do
      curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && continue 2
      sleep 1
    done
    echo "llama.cpp's server on port $port did not start: see $WORK/llama-server.$i.log" >&2; exit 1
  done
}
done_labels() {  # $1 = label summary: present when a run labelled every selected slate
  [ -f "$1" ] && $BIN/python -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(d["unlabelled"] != 0)' "$1"
}
smollm2_label() {  # $1 = split, $2 = mode
  local dir="$WORK/smollm2-$2" slates="$WORK/$1.jsonl"; mkdir -p "$dir"
  [ "$1" = eval ] || slates="$WORK/$1-smollm2.jsonl"
  done_labels "$dir/$1.summary.json" && return 0
  start_server
  echo "llama.cpp server threads: $THREADS$( [ "$SERVERS" = 1 ] || echo " ($SERVERS servers, one request each)")" > "$dir/$1.threads.txt"
  $BIN/spdrank teacher --slates "$slates" --out "$dir/$1.labels.jsonl" --slates-out "$dir/$1.slates.jsonl" \
    --backend openai \
    "${BASE_URLS[@]}" --model-name smollm2 --mode "$2" --concurrency 1 \
    --timeout 600 --max-item-tokens "$ITEM_TOKENS" --tokenizer bundled --max-failures 0 \
    $( [ "$2" = reasoning ] && echo --max-new-tokens "$REASONING_TOKENS" ) \
    --json "$dir/$1.summary.json" --no-progress
}
cooc_label() {  # $1 = split
  local dir="$WORK/cooccurrence"; mkdir -p "$dir"
  done_labels "$dir/$1.summary.json" && return 0
  $BIN/spdrank teacher --slates "$WORK/$1.jsonl" --out "$dir/$1.labels.jsonl" \
    --slates-out "$dir/$1.slates.jsonl" --backend ranker:cooccurrence --train "$DATA/train.jsonl" --json "$dir/$1.summary.json" --no-progress
}
if wants smollm2; then
  smollm2_label eval direct
  smollm2_label train direct
  [ "$REASONING" = 0 ] || smollm2_label eval reasoning
  stop_server
fi
if wants cooccurrence; then
  cooc_label eval
  cooc_label train
fi
complete() { done_labels "$WORK/$1/eval.summary.json" && done_labels "$WORK/$1/train.summary.json"; }

# -- 2. the teachers next to the baselines --------------------------------------------------------
AR_LABELS=()
for mode in direct reasoning; do
  ! done_labels "$WORK/smollm2-$mode/eval.summary.json" ||
    AR_LABELS+=( --labels "smollm2-$mode=$WORK/smollm2-$mode/eval.labels.jsonl" )
done
TEACHERS_EVAL=( $BIN/spdrank eval --slates "$WORK/eval.jsonl" --train "$DATA/train.jsonl"
  --ranker random --ranker popularity --ranker cooccurrence "${AR_LABELS[@]}"
  --json "$OUT/teachers.json" --no-progress )
"${TEACHERS_EVAL[@]}" > "$OUT/teachers.txt"

# -- 3. students per teacher ---------------------------------------------------------------------
train_student() {  # $1 = teacher dir name, $2 = target, $3 = head
  local run="$WORK/students/$1-$2-$3"
  [ -f "$run/train.json" ] && return 0
  mkdir -p "$WORK/students"
  local t0; t0=$(date +%s)
  OMP_NUM_THREADS=1 $BIN/spdrank train --slates "$WORK/$1/train.slates.jsonl" --out "$run" --target "$2" --head "$3" \
    --layers "$LAYERS" --lora-r "$LORA_R" --lora-alpha "$LORA_R" --max-item-tokens "$ITEM_TOKENS" \
    --batch-size "$BATCH" --epochs "$EPOCHS" --lr 2e-4 --head-lr 1e-3 --eval-every 100000 \
    --save-every 25 --seed 0 --decoder hungarian --no-progress > "$run.log" 2>&1
  echo $(( $(date +%s) - t0 )) > "$run/wall_s.txt"
}
HEADS=(attn first scalar); TARGETS=(teacher teacher+clicks)
STUDENT_TEACHERS=()
wants cooccurrence && complete cooccurrence && STUDENT_TEACHERS+=(cooccurrence)
wants smollm2 && complete smollm2-direct && STUDENT_TEACHERS+=(smollm2-direct)
for T in "${STUDENT_TEACHERS[@]}"; do
  MODELS=()
  for target in "${TARGETS[@]}"; do
    for head in "${HEADS[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
      train_student "$T" "$target" "$head" &
      name=$([ "$head" = attn ] && echo spd || echo "$head")
      MODELS+=( --model "$name-$target=$WORK/students/$T-$target-$head" )
    done
  done
  wait
  for target in "${TARGETS[@]}"; do
    for head in "${HEADS[@]}"; do
      run="$WORK/students/$T-$target-$head"
      [ -f "$run/train.json" ] || { echo "training $run failed: see $run.log" >&2; exit 1; }
    done
  done
  STUDENTS_EVAL=( $BIN/spdrank eval --slates "$WORK/$T/eval.slates.jsonl" --train "$DATA/train.jsonl"
    --ranker random --ranker popularity --ranker cooccurrence --labels "teacher=$WORK/$T/eval.labels.jsonl"
    "${MODELS[@]}" --json "$OUT/students-$T.json" --no-progress )
  "${STUDENTS_EVAL[@]}" > "$OUT/students-$T.txt"
done

# -- report ------------------------------------------------------------------------------------
summary_rows() {
  for f in "$WORK"/smollm2-direct/eval "$WORK"/smollm2-reasoning/eval "$WORK"/smollm2-direct/train \
           "$WORK"/cooccurrence/eval "$WORK"/cooccurrence/train; do
    [ -f "$f.summary.json" ] || continue
    $BIN/python - "$f.summary.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
st = d["statuses"]
name = sys.argv[1].split("/")[-2] + " " + sys.argv[1].split("/")[-1].split(".")[0]
lat = d.get("mean_latency_ms") or 0.0
passes = d.get("mean_decode_passes") or 0.0
print(f"| {name} | {d['selected']} | " + " | ".join(str(st.get(k, 0)) for k in
      ("ok", "wrong_format", "repetition", "missing", "out_of_range")) +
      f" | {passes:.1f} | {lat / 1000:.2f} |")
EOF
  done
}
wall_all=$(( $(date +%s) - start_all ))
{
  echo "# Teachers and students on Amazon Beauty 2014, CPU scale"
  echo
  machine_lines
  echo "- data: \`spdrank data beauty --negatives $NEG\`: the first $EVAL_N eval slates and the first $TRAIN_N train slates ($SMOLLM2_TRAIN_N labelled by SmolLM2; 50 candidates each, history 10); popularity and co-occurrence are counted on all 21,245 training slates"
  echo "- teachers: SmolLM2-135M-Instruct (bundled GGUF Q4_1) through llama.cpp's server (llama-cpp-python[server], greedy; threads: $(cat "$WORK"/smollm2-*/*.threads.txt 2>/dev/null | sort -u | sed 's/.*: //' | paste -sd/ || echo none yet)), titles cut to $ITEM_TOKENS tokens, direct mode (cap 6N+16 new tokens) and reasoning mode (cap $REASONING_TOKENS new tokens); and the co-occurrence baseline as \`ranker:cooccurrence\`. Note: co-occurrence counts include each training slate's own next item, so on TRAIN slates it is a stronger teacher than on eval slates"
  echo "- students: the first $LAYERS of SmolLM2's 30 layers, LoRA r=$LORA_R on all linear layers, titles cut to $ITEM_TOKENS tokens, $TRAIN_N training slates ($SMOLLM2_TRAIN_N for the SmolLM2 teacher), batch $BATCH, $EPOCHS epochs, lr 2e-4 (head 1e-3); spd = attention head + Hungarian, first = FIRST (first-token logits over letter labels, ListNet), scalar = one score per item + argsort (ListNet)"
  echo "- latency: measured on the machine as it was, shared with other jobs (the SmolLM2 labelling runs in the background at low priority); on 2 shared cores the p50/p95 and the teachers' recorded latencies are upper bounds, not idle-machine speeds"
  echo "- wall time of this script (everything not already done): $wall_all s"
  echo
  echo "## Teacher runs"
  echo
  echo "| teacher, split | slates | ok | wrong_format | repetition | missing | out_of_range | decode passes (mean) | latency s (mean) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  summary_rows
  echo
  echo "## The teachers' quality on the $EVAL_N eval slates, next to the baselines"
  echo
  echo "Teacher rows replay the label files: their own answers (invalid ones count against valid% and are scored repaired), decode passes and the latency measured when they ran."
  echo
  code_block -f "$OUT/teachers.txt"
  for T in cooccurrence smollm2-direct; do
    [ -f "$OUT/students-$T.txt" ] || { echo; echo "## Students of $T: not run yet (its labels are incomplete)"; continue; }
    echo
    echo "## Students of $T, on the $EVAL_N eval slates (tau, top1: agreement with $T)"
    echo
    code_block -f "$OUT/students-$T.txt"
  done
  echo
  echo "Commands:"
  echo
  code_block "bash benchmarks/teacher_beauty_cpu.sh ${RUN_TEACHERS[*]}   # NEG=$NEG EVAL_N=$EVAL_N TRAIN_N=$TRAIN_N SMOLLM2_TRAIN_N=$SMOLLM2_TRAIN_N LAYERS=$LAYERS EPOCHS=$EPOCHS" \
    "${TEACHERS_EVAL[*]}" "${STUDENTS_EVAL[*]:-}"
} > "$OUT/report.md"
cat "$OUT/report.md"
