"""Does the head's one-thread switch pay on the whole ranking call?

Times ``model.rank(slate)`` (what a user waits for: tokenize, prefill, readout, head, decode)
at N candidates for two students on the bundled backbone (SmolLM2-135M-Instruct, its first
``--layers`` layers, frozen): the demo's (the history head matching the words of the titles,
``spdrank demo``'s recipe) and the paper's attention head. Each is saved and loaded back as a
user loads a checkpoint (``dtype: auto``: bfloat16 on a CPU with bfloat16 units), and also
loaded in float32. :mod:`spdrank.model.ranker`'s switch to one thread for a small head
(``HEAD_SERIAL_ROWS``) is on or off, the two compared on every slate, one after the other and
in an order that alternates from slate to slate, so a slow spell of a shared machine falls on
both alike.

Slates are Beauty users (the bundled log and titles): the ten items before a user's last one
as the history, the last item and N - 1 others drawn at random as the candidates. The heads
are untrained (their timing does not depend on their weights), and the scores of the two
settings are compared on the same slate.

    .venv/bin/python benchmarks/head_path.py --out benchmarks/results/head-path-cpu/serial
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Whether the head runs on one thread: the switch on, then off.
SETTINGS = [True, False]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for results.json and report.md")
    p.add_argument("--slates", type=int, default=100, help="slates timed per setting")
    p.add_argument("--candidates", type=int, default=50, help="N, candidates a slate")
    p.add_argument("--layers", type=int, default=2, help="backbone layers kept (the demo's 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heads", nargs="*", default=["history", "attn"],
                   help="fresh students of these heads (none: only the --model checkpoints)")
    p.add_argument("--dtypes", nargs="+", default=["auto", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                   help="also time this checkpoint (repeatable)")
    p.add_argument("--slates-file", help="rank these slates' first --candidates candidates "
                   "instead of the Beauty users'")
    return p.parse_args(argv)


def beauty_slates(count: int, candidates: int, seed: int) -> list[Any]:
    """``count`` slates of Beauty users with ten history items each (see the module doc)."""
    from spdrank.core.slates import Candidate, Query, Slate
    from spdrank.datasets.beauty import load_log, load_titles
    from spdrank.datasets.titles import render_history

    titles = {k: v for k, v in load_titles().items() if v}
    pool = sorted(titles)
    rng = random.Random(seed)
    slates = []
    for user, items in load_log().users:
        items = [i for i in items if i in titles]
        if len(items) < 11:
            continue
        history, target = items[-11:-1], items[-1]
        others = [d for d in rng.sample(pool, candidates + 20) if d != target][: candidates - 1]
        docids = [target, *others]
        rng.shuffle(docids)
        query = Query(str(user), render_history([titles[i] for i in history]), history)
        slates.append(Slate(query, [Candidate(d, {"title": titles[d]}) for d in docids]))
        if len(slates) == count:
            return slates
    raise SystemExit(f"only {len(slates)} Beauty users have 11 titled items")


def file_slates(path: str, count: int, candidates: int) -> list[Any]:
    """The first ``count`` slates of ``path`` with at least ``candidates`` candidates, cut to
    that many."""
    from spdrank.core.slates import Slate, read_slates

    slates = [Slate(s.query, s.candidates[:candidates]) for s in read_slates(path)
              if len(s) >= candidates]
    if len(slates) < count:
        raise SystemExit(f"{path}: only {len(slates)} slates with {candidates} candidates")
    return slates[:count]


def student(head: str, layers: int, folder: Path, dtype: str) -> Any:
    """A fresh (untrained) student of ``head``, saved and loaded back in ``dtype``."""
    import torch

    from spdrank.model.ranker import SPDRanker
    from spdrank.training.config import TrainConfig

    path = folder / head
    if not path.exists():
        torch.manual_seed(0)
        cfg = TrainConfig(slates="-", out="-", head=head, frozen=True, layers=layers,
                          max_item_tokens=32, decoder="expected_rank")
        if head == "history":
            cfg.readout, cfg.match = "words", "tfidf"
        SPDRanker.build(cfg.model_config()).save_pretrained(path)
    return SPDRanker.from_pretrained(path, dtype=None if dtype == "auto" else dtype)


@contextlib.contextmanager
def setting(serial: bool) -> Iterator[None]:
    """The model's one-thread switch for a small head as asked, then restored."""
    from spdrank.model import ranker

    saved = ranker.HEAD_SERIAL_ROWS
    if not serial:
        ranker.HEAD_SERIAL_ROWS = 0
    try:
        yield
    finally:
        ranker.HEAD_SERIAL_ROWS = saved


def name(serial: bool) -> str:
    return f"serial={'on' if serial else 'off'}"


def time_model(model: Any, slates: list[Any]) -> dict[str, Any]:
    """Per setting: every slate's whole ``rank`` call in ms, and its scores' largest distance
    from the switch-on scores (and whether the order differs) on the same slate."""
    import numpy as np

    for serial in SETTINGS:  # warm-up: the first call at a shape pays its allocations
        with setting(serial):
            model.rank(slates[0])
    ms: dict[str, list[float]] = {name(s): [] for s in SETTINGS}
    diff = {name(s): 0.0 for s in SETTINGS}
    reordered = {name(s): 0 for s in SETTINGS}
    for i, slate in enumerate(slates):
        got = {}
        for serial in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
            with setting(serial):
                start = time.perf_counter()
                ranking = model.rank(slate)
                ms[name(serial)].append(1e3 * (time.perf_counter() - start))
            got[name(serial)] = ranking
        ref = got[name(True)]
        ref_scores = dict(zip(ref.docids, ref.scores))
        for key, ranking in got.items():
            d = max(abs(s - ref_scores[docid]) for docid, s in zip(ranking.docids, ranking.scores))
            diff[key] = max(diff[key], d)
            reordered[key] += ranking.docids != ref.docids
    rng = np.random.default_rng(0)
    base = np.array(ms[name(True)])
    out = {}
    for key, v in ms.items():
        # Each slate's time under this setting over the reference's on the same slate: the
        # median ratio, and a bootstrap 95% interval over the slates.
        ratio = np.array(v) / base
        boots = np.median(rng.choice(ratio, (2000, len(ratio))), axis=1)
        out[key] = {
            "paired_median_ratio": float(np.median(ratio)),
            "paired_ratio_ci95": [float(np.percentile(boots, 2.5)),
                                  float(np.percentile(boots, 97.5))],
            "ms": v,
        }
    return {
        key: {
            **out[key],
            "p50_ms": float(np.median(v)),
            "p90_ms": float(np.percentile(v, 90)),
            "mean_ms": float(np.mean(v)),
            "max_score_diff_vs_serial": diff[key],
            "slates_ordered_differently": reordered[key],
        }
        for key, v in ms.items()
    }


def machine() -> dict[str, Any]:
    """The CPU's model name, and the load averages (how busy the machine was)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines
                if line.startswith("model name")), platform.processor())
    load = Path("/proc/loadavg").read_text().split()[:3]
    return {"cpu": cpu, "python": sys.version.split()[0], "loadavg": load}


def busy_processes() -> list[str]:
    """The processes using a CPU at the moment (what else was running)."""
    out = subprocess.run(["ps", "-eo", "pcpu,comm,args", "--sort=-pcpu"], check=True,
                         capture_output=True, text=True).stdout.splitlines()[1:]
    return [line.strip()[:160] for line in out if float(line.split()[0]) >= 5.0][:10]


def main(argv: list[str] | None = None) -> int:
    import torch

    from spdrank.backbone.locate import bundled_backbone_path

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slates = (file_slates(args.slates_file, args.slates, args.candidates) if args.slates_file
              else beauty_slates(args.slates, args.candidates, args.seed))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True,
                            text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], check=False,
                           capture_output=True, text=True).stdout
    record: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "commit": commit.strip(),
        "src_modified": [line[3:] for line in dirty.splitlines()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine_before": machine(),
        "busy_before": busy_processes(),
        "backbone": str(bundled_backbone_path()),
        "torch": torch.__version__,
        "threads": args.threads,
        "candidates": args.candidates,
        "slates": args.slates,
        "layers": args.layers,
        "models": args.model,
        "slates_file": args.slates_file,
        "results": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        models = [(h, None) for h in args.heads] + [m.split("=", 1) for m in args.model]
        for head, path in models:
            for dtype in args.dtypes:
                if path is None:
                    model = student(head, args.layers, Path(tmp), dtype)
                else:
                    from spdrank.model.ranker import SPDRanker

                    model = SPDRanker.from_pretrained(path, dtype=None if dtype == "auto" else dtype)
                backbone = str(next(model.backbone.parameters()).dtype)
                key = f"{head} ({backbone})"
                print(f"timing {key} ...", flush=True)
                record["results"][key] = time_model(model, slates)
                for setting_name, r in record["results"][key].items():
                    print(f"  {setting_name}: p50 {r['p50_ms']:.1f} ms, paired ratio "
                          f"{r['paired_median_ratio']:.3f} {r['paired_ratio_ci95']}, "
                          f"max |score diff| {r['max_score_diff_vs_serial']:.2e}", flush=True)
                del model
    record["machine_after"] = machine()
    record["busy_after"] = busy_processes()
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
