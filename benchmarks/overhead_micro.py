"""The work around the prefill, alone: each stage of ``rank()`` but the prefill, repeated.

    .venv/bin/python benchmarks/overhead_micro.py --model runs/overhead-cpu/spd-k160 \\
        --slates data-out/v-uniform/eval.jsonl [--dtype bfloat16] [--reps 300] [--out FILE]

``spdrank bench --latency`` times whole ``rank()`` calls, each right after its own prefill,
so its stages pay for caches the prefill emptied and, on a loaded machine, for whatever else
ran meanwhile. This script times the same stages with the prefill's output computed
beforehand, each stage many times over the same slates on one thread: the minimum and the
median of the wall time, and the median of the thread's CPU time (which a descheduled thread
does not accrue), so a shared machine moves its figures less.

Stages, as ``SPDRanker.rank_batch`` runs them on one slate: ``tokenize`` (encode and collate,
token ids from the builder's cache as a served catalogue's repeating titles would be),
``readout`` (pooling the prefill's states into what the head reads), ``head`` (scores, to
numpy), ``assign`` (the decoder), ``result`` (building the Ranking); ``around`` is one call of
all five in a row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import spdrank.backbone.readout
from spdrank.backbone.batching import Batch
from spdrank.backbone.readout import HeadInputs
from spdrank.backbone.split import last_hidden
from spdrank.compare.latency import resize_slates
from spdrank.core.slates import Slate, load_slates
from spdrank.methods.spd.decode import decode_batch
from spdrank.model.ranker import SPDRanker


def timed(fn: Callable[[int], object], count: int, reps: int) -> dict[str, float]:
    """Min and median wall ms, median thread-CPU ms of ``fn(i)``, i cycling over ``count``."""
    for i in range(min(count, 10)):
        fn(i)
    wall, cpu = [], []
    for r in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn(r % count)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return {"min": min(wall), "median": statistics.median(wall), "cpu_median": statistics.median(cpu)}


def read(model: SPDRanker, batch: Batch, hidden: torch.Tensor) -> HeadInputs:
    """``model.read(batch)`` with the backbone's forward replaced by its output ``hidden``:
    the readout alone, timed the same way on any version of the code."""
    forward = spdrank.backbone.readout.prompt_hidden
    spdrank.backbone.readout.prompt_hidden = lambda *_: hidden
    try:
        return model.read(batch)
    finally:
        spdrank.backbone.readout.prompt_hidden = forward


def around(model: SPDRanker, slate: Slate, hidden: torch.Tensor) -> object:
    """One slate's whole work around the prefill, given the prefill's output ``hidden``:
    tokenize, readout, head, decoder, result."""
    batch = model.collate([model.encode(slate)])
    m = model.score(read(model, batch, hidden), batch).cpu().numpy()
    order = decode_batch(m, [len(slate)], model.config.decoder)[0]
    return model.ranking(slate, order, m[0], {})


def stages(model: SPDRanker, slates: list[Slate], reps: int) -> dict[str, dict[str, float]]:
    """Each stage's times over ``slates`` (all of one size)."""
    n = len(slates[0])
    batches = [model.collate([model.encode(s)]) for s in slates]
    with torch.inference_mode():
        hidden = [last_hidden(model.backbone, b.prompt.input_ids, b.prompt.attention_mask)
                  for b in batches]
        inputs = [read(model, b, h) for b, h in zip(batches, hidden)]
        scores = [model.score(x, b).cpu().numpy() for x, b in zip(inputs, batches)]
        orders = [decode_batch(s, [n], model.config.decoder) for s in scores]

        def tokenize(i: int) -> object:
            return model.collate([model.encode(slates[i])])

        def readout(i: int) -> object:
            return read(model, batches[i], hidden[i])

        def head(i: int) -> object:
            return model.score(inputs[i], batches[i]).cpu().numpy()

        def assign(i: int) -> object:
            return decode_batch(scores[i], [n], model.config.decoder)

        def result(i: int) -> object:
            return model.ranking(slates[i], orders[i][0], scores[i][0], {})

        parts = {"tokenize": tokenize, "readout": readout, "head": head, "assign": assign,
                 "result": result, "around": lambda i: around(model, slates[i], hidden[i])}
        return {name: timed(fn, len(slates), reps) for name, fn in parts.items()}


def write_figures(out: str, meta: dict[str, Any], rows: list[dict[str, Any]],
                  lines: list[str]) -> None:
    """``rows`` and ``meta`` (with the torch threads and versions added) as JSON in ``out``,
    and the table printed, ``lines``, beside it (the same name, .txt)."""
    meta = {**meta, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": sys.version.split()[0]}
    Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    Path(out).with_suffix(".txt").write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--limit", type=int, default=100, help="evaluation slates to resize")
    p.add_argument("--sizes", default="20,50,150")
    p.add_argument("--dtype", help="the backbone's dtype (default: the checkpoint's own)")
    p.add_argument("--reps", type=int, default=300, help="timed calls per stage and size")
    p.add_argument("--slates-per-size", type=int, default=20, help="slates each stage cycles over")
    p.add_argument("--out", help="also write the figures here as JSON, and the table beside "
                   "it (the same name, .txt)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = SPDRanker.from_pretrained(args.model, device="cpu", dtype=args.dtype)
    slates = load_slates(args.slates, limit=args.limit)
    rows = []
    lines = [f"{'N':>4} {'stage':<9} {'min ms':>8} {'median ms':>10} {'cpu median ms':>14}"]
    print(lines[0])
    for n in (int(x) for x in args.sizes.split(",")):
        sized = resize_slates(slates, n, 0)[: args.slates_per_size]
        for name, t in stages(model, sized, args.reps).items():
            lines.append(f"{n:>4} {name:<9} {t['min']:>8.3f} {t['median']:>10.3f} "
                         f"{t['cpu_median']:>14.3f}")
            print(lines[-1], flush=True)
            rows.append({"n": n, "stage": name, **t})
    if args.out:
        write_figures(args.out, {
            "model": args.model, "dtype": args.dtype or model.config.backbone.dtype,
            "reps": args.reps}, rows, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
