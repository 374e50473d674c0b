#!/usr/bin/env bash
# Ablation: backbone depth, one command: how much quality each layer buys.
#
#   bash benchmarks/ablation_depth.sh             # writes benchmarks/results/ablation-depth/
#   bash benchmarks/ablation_depth.sh --dry-run   # prints every command instead
#
# SPD students on the first L layers of the backbone (early exit: the others are never
# loaded), one for each L in LAYERS_LIST (default "2 4 8"), the same in everything else
# (attention head, LoRA, target, data, steps); then one `spdrank bench` over them (Hungarian
# decoder) and the baselines on the same eval slates, with paired differences against the
# first L. The other settings (CPU-sized by default, each overridable from the environment)
# and the teacher: benchmarks/lib.sh. About 35 minutes on 2 idle cores at the defaults (the
# 8-layer run, ~30 min, beside the 4- and 2-layer ones; then the bench). Resumable: rerun it
# and finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
ablation_setup depth "$@"
depths=( ${LAYERS_LIST:-2 4 8} )
ablation_data

# Deepest first: the longest run starts first, the shallower ones fill in beside it.
SPECS=()
for layers in $(printf '%s\n' "${depths[@]}" | sort -rn); do SPECS+=( "$TARGET lora attn $layers" ); done
train_all "${SPECS[@]}"

MODELS=()
for layers in "${depths[@]}"; do MODELS+=( "L$layers=$(run_of "$TARGET lora attn $layers")" ); done
ablation_bench "Ablation: backbone depth" \
  "the number of backbone layers kept (\`--layers ${depths[*]}\`)" \
  "L${depths[0]}:hungarian" hungarian "${MODELS[@]}"
