#!/usr/bin/env bash
# Ablation: the scoring head (the paper's Table 4), one command.
#
#   bash benchmarks/ablation_heads.sh             # writes benchmarks/results/ablation-heads/
#   bash benchmarks/ablation_heads.sh --dry-run   # prints every command instead
#
# SPD students with the attention head (2 self-attention layers over the candidates; the
# reference row) and a linear probe, the same in everything else (LoRA, target, data,
# steps); then one `spdrank bench` over them (Hungarian decoder) and the
# baselines on the same eval slates, with paired differences against the first head.
# HEADS picks the heads (default "attn linear"; any of `spdrank train --head`). The other
# settings (CPU-sized by default, each overridable from the environment) and the teacher:
# benchmarks/lib.sh.
# About 20 minutes on 2 idle cores at the defaults (two LoRA runs of ~15 min side by side,
# and the bench); less if ablation_signal.sh already trained the attention run.
# Resumable: rerun it and finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
ablation_setup heads "$@"
heads=( ${HEADS:-attn linear} )
ablation_data

SPECS=()
MODELS=()
for head in "${heads[@]}"; do
  SPECS+=( "$TARGET lora $head $LAYERS" )
  MODELS+=( "$head=$(run_of "$TARGET lora $head $LAYERS")" )
done
train_all "${SPECS[@]}"

ablation_bench "Ablation: scoring heads (Table 4)" \
  "the head (\`--head ${heads[*]}\`: attn = self-attention, linear = linear probe)" \
  "${heads[0]}:hungarian" hungarian "${MODELS[@]}"
