"""What a prefill costs against the number of candidates and the prompt's length, for
recommendation and search prompts, and what sliding windows cost against one long prefill.

    .venv/bin/python benchmarks/prefill_cost.py [--backbone bundled | config:PATH] [--layers 2] \\
        [--sizes 10,20,50,100] [--dtypes float32,bfloat16] [--window 20 --stride 10] \\
        [--reps 5] [--threads 2] [--note "what else ran"] [--out DIR]

A prompt's length grows with its candidates, and attention with the square of the length, so
the prefill's cost curve bends. For each dtype, prompt kind and slate size N, the script times
the prefill of the first ``--layers`` layers (median of ``--reps``), and profiles one prefill
to split its time between the matrix products and the attention kernel
(:func:`prefill_limit.profile`); the table says from which N attention takes more than the
products. The prompts are spdrank's own (``PromptBuilder``):

- recommendation: a 10-item history and N Beauty titles, 32 tokens each;
- search: a DL19 query and N of its BM25 passages (``../shared/data/trec-dl19``, or
  ``--passages FILE``), 64 tokens each, with the search template.

Sliding windows: for each search N over ``--window``, the prefills of RankGPT's windows of
that many passages (stride ``--stride``), one after the other, against the one prefill of all
N. Writes ``report.md``, ``results.json`` and ``command.txt`` to ``--out`` (default
``benchmarks/results/prefill-cost-cpu``). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from prefill_limit import load_average, median_ms, profile, sizes_arg
from serve_harness import ROOT, code_version, machine

from spdrank.backbone import cpu
from spdrank.backbone.load import load_backbone, load_tokenizer
from spdrank.backbone.prompt import PromptBuilder, PromptSettings
from spdrank.backbone.settings import BUNDLED, BackboneConfig
from spdrank.backbone.split import last_hidden
from spdrank.backbone.templates import SEARCH
from spdrank.datasets.beauty import load_titles
from spdrank.datasets.titles import render_history
from spdrank.rankers.windows import Windows

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "prefill-cost-cpu"
DL19 = ROOT.parent / "shared" / "data" / "trec-dl19" / "retrieve_results_dl19.json"


def search_texts(path: Path, n: int, seed: int) -> tuple[str, list[str]]:
    """A query with at least ``n`` passages from a retrieve-results file, and its first ``n``."""
    records = [r for r in json.loads(path.read_text()) if len(r["hits"]) >= n]
    if not records:
        raise SystemExit(f"{path} holds no query with {n} passages")
    record = random.Random(seed).choice(records)
    return record["query"], [h["content"] for h in record["hits"][:n]]


def prompt_ids(kind: str, tokenizer: Any, n: int, args: argparse.Namespace) -> list[int]:
    """One prompt of ``kind`` with ``n`` candidates, as spdrank builds it."""
    if kind == "recommendation":
        settings = PromptSettings(max_item_tokens=32, history_items=True)
        titles = sorted(t for t in load_titles().values() if t)
        drawn = random.Random(args.seed).sample(titles, 10 + n)
        query, texts = render_history(drawn[:10]), drawn[10:]
    else:
        settings = PromptSettings(max_item_tokens=64, template=SEARCH)
        query, texts = search_texts(args.passages, n, args.seed)
    return PromptBuilder(tokenizer, settings).encode(query, texts).input_ids


def prefill_ms(backbone: torch.nn.Module, ids: list[int], args: argparse.Namespace) -> float:
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        call = functools.partial(last_hidden, backbone, tensor, torch.ones_like(tensor))
        return median_ms(call, args.reps, args.warmup)["median"]


def measure(backbone: torch.nn.Module, tokenizer: Any, dtype: str,
            args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for kind in ("recommendation", "search"):
        for n in args.sizes:
            ids = prompt_ids(kind, tokenizer, n, args)
            tensor = torch.tensor([ids])
            split = profile(backbone, tensor, torch.ones_like(tensor), 1, 5)["categories_ms"]
            row: dict[str, Any] = {
                "dtype": dtype, "prompt": kind, "n": n, "tokens": len(ids),
                "prefill_ms": prefill_ms(backbone, ids, args),
                "attention_ms": split.get("attention kernel", 0.0),
                "products_ms": split.get("matrix products", 0.0),
            }
            if kind == "search" and n > args.window:
                spans = Windows(args.window, args.stride).spans(n)
                width = args.window
                window_ids = prompt_ids(kind, tokenizer, width, args)
                row["windows"] = len(spans)
                row["windows_ms"] = len(spans) * prefill_ms(backbone, window_ids, args)
            rows.append(row)
            print(f"{dtype} {kind} N={n} T={len(ids)}: {row['prefill_ms']:.1f} ms"
                  + (f", windows {row['windows_ms']:.1f} ms" if "windows" in row else ""),
                  flush=True)
    return rows


def report(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# What a prefill costs against N and the prompt's length",
        "",
        ("Command: see [command.txt](command.txt). Backbone "
        f"`{meta['backbone']}`, {meta['layers']} layers, batch 1, median of {meta['reps']} "
        "calls; attention and products from one profiled prefill (their own time)."),
        "",
        f"- date: {meta['date']}; commit: {meta['commit']}",
        (f"- machine: {meta['machine'].get('cpus')} CPU cores ({meta['machine'].get('cpu')}), "
        f"torch {torch.__version__}, {meta['threads']} threads; CPU bfloat16 flags: "
        f"{meta['bf16_flags']}"),
        (f"- load average before / after: {meta['load_before']} / {meta['load_after']}; also "
        f"running: {meta['note'] or 'not said'}"),
        "",
        ("| dtype | prompt | N | tokens | prefill ms | ms a candidate | attention ms | products "
        f"ms | windows of {meta['window']} (stride {meta['stride']}) | windows ms | windows / one |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        windows = (f"{r['windows']} | {r['windows_ms']:.1f} | "
                   f"{r['windows_ms'] / r['prefill_ms']:.2f}x") if "windows" in r else "- | - | -"
        lines.append(
            f"| {r['dtype']} | {r['prompt']} | {r['n']} | {r['tokens']} | {r['prefill_ms']:.1f} | "
            f"{r['prefill_ms'] / r['n']:.2f} | {r['attention_ms']:.1f} | {r['products_ms']:.1f} "
            f"| {windows} |"
        )
    lines += ["", "## Where attention starts to dominate", ""]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for kind in ("recommendation", "search"):
            mine = [r for r in rows if r["dtype"] == dtype and r["prompt"] == kind]
            over = next((r for r in mine if r["attention_ms"] > r["products_ms"]), None)
            lines.append(
                f"- {dtype}, {kind}: "
                + (f"from N = {over['n']} ({over['tokens']} tokens) the attention kernel takes "
                   f"more than the matrix products ({over['attention_ms']:.1f} against "
                   f"{over['products_ms']:.1f} ms)" if over else
                   f"not up to N = {mine[-1]['n']} ({mine[-1]['tokens']} tokens)")
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default=BUNDLED)
    p.add_argument("--layers", type=int, default=2, help="layers kept (0: all; default 2)")
    p.add_argument("--sizes", type=sizes_arg, default=[10, 20, 50, 100])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--passages", type=Path, default=DL19, help="a retrieve-results JSON")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--stride", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--note", default="")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    before = load_average()
    tokenizer = load_tokenizer(args.backbone)
    rows = []
    for dtype in args.dtypes.split(","):
        config = BackboneConfig(name_or_path=args.backbone, layers=args.layers or None,
                                dtype=dtype, lora=None)
        rows += measure(load_backbone(config), tokenizer, dtype, args)
    meta = {
        "backbone": args.backbone, "layers": args.layers or "all", "reps": args.reps,
        "window": args.window, "stride": args.stride,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "commit": code_version(),
        "machine": machine(), "threads": torch.get_num_threads(),
        "bf16_flags": ", ".join(sorted(cpu.cpuinfo_flags() & set(cpu.BF16_FLAGS))) or "none",
        "load_before": before, "load_after": load_average(), "note": args.note,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.out / "report.md").write_text(report(meta, rows))
    command = shlex.join([".venv/bin/python", "benchmarks/prefill_cost.py", *(argv or sys.argv[1:])])
    (args.out / "command.txt").write_text(command + "\n")
    print(f"wrote {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
