"""Do a checkpoint's rankings agree between float32 and bfloat16 on this CPU, and what does
bfloat16 save a slate?

    .venv/bin/python benchmarks/bf16_agreement.py --model history=runs/demo/model \\
        --model attn=runs/overhead-cpu/spd-k160 --slates data/beauty/eval.jsonl \\
        [--limit 200] [--threads 2] [--min-tau 0.99] [--note "what else ran"] [--out DIR]

``--dtype auto`` ranks in bfloat16 on a CPU with native bfloat16 matrix units (AMX,
AVX512-BF16). This script is the check behind that default: each checkpoint (``NAME=DIR``,
repeatable: one per head kind) is loaded twice, in float32 and in bfloat16 (the backbone,
and the head's products with it), and ranks each of the first ``--limit`` slates in both,
alternating which goes first. Per checkpoint it reports Kendall's tau between the two
rankings (mean and min over the slates; the float32 ranking is the reference, its score
ties left out), how often they put the same item first, and the median milliseconds of a
whole ``rank()`` call in each dtype. A checkpoint agrees when its mean tau reaches
``--min-tau`` (the issue's bar, .99).

Writes ``report.md``, ``results.json`` (with every slate's figures) and ``command.txt`` to
``--out`` (default ``benchmarks/results/bf16-agreement-cpu``), with the machine, the date,
the commit and what else ran (``--note``, and the load average before and after). Exits 1,
after writing them, when a checkpoint falls short. Run it alone on the machine for the
milliseconds; the taus do not depend on the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from machine import ROOT, code_version, fmt, load, shown
from machine import facts as machine_facts

from spdrank.backbone import cpu
from spdrank.backbone.load import resolve_dtype
from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, load_slates
from spdrank.eval.metrics import kendall_tau, top1_agreement
from spdrank.model.checkpoint import CONFIG_NAME, checkpoint_dir, read_config
from spdrank.model.ranker import SPDRanker

DTYPES = ("float32", "bfloat16")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bf16-agreement-cpu"


@dataclass
class SlateRow:
    """One slate ranked in both dtypes."""

    qid: str
    n: int
    tau: float | None
    top1: float | None
    ms_float32: float
    ms_bfloat16: float


def agreement(reference: Ranking, other: Ranking) -> tuple[float | None, float | None]:
    """Kendall's tau and top-1 agreement of ``other`` with ``reference`` (the float32 one), its
    score ties left out where its scores fall along its ranking (else every pair counts)."""
    scores = reference.scores
    try:
        return (kendall_tau(other.docids, reference.docids, scores),
                top1_agreement(other.docids, reference.docids, scores))
    except ValueError:
        if scores is None:
            raise
    return (kendall_tau(other.docids, reference.docids),
            top1_agreement(other.docids, reference.docids))


def timed_rank(model: SPDRanker, slate: Slate) -> tuple[Ranking, float]:
    """``model.rank(slate)`` and its wall milliseconds."""
    start = time.perf_counter()
    ranking = model.rank(slate)
    return ranking, (time.perf_counter() - start) * 1e3


def compare(models: dict[str, SPDRanker], slates: Sequence[Slate], warmup: int) -> list[SlateRow]:
    """Every slate ranked by the float32 and the bfloat16 model, the first one alternating
    slate by slate so neither always finds the caches the other left."""
    for slate in slates[:warmup]:
        for model in models.values():
            model.rank(slate)
    rows = []
    for i, slate in enumerate(slates):
        order = DTYPES if i % 2 == 0 else DTYPES[::-1]
        ranked = {dtype: timed_rank(models[dtype], slate) for dtype in order}
        tau, top1 = agreement(ranked["float32"][0], ranked["bfloat16"][0])
        rows.append(SlateRow(slate.query.qid, len(slate), tau, top1,
                             ranked["float32"][1], ranked["bfloat16"][1]))
    return rows


def summary(name: str, path: str, model: SPDRanker, rows: list[SlateRow],
            min_tau: float) -> dict[str, Any]:
    """One checkpoint's figures over its slates, and whether it agrees (mean tau ≥ min_tau)."""
    taus = [r.tau for r in rows if r.tau is not None]
    top1 = [r.top1 for r in rows if r.top1 is not None]
    p50 = {d: statistics.median(getattr(r, f"ms_{d}") for r in rows) for d in DTYPES}
    tau_mean = statistics.fmean(taus) if taus else None
    return {
        "name": name, "path": str(path), "head": model.config.head.kind,
        "decoder": model.config.decoder, "positions": model.config.head.positions,
        "layers": model.config.backbone.layers,
        "saved_dtype": read_config(checkpoint_dir(path) / CONFIG_NAME).backbone.dtype,
        "slates": len(rows), "slates_with_tau": len(taus),
        "tau_mean": tau_mean, "tau_min": min(taus) if taus else None,
        "tau_at_least_min": sum(t >= min_tau for t in taus) / len(taus) if taus else None,
        "identical": sum(t == 1.0 for t in taus) / len(taus) if taus else None,
        "top1": statistics.fmean(top1) if top1 else None,
        "p50_ms": p50, "speedup": p50["float32"] / p50["bfloat16"] if p50["bfloat16"] else None,
        "agrees": tau_mean is not None and tau_mean >= min_tau,
    }


def facts(args: argparse.Namespace) -> dict[str, Any]:
    """What the figures mean little without: machine, CPU flags, threads, date, commit."""
    flags = sorted(cpu.cpuinfo_flags() & set(cpu.BF16_FLAGS))
    return {
        "machine": machine_facts(), "cpu_bf16_flags": flags, "native_bf16": cpu.native_bf16(),
        "override": os.environ.get(cpu.ENV),
        "auto_ranks_in": str(resolve_dtype("auto", args.device, cpu_bf16=True)).removeprefix(
            "torch."),
        "threads": torch.get_num_threads(), "device": args.device,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": code_version(), "slates": args.slates, "limit": args.limit,
        "min_tau": args.min_tau, "warmup": args.warmup, "note": args.note,
    }


def report(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The report's markdown: the facts, one row a checkpoint, the verdict."""
    m = meta["machine"]
    lines = [
        "# float32 against bfloat16 on the CPU: do the rankings agree?", "",
        (f"Command: see [command.txt](command.txt). Slates: `{meta['slates']}` (the first "
        f"{meta['limit']}), each ranked by each checkpoint in both dtypes (whole `rank()` "
        "calls, batch 1, the first dtype alternating slate by slate)."), "",
        f"- date: {meta['date']}; commit: {meta['commit']}",
        (f"- machine: {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}), "
        f"{m.get('ram_gib', '?')} GiB RAM; torch {m.get('torch')}, {meta['threads']} threads"),
        (f"- CPU bfloat16 flags: {' '.join(meta['cpu_bf16_flags']) or 'none'}; native bfloat16 "
        f"units: {'yes' if meta['native_bf16'] else 'no'}"
        + (f" ({cpu.ENV}={meta['override']} set)" if meta["override"] is not None else "")
        + f", so `--dtype auto` ranks "
        f"in {meta['auto_ranks_in']} here"),
        f"- load average before / after: {meta['load_before']} / {meta['load_after']}"
        + (f"; also running: {meta['note']}" if meta["note"] else ""), "",
        ("| checkpoint | head | slates | mean tau | min tau | tau ≥ "
        f"{meta['min_tau']:g} | identical | top-1 agreement | p50 ms float32 | "
        "p50 ms bfloat16 | speed-up | agrees |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['head']} | {r['slates']} | {fmt(r['tau_mean'], '.4f')} | "
            f"{fmt(r['tau_min'], '.4f')} | {fmt(r['tau_at_least_min'], '.3f')} | "
            f"{fmt(r['identical'], '.3f')} | {fmt(r['top1'], '.3f')} | "
            f"{r['p50_ms']['float32']:.1f} | {r['p50_ms']['bfloat16']:.1f} | "
            f"{fmt(r['speedup'], '.2f')}x | {'yes' if r['agrees'] else 'NO'} |"
        )
    short = [r["name"] for r in rows if not r["agrees"]]
    lines += ["", (f"Every checkpoint agrees: mean tau ≥ {meta['min_tau']:g}." if not short else
                   f"Short of mean tau {meta['min_tau']:g}: {', '.join(short)}."), "",
              ("Tau is Kendall's between the two rankings of a slate, the float32 one the "
              "reference (its score ties left out); `identical` is the share of slates ranked "
              "exactly alike. The milliseconds are a whole `rank()` call (tokenize, prefill, "
              "head, decoder); every slate's figures are in results.json.")]
    return "\n".join(lines) + "\n"


def named_model(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--model takes NAME=DIR, got {text!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", type=named_model, required=True,
                   metavar="NAME=DIR", help="a checkpoint to check (repeatable)")
    p.add_argument("--slates", required=True, help="the eval slates (JSONL)")
    p.add_argument("--limit", type=int, default=200, help="slates ranked (default 200)")
    p.add_argument("--device", default="cpu", help="the device (default cpu: the question)")
    p.add_argument("--threads", type=int, help="torch's threads (default: torch's own)")
    p.add_argument("--min-tau", type=float, default=0.99, help="the mean tau a checkpoint "
                   "must reach (default .99)")
    p.add_argument("--warmup", type=int, default=3, help="untimed slates first (default 3)")
    p.add_argument("--note", default="", help="what else ran on the machine, for the report")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the report's folder")
    args = p.parse_args(argv)
    names = [name for name, _ in args.model]
    if len(set(names)) != len(names):
        p.error(f"--model names repeat: {names}")
    if args.limit < 1:
        p.error("--limit must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        slates = load_slates(args.slates, limit=args.limit)
        if not slates:
            raise ValueError(f"{args.slates} holds no slates")
        meta = facts(args) | {"load_before": load()}
        rows, per_slate = [], {}
        for name, path in args.model:
            models = {d: SPDRanker.from_pretrained(path, device=args.device, dtype=d)
                      for d in DTYPES}
            ranked = compare(models, slates, args.warmup)
            rows.append(summary(name, path, models["float32"], ranked, args.min_tau))
            per_slate[name] = [asdict(r) for r in ranked]
            r = rows[-1]
            print(f"{name}: mean tau {fmt(r['tau_mean'], '.4f')}, min {fmt(r['tau_min'], '.4f')}, "
                  f"top-1 {fmt(r['top1'], '.3f')}, p50 ms {r['p50_ms']['float32']:.1f} float32 / "
                  f"{r['p50_ms']['bfloat16']:.1f} bfloat16", flush=True)
            del models
    except (ValueError, OSError) as e:
        print(f"bf16_agreement: {e}", file=sys.stderr)
        return 2
    meta["load_after"] = load()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"meta": meta, "models": rows, "per_slate": per_slate}
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "report.md").write_text(report(meta, rows))
    command = shlex.join([shown(Path(sys.executable)), "benchmarks/bf16_agreement.py",
                          *(sys.argv[1:] if argv is None else argv)])
    (args.out / "command.txt").write_text(command + "\n")
    print(f"wrote {args.out}/report.md")
    return 0 if all(r["agrees"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
