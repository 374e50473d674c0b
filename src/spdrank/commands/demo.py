"""``spdrank demo``: the Beauty benchmark's slates and the baseline table, end to end.

This is the foundation's demo: it builds the bundled Amazon Beauty 2014 slates (reused
when already built) and prints how the non-LLM baselines rank them, the rows every later
results table starts with. Training and serving the SPD student join it as they land.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build the Beauty slates and show the baseline table", description=__doc__)
    p.add_argument("--dir", default="spdrank-demo", help="working directory (default: ./spdrank-demo)")
    p.add_argument("--negatives", default="uniform", choices=["uniform", "popularity"])
    p.add_argument("--limit", type=int, help="evaluate only the first N eval slates")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from spdrank.cli import main

    data = Path(args.dir) / f"beauty-{args.negatives}"
    if (data / "manifest.json").exists():
        print(f"[1/2] Beauty slates already built in {data}: reusing them")
    else:
        print(f"[1/2] building the Amazon Beauty 2014 slates in {data} (about 15 s)")
        code = main(["data", "beauty", "--out", str(data), "--negatives", args.negatives])
        if code:
            return code
    print("[2/2] ranking the 1,118 eval slates with the non-LLM baselines (about 30 s)")
    argv = ["eval", "--slates", str(data / "eval.jsonl"), "--json", str(Path(args.dir) / "baselines.json")]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    code = main(argv)
    if code == 0:
        print(f"\nresults as JSON: {Path(args.dir) / 'baselines.json'}")
    return code
