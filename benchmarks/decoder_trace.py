"""`spdrank bench` with each batch-1 decoder call traced: its time, and what the host took.

    TRACE=FILE OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decoder_trace.py --size 150 \\
        bench --latency --latency-sizes 150 ... (any `spdrank bench` arguments)

For a decoder call that is slow inside the whole benchmark's process but not when the same
checkpoint is decomposed alone: this runs the benchmark unchanged but for a wrapper
around ``spdrank.decode.decode_batch``: for each call on one slate of ``--size`` items it
writes one JSON line to FILE with the call's wall and thread-CPU ms, the steal time the host
reported meanwhile (``/proc/stat``, in USER_HZ ticks summed over the CPUs), the calls' page
faults and context switches, and the wall ms of the same call repeated three times right
after it on the same scores. A slow call whose repeats are fast is a transient state of the
machine, not of the matrix; steal that rises with it is the host running something else on
the guest's core.

The wrapper's extra work (reading ``/proc/stat``, the repeats) falls inside the bench's
``assign`` stage: read the trace, not that stage's figures.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

import spdrank.decode
from spdrank.cli import main


def steal_ticks() -> int:
    """The steal time of every CPU so far, in USER_HZ ticks (``/proc/stat``'s 8th field)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def traced(size: int, out: Path):
    """``decode_batch``, writing a line to ``out`` for each call on one slate of ``size``."""
    decode_batch = spdrank.decode.decode_batch
    log = out.open("a", buffering=1)

    def decode(scores: np.ndarray, sizes, name: str = spdrank.decode.UNNAMED_DECODER):
        if list(sizes) != [size]:
            return decode_batch(scores, sizes, name)
        s0, r0 = steal_ticks(), resource.getrusage(resource.RUSAGE_THREAD)
        c0, t0 = time.thread_time(), time.perf_counter()
        orders = decode_batch(scores, sizes, name)
        wall, cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
        r1, s1 = resource.getrusage(resource.RUSAGE_THREAD), steal_ticks()
        again = []
        for _ in range(3):
            t = time.perf_counter()
            decode_batch(scores, sizes, name)
            again.append((time.perf_counter() - t) * 1e3)
        log.write(json.dumps({
            "wall_ms": wall, "cpu_ms": cpu, "steal_ticks": s1 - s0,
            "minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt,
            "switches": (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw),
            "again_ms": again,
        }) + "\n")
        return orders

    return decode


def summary(path: Path, slow_ms: float = 2.0) -> str:
    """A few lines on a trace: how many calls were slow, their repeats, and the steal."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if not rows:
        return f"{path}: no calls traced"
    slow = [r for r in rows if r["wall_ms"] > slow_ms]
    fast = [r for r in rows if r["wall_ms"] <= slow_ms]

    def med(values: list[float]) -> float:
        return float(np.median(values)) if values else float("nan")

    lines = [f"{len(rows)} calls; {len(slow)} over {slow_ms} ms"]
    for label, group in (("slow", slow), ("fast", fast)):
        if not group:
            continue
        lines.append(
            f"{label}: median {med([r['wall_ms'] for r in group]):.3f} ms (CPU "
            f"{med([r['cpu_ms'] for r in group]):.3f}), repeats' median "
            f"{med([x for r in group for x in r['again_ms']]):.3f} ms and largest "
            f"{max(x for r in group for x in r['again_ms']):.3f}; with steal: "
            f"{sum(r['steal_ticks'] > 0 for r in group)} of {len(group)}; page faults "
            f"{sum(r['minflt'] + r['majflt'] for r in group)}, switches "
            f"{sum(r['switches'] for r in group)}")
    return "\n".join(lines)


def run(argv: list[str]) -> int:
    if argv[:1] == ["--summary"]:
        print(summary(Path(argv[1])))
        return 0
    if argv[:1] != ["--size"] or len(argv) < 3:
        sys.exit("usage: decoder_trace.py --size N bench ARGS... | --summary FILE "
                 "(TRACE=FILE names the trace)")
    out = Path(os.environ.get("TRACE", "decoder-trace.jsonl"))
    spdrank.decode.decode_batch = traced(int(argv[1]), out)
    return main(argv[2:])


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
