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

# parse_modes SCRIPT SETTINGS_DOC [ARG...]: DRY=1 for --dry-run, SMOKE=1 for --smoke (together:
# the smoke run's commands), each 0 when absent; anything else is a usage error (exit 2).
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
# Every step of a GPU script on a CPU at toy scale (docs/scaling.md): a tiny random Qwen3
# (benchmarks/tiny_backbone.py) for every backbone, each split's first $SLATES slates, small
# sizes, the real run's commands; what a step cannot read fails on the CPU, not on a lent GPU.

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
# (gpu.sh) will cost on $ESTIMATE_DEVICE (default h200), with the settings named by NAME... as
# they stand; a refusal (exit 1) stops the script here unless FIT_CHECK=0. Each step's estimated
# seconds go to $PLAN (default $WORK/estimate.tsv), which `step` weighs against the budget.
gpu_estimate() {
  local script=$1 name py=$BIN/python rc=0 args=(); shift
  [ -x "$py" ] || py=python3  # the estimator needs only the standard library: a dry run, no venv
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
# space-separated), a step not named there is left for a later run; with DRY=1, CMD is only
# printed. A step past the budget (within_budget) exits 75, and a rerun (its finished steps
# skipped, the budget counted afresh) continues from it.
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
