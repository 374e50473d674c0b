#!/usr/bin/env bash
# A lent machine's calls rehearsed on this CPU, before a machine is lent: benchmarks/lease.sh
# run once for each call of .lease/calls.tsv (benchmarks/lease_pack.sh, run first), each call
# given exactly the paths it carries and no other, on a fresh site folder, with the preflight on the CPU and
# `gpu.sh --smoke` in place of the full run. So the install of the carried wheels, the joining
# and checking of the backbone's parts, the scripts' BIN and every step's command line run as
# they will there; only the device, the sizes and the Python differ.
#
#   bash benchmarks/lease_rehearse.sh     # writes benchmarks/results/lease-rehearsal-cpu/report.md
#
# Scratch in $SCRATCH (default /tmp/lease-rehearsal, emptied first); the report to $RESULTS.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
LEASE=${LEASE:-.lease}
SCRATCH=${SCRATCH:-/tmp/lease-rehearsal}
RESULTS=${RESULTS:-benchmarks/results/lease-rehearsal-cpu}
[ -s "$LEASE/calls.tsv" ] || { echo "no $LEASE/calls.tsv: run benchmarks/lease_pack.sh first" >&2; exit 1; }
parts=$(wc -l < "$LEASE/calls.tsv")
SOURCE=$LEASE
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH/lease" "$RESULTS"
export LEASE=$SCRATCH/lease SITE=$SCRATCH/site PY=$BIN/python LEASE_BIN=$SCRATCH/bin \
  PREFLIGHT_DIR=$SCRATCH/preflight SMOKE_DIR=$SCRATCH/smoke PREFLIGHT_DEVICE=cpu REHEARSE=1 \
  SPDRANK_CACHE=$SCRATCH/cache OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
rows=()
# The plan's calls, then one more that carries nothing and runs the steps the first left (ONLY=).
{ cat "$SOURCE/calls.tsv"; printf '%s\t\n' "$(( parts + 1 ))"; } > "$SCRATCH/calls.tsv"
while IFS=$'\t' read -r call paths; do
  for path in $paths; do cp -r "$path" "$SCRATCH/lease/"; done
  rest=(); [ "$call" -le "$parts" ] || rest=( env ONLY= )
  t0=$SECONDS; rc=0
  OUT=$SCRATCH/out-$call "${rest[@]}" bash benchmarks/lease.sh < /dev/null > "$SCRATCH/call-$call.log" 2>&1 || rc=$?
  steps=$(grep -cE '^== [^ ]+: [0-9]+ s$' "$SCRATCH/call-$call.log" || true)
  said=$(grep -E '^== lease: [0-9]+ of|^== lease: gpu.sh|stopped at its budget' "$SCRATCH/call-$call.log" | sed 's/^== lease: //' | paste -sd ';' - || true)
  back=$(ls "$SCRATCH/out-$call" | paste -sd ' ' -)
  rows+=( "| $call | $rc | $(( SECONDS - t0 )) | $steps | ${said:--} | $back |" )
done < "$SCRATCH/calls.tsv"
{
  echo "# A lent machine's calls, rehearsed on a CPU"
  echo
  echo "\`bash benchmarks/lease_rehearse.sh\` ($(date -u +%Y-%m-%d)): benchmarks/lease.sh once for each of"
  echo "the $parts calls of the plan (benchmarks/lease_pack.sh), each given exactly the paths"
  echo "\`.lease/calls.tsv\` names, then once more carrying nothing with \`ONLY=\` (the steps the"
  echo "lease's first run leaves); the carried wheels installed into a fresh folder, the preflight"
  echo "(gpu_latency.sh --smoke) on the CPU and gpu.sh --smoke in place of the full run."
  echo
  machine_lines
  echo "- Python: $("$PY" --version 2>&1) (a lent machine's is 3.12, with its own torch)"
  echo
  echo "| call | exit | seconds | steps run | what it said | came back in \$OUT |"
  echo "| --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Each call's steps and seconds:"
  echo
  for call in $(seq 1 "$(( parts + 1 ))"); do
    echo "call $call:"
    code_block "$(grep -E '^== [^ ]+: [0-9]+ s$' "$SCRATCH/call-$call.log" | sed 's/^== //' | paste -sd ',' - | sed 's/,/, /g')"
  done
} > "$RESULTS/report.md"
cat "$RESULTS/report.md"
