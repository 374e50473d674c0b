"""The features-only reruns against the committed run of benchmarks/beauty_best_input_cpu.py:
each per-slate value of each ranker (latency aside), and the runner's slices of the committed
per-slate files against the script's.

    .venv/bin/python benchmarks/results/beauty-best-input-cpu/features-rerun/compare.py \\
        RETRIEVED_OUT UNIFORM_OUT   # the reruns' --out folders, which hold their rows files
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))
import run

RESULTS = ROOT / "benchmarks/results/beauty-best-input-cpu"
committed = json.loads((RESULTS / "results.json").read_text())
experiment = run.Experiment(ROOT / "benchmarks/experiments/beauty-best-input.toml", {})
section = next(s for s in experiment.sections if "slices" in s)
for setting, rerun in zip(("retrieved", "uniform"), sys.argv[1:3], strict=True):
    new = run.per_query(Path(rerun) / f"{setting}.rows.jsonl")
    old = run.per_query(RESULTS / f"{setting}.rows.jsonl")
    for ranker, rows in new.items():
        differ = sum(1 for q, r in rows.items() for k, v in r.items()
                     if k not in ("latency_ms", "index") and old[ranker][q].get(k) != v)
        print(f"{setting} {ranker}: {len(rows)} slates, {differ} values differ from the "
              "committed run")
    values = run.with_row(experiment.values, {"setting": setting}, "compare")
    for label, entry in run.slices_section(section, values, "compare")[1]["slices"].items():
        then = committed["settings"][setting]["slices"].get(label)
        print(f"  {label}: runner {entry['queries']} users, llm {run.number(entry['llm'])}, "
              f"features {run.number(entry['features'])}, {run.interval(entry['difference'])}"
              " | script: " + (f"{then['users']} users, llm {run.number(then['llm'])}, "
                               f"features {run.number(then['features'])}, "
                               f"{run.interval(then['diff'])}" if then else "no such slice"))
