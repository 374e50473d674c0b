#!/usr/bin/env bash
# Ablation: the decoder, one command.
#
#   bash benchmarks/ablation_decoders.sh             # writes benchmarks/results/ablation-decoders/
#   bash benchmarks/ablation_decoders.sh --dry-run   # prints every command instead
#
# One trained SPD student (attention head, LoRA) decoded from the same score matrix by each
# decoder: hungarian (the exact assignment; the reference row), greedy, argsort and
# expected_rank. Its rows share one forward pass per slate, so they differ by the decoder
# alone; paired differences against hungarian. DECODERS picks them (comma-separated, the
# first is the reference). The other settings (CPU-sized by default, each overridable from
# the environment) and the teacher: benchmarks/lib.sh. About 17 minutes on 2 idle cores at
# the defaults (one LoRA run, the bench), 2 if another ablation already trained that run.
# Resumable: rerun it and finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
ablation_setup decoders "$@"
DECODERS=${DECODERS:-hungarian,greedy,argsort,expected_rank}
ablation_data

SPEC="$TARGET lora attn $LAYERS"
train_all "$SPEC"

ablation_bench "Ablation: decoders on one trained score matrix" \
  "the decoder only (\`--decoders $DECODERS\`): one student, one forward pass per slate shared by its rows" \
  "spd:${DECODERS%%,*}" "$DECODERS" "spd=$(run_of "$SPEC")"
