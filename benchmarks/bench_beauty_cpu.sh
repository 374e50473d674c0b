#!/usr/bin/env bash
# The headline benchmark (the paper's Tables 2 and 5) at CPU scale, in one `spdrank bench`:
#
#   bash benchmarks/bench_beauty_cpu.sh     # writes benchmarks/results/bench-beauty-cpu/
#
# On the same 200 Amazon Beauty eval slates (uniform negatives), in one process:
# - the baselines (random, popularity, co-occurrence);
# - the autoregressive SmolLM2-135M teacher, direct and with reasoning, replayed from the label
#   files benchmarks/teacher_beauty_cpu.sh wrote through llama.cpp's server (its own answers,
#   decode passes and recorded latency; a mode is left out until its 200 slates are labelled);
# - the single-pass peers and SPD distilled from the co-occurrence teacher by
#   benchmarks/teacher_beauty_cpu.sh (first 2 layers + LoRA r=16, 200 slates): FIRST,
#   scalar+argsort, SPD (attention head);
# - the CPU students of benchmarks/quality_beauty_cpu.py (issue 9): the features-only heads (the
#   baselines' two features; + title similarity, the best on validation) and frozen SmolLM2
#   (2 layers) + features;
# every SPD checkpoint under each decoder (hungarian, greedy, argsort, expected_rank), paired
# differences against the best student (spd-features-title), and the latency decomposition
# (tokenize, prefill, head, assignment, rest at N = 20, 50 and 150 over 100 slates; batched
# throughput; peak memory; overhead over a bare prefill). Run it alone on the machine: it
# measures latency.
#
# N = 150: the students rank up to K = 64 positions (FIRST's letters stop at 52), so the script
# also trains spd-llm-features-k160, the spd-llm-features command with K = 160 positions, from
# the quality run's cached states (about a minute). It is timed at every size; its quality
# rows are those of a K=160 head trained on 50-candidate slates, and the other checkpoints
# are timed at the sizes up to their K.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
OUT=${OUT:-benchmarks/results/bench-beauty-cpu}
TEACHERS=${TEACHERS:-runs/teacher-beauty-cpu}
QUALITY=${QUALITY:-runs/quality-uniform}
N=${N:-200}
LATENCY_SIZES=${LATENCY_SIZES:-20,50,150}
mkdir -p "$OUT"

need() { [ -e "$1" ] || { echo "missing $1: run $2 first" >&2; exit 1; }; }
need "$QUALITY/cooccurrence/eval.slates.jsonl" "benchmarks/quality_beauty_cpu.py --negatives uniform"
SLATES=$OUT/eval-$N.slates.jsonl  # features and the co-occurrence teacher's ranking filled in
head -n "$N" "$QUALITY/cooccurrence/eval.slates.jsonl" > "$SLATES"

ROWS=()
for mode in direct reasoning; do
  summary=$TEACHERS/smollm2-$mode/eval.summary.json
  if [ -f "$summary" ] && "$BIN/python" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["unlabelled"] != 0)' "$summary"; then
    ROWS+=( --labels "smollm2-$mode=$TEACHERS/smollm2-$mode/eval.labels.jsonl" )
  else
    echo "SmolLM2 $mode: labels incomplete, row left out (benchmarks/teacher_beauty_cpu.sh)" >&2
  fi
done
for head in first scalar attn; do
  run=$TEACHERS/students/cooccurrence-teacher-$head
  need "$run/train.json" "benchmarks/teacher_beauty_cpu.sh cooccurrence"
  name=$([ "$head" = attn ] && echo spd-lora-teacher || echo "$head-lora-teacher")
  ROWS+=( --model "$name=$run" )
done
best_run() {  # $1 = row prefix in the quality runs: the finished run that took the best settings
  local run
  run=$(ls -d "$QUALITY/runs/$1@"* 2>/dev/null | head -n 1)
  need "$run/train.json" "benchmarks/quality_beauty_cpu.py --negatives uniform"
  echo "$run"
}
ROWS+=( --model "spd-features=$(best_run features__best)" )
ROWS+=( --model "spd-features-title=$(best_run features+title__best)" )
LLM_RUN=$(best_run llm-L2+features__best__2k)
ROWS+=( --model "spd-llm-features=$LLM_RUN" )
WIDE=$QUALITY/runs/llm-L2+features-k160
if [ ! -f "$WIDE/train.json" ]; then  # $LLM_RUN's own command (its saved config), with K = 160
  "$BIN/python" - "$LLM_RUN" "$WIDE" --positions 160 > "$WIDE.cmd" <<'PY'
import json, shlex, sys
from pathlib import Path
from spdrank.commands.train import config_argv
from spdrank.training.config import TrainConfig
run, out, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
config = json.loads((run / "train.json").read_text(encoding="utf-8"))["config"]
cfg = TrainConfig(**{**config, "out": out})
print(shlex.join([".venv/bin/spdrank", "train", *config_argv(cfg), *overrides]))
PY
  OMP_NUM_THREADS=1 bash "$WIDE.cmd" > "$WIDE.log" 2>&1 || { echo "training $WIDE failed: see $WIDE.log" >&2; exit 1; }
fi
ROWS+=( --model "spd-llm-features-k160=$WIDE" )

BENCH=( "$BIN/spdrank" bench --slates "$SLATES" --train data-out/v-uniform/train.jsonl
  --ranker random --ranker popularity --ranker cooccurrence "${ROWS[@]}"
  --decoders hungarian,greedy,argsort,expected_rank --reference spd-features-title:expected_rank
  --latency --latency-sizes "$LATENCY_SIZES" --latency-slates 100 --device cpu --warmup 1 --seed 0 --out "$OUT"
  --title "Amazon Beauty at CPU scale: teachers, single-pass peers and SPD students"
  --preamble "$OUT/preamble.md" --no-progress )
{
  echo "One command: \`bash benchmarks/bench_beauty_cpu.sh\` (after benchmarks/teacher_beauty_cpu.sh and benchmarks/quality_beauty_cpu.py)"
  echo
  machine_lines
  echo "- load when the benchmark started: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; 2 cores): above ~0.5, other jobs shared the cores and the latencies are upper bounds"
  echo "- slates: the first $N of the 1,118 eval slates (uniform negatives, 50 candidates) with the features of \`spdrank data beauty --validation 1000 --features\` and the co-occurrence teacher's ranking (tau, top1 are fidelity to it)"
  echo "- AR teacher rows: SmolLM2-135M-Instruct (bundled GGUF) through llama.cpp's server, 1 thread, replayed with their recorded latency (see benchmarks/results/teacher-beauty-cpu/)"
  echo "- *-lora-teacher rows: trained on the co-occurrence teacher's rankings of 200 slates, first 2 layers + LoRA r=16 (benchmarks/results/teacher-beauty-cpu/)"
  echo "- spd-features, spd-features-title, spd-llm-features: the issue-9 students (benchmarks/results/quality-beauty-cpu/), all 1 epoch, clicks target, expected-rank decoder: attention head on the popularity and co-occurrence features (20,245 slates), the same plus title_similarity (20,245 slates; the best on validation), the two features next to frozen SmolLM2 (first 2 layers) states (2,000 slates)"
  echo "- spd-llm-features-k160: spd-llm-features's command with K = 160 positions (\`$(cat "$WIDE.cmd")\`), so that N = 150 can be timed; the other checkpoints are timed up to their K (64; FIRST's letters: 52)"
  echo
  code_block "$(print_command "${BENCH[@]}")"
} > "$OUT/preamble.md"
"${BENCH[@]}"
print_command "${BENCH[@]}" > "$OUT/command.txt"
