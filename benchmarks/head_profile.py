"""Where a checkpoint's head spends its time: torch's profiler over repeated head calls.

    .venv/bin/python benchmarks/head_profile.py --model runs/overhead-cpu/spd-k160 \\
        --slates data-out/v-uniform/eval.jsonl --n 50 [--dtype bfloat16] [--calls 100]

One slate of N candidates (resized as ``spdrank bench --latency`` resizes them), its prefill
and readout computed once; then the head alone, on one thread, ``--calls`` times under
``torch.profiler``. Prints the operations by their own CPU time, grouped by input shapes, and
the mean ms per call, profiler included.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from spdrank.bench.latency import resize_slates
from spdrank.model import SPDRanker
from spdrank.slates import load_slates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--dtype", help="the backbone's dtype (default: the checkpoint's own)")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rows", type=int, default=25, help="operations to list")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = SPDRanker.from_pretrained(args.model, device="cpu", dtype=args.dtype).eval()
    slate = resize_slates(load_slates(args.slates, limit=20), args.n, 0)[0]
    batch = model.collate([model.encode(slate)])
    with torch.inference_mode():
        inputs = model.read(batch)
        for _ in range(20):
            model.score(inputs, batch)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(args.calls):
                model.score(inputs, batch)
    averages = prof.key_averages(group_by_input_shape=True)
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                         max_name_column_width=45, max_shapes_column_width=70))
    total_ms = sum(e.self_cpu_time_total for e in averages) / 1e3
    print(f"{args.model}, N={args.n}, {args.dtype or 'checkpoint dtype'}: "
          f"{total_ms / args.calls:.3f} ms of CPU per head call, profiler included")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
