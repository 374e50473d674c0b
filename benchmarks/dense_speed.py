"""How fast does the dense ranker (all-MiniLM-L6-v2, ``--ranker dense``) rank a search slate on
this CPU, before and after its length-sorted batches, and do its scores stay the same?

    .venv/bin/spdrank data search --retrieved ../shared/data/trec-dl19/retrieve_results_dl19.json \\
        --qrels ../shared/data/trec-dl19/qrels_dl19.json --rel-level 2 --out /tmp/dl19.jsonl
    .venv/bin/python benchmarks/dense_speed.py --slates /tmp/dl19.jsonl [--limit 12] \\
        [--budgets 1024,4096] [--note "what else ran"] [--out DIR]

Each slate (a query and BM25's top 100 passages) is scored, query by query, by every variant
of the same loaded encoder, the first variant rotating from query to query so that a drift of
the machine's speed is spread over all of them:

- ``before``: the code before the change, texts in slate order in batches of 64, each padded
  to its longest text, torch splitting each product over its threads;
- ``sorted, B tokens, one forward at a time``: texts sorted by length into batches of at most B
  padded tokens, run one after the other, torch splitting each product over its threads (the
  sort alone);
- ``sorted, B tokens, a batch a thread``: ``DenseRanker.embed`` as it is, the sorted batches
  spread over torch's threads, each forward on one thread, for each B of ``--budgets`` (the
  ranker's default is marked);
- ``sorted, B tokens, 1 thread``: the default budget with torch on one thread (``--one-thread``).

Writes ``report.md``, ``results.json`` (every query's figures) and ``command.txt`` to ``--out``
(default ``benchmarks/results/dense-speed-cpu``) with the machine, the date, the commit and
what else ran (``--note``, and the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from serve_harness import ROOT, code_version, machine

from spdrank.core.slates import TEXT_FIELDS, Slate, load_slates
from spdrank.rankers.dense import BATCH_TOKENS, DenseRanker, length_batches

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "dense-speed-cpu"
#: The batch size of the code before the change: texts in the order given.
BEFORE_BATCH = 64


def in_order_batches(n: int, size: int = BEFORE_BATCH) -> list[list[int]]:
    """The batches of the code before the change: consecutive texts, ``size`` at a time."""
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def embed_in_order(ranker: DenseRanker, texts: list[str]) -> Any:
    """Embeddings as ``DenseRanker.embed`` computed them before: batches of 64 in the order
    given, each tokenized with ``padding=True`` (to its longest text)."""
    parts = []
    with torch.inference_mode():
        for batch in in_order_batches(len(texts)):
            inputs = ranker._tokenizer([texts[i] for i in batch], padding=True, truncation=True,
                                       max_length=ranker.max_tokens, return_tensors="pt")
            states = ranker._encoder(**inputs).last_hidden_state
            mask = inputs["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            parts.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(parts)


def padded_tokens(lengths: list[int], batches: list[list[int]]) -> int:
    """Tokens the forwards read: each batch's rows times its longest text."""
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def embed_one_at_a_time(ranker: DenseRanker, texts: list[str], budget: int) -> Any:
    """The sorted batches run one after the other on the caller's thread (torch splitting
    each product over its threads): the sort without the spreading over threads."""
    encoded = ranker._tokenizer(texts, truncation=True, max_length=ranker.max_tokens)
    rows = [dict(zip(encoded.keys(), values)) for values in zip(*encoded.values())]
    out = torch.empty(len(texts), ranker._encoder.config.hidden_size)
    for batch in length_batches([len(r["input_ids"]) for r in rows], budget):
        out[torch.tensor(batch)] = ranker._embed_batch([rows[i] for i in batch])
    return out


class Variant:
    """One way of scoring a slate: a name, its batches (to count padding) and how it runs."""

    def __init__(self, name: str, budget: int | None, how: str, threads: int | None = None) -> None:
        self.name = name
        self.budget = budget  # None: the code before, batches of 64 in order
        self.how = how  # "before", "one at a time" or "a batch a thread" (the ranker's)
        self.threads = threads

    def batches(self, lengths: list[int]) -> list[list[int]]:
        if self.budget is None:
            return in_order_batches(len(lengths))
        return length_batches(lengths, self.budget)

    def scores(self, ranker: DenseRanker, slate: Slate) -> tuple[list[float], float]:
        """The slate's cosines and the milliseconds they took."""
        default = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            t0 = time.perf_counter()
            if self.how == "a batch a thread":
                ranker.batch_tokens = self.budget or BATCH_TOKENS
                scores = ranker.scores(slate)
            else:
                vectors = (embed_in_order(ranker, texts_of(slate)) if self.budget is None else
                           embed_one_at_a_time(ranker, texts_of(slate), self.budget))
                scores = (vectors[1:] @ vectors[0]).tolist()
            return scores, (time.perf_counter() - t0) * 1000.0
        finally:
            torch.set_num_threads(default)


def texts_of(slate: Slate) -> list[str]:
    """What the ranker embeds: the query, then each candidate's text."""
    return [slate.query.text, *slate.candidate_texts(TEXT_FIELDS)]


def variants(budgets: list[int], one_thread: bool) -> list[Variant]:
    out = [Variant("before: 64 texts a batch, in slate order", None, "before"),
           Variant(f"sorted, {BATCH_TOKENS} tokens a batch, one forward at a time", BATCH_TOKENS,
                   "one at a time")]
    for b in budgets:
        mark = " (the default)" if b == BATCH_TOKENS else ""
        out.append(Variant(f"sorted, {b} tokens a batch, a batch a thread{mark}", b,
                           "a batch a thread"))
    if one_thread:
        out.append(Variant(f"sorted, {BATCH_TOKENS} tokens a batch, 1 thread", BATCH_TOKENS,
                           "a batch a thread", 1))
    return out


def alone_difference(ranker: DenseRanker, slate: Slate) -> float:
    """The largest difference between the ranker's embeddings of a slate's texts and each text
    embedded alone (no padding, no batch)."""
    texts = texts_of(slate)
    ranker.batch_tokens = BATCH_TOKENS
    batched = ranker.embed(texts)
    alone = torch.cat([ranker.embed([t]) for t in texts])
    return float((batched - alone).abs().max())


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def summarize(rows: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per variant: p50 and mean ms a query, speed-up of the p50 over ``before``'s, padded
    over real tokens and the largest score difference from ``before``."""
    real = sum(r["real_tokens"] for r in rows)
    out = []
    for name in names:
        ms = [r["ms"][name] for r in rows]
        out.append({
            "variant": name,
            "queries": len(rows),
            "p50_ms": statistics.median(ms),
            "mean_ms": statistics.fmean(ms),
            "padded_over_real_tokens": sum(r["padded_tokens"][name] for r in rows) / real,
            "max_score_diff_vs_before": max(r["score_diff"][name] for r in rows),
        })
    base = out[0]["p50_ms"]
    for row in out:
        row["speedup_p50"] = base / row["p50_ms"]
    return out


def report(meta: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    m = meta["machine"]
    lines = [
        "# The dense ranker's speed on the CPU: all-MiniLM-L6-v2 over BM25's top 100", "",
        (f"Command: see [command.txt](command.txt). Slates: `{meta['slates']}` (TREC DL19, the "
         f"first {meta['queries']} queries, {meta['texts_per_query']:.0f} texts each: the query "
         "and its passages), each scored by every variant of one loaded encoder, the first "
         "variant rotating query by query. Milliseconds are one slate's embeddings and cosines."),
        "",
        f"- date: {meta['date']}; commit: {meta['commit']}",
        (f"- machine: {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}), "
         f"{m.get('ram_gib', '?')} GiB RAM; torch {m.get('torch')}, {meta['threads']} threads "
         "unless a row says otherwise"),
        f"- load average before / after: {meta['load_before']} / {meta['load_after']}"
        + (f"; also running: {meta['note']}" if meta["note"] else ""),
        "",
        ("| variant | p50 ms a query | mean ms | speed-up (p50) | padded / real tokens | "
         "max score diff vs before |"),
        "|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['variant']} | {s['p50_ms']:.0f} | {s['mean_ms']:.0f} | "
            f"{s['speedup_p50']:.2f}x | {s['padded_over_real_tokens']:.2f} | "
            f"{s['max_score_diff_vs_before']:.1e} |"
        )
    before, serial = summary[0], summary[1]
    default = next(x for x in summary if "(the default)" in x["variant"])
    alone = [x for x in summary if x["variant"].endswith("1 thread")]
    lines += [
        "",
        (f"Reading: the code before read {before['padded_over_real_tokens']:.2f}x the real "
         f"tokens, the sorted batches {default['padded_over_real_tokens']:.2f}x. Run one forward "
         f"at a time with torch splitting each product over {meta['threads']} threads, they took "
         f"{serial['p50_ms']:.0f} ms a query; spread a batch a thread, {default['p50_ms']:.0f} ms"
         + (f" (on one thread alone: {alone[0]['p50_ms']:.0f} ms)" if alone else "")
         + f", {default['speedup_p50']:.2f}x the code before. The default ran the encoder's "
         f"products at {meta['gflop_per_query'] / default['p50_ms'] * 1000:.0f} GFLOP/s."),
    ]
    lines += [
        "",
        (f"The first slate's embeddings differ from each text embedded alone by at most "
         f"{meta['alone_max_diff']:.1e} (the default batching): sorting and batching move no "
         "embedding beyond float rounding."),
        "",
        (f"Real tokens: {meta['real_tokens_per_query']:.0f} a query. The encoder's matrix "
         f"products are about {meta['gflop_per_query']:.0f} GFLOP a query on those alone "
         "(2 x 10.6M weights of its 6 layers a token, attention besides), so in float32 "
         "a query costs about that over the cores' sustained rate, whatever the batching."),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slates", required=True, type=Path, help="search slates (JSONL)")
    p.add_argument("--limit", type=int, default=12, help="first N slates (default 12)")
    p.add_argument("--budgets", default="1024,4096",
                   help="batch_tokens values to time a batch a thread (default 1024,4096)")
    p.add_argument("--no-one-thread", dest="one_thread", action="store_false",
                   help="leave out the default budget on one thread")
    p.add_argument("--note", default="", help="what else ran on the machine")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",") if b]

    slates = load_slates(args.slates)[: args.limit]
    ranker = DenseRanker()
    chosen = variants(budgets, args.one_thread)
    names = [v.name for v in chosen]
    meta: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": code_version(), "machine": machine(), "threads": torch.get_num_threads(),
        "slates": str(args.slates), "note": args.note, "load_before": load_average(),
    }
    ranker.scores(slates[0])  # loads the encoder; a warm-up for every variant's kernels
    embed_in_order(ranker, texts_of(slates[0]))
    meta["alone_max_diff"] = alone_difference(ranker, slates[0])

    rows = []
    for q, slate in enumerate(slates):
        lengths = [len(ids) for ids in ranker._tokenizer(
            texts_of(slate), truncation=True, max_length=ranker.max_tokens)["input_ids"]]
        ms: dict[str, float] = {}
        scores: dict[str, list[float]] = {}
        for k in range(len(chosen)):
            v = chosen[(q + k) % len(chosen)]
            scores[v.name], ms[v.name] = v.scores(ranker, slate)
        before = scores[names[0]]
        rows.append({
            "qid": slate.query.qid, "texts": len(lengths), "real_tokens": sum(lengths),
            "ms": ms,
            "padded_tokens": {v.name: padded_tokens(lengths, v.batches(lengths)) for v in chosen},
            "score_diff": {n: max(abs(a - b) for a, b in zip(scores[n], before)) for n in names},
        })
        print(f"{q + 1}/{len(slates)} {slate.query.qid}: "
              + ", ".join(f"{ms[n]:.0f}" for n in names), file=sys.stderr)
    meta["load_after"] = load_average()
    meta["queries"] = len(rows)
    meta["texts_per_query"] = statistics.fmean(r["texts"] for r in rows)
    meta["real_tokens_per_query"] = statistics.fmean(r["real_tokens"] for r in rows)
    meta["gflop_per_query"] = meta["real_tokens_per_query"] * 2 * 10.6e6 / 1e9
    summary = summarize(rows, names)

    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/dense_speed.py",
                                                *(sys.argv[1:] if argv is None else argv)])
    (args.out / "command.txt").write_text(
        "# the slates:\n.venv/bin/spdrank data search --retrieved "
        "../shared/data/trec-dl19/retrieve_results_dl19.json --qrels "
        "../shared/data/trec-dl19/qrels_dl19.json --rel-level 2 --out /tmp/dl19.jsonl\n"
        f"# the measurement ({meta['date']}):\n{command}\n"
    )
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "per_query": rows}, indent=2) + "\n")
    (args.out / "report.md").write_text(report(meta, summary))
    print(report(meta, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
