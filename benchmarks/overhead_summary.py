"""The tables of benchmarks/results/overhead-cpu/report.md, from the files overhead_cpu.sh wrote.

    .venv/bin/python benchmarks/overhead_summary.py [--dir benchmarks/results/overhead-cpu]
        [--before DIR]

For each dtype directory under ``--dir`` (float32/, bfloat16/): the bench's latency rows (every
stage's median, the overhead around the prefill in ms, SPD over the bare prefill) and the
micro-benchmark's minima per stage; then each checkpoint's distance to the goals (<= 1.0 ms
around the prefill at N = 50 and <= 3.0 ms at N = 150; SPD / bare prefill <= 1.02x and
<= 1.03x; both the ratio of the medians and, where the bench recorded it, the median of each
slate's own ratio); and each stage's median right after a prefill (the bench) over its
minimum with warm caches (the micro-benchmark), with what the work around the prefill takes
in situ without the head. ``--before``: a directory of micro-benchmark JSON files measured on earlier code
(``micro-NAME-DTYPE.json``), shown beside the new minima.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spdrank.core.ranking import STAGES

#: The goals, per slate size: ms around the prefill, and SPD over the bare prefill.
AROUND_GOAL_MS = {50: 1.0, 150: 3.0}
RATIO_GOAL = {50: 1.02, 150: 1.03}
DTYPES = ("float32", "bfloat16")


def ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def bench_table(rows: list[dict]) -> list[str]:
    cols = [*STAGES, "rest"]
    lines = ["| checkpoint | dtype | N | " + " | ".join(f"{c} ms" for c in cols)
             + " | total p50 ms | bare prefill ms | SPD / bare | per slate | overhead ms |",
             "| --- " * (len(cols) + 8) + "|"]
    for r in rows:
        stages = [ms(r["stages_ms"].get(c, 0.0)) for c in cols]
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['n']} | " + " | ".join(stages)
            + f" | {ms(r['total_ms']['median'])} | {ms(r['bare_prefill_ms'])} | "
            f"{r['overhead']:.3f}x | {paired(r)} | {ms(r['overhead_ms'])} |"
        )
    return lines


def paired(row: dict) -> str:
    """The median of each slate's SPD / bare ratio; "-" in results from before it was kept."""
    ratio = row.get("paired_ratio")
    return "-" if ratio is None else f"{ratio:.3f}x"


def micro_table(micro: dict[tuple[str, str], dict], before: dict[tuple[str, str], dict]) -> list[str]:
    stages = ["tokenize", "readout", "head", "assign", "result", "around"]
    lines = ["| checkpoint | dtype | N | " + " | ".join(stages) + " |",
             "| --- " * (len(stages) + 3) + "|"]
    for (name, dtype), data in micro.items():
        old = before.get((name, dtype))
        for n in sorted({row["n"] for row in data["rows"]}):
            cells = []
            for stage in stages:
                now = _micro(data, n, stage)
                was = _micro(old, n, stage) if old else None
                cell = "-" if now is None else ms(now)
                if was is not None:
                    cell = f"{ms(was)} → {cell}"
                cells.append(cell)
            lines.append(f"| {name} | {dtype} | {n} | " + " | ".join(cells) + " |")
    return lines


def _micro(data: dict, n: int, stage: str) -> float | None:
    for row in data["rows"]:
        if row["n"] == n and row["stage"] == stage:
            return row["min"]
    return None


def goals_table(rows: list[dict], micro: dict[tuple[str, str], dict]) -> list[str]:
    head = ("| checkpoint | dtype | N | around, bench median ms | around, micro min ms | goal ms "
            "| SPD / bare | per slate | goal |")
    lines = [head, "| --- " * 9 + "|"]
    for r in rows:
        n = r["n"]
        if n not in AROUND_GOAL_MS:
            continue
        data = micro.get((r["model"], r["dtype"]))
        low = _micro(data, n, "around") if data else None
        lines.append(
            f"| {r['model']} | {r['dtype']} | {n} | {ms(r['overhead_ms'])} | "
            f"{'-' if low is None else ms(low)} | {AROUND_GOAL_MS[n]} | {r['overhead']:.3f}x | "
            f"{paired(r)} | {RATIO_GOAL[n]}x |"
        )
    return lines


def situ_table(rows: list[dict], micro: dict[tuple[str, str], dict]) -> list[str]:
    """Each stage in situ / warm: the bench's median right after a prefill over the
    micro-benchmark's minimum; and the bench's time around the prefill less its head's."""
    stages = ["tokenize", "readout", "head", "assign"]
    lines = ["| checkpoint | dtype | N | " + " | ".join(f"{s}: in situ / warm ms" for s in stages)
             + " | around less the head, in situ ms |", "| --- " * (len(stages) + 4) + "|"]
    for r in rows:
        data = micro.get((r["model"], r["dtype"]))
        if data is None:
            continue
        cells = []
        for stage in stages:
            situ, warm = r["stages_ms"].get(stage, 0.0), _micro(data, r["n"], stage)
            cells.append("-" if not warm else f"{ms(situ)} / {ms(warm)} ({situ / warm:.1f}x)")
        less_head = r["overhead_ms"] - r["stages_ms"].get("head", 0.0)
        lines.append(f"| {r['model']} | {r['dtype']} | {r['n']} | " + " | ".join(cells)
                     + f" | {ms(less_head)} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="benchmarks/results/overhead-cpu")
    p.add_argument("--before", help="micro-benchmark JSON files of earlier code")
    args = p.parse_args()
    root = Path(args.dir)
    rows, micro, before = [], {}, {}
    for dtype in DTYPES:
        results = root / dtype / "results.json"
        if results.is_file():  # absent when only the micro-benchmark ran (BENCH=0)
            for row in json.loads(results.read_text())["latency"]:
                rows.append({**row, "dtype": dtype})
        for path in sorted((root / dtype).glob("micro-*.json")):
            micro[(path.stem.removeprefix("micro-"), dtype)] = json.loads(path.read_text())
    if args.before:
        for path in sorted(Path(args.before).glob("micro-*.json")):
            name, _, dtype = path.stem.removeprefix("micro-").rpartition("-")
            before[(name, dtype)] = json.loads(path.read_text())
    print("\n".join(["### `spdrank bench --latency`: medians over the slates", "",
                     *bench_table(rows), "",
                     "### The micro-benchmark: each stage alone, minimum ms over the repeats", "",
                     *micro_table(micro, before), "", "### Against the goals", "",
                     *goals_table(rows, micro), "",
                     "### Each stage right after a prefill, over its warm minimum", "",
                     *situ_table(rows, micro)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
