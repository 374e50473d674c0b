"""How long does SASRec take to rank a slate in ``spdrank eval``, against its own forward, in
this checkout and in an earlier revision?

    .venv/bin/python benchmarks/sasrec_latency.py --before REV [--after REV] [--slates 300] \\
        [--rounds 3] [--batch 64] [--note "what else ran"] [--out DIR]

Each variant's spdrank source runs in a process of its own (``--before REV``: ``src/`` of that
revision, from ``git archive``; ``after``: this checkout's ``src/``, or ``--after REV``'s), the
variants alternating round by round, so both meet the same load on a shared machine. In each,
one SASRec of the default settings (2 blocks, dim 64, 50 positions) over Amazon Beauty's 12,101
items, unfitted (its weights change what it ranks, not how long it takes), ranks the same seeded
slates (a history of 10 items, 50 candidates, as the Beauty builds hold):

- ``rank``: ``SASRecRanker.rank`` on one slate at a time, as ``spdrank eval`` calls it
  (:func:`spdrank.eval.evaluate._timed_rank`: wall clock, cyclic GC paused), torch at its
  default thread count, after one untimed call;
- ``forward on one thread``: ``SASRec.encode`` of the slate's history with torch set to one
  thread, the network's forward alone (the yardstick: ranking should take a few times it);
- ``rank_batch``: ``SASRecRanker.rank_batch`` on ``--batch`` slates at a time, milliseconds a
  slate (a variant without it: none).

Every variant's rankings are compared with the first's (same order, largest score
difference). Writes ``report.md``, ``results.json`` and ``command.txt`` to ``--out`` (default
``benchmarks/results/sasrec-latency-cpu``) with the machine, date, commits, this process's nice
value and what else ran (``--note``, and the load average before and after).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path
from typing import Any

from machine import load, machine

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sasrec-latency-cpu"
#: Amazon Beauty 2014's items, the catalogue the demo and the SASRec report rank.
BEAUTY_ITEMS = 12101


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile, linearly interpolated (as ``spdrank eval`` computes p95)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# -- one variant, in its own process ---------------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Time one variant's spdrank (``args.worker``, a ``src`` folder) on the seeded slates."""
    sys.path.insert(0, args.worker)
    import random

    import torch

    import spdrank
    from spdrank.core.slates import Candidate, Query, Slate
    from spdrank.rankers.sasrec import SASRec, SASRecRanker
    from spdrank.rankers.sasrec_config import SASRecConfig

    assert Path(spdrank.__file__).resolve().is_relative_to(Path(args.worker).resolve())
    rng = random.Random(args.seed)
    items = [f"i{k}" for k in range(args.items)]
    slates = []
    for u in range(args.slates):
        picked = rng.sample(items, args.history + args.candidates)
        slates.append(Slate(
            query=Query(qid=f"u{u}", text="-", history=picked[: args.history]),
            candidates=[Candidate(docid=d, doc={"title": d}) for d in picked[args.history :]],
        ))
    ranker = SASRecRanker(SASRecConfig(), cache=None)
    ranker.model = SASRec(items, SASRecConfig())
    threads = torch.get_num_threads()

    def timed(call: Any) -> tuple[Any, float]:
        gc.disable()
        try:
            t0 = time.perf_counter()
            out = call()
            return out, (time.perf_counter() - t0) * 1000.0
        finally:
            gc.enable()

    ranker.rank(slates[0])
    rankings, rank_ms = [], []
    for slate in slates:
        ranking, ms = timed(lambda s=slate: ranker.rank(s))
        rankings.append([ranking.docids, [float(x) for x in ranking.scores]])
        rank_ms.append(ms)

    torch.set_num_threads(1)
    forward_ms = [timed(lambda s=s: ranker.model.encode([s.query.history]))[1] for s in slates]
    torch.set_num_threads(threads)

    batch_ms: list[float] = []
    if hasattr(ranker, "rank_batch"):
        ranker.rank_batch(slates[: args.batch])
        for start in range(0, len(slates), args.batch):
            chunk = slates[start : start + args.batch]
            batch_ms.append(timed(lambda c=chunk: ranker.rank_batch(c))[1] / len(chunk))
    return {"threads": threads, "rank_ms": rank_ms, "forward_1thread_ms": forward_ms,
            "rank_batch_ms_per_slate": batch_ms, "rankings": rankings}


# -- the comparison --------------------------------------------------------------------------


def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True,
                          check=True).stdout.strip()


def source_of(rev: str, where: Path) -> Path:
    """``src/`` of revision ``rev``, unpacked under ``where``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where / "src"


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rank = [ms for r in runs for ms in r["rank_ms"]]
    forward = [ms for r in runs for ms in r["forward_1thread_ms"]]
    batch = [ms for r in runs for ms in r["rank_batch_ms_per_slate"]]
    return {
        "slates_timed": len(rank),
        "threads": runs[0]["threads"],
        "rank_p50_ms": percentile(rank, 50), "rank_p95_ms": percentile(rank, 95),
        "rank_mean_ms": sum(rank) / len(rank), "rank_max_ms": max(rank),
        "forward_1thread_p50_ms": percentile(forward, 50),
        "rank_batch_p50_ms_per_slate": percentile(batch, 50) if batch else None,
    }


def max_score_diff(a: list[Any], b: list[Any]) -> tuple[bool, float]:
    """Whether two variants' rankings have the same orders, and their largest score gap."""
    same = all(x[0] == y[0] for x, y in zip(a, b))
    gap = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x[1], y[1]))
    return same, gap


def report(meta: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# SASRec's latency in `spdrank eval`, against its own forward (CPU)",
        "",
        ("Command: see [command.txt](command.txt). One SASRec of the default settings (2 blocks, "
         f"dim 64) over {meta['items']:,} items (Amazon Beauty's), unfitted; {meta['slates']} "
         f"seeded slates of a {meta['history']}-item history and {meta['candidates']} "
         f"candidates, ranked {meta['rounds']} times by each variant, each variant in its own "
         "process, the variants alternating round by round."),
        "",
        f"- date: {meta['date']}; this checkout: {meta['commit']}",
        (f"- machine: {meta['machine']}; torch at {meta['threads']} intra-op threads unless a "
         f"column says one; nice {meta['nice']}"),
        (f"- load average before / after: {meta['load_before']} / {meta['load_after']}; also "
         f"running: {meta['note'] or 'not noted'}"),
        "",
        ("| variant | source | rank p50 ms | p95 ms | mean ms | max ms | forward on one thread, "
         f"p50 ms | rank p50 / forward p50 | rank_batch of {meta['batch']}, p50 ms a slate |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        s = row["summary"]
        batch = s["rank_batch_p50_ms_per_slate"]
        lines.append(
            f"| {name} | {row['source']} | {s['rank_p50_ms']:.2f} | {s['rank_p95_ms']:.2f} | "
            f"{s['rank_mean_ms']:.2f} | {s['rank_max_ms']:.1f} | {s['forward_1thread_p50_ms']:.2f}"
            f" | {s['rank_p50_ms'] / s['forward_1thread_p50_ms']:.1f}x | "
            + ("none" if batch is None else f"{batch:.3f}") + " |"
        )
    lines.append("")
    for name, row in rows.items():
        s = row["summary"]
        lines.append(
            f"{name}: a slate took {s['rank_mean_ms']:.2f} ms on average (p95 "
            f"{s['rank_p95_ms']:.2f} ms), {s['rank_mean_ms'] / s['forward_1thread_p50_ms']:.1f}x "
            "the forward on one thread."
        )
    lines.append("")
    for name, row in rows.items():
        if "same_orders" in row:
            lines.append(
                f"{name} against {next(iter(rows))}: the same orders on every slate: "
                f"{'yes' if row['same_orders'] else 'NO'}; largest score difference "
                f"{row['max_score_diff']:.1e}."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None,
                        help="a git revision whose src/ runs as the 'before' variant")
    parser.add_argument("--after", default=None,
                        help="a git revision whose src/ runs as the 'after' variant (default: "
                             "this checkout's src/, uncommitted changes and all)")
    parser.add_argument("--slates", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--items", type=int, default=BEAUTY_ITEMS)
    parser.add_argument("--history", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        json.dump(worker(args), sys.stdout)
        return 0

    passed = list(argv if argv is not None else sys.argv[1:])
    load_before = load()
    with tempfile.TemporaryDirectory(prefix="sasrec-latency-") as tmp:
        sources = {}
        if args.before is not None:
            before = git("rev-parse", "--short", args.before)
            sources["before"] = (source_of(args.before, Path(tmp) / "before"),
                                 f"{before} (`--before`)")
        if args.after is not None:
            after = git("rev-parse", "--short", args.after)
            sources["after"] = (source_of(args.after, Path(tmp) / "after"), f"{after} (`--after`)")
        else:
            dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "src"],
                                   check=False).returncode
            after = git("rev-parse", "--short", "HEAD") + (" + uncommitted src/" if dirty else "")
            sources["after"] = (ROOT / "src", f"{after} (this checkout)")
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
        names = list(sources)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                cmd = [sys.executable, __file__, "--worker", str(sources[name][0]),
                       "--slates", str(args.slates), "--batch", str(args.batch),
                       "--items", str(args.items), "--history", str(args.history),
                       "--candidates", str(args.candidates), "--seed", str(args.seed)]
                env = {**os.environ, "PYTHONPATH": str(sources[name][0])}
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"the {name} variant failed:\n{done.stderr}")
                runs[name].append(json.loads(done.stdout))
                print(f"round {round_ + 1}/{args.rounds} {name}: rank p50 "
                      f"{percentile(runs[name][-1]['rank_ms'], 50):.2f} ms", flush=True)
    rows: dict[str, dict[str, Any]] = {}
    first = runs[names[0]][0]["rankings"]
    for name in names:
        rows[name] = {"source": sources[name][1], "summary": summary(runs[name])}
        if name != names[0]:
            same, gap = max_score_diff(first, runs[name][0]["rankings"])
            rows[name].update(same_orders=same, max_score_diff=gap)
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": after, "machine": machine(), "threads": runs[names[-1]][0]["threads"],
        "nice": os.nice(0), "load_before": load_before, "load_after": load(),
        "note": args.note, "items": args.items, "slates": args.slates, "rounds": args.rounds,
        "history": args.history, "candidates": args.candidates, "batch": args.batch,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    command = (f"nice -n {os.nice(0)} .venv/bin/python benchmarks/sasrec_latency.py "
               f"{shlex.join(passed)}")
    (args.out / "command.txt").write_text(command + "\n", encoding="utf-8")
    (args.out / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": rows,
         "per_slate_rank_ms": {n: [r["rank_ms"] for r in runs[n]] for n in names}},
        indent=1) + "\n", encoding="utf-8")
    text = report(meta, rows)
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
