"""What a batched prefill costs per slate on this machine: the measurement behind
``spdrank serve --batch-policy``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/batch_cost.py \\
        [--model runs/load-1layer/model] [--slates data-out/v-uniform/eval.jsonl] \\
        [--limit 32] [--batch-sizes 1 2 4 8] [--threads N]

It times ``SPDRanker.rank_batch`` (prefill, head, assignment; the prompts encoded beforehand,
as the server's engine does) on real Beauty eval slates (``--documents`` candidates each) at
each batch size, with the slates grouped four ways:

* ``mixed``: in file order, as concurrent requests arrive: prompts of different lengths, so
  every batch is padded to its longest prompt;
* ``bucketed``: sorted by prompt length, then cut into batches: near-equal lengths, little
  padding (what a length-bucketing policy can reach at best);
* ``capped``: the ``mixed`` batches, each split as ``spdrank serve --batch-policy bucketed``
  splits a collected batch (``--max-padding``, padded positions over real tokens): what that
  policy costs on requests as they come;
* ``copies``: B copies of one slate: no padding at all, so it isolates what batching itself
  saves (or costs) per slate.

For each batch size it times the arrangements and the reference, the same slates ranked
one at a time (``alone``), interleaved (:func:`time_interleaved`). It prints the per-slate wall
and CPU time (the batches' totals over the slates they held), each relative to ``alone``, the
batches' median prefill per slate, and the padding (padded token positions over real tokens,
over all the prefills). ``--threads`` sets torch's intra-op threads (the server uses torch's
default: one per core).

Without ``--model`` it builds a checkpoint shaped like the load test's
(benchmarks/results/load-spd-1layer-cpu): the bundled SmolLM2 cut to ``--layers`` (1), LoRA,
the attention head, K = 64, titles cut to 8 tokens, an untrained head: the numbers time the
computation, not ranking quality. Nothing is written; the table goes to stdout (``--json``
adds a machine-readable copy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARRANGEMENTS = ("mixed", "bucketed", "capped", "copies")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="checkpoint (default: build a load-test-shaped one here)")
    p.add_argument("--layers", type=int, default=1, help="backbone layers of the built model")
    p.add_argument(
        "--slates",
        default=str(ROOT / "data-out" / "v-uniform" / "eval.jsonl"),
        help="eval slates (JSONL)",
    )
    p.add_argument("--limit", type=int, default=32, help="slates timed per arrangement")
    p.add_argument("--documents", type=int, default=50, help="candidates kept per slate")
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[2, 4, 8],
        help="batch sizes (each timed beside the same slates one at a time)",
    )
    p.add_argument("--arrangements", nargs="+", default=list(ARRANGEMENTS), choices=ARRANGEMENTS)
    p.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: torch's, e.g. OMP_NUM_THREADS)",
    )
    p.add_argument(
        "--max-padding",
        type=float,
        help="the capped arrangement's cap (default: the server's, spdrank.serving.policy)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = p.parse_args(argv)
    if args.limit < max(args.batch_sizes) or min(args.batch_sizes) < 1:
        p.error("--batch-sizes must be positive and --limit at least the largest batch size")
    return args


def build_model(args: argparse.Namespace) -> Any:
    import torch

    from spdrank.backbone.load import resolve_device
    from spdrank.backbone.prompt import PromptSettings
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.methods.head_config import HeadConfig
    from spdrank.model.config import SPDConfig
    from spdrank.model.ranker import SPDRanker

    device = resolve_device(args.device)
    if args.model:
        return SPDRanker.from_pretrained(args.model, device=device)
    torch.manual_seed(0)
    config = SPDConfig.paper(
        backbone=BackboneConfig(layers=args.layers),
        head=HeadConfig(kind="attn", positions=64),
        prompt=PromptSettings(max_item_tokens=8),
    )
    return SPDRanker.build(config, device=device)


def load(path: str, limit: int, documents: int) -> list[Any]:
    from spdrank.core.slates import Slate, read_slates

    out = []
    for slate in read_slates(path):
        if len(slate) >= documents:
            out.append(Slate(slate.query, slate.candidates[:documents]))
        if len(out) >= limit:
            break
    if len(out) < limit:
        raise SystemExit(f"{path}: only {len(out)} slates with {documents} candidates or more")
    return out


def batches(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order) - size + 1, size)]


def time_interleaved(
    model: Any, slates: list[Any], encoded: list[Any], plans: dict[str, list[list[int]]]
) -> dict[str, dict[str, float]]:
    """Rank each plan's groups, one batch each, interleaving the plans (the next batch is
    always the one of the plan that has ranked the fewest slates), so a slow spell of a shared
    machine falls on all of them alike; per plan, the figures the module docstring names."""
    stats = {name: {"wall": 0.0, "cpu": 0.0, "done": 0, "padded": 0, "real": 0} for name in plans}
    prefill: dict[str, list[float]] = {name: [] for name in plans}
    for groups in plans.values():  # unrecorded: the first call at a new shape pays allocation
        model.rank_batch([slates[i] for i in groups[0]], encoded=[encoded[i] for i in groups[0]])
    cursor = dict.fromkeys(plans, 0)
    while True:
        left = [name for name in plans if cursor[name] < len(plans[name])]
        if not left:
            break
        name = min(left, key=lambda n: stats[n]["done"])
        group = plans[name][cursor[name]]
        cursor[name] += 1
        batch, enc = [slates[i] for i in group], [encoded[i] for i in group]
        t0, c0 = time.perf_counter(), time.process_time()
        rankings = model.rank_batch(batch, encoded=enc)
        st = stats[name]
        st["wall"] += time.perf_counter() - t0
        st["cpu"] += time.process_time() - c0
        st["done"] += len(group)
        prefill[name].append(rankings[0].timings["prefill"] / len(group))
        lengths = [len(e.input_ids) for e in enc]
        st["real"] += sum(lengths)
        st["padded"] += max(lengths) * len(lengths) - sum(lengths)
    return {
        name: {
            "slates": st["done"],
            "batches": len(plans[name]),
            "ms_per_slate": st["wall"] / st["done"] * 1e3,
            "cpu_ms_per_slate": st["cpu"] / st["done"] * 1e3,
            "median_prefill_ms_per_slate": statistics.median(prefill[name]),
            "padding": st["padded"] / st["real"],
        }
        for name, st in stats.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from spdrank.serving.policy import DEFAULT_MAX_PADDING, plan_prefills

    cap = DEFAULT_MAX_PADDING if args.max_padding is None else args.max_padding
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = build_model(args)
    slates = load(args.slates, args.limit, args.documents)
    encoded = [model.encode(s) for s in slates]
    lengths = [len(e.input_ids) for e in encoded]
    print(
        f"# batch cost: {len(slates)} slates of {args.documents} candidates from {args.slates}; "
        f"prompt tokens min {min(lengths)}, median {int(statistics.median(lengths))}, "
        f"max {max(lengths)}",
        file=sys.stderr,
    )
    print(
        f"# model {args.model or f'built: bundled SmolLM2, {args.layers} layer(s), LoRA, attn'}; "
        f"device {model.device}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"set up in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    file_order = list(range(len(slates)))
    by_length = sorted(file_order, key=lambda i: lengths[i])
    rows: list[dict[str, Any]] = []
    for size in args.batch_sizes:
        if size == 1:
            continue  # the reference: timed beside every other size
        plans = {
            "alone": [[i] for i in file_order],
            "mixed": batches(file_order, size),
            "bucketed": batches(by_length, size),
            "capped": [
                [batch[i] for i in group]
                for batch in batches(file_order, size)
                for group in plan_prefills([lengths[i] for i in batch], "bucketed", cap)
            ],
            # B copies of one slate, for len(slates) / B slates: as many prefills as the others.
            "copies": [[i] * size for i in file_order[: len(slates) // size]],
        }
        chosen = {k: v for k, v in plans.items() if k == "alone" or k in args.arrangements}
        timed = time_interleaved(model, slates, encoded, chosen)
        for name, numbers in timed.items():
            row = {"batch_size": 1 if name == "alone" else size, "arrangement": name, **numbers}
            rows.append(row)
            print(_line(row, timed["alone"], first=len(rows) == 1), flush=True)
    if args.json:
        print(json.dumps({"machine": platform.platform(), "max_padding": cap, "rows": rows}))
    return 0


def _line(row: dict[str, Any], reference: dict[str, Any], first: bool) -> str:
    if first:
        print(
            "| batch | arrangement | slates | ms / slate | vs alone | CPU ms / slate | vs alone "
            "| prefill ms / slate (median) | padding / real tokens |\n"
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        )
    ratio = row["ms_per_slate"] / reference["ms_per_slate"]
    cpu_ratio = row["cpu_ms_per_slate"] / reference["cpu_ms_per_slate"]
    return (
        f"| {row['batch_size']} | {row['arrangement']} | {row['slates']} "
        f"| {row['ms_per_slate']:.1f} | {ratio:.2f}x | {row['cpu_ms_per_slate']:.1f} "
        f"| {cpu_ratio:.2f}x | {row['median_prefill_ms_per_slate']:.1f} "
        f"| {row['padding']:.1%} |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
