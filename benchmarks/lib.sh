# Shared by the benchmark scripts: where a result came from (date, commit, machine).
machine_lines() {
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (+ uncommitted changes in src/)')"
  echo "- machine: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo 'no GPU')"
}

# A fenced block: each argument a line (commands), or a file's content with `code_block -f FILE`.
code_block() {
  echo '```'
  if [ "$1" = "-f" ]; then cat "$2"; else printf '%s\n' "$@"; fi
  echo '```'
}

# print_command CMD...: CMD as one line that a shell (or Python's shlex) reads back as CMD.
print_command() {
  local line
  printf -v line '%q ' "$@"
  echo "${line% }"
}

# parse_dry_run SCRIPT SETTINGS_DOC [ARG]: DRY=1 for --dry-run, DRY=0 for nothing; any other
# argument is a usage error (exit 2) naming where the script's settings are documented.
parse_dry_run() {
  local script=$1 doc=$2; shift 2
  DRY=0
  case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "usage: bash $script [--dry-run]  (settings: environment variables, see $doc)" >&2; exit 2 ;;
  esac
}

# parse_modes SCRIPT SETTINGS_DOC [ARG...]: the GPU scripts' arguments: DRY=1 for --dry-run,
# SMOKE=1 for --smoke (together: the smoke run's commands), each 0 when absent; anything else
# is a usage error (exit 2).
parse_modes() {
  local script=$1 doc=$2 arg; shift 2
  DRY=0; SMOKE=0
  for arg in "$@"; do
    case $arg in
      --dry-run) DRY=1 ;;
      --smoke) SMOKE=1 ;;
      *) echo "usage: bash $script [--smoke] [--dry-run]  (settings: environment variables, see $doc)" >&2; exit 2 ;;
    esac
  done
}

# -- the smoke runs (--smoke) -----------------------------------------------------------------
#
# A GPU script run with --smoke runs every one of its steps, on a CPU, at toy scale: a tiny
# random Qwen3 saved as a model folder with SmolLM2's tokenizer (benchmarks/tiny_backbone.py)
# stands for every backbone, each split keeps its first $SLATES slates, and every size (slate
# length, batch, steps, rank, queries) is small. Its commands are the real run's, with only
# the sizes, the backbone and the device differing (tests/benchmarks/test_gpu_smoke.py holds
# them to it), so a flag, a path or a family a step cannot read fails here, on the CPU, and not
# minutes into the GPU's only lent quarter hour.

# smoke_backbone FOLDER: make the tiny Qwen3 model folder unless it is there.
smoke_backbone() {
  if [ "$DRY" = 1 ]; then print_command "$BIN/python" benchmarks/tiny_backbone.py --family qwen3 --out "$1"; return 0; fi
  "$BIN/python" benchmarks/tiny_backbone.py --family qwen3 --out "$1"
}

# smoke_cut DIR: with --smoke, keep the first $SLATES slates of each *.jsonl in DIR, in place.
smoke_cut() {
  [ "${SMOKE:-0}" = 1 ] || return 0
  if [ "$DRY" = 1 ]; then echo "# smoke: the first $SLATES slates of each $1/*.jsonl kept"; return 0; fi
  local f
  for f in "$1"/*.jsonl; do
    [ -e "$f" ] || continue  # the step that writes DIR left for a later run (ONLY)
    [ "$(wc -l < "$f")" -le "$SLATES" ] || { head -n "$SLATES" "$f" > "$f.tmp" && mv "$f.tmp" "$f"; }
  done
}

# smoke_trec FROM TO: with --smoke, the TREC DL folders of FROM in TO, each retrieve-results
# file cut to its first $SLATES queries (the judgements copied whole).
smoke_trec() {
  if [ "$DRY" = 1 ]; then echo "# smoke: the first $SLATES queries of each TREC DL file of $1 in $2"; return 0; fi
  "$BIN/python" - "$1" "$2" "$SLATES" <<'EOF'
import json, shutil, sys
from pathlib import Path
source, target, keep = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for path in source.glob("trec-dl*/*"):
    out = target / path.relative_to(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    if path.name.startswith("retrieve_results") and path.suffix == ".json":
        out.write_text(json.dumps(json.loads(path.read_text())[:keep]))
    elif path.is_file():
        shutil.copyfile(path, out)
EOF
}

# gpu_estimate SCRIPT NAME...: benchmarks/gpu_estimate.py's table of what each step of SCRIPT
# (gpu.sh, gpu_latency.sh) will cost on $ESTIMATE_DEVICE (default h200), with the settings named
# by NAME... as they stand; a step that will not fit the device's memory (or that alone
# outlasts $BUDGET_S seconds, when set) stops the script here, exit 1, unless FIT_CHECK=0. Each
# step's estimated seconds go to $PLAN (default $WORK/estimate.tsv), which `step` weighs
# against the budget. The estimator needs only Python's standard library, so a dry run prints
# the table without the environment.
gpu_estimate() {
  local script=$1 name py=$BIN/python rc=0 args=(); shift
  [ -x "$py" ] || py=python3
  for name in "$@"; do args+=( "$name=${!name:-}" ); done
  [ "${SMOKE:-0}" = 0 ] || args+=( --tiny qwen3 )
  PLAN=${PLAN:-$WORK/estimate.tsv}
  if [ "${DRY:-0}" = 0 ]; then rm -f "$PLAN"; args+=( --plan "$PLAN" ); fi
  "$py" benchmarks/gpu_estimate.py "$script" --device "${ESTIMATE_DEVICE:-h200}" "${args[@]}" || rc=$?
  case $rc in
    0) ;;
    1) if [ "${FIT_CHECK:-1}" = 0 ]; then echo "== FIT_CHECK=0: running it anyway"; else exit 1; fi ;;
    3) echo "== no estimate (the line above says why): the steps run unestimated" ;;
    *) exit "$rc" ;;
  esac
}

# require_cuda BIN: stop unless the torch in BIN sees a CUDA device.
require_cuda() {
  "$1/python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' || {
    echo "the torch in $1 sees no CUDA device (a CPU build?): install a CUDA build of torch" >&2
    exit 1
  }
}

# within_budget NAME: whether step NAME's estimate (in $PLAN) ends within $BUDGET_S seconds of
# $start_all; true without a budget or an estimate (CPU steps are not estimated). Says why not.
within_budget() {
  [ -n "${BUDGET_S:-}" ] && [ -s "${PLAN:-}" ] || return 0
  local est elapsed=$(( SECONDS - ${start_all:-0} ))
  est=$(awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$PLAN")
  [ -n "$est" ] || return 0
  if [ $(( elapsed + est )) -gt "$BUDGET_S" ]; then
    echo "== $1: not started: its estimated $est s after $elapsed s would end past BUDGET_S=$BUDGET_S;" \
      "run the script again with the same settings to continue from this step"
    return 1
  fi
}

# step NAME DONE CMD...: run CMD unless the file DONE exists; print its wall time and append
# "NAME<tab>seconds" to $TIMINGS (default $OUT/timings.tsv). With $ONLY set (step names,
# space-separated), a step not named there is left for a later run. With DRY=1, only print CMD. With
# $BUDGET_S set, a step whose estimate in $PLAN would end past BUDGET_S seconds after
# $start_all is not started: the script exits 75 saying so, and a rerun (its finished steps
# skipped, the budget counted afresh) continues from that step.
step() {
  local name=$1 done=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    [ "${DRY:-0}" = 1 ] || echo "== $name: not in ONLY, left for a later run"
    return 0
  fi
  if [ "${DRY:-0}" = 1 ]; then print_command "$@"; return 0; fi
  if [ -e "$done" ]; then echo "== $name: already done ($done)"; return 0; fi
  within_budget "$name" || exit 75
  echo "== $name: $*"
  local t0=$SECONDS
  "$@"
  printf '%s\t%s\n' "$name" $(( SECONDS - t0 )) >> "${TIMINGS:-$OUT/timings.tsv}"
  echo "== $name: $(( SECONDS - t0 )) s"
}

# -- the ablations (benchmarks/ablation_*.sh) ------------------------------------------------
#
# Each ablation trains the SPD students it compares and runs `spdrank bench` once over all of
# them on the same eval slates, with paired differences against a reference row. The students
# learn from the co-occurrence baseline as a teacher (`ranker:cooccurrence`, counted on all
# training slates): a teacher with signal that labels thousands of slates in seconds on a CPU.
#
# The settings, in ablation_setup, are shared and each can be set from the environment. The
# defaults are CPU-sized: a LoRA step on one ~1,000-token slate (50 candidates, titles cut to
# 12 tokens) takes ~1.1 s at 4 layers on a 2-core machine, so 800 training slates, one epoch,
# cost ~15 min per LoRA run (~5 min frozen; time grows with the layers), two runs at a time
# on 2 cores; the bench over 200 eval slates takes a few minutes. On a GPU: DEVICE=cuda
# DTYPE=bfloat16 and larger TRAIN_N, EVAL_N, LAYERS, BATCH (and JOBS=1 on one GPU).
#
# Runs live in $WORK/runs/, named by what the ablations vary plus a checksum of the whole
# training command: an identical command (from any of the scripts, or a rerun) reuses a
# finished run and resumes an interrupted one, and any other setting trains a new run. So the
# attention-head, teacher-target, LoRA run at $LAYERS layers is trained once for all four.

# ablation_setup NAME [--dry-run]: the settings; NAME names the results folder.
ablation_setup() {
  ABLATION=$1; shift
  parse_dry_run "benchmarks/ablation_$ABLATION.sh" "benchmarks/lib.sh" "$@"
  BIN=${BIN:-.venv/bin}
  NEG=${NEG:-uniform}                      # negatives of `spdrank data beauty`: uniform | popularity
  DATA=${DATA:-data-out/beauty-$NEG}
  WORK=${WORK:-runs/ablation-$NEG}
  OUT=${OUT:-benchmarks/results/ablation-$ABLATION}
  TRAIN_N=${TRAIN_N:-800}; EVAL_N=${EVAL_N:-200}     # the first N slates of train / eval
  BACKBONE=${BACKBONE:-bundled}            # bundled: SmolLM2-135M-Instruct, 30 layers
  LAYERS=${LAYERS:-4}; LORA_R=${LORA_R:-64}
  ITEM_TOKENS=${ITEM_TOKENS:-12}; QUERY_TOKENS=${QUERY_TOKENS:-512}
  TARGET=${TARGET:-teacher}                # the target of every run whose target is not varied
  EPOCHS=${EPOCHS:-1}; BATCH=${BATCH:-4}; LR=${LR:-2e-4}; HEAD_LR=${HEAD_LR:-1e-3}; SEED=${SEED:-0}
  DEVICE=${DEVICE:-cpu}; DTYPE=${DTYPE:-float32}
  JOBS=${JOBS:-2}; THREADS=${THREADS:-1}   # trainings at once, threads each (OpenMP threads stall on shared cores)
  BASELINES=${BASELINES-random popularity cooccurrence}  # rows for context; empty for none
  BOOTSTRAP=${BOOTSTRAP:-2000}
  TIMINGS=$OUT/timings.tsv
  START=$SECONDS
  if [ "$DRY" = 0 ]; then
    [ -x "$BIN/spdrank" ] || { echo "no $BIN/spdrank: run \`make install\` (or set BIN)" >&2; exit 1; }
    mkdir -p "$OUT" "$WORK/data" "$WORK/cooccurrence" "$WORK/runs"
  fi
}

# subset SRC N DST: the first N slates of SRC as DST, unless DST exists.
subset() {
  if [ "$DRY" = 1 ]; then echo "head -n $2 $1 > $3"; return 0; fi
  [ -s "$3" ] || { head -n "$2" "$1" > "$3.tmp" && mv "$3.tmp" "$3"; }
}

# ablation_data: the Beauty slates, their first TRAIN_N train and EVAL_N eval slates, and those
# labelled by the co-occurrence teacher (counted on all training slates). Sets TRAIN_SLATES and
# EVAL_SLATES, the labelled subsets every run trains and is evaluated on.
ablation_data() {
  step data "$DATA/manifest.json" \
    "$BIN/spdrank" data beauty --out "$DATA" --negatives "$NEG" --no-progress
  local split n labels
  for split in train eval; do
    n=$TRAIN_N; [ "$split" = train ] || n=$EVAL_N
    subset "$DATA/$split.jsonl" "$n" "$WORK/data/$split-$n.jsonl"
    labels=$WORK/cooccurrence/$split-$n
    step "teacher-$split" "$labels.slates.jsonl" \
      "$BIN/spdrank" teacher --slates "$WORK/data/$split-$n.jsonl" --out "$labels.labels.jsonl" \
      --slates-out "$labels.slates.jsonl" --backend ranker:cooccurrence --train "$DATA/train.jsonl" \
      --json "$labels.summary.json" --no-progress
  done
  TRAIN_SLATES=$WORK/cooccurrence/train-$TRAIN_N.slates.jsonl
  EVAL_SLATES=$WORK/cooccurrence/eval-$EVAL_N.slates.jsonl
}

# train_command TARGET ADAPT HEAD LAYERS: sets TRAIN_CMD, the `spdrank train` command of that
# student (ADAPT: lora | frozen) with the shared settings, and RUN, its run directory.
train_command() {
  local target=$1 adapt=$2 head=$3 layers=$4
  TRAIN_CMD=( "$BIN/spdrank" train --slates "$TRAIN_SLATES" --target "$target" --head "$head"
    --backbone "$BACKBONE" --layers "$layers" --max-item-tokens "$ITEM_TOKENS"
    --max-query-tokens "$QUERY_TOKENS" --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR"
    --head-lr "$HEAD_LR" --seed "$SEED" --device "$DEVICE" --dtype "$DTYPE" --save-every 25 )
  case $adapt in
    lora) TRAIN_CMD+=( --lora-r "$LORA_R" --lora-alpha "$LORA_R" ) ;;
    frozen) TRAIN_CMD+=( --frozen ) ;;
    *) echo "backbone adaptation: lora or frozen, not $adapt" >&2; return 1 ;;
  esac
  # The checksum leaves out the executable's path: the same command from another env is the same run.
  RUN=$WORK/runs/$target-$adapt-$head-L$layers-$(printf '%s\n' "${TRAIN_CMD[@]:1}" | cksum | cut -d' ' -f1)
  TRAIN_CMD+=( --out "$RUN" --no-progress )
}

# run_of "TARGET ADAPT HEAD LAYERS": that student's run directory.
run_of() {
  train_command $1
  echo "$RUN"
}

# train_once TARGET ADAPT HEAD LAYERS: train that student unless it finished; its output goes
# to RUN.log and each attempt's wall time to RUN.wall.tsv.
train_once() {
  train_command "$@"
  if [ "$DRY" = 1 ]; then print_command "${TRAIN_CMD[@]}"; return 0; fi
  OMP_NUM_THREADS=$THREADS TIMINGS=$RUN.wall.tsv \
    step "train $(basename "$RUN")" "$RUN/train.json" "${TRAIN_CMD[@]}" >> "$RUN.log" 2>&1
}

# train_all SPEC...: train_once each "TARGET ADAPT HEAD LAYERS", $JOBS at a time, in the order
# given (longest first keeps the cores busy). Fails naming the log of a run that did not finish.
train_all() {
  local spec run runs=()
  for spec in "$@"; do
    run=$(run_of "$spec")
    runs+=( "$run" )
    if [ "$DRY" = 1 ]; then train_once $spec; continue; fi
    if [ -f "$run/train.json" ]; then echo "== train $(basename "$run"): already done"; continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    echo "== train $(basename "$run"): started, log in $run.log"
    train_once $spec &
  done
  [ "$DRY" = 1 ] && return 0
  wait
  for run in "${runs[@]}"; do
    [ -f "$run/train.json" ] || { echo "training $run did not finish: see $run.log" >&2; return 1; }
  done
}

# ablation_bench TITLE VARIES REFERENCE DECODERS NAME=RUN...: `spdrank bench` once over the
# students (and $BASELINES) on EVAL_SLATES, alone on the machine since it measures latency,
# into $OUT; its report opens with the scale, the runs and every command of the script. A
# report from another bench command (other runs, other settings) is redone, never kept.
ablation_bench() {
  local title=$1 varies=$2 reference=$3 decoders=$4; shift 4
  local args=() name
  for name in $BASELINES; do args+=( --ranker "$name" ); done
  for name in "$@"; do args+=( --model "$name" ); done
  local preamble=$WORK/ablation-$ABLATION.preamble.md
  local bench=( "$BIN/spdrank" bench --slates "$EVAL_SLATES" --train "$DATA/train.jsonl"
    "${args[@]}" --decoders "$decoders" --reference "$reference" --bootstrap "$BOOTSTRAP"
    --seed "$SEED" --device "$DEVICE" --dtype "$DTYPE" --warmup 1 --out "$OUT" --title "$title"
    --preamble "$preamble" --no-progress )
  if [ "$DRY" = 0 ]; then
    [ "$(cat "$OUT/command.txt" 2>/dev/null)" = "$(print_command "${bench[@]}")" ] || rm -f "$OUT/report.md"
    [ -e "$OUT/report.md" ] || ablation_preamble "$varies" "$@" > "$preamble"
  fi
  step bench "$OUT/report.md" "${bench[@]}"
  [ "$DRY" = 1 ] || { print_command "${bench[@]}" > "$OUT/command.txt"; cat "$OUT/report.md"; }
}

# ablation_preamble VARIES NAME=RUN...: the report's opening, markdown: what varies, the data,
# the students' shared settings, each run's steps and wall time, the commands.
ablation_preamble() {
  local varies=$1; shift
  local env="NEG=$NEG TRAIN_N=$TRAIN_N EVAL_N=$EVAL_N LAYERS=$LAYERS LORA_R=$LORA_R ITEM_TOKENS=$ITEM_TOKENS EPOCHS=$EPOCHS BATCH=$BATCH TARGET=$TARGET DEVICE=$DEVICE DTYPE=$DTYPE${HEADS:+ HEADS='$HEADS'}${DECODERS:+ DECODERS=$DECODERS}${LAYERS_LIST:+ LAYERS_LIST='$LAYERS_LIST'}"
  echo "One command: \`$env bash benchmarks/ablation_$ABLATION.sh\`"
  echo
  echo "- varies: $varies; everything else is the same for every student"
  machine_lines
  echo "- data: the first $TRAIN_N train and the first $EVAL_N eval slates of \`spdrank data beauty --negatives $NEG\` (50 candidates, history 10)"
  echo "- teacher: the co-occurrence baseline (\`spdrank teacher --backend ranker:cooccurrence\`, counted on all training slates of $DATA): its ranking is the \`teacher\` target and the reference of tau and top1. Its counts include each training slate's own next item, so on the training slates it is a stronger teacher than on the eval slates"
  echo "- students, but for what varies: backbone $BACKBONE$([ "$BACKBONE" != bundled ] || echo ' (SmolLM2-135M-Instruct, 30 layers)'), the first $LAYERS layers, LoRA r=$LORA_R, attention head, target $TARGET, titles cut to $ITEM_TOKENS tokens, user context to $QUERY_TOKENS, $TRAIN_N slates x $EPOCHS epoch(s), batch $BATCH, lr $LR (head $HEAD_LR), seed $SEED, $DEVICE $DTYPE; trained $JOBS at a time with OMP_NUM_THREADS=$THREADS, the benchmark alone afterwards"
  echo "- wall time of this script before the benchmark: $(( SECONDS - START )) s (steps already done not counted; each run's own below)"
  echo
  echo "| row | run | steps | training slates | training wall s |"
  echo "| --- | --- | --- | --- | --- |"
  local spec run
  for spec in "$@"; do
    run=${spec#*=}
    "$BIN/python" - "${spec%%=*}" "$run" <<'EOF'
import json, pathlib, sys
name, run = sys.argv[1:]
d = json.loads(pathlib.Path(run, "train.json").read_text())
wall = pathlib.Path(run + ".wall.tsv")
seconds = sum(int(line.split("\t")[1]) for line in wall.read_text().splitlines()) if wall.exists() else "?"
print(f"| {name} | `{run}` | {d['total_steps']} | {d['train_slates']} | {seconds} |")
EOF
  done
  echo
  echo "Commands (what \`--dry-run\` prints; each skipped when its output exists):"
  echo
  code_block "$(bash "benchmarks/ablation_$ABLATION.sh" --dry-run)"
}
