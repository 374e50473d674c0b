"""The attention head in bfloat16 with and without its weights packed for oneDNN, interleaved.

    .venv/bin/python benchmarks/head_packing_ab.py --model runs/overhead-cpu/spd-k160 \\
        [--sizes 20,50,150] [--rounds 3] [--reps 400]

Random states of the backbone's width (the head's time does not depend on their values), one
thread. Each round times the packed head, then the plain one (``F.linear`` on the cast
weights), so load on a shared machine falls on both alike; per size and way: the minimum wall
ms and the median thread CPU ms of each round, and the largest score difference between them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from spdrank import head_inference
from spdrank.model import SPDRanker


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return min(wall), statistics.median(cpu)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--sizes", default="20,50,150")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=400)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SPDRanker.from_pretrained(args.model, device="cpu", dtype="bfloat16")
    head = model.head
    head.compute_dtype = torch.bfloat16
    hidden = head.proj[0].normalized_shape[0]
    features = head.features.in_features if head.features is not None else 0
    packed_cast, plain_cast = (head_inference.WeightCache(head._cast.build) for _ in range(2))
    packed_cast.weights(head, torch.bfloat16)
    original = head_inference.packed_weight
    head_inference.packed_weight = lambda weight: None
    try:
        plain_cast.weights(head, torch.bfloat16)
    finally:
        head_inference.packed_weight = original
    for n in (int(x) for x in args.sizes.split(",")):
        h = torch.randn(1, n, hidden)
        f = torch.randn(1, n, features) if features else None
        mask = torch.ones(1, n, dtype=torch.bool)
        results: dict[str, list[str]] = {"packed": [], "plain": []}
        with torch.inference_mode():
            outputs = {}
            for _ in range(args.rounds):
                for way, cast in (("packed", packed_cast), ("plain", plain_cast)):
                    head._cast = cast
                    outputs[way] = head(h, mask, f)
                    low, cpu = timed(lambda h=h, mask=mask, f=f: head(h, mask, f), args.reps)
                    results[way].append(f"{low:.3f}/{cpu:.3f}")
        diff = (outputs["packed"] - outputs["plain"]).abs().max().item()
        print(f"N={n}: packed {' '.join(results['packed'])}; plain {' '.join(results['plain'])} "
              f"(min wall / median CPU ms per round); largest score difference {diff:.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
