"""What reusing the user context's keys and values buys per slate.

    .venv/bin/python benchmarks/prefix_reuse.py [--layers 2] [--sizes 20,50,150] \
        [--slates 100] [--item-tokens 12] [--threads 2] [--note TEXT]

One user ranked against many candidate sets (a refresh, the next page, several retrievers)
sends the same context every time: the chat template's head, the instruction and the history.
A prefill of the whole prompt recomputes that context for every set; with its keys and values
kept from the first, only the candidates' part runs. Both paths run here on the same prompts
(the history head's prompt, each history item spanned, as the recipe reads it), batch 1, one
slate after another after a warm-up; the time of the reused path includes trimming the cache
back to the context for the next set. The readout states of the two paths must agree: the
largest absolute difference is reported, so a saving bought by computing something else would
show.

Writes benchmarks/results/prefix-reuse-cpu/{report.md,results.json}. Run it alone: it
measures latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path("benchmarks/results/prefix-reuse-cpu")
DATA = Path("data-out/v-uniform/eval.jsonl")
#: What the reused path must save at N = 50 for the server and the API to ship it.
SHIP_AT = 0.20


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from spdrank.backbone import BackboneConfig, bundled_backbone_path, load_backbone
    from spdrank.bench.latency import resize_slates
    from spdrank.prompt import PromptBuilder, PromptSettings
    from spdrank.slates import load_slates

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(bundled_backbone_path())
    builder = PromptBuilder(tokenizer, PromptSettings(
        max_item_tokens=args.item_tokens, readout="mean", history_items=True))
    model = load_backbone(BackboneConfig(layers=args.layers, lora=None, dtype="float32"))
    slates = load_slates(args.data)[: args.slates]
    rows = {}
    for n in args.sizes:
        sized = resize_slates(slates, n, seed=0)
        prompts = [builder.encode(s.query.text, [c.text() for c in s.candidates]) for s in sized]
        full_ms, reuse_ms, diffs = [], [], []
        for i, prompt in enumerate(prompts[: args.warmup] + prompts):
            ids = torch.tensor([prompt.input_ids])
            c = prompt.context_end
            readout = torch.tensor(prompt.readout)
            with torch.inference_mode():
                cache = model(input_ids=ids[:, :c], use_cache=True).past_key_values
                start = time.perf_counter()
                full = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
                middle = time.perf_counter()
                rest = model(input_ids=ids[:, c:], attention_mask=torch.ones_like(ids),
                             cache=cache, use_cache=True).last_hidden_state
                cache.crop(c - ids.size(1))  # drop the candidates, keep the context
                end = time.perf_counter()
            if i < args.warmup:
                continue
            full_ms.append((middle - start) * 1e3)
            reuse_ms.append((end - middle) * 1e3)
            diffs.append(float((full[0, readout] - rest[0, readout - c]).abs().max()))
        tokens = [len(p.input_ids) for p in prompts]
        context = [p.context_end for p in prompts]
        full_med, reuse_med = statistics.median(full_ms), statistics.median(reuse_ms)
        rows[str(n)] = {
            "tokens_median": statistics.median(tokens),
            "context_tokens_median": statistics.median(context),
            "context_share": sum(context) / sum(tokens),
            "full_ms_median": full_med,
            "reuse_ms_median": reuse_med,
            "saving": 1 - reuse_med / full_med,
            "max_abs_diff": max(diffs),
        }
        print(f"N={n}: full {full_med:.1f} ms, reused context {reuse_med:.1f} ms "
              f"({rows[str(n)]['saving']:.1%} saved), max |diff| {max(diffs):.2e}", flush=True)
    return rows


def write_report(args: argparse.Namespace, rows: dict[str, Any]) -> None:
    from spdrank.bench.report import environment

    env = environment()
    at50 = rows.get("50")
    verdict = ""
    if at50 is not None:
        ships = at50["saving"] >= SHIP_AT
        slower = [n for n, r in rows.items() if r["saving"] < 0]
        verdict = (
            f"At N = 50 the reused context saves {at50['saving']:.1%} of the prefill "
            f"({'at least' if ships else 'below'} the {SHIP_AT:.0%} that would make it worth a "
            f"cache in the API and the server): "
            + ("ship it." if ships else "the context is a small share of the prompt "
               f"({at50['context_share']:.0%} of its tokens), and the candidates' tokens, which "
               "every set brings anew, are most of the prefill.")
            + (f" At N = {', '.join(slower)} the reused path is slower than the whole prefill: "
               "the candidates' part run against the cache costs more than the context saves "
               "(likely its attention: a block of queries against a longer cache does not take "
               "the plain causal path of a fresh prefill)." if slower else "")
        )
    lines = [
        "# Prefix reuse: the user context's keys and values kept across candidate sets",
        "",
        (f"Command: `.venv/bin/python benchmarks/prefix_reuse.py --layers {args.layers} "
        f"--sizes {','.join(map(str, args.sizes))} --slates {args.slates} "
        f"--item-tokens {args.item_tokens} --threads {args.threads}`"),
        "",
        (f"Machine: {env['platform']}, {env['cpus']} cores, torch {env['torch']} "
        f"({env['threads']} threads); date {env['date_utc']}. {args.note}"),
        "",
        (f"Scale: the bundled SmolLM2-135M-Instruct, first {args.layers} layers, float32; the "
        f"first {args.slates} Beauty eval slates resized to N candidates; titles cut to "
        f"{args.item_tokens} tokens; the history head's prompt; batch 1; median over slates "
        f"after {args.warmup} warm-up slates."),
        "",
        ("| N | prompt tokens | context tokens | context share | full prefill ms | "
        "reused context ms | saved | max abs diff |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in rows.items():
        lines.append(
            f"| {n} | {r['tokens_median']:.0f} | {r['context_tokens_median']:.0f} | "
            f"{r['context_share']:.1%} | {r['full_ms_median']:.1f} | {r['reuse_ms_median']:.1f} "
            f"| {r['saving']:.1%} | {r['max_abs_diff']:.1e} |")
    lines += ["", verdict]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "results.json").write_text(json.dumps(
        {"settings": settings, "environment": env, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[20, 50, 150])
    parser.add_argument("--slates", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--item-tokens", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    write_report(args, measure(args))
    print(f"report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
