#!/usr/bin/env bash
# One checkpoint ranked on the CPU in float32 and in bfloat16: what the lower precision buys
# in latency and what it costs in rankings, on CPUs with native bfloat16 matrix units (Intel
# AMX, AVX512-BF16), where oneDNN runs bfloat16 matmuls several times faster than float32.
#
#   bash benchmarks/cpu_bf16.sh     # writes benchmarks/results/cpu-bf16/
#
# The checkpoint: the fidelity report's lexical student (history head on SmolLM2's first 2
# layers, frozen, mean readout, 32-token titles; runs/fidelity/runs/lex/history-mean-t32 from
# benchmarks/fidelity_beauty_cpu.py), trained on float32 states. Both runs rank the same
# lexical-teacher eval slates through `spdrank bench` (fidelity to the teacher, quality against
# clicks, latency per slate at batch 1) and decompose the latency at N = 20 and 50 (the
# checkpoint's K is 64). Run it alone on the machine: it measures latency. Settings from the
# environment: BIN, MODEL, SLATES, LIMIT, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
BIN=${BIN:-.venv/bin}
MODEL=${MODEL:-runs/fidelity/runs/lex/history-mean-t32}
SLATES=${SLATES:-runs/fidelity/lexical/eval.labels.slates.jsonl}
LIMIT=${LIMIT:-200}
OUT=${OUT:-benchmarks/results/cpu-bf16}
parse_dry_run benchmarks/cpu_bf16.sh "the script's header" "$@"
[ "$DRY" = 1 ] || mkdir -p "$OUT"

for DTYPE in float32 bfloat16; do
  step "bench-$DTYPE" "$OUT/$DTYPE/report.md" \
    "$BIN/spdrank" bench --slates "$SLATES" --limit "$LIMIT" --model "student=$MODEL" \
    --decoders expected_rank --dtype "$DTYPE" --device cpu --latency --latency-sizes 20,50 \
    --latency-slates 50 --seed 0 --out "$OUT/$DTYPE" \
    --title "The lexical student on the CPU in $DTYPE" --no-progress
done
[ "$DRY" = 1 ] && exit 0

{
  echo "# float32 and bfloat16 on the CPU: one checkpoint, the same slates"
  echo
  echo "Command: \`bash benchmarks/cpu_bf16.sh\` (MODEL=$MODEL, SLATES=$SLATES, LIMIT=$LIMIT)"
  echo
  machine_lines
  echo "- CPU flags: $(grep -o -w 'amx_bf16\|avx512_bf16' /proc/cpuinfo | sort -u | xargs || true)"
  echo
  "$BIN/python" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {d: json.loads((out / d / "results.json").read_text()) for d in ("float32", "bfloat16")}
print("| dtype | tau | top1 | AUC | R@10 | p50 ms a slate | N = 20: prefill ms, total ms | "
      "N = 50: prefill ms, total ms |")
print("|---|---|---|---|---|---|---|---|")
for d, r in rows.items():
    s = r["rankers"]["student:expected_rank"]
    m = s["metrics"]
    lat = {x["n"]: x for x in r["latency"]}
    sizes = [f"{lat[n]['stages_ms']['prefill']:.1f}, {lat[n]['total_ms']['median']:.1f}"
             for n in (20, 50)]
    print(f"| {d} | {m['tau']['mean']:.3f} | {m['top1']['mean']:.3f} | {m['AUC']['mean']:.4f} | "
          f"{m['R@10']['mean']:.4f} | {s['latency_ms']['median']:.1f} | {sizes[0]} | {sizes[1]} |")
EOF
  echo
  echo "Each run's full report: [float32](float32/report.md), [bfloat16](bfloat16/report.md)."
} > "$OUT/report.md"
cat "$OUT/report.md"
