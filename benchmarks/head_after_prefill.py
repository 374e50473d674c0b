"""What makes the work around the prefill slower right after a prefill than when repeated.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/head_after_prefill.py \\
        --model runs/overhead-cpu/spd-k160 --slates data-out/v-uniform/eval.jsonl \\
        [--size 50] [--dtype bfloat16] [--slates-count 100] [--out FILE]

``spdrank bench --latency`` times the stages around the prefill right after it; the
micro-benchmark (overhead_micro.py) times them repeated, with warm caches; on this CPU the
first is 2-3x the second. This script times the same work (``around``: tokenize, readout,
head, decoder, result, with the prefill's output computed beforehand, as in the
micro-benchmark) once per slate after each of these, in turn, slate by slate:

- ``warm``: the same work just before (the micro-benchmark's condition);
- ``prefill``: the backbone's forward on the slate's prompt (the bench's condition);
- ``sweep``: a pass over a buffer larger than the last-level cache, which evicts what the
  work had cached as a prefill does, without the prefill's arithmetic;
- ``idle``: a sleep as long as the prefill takes: the core idles, caches stay;
- ``spin``: a Python loop as long as the prefill: the core stays busy on little data.

So ``prefill`` − ``warm`` is the penalty the bench sees, and the other three say how much of
it is evicted caches, an idle core, or neither. Medians (and quartiles) over the slates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from overhead_micro import around

from spdrank.backbone import last_hidden
from spdrank.bench.latency import resize_slates
from spdrank.model import SPDRanker
from spdrank.slates import Slate, load_slates

CONDITIONS = ("warm", "prefill", "sweep", "idle", "spin")


def quartiles(values: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return {"p25": q1, "median": median, "p75": q3}


def measure(model: SPDRanker, slates: list[Slate], sweep_mb: int) -> dict[str, list[float]]:
    """Per condition, the ms of one ``around`` call per slate right after that condition."""
    buffer = np.ones(sweep_mb * 2**20 // 8)
    times: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    with torch.inference_mode():
        batches = [model.collate([model.encode(s)]) for s in slates]
        for b in batches:  # builds oneDNN's kernels for each prompt length before timing
            last_hidden(model.backbone, b.input_ids, b.attention_mask)
        hidden, prefill_s = [], []
        for b in batches:
            t0 = time.perf_counter()
            hidden.append(last_hidden(model.backbone, b.input_ids, b.attention_mask))
            prefill_s.append(time.perf_counter() - t0)

        def timed_around(i: int) -> float:
            t0 = time.perf_counter()
            around(model, slates[i], hidden[i])
            return (time.perf_counter() - t0) * 1e3

        def spin(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

        before: dict[str, Callable[[int], object]] = {
            "warm": timed_around,
            "prefill": lambda i: last_hidden(model.backbone, batches[i].input_ids,
                                             batches[i].attention_mask),
            "sweep": lambda i: float(buffer.sum()),
            "idle": lambda i: time.sleep(prefill_s[i]),
            "spin": lambda i: spin(prefill_s[i]),
        }
        for i in range(len(slates)):
            # Each slate takes the conditions in a rotated order, so a slow spell of the
            # machine falls on all of them alike.
            for k in range(len(CONDITIONS)):
                condition = CONDITIONS[(i + k) % len(CONDITIONS)]
                before[condition](i)
                times[condition].append(timed_around(i))
    times["prefill_itself"] = [s * 1e3 for s in prefill_s]
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--size", type=int, default=50, help="candidates per slate (N)")
    p.add_argument("--dtype", help="the backbone's dtype (default: the checkpoint's own)")
    p.add_argument("--slates-count", type=int, default=100)
    p.add_argument("--sweep-mb", type=int, default=256,
                   help="the buffer the sweep reads: more than the last-level cache")
    p.add_argument("--out", help="also write the figures here as JSON")
    args = p.parse_args()
    model = SPDRanker.from_pretrained(args.model, device="cpu", dtype=args.dtype)
    slates = resize_slates(load_slates(args.slates, limit=args.slates_count), args.size, 0)
    times = measure(model, slates, args.sweep_mb)
    rows = {name: quartiles(values) for name, values in times.items()}
    print(f"N = {args.size}, {len(slates)} slates, {torch.get_num_threads()} torch thread(s); "
          "ms of the work around the prefill right after:")
    print(f"{'condition':<15} {'p25':>8} {'median':>8} {'p75':>8}")
    for name, q in rows.items():
        print(f"{name:<15} {q['p25']:>8.3f} {q['median']:>8.3f} {q['p75']:>8.3f}")
    if args.out:
        meta = {"model": args.model, "dtype": args.dtype or model.config.backbone.dtype,
                "size": args.size, "slates": len(slates), "sweep_mb": args.sweep_mb,
                "threads": torch.get_num_threads(), "torch": torch.__version__,
                "python": sys.version.split()[0]}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "times": times},
                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
