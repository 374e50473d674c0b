#!/usr/bin/env bash
# Ablation: training signal x backbone adaptation (the paper's Table 3), one command.
#
#   bash benchmarks/ablation_signal.sh             # writes benchmarks/results/ablation-signal/
#   bash benchmarks/ablation_signal.sh --dry-run   # prints every command instead
#
# Four SPD students, the same in everything but the target and whether the backbone adapts:
#   clicks-frozen        the clicked item first, frozen backbone (the paper's Track 1)
#   teacher-frozen       the teacher's whole ranking, frozen backbone (Track 2)
#   teacher-lora         the teacher's whole ranking, LoRA (Track 3; the reference row)
#   teacher+clicks-lora  the teacher's ranking with the clicked item first, LoRA
# The teacher is the co-occurrence baseline (`ranker:cooccurrence`). Then one `spdrank bench`
# over them (Hungarian decoder) and the baselines on the same eval slates, with paired
# differences against teacher-lora. The settings (CPU-sized by default, each overridable from
# the environment: TRAIN_N, EVAL_N, LAYERS, EPOCHS, BATCH, DEVICE, DTYPE, JOBS, ...):
# benchmarks/lib.sh. About 30 minutes on 2 idle cores at the defaults (two LoRA runs of
# ~15 min side by side, then two frozen ones of ~5 min; the bench). Resumable: rerun it and
# finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
ablation_setup signal "$@"
ablation_data

# The LoRA runs take longest: first, so that the frozen ones fill in beside them.
SIGNALS=( "teacher lora" "teacher+clicks lora" "clicks frozen" "teacher frozen" )
SPECS=()
for signal in "${SIGNALS[@]}"; do SPECS+=( "$signal attn $LAYERS" ); done
train_all "${SPECS[@]}"

ablation_bench "Ablation: training signal x backbone adaptation (Table 3)" \
  "the target (\`--target clicks | teacher | teacher+clicks\`) and the backbone (\`--frozen\` or LoRA r=$LORA_R)" \
  teacher-lora:hungarian hungarian \
  "clicks-frozen=$(run_of "clicks frozen attn $LAYERS")" \
  "teacher-frozen=$(run_of "teacher frozen attn $LAYERS")" \
  "teacher-lora=$(run_of "teacher lora attn $LAYERS")" \
  "teacher+clicks-lora=$(run_of "teacher+clicks lora attn $LAYERS")"
