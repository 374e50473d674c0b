"""SPD against the pointwise peer on the same backbone, and FIRST: speed, tokens and fidelity.

    .venv/bin/python benchmarks/pointwise_cpu.py [--train-slates 256] [--eval-slates 200]
        [--latency-slates 10] [--teacher-slates 3] [--note TEXT] [--dry-run]

Every model reads SmolLM2's first 2 layers, frozen, in the same prompt settings (12-token
titles). SPD (the paper's attention head over last-token states, one prompt a slate), the
pointwise peer (each candidate in its own sequence with the user context, one linear score
from its last state: ``--head pointwise``) and SPD with the project's history head (on mean
states, the fidelity report's recipe) are trained by the same ``spdrank train`` command but
for the head (and the history head's readout), on the same lexical teacher's labels
(``ranker:title_similarity``, made by ``benchmarks/fidelity_beauty_cpu.py``), each from a
state cache of the same slates. FIRST has no weights of its own with the backbone frozen (its
letters' logits are the LM's), so it enters untrained: its speed is FIRST's, its fidelity a
zero-shot one.

Three measurements, written to ``benchmarks/results/pointwise-cpu/``:

- fidelity: ``spdrank bench`` on held-out eval slates (50 candidates), Kendall tau, top-1 and
  top-10 against the teacher, quality against the clicks, each row paired slate by slate with
  SPD (95% bootstrap intervals), in ``fidelity/``;
- latency: ms a slate (p50, p95) of ``rank()`` at N = 20, 50, 150 candidates on eval slates
  whose history holds 10 items (more candidates drawn, seeded, from the other slates'
  items), the models alternating slate by slate in one loop (``spdrank.eval.evaluate``), each
  slate first ranked once untimed by every model (kernels built per shape are built there);
  with the stages, and the tokens the backbone processes a slate;
- the autoregressive teacher on the same 2 layers (``spdrank teacher --backend hf
  --constrained``): ms a slate and decode passes, on the first slates of each size.

Runs live under ``runs/pointwise/`` (a finished run is reused).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path("benchmarks/results/pointwise-cpu")
WORK = Path("runs/pointwise")
#: The lexical teacher's labelled slates (train.labels.slates.jsonl, eval.labels.slates.jsonl).
LABELS = Path("runs/fidelity/lexical")
LAYERS = 2
ITEM_TOKENS = 12
SIZES = "20,50,150"
HISTORY = 10


@dataclass(frozen=True)
class Row:
    """One trained model: its name in the tables and its ``--head``."""

    name: str
    head: str
    what: str
    readout: str = "last"

    def run_dir(self, work: Path) -> Path:
        return work / "runs" / self.name

    def states(self, work: Path) -> Path:
        return work / f"states-{self.name}"


ROWS = (
    Row("spd", "attn", "SPD: one prompt a slate, the paper's attention head over the "
        "candidates' last-token states, decoded by expected rank"),
    Row("pointwise", "pointwise", "pointwise: each candidate in its own sequence with the "
        "user context (one row of a batched prefill), one linear score from its last state"),
    Row("spd-history", "history", "SPD with the project's history head (candidates matched "
        "with the history items' states) on mean states: the recipe of the fidelity report",
        readout="mean"),
)


def python() -> list[str]:
    """This interpreter running spdrank, so the commands use the code this script imports."""
    return [sys.executable, "-m", "spdrank"]


def train_command(row: Row, args: argparse.Namespace) -> list[str]:
    return [
        *python(), "train",
        "--slates", str(args.labels / "train.labels.slates.jsonl"),
        "--out", str(row.run_dir(args.work)), "--target", "teacher", "--head", row.head,
        "--backbone", args.backbone, "--frozen", "--layers", str(args.layers),
        "--readout", row.readout, "--max-item-tokens", str(ITEM_TOKENS),
        "--positions", str(max(args.sizes)), "--dtype", "bfloat16",
        "--cache-states", str(row.states(args.work)),
        "--limit", str(args.train_slates), "--epochs", str(args.epochs),
        "--batch-size", "16", "--head-lr", "1e-3", "--warmup-steps", "10",
        "--eval-every", "0", "--seed", "0", "--no-progress",
    ]


def first_dir(args: argparse.Namespace) -> Path:
    return args.work / "runs" / "first-zero-shot"


def save_first(args: argparse.Namespace) -> Path:
    """FIRST on the same backbone and prompt settings, as ``spdrank train --head first`` builds
    it; saved untrained (frozen, its weights are the backbone's)."""
    from spdrank.model.ranker import SPDRanker
    from spdrank.training.config import TrainConfig

    path = first_dir(args)
    if not (path / "config.json").exists():
        cfg = TrainConfig(slates="-", out=str(path), head="first", frozen=True,
                          backbone=args.backbone, layers=args.layers, readout="last",
                          max_item_tokens=ITEM_TOKENS, positions=max(args.sizes))
        SPDRanker.build(cfg.model_config()).save_pretrained(path)
    return path


def bench_command(args: argparse.Namespace) -> list[str]:
    models = [f"{r.name}={r.run_dir(args.work)}" for r in ROWS] + [f"first={first_dir(args)}"]
    return [
        *python(), "bench", "--slates", str(args.labels / "eval.labels.slates.jsonl"),
        "--limit", str(args.eval_slates), *[x for m in models for x in ("--model", m)],
        "--decoders", "expected_rank", "--reference", "spd:expected_rank",
        "--out", str(args.out / "fidelity"), "--title", "SPD, pointwise and FIRST on the lexical teacher",
        "--no-progress",
    ]


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` with its output in ``log``; its wall seconds. A failure stops the script."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("+", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        sys.exit(f"{cmd[3]} failed ({done.returncode}): see {log}")
    return time.perf_counter() - t0


def train_all(args: argparse.Namespace) -> dict[str, Any]:
    """Each row's run (trained now, or reused when finished) and its summary."""
    out = {}
    for row in ROWS:
        summary = row.run_dir(args.work) / "train.json"
        finished = summary.exists() and json.loads(summary.read_text()).get("finished")
        log = args.work / "logs" / f"{row.name}.log"
        wall = None if finished else run(train_command(row, args), log)
        data = json.loads(summary.read_text())
        out[row.name] = {"wall_s_now": wall, "steps": data.get("step"),
                         "train_slates": data.get("train_slates"),
                         "wall_s": data.get("wall_s_this_run"), "cache_s": data.get("cache_s")}
    return out


def latency_slates(args: argparse.Namespace, limit: int) -> list[Any]:
    """The first ``limit`` eval slates whose user context holds ``--history`` items."""
    from spdrank.core.slates import read_slates

    out = []
    for slate in read_slates(args.labels / "eval.labels.slates.jsonl"):
        if len([line for line in slate.query.text.splitlines() if line.strip()]) == args.history:
            out.append(slate)
            if len(out) == limit:
                break
    return out


def latency(args: argparse.Namespace) -> list[dict[str, Any]]:
    """ms a slate, stages and tokens of each model at each size, in one alternating loop."""
    import numpy as np

    from spdrank.compare.latency import resize_slates
    from spdrank.eval.evaluate import evaluate, percentile
    from spdrank.model.ranker import SPDRanker

    models = [SPDRanker.from_pretrained(r.run_dir(args.work)) for r in ROWS]
    models.append(SPDRanker.from_pretrained(first_dir(args)))
    for model, name in zip(models, [r.name for r in ROWS] + ["first"]):
        model.name = name  # the rows' names in the bench's table too
    base = latency_slates(args, args.latency_slates)
    rows = []
    for n in args.sizes:
        sized = resize_slates(base, n, seed=0)
        fits = [m for m in models if n <= m.config.head.positions]

        def prepare(slate: Any, fits: list = fits) -> None:
            for m in fits:
                m.rank(slate)

        results = evaluate(fits, sized, warmup=1, prepare=prepare)
        spd_ms = [r.latency_ms for r in results[models[0].name].records]
        for m in fits:
            records = results[m.name].records
            ms = [r.latency_ms for r in records]
            tokens = [len(m.encode(s).input_ids) for s in sized]
            stages = {s: float(np.median([r.timings.get(s, 0.0) for r in records]))
                      for s in ("tokenize", "prefill", "readout", "head", "assign")}
            rows.append({
                "model": m.name, "n": n, "slates": len(ms),
                "p50_ms": float(percentile(ms, 50)), "p95_ms": float(percentile(ms, 95)),
                "over_spd_per_slate": float(np.median([a / b for a, b in zip(ms, spd_ms)])),
                "tokens_mean": float(np.mean(tokens)), "stages_ms": stages,
                "dtype": str(next(m.backbone.parameters()).dtype).removeprefix("torch."),
            })
            print(f"N={n} {m.name}: p50 {rows[-1]['p50_ms']:.1f} ms, "
                  f"{rows[-1]['tokens_mean']:.0f} tokens", flush=True)
    return rows


def teacher(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The autoregressive teacher (the same backbone and layers, constrained decoding) on the
    first ``--teacher-slates`` latency slates of each size: ms a slate and decode passes."""
    from spdrank.compare.latency import resize_slates
    from spdrank.core.slates import write_slates
    from spdrank.eval.evaluate import percentile

    base = latency_slates(args, args.latency_slates)
    rows = []
    for n in args.sizes:
        folder = args.work / "teacher" / f"n{n}"
        folder.mkdir(parents=True, exist_ok=True)
        sized = resize_slates(base, n, seed=0)[: args.teacher_slates]  # as the models were timed
        write_slates(folder / "slates.jsonl", sized)
        labels = folder / "labels.jsonl"
        if labels.exists():
            labels.unlink()
        run([*python(), "teacher", "--slates", str(folder / "slates.jsonl"), "--out", str(labels),
             "--backend", "hf", "--model", args.backbone, "--layers", str(args.layers),
             "--constrained",
             "--max-item-tokens", str(ITEM_TOKENS), "--batch-size", "1", "--no-progress"],
            folder / "teacher.log")
        records = [json.loads(line) for line in labels.open()]
        ms = [r["latency_ms"] for r in records]
        passes = [r.get("decode_passes") for r in records]
        rows.append({"model": "teacher-hf-constrained", "n": n, "slates": len(ms),
                     "p50_ms": float(percentile(ms, 50)), "decode_passes": passes})
        print(f"N={n} teacher: p50 {rows[-1]['p50_ms']:.0f} ms, passes {passes}", flush=True)
    return rows


def machine() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def commit(given: str | None) -> str:
    """The commit the code ran from: ``given`` (code run from outside its checkout), else this
    checkout's HEAD, marked when src/ holds uncommitted edits."""
    if given:
        return given
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return done.stdout.strip() + (" (src/ with uncommitted edits)" if dirty else "")


def fidelity_lines(args: argparse.Namespace) -> list[str]:
    """The bench's fidelity and quality means, and each row's paired difference with SPD."""
    path = args.out / "fidelity" / "results.json"
    if not path.exists():
        return ["(not run)"]
    data = json.loads(path.read_text())
    paired = (data.get("paired") or {}).get("rows", {})
    metrics = ("tau", "top1", "AUC", "R@10")
    lines = [
        (f"`spdrank bench` on the first {data['n_slates']} eval slates (held out), every row "
         "on the same slates ([its report](fidelity/report.md)). Each cell: the row's mean, "
         "then, in brackets, its mean paired difference with SPD on the same slates and the "
         "95% bootstrap interval (2,000 resamples)."),
        "",
        "| row | ms a slate (p50) | " + " | ".join(metrics) + " |",
        "| --- | --- | " + " | ".join("---" for _ in metrics) + " |",
    ]
    for name, row in data["rankers"].items():
        cells = []
        for m in metrics:
            mean = row["metrics"].get(m, {}).get("mean")
            cell = "-" if mean is None else f"{mean:.3f}"
            diff = paired.get(name, {}).get(m)
            if diff and diff.get("mean") is not None:
                cell += f" ({diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}])"
            cells.append(cell)
        lines.append(f"| {name} | {row['latency_ms']['median']:,.1f} | " + " | ".join(cells) + " |")
    return lines


def write_report(args: argparse.Namespace, meta: dict[str, Any], lat: list[dict[str, Any]],
                 teach: list[dict[str, Any]]) -> Path:
    training = meta.get("training") or {}
    lines = [
        "# SPD against the pointwise peer and FIRST, same backbone, CPU",
        "",
        f"Command: `{meta['command']}`",
        "",
        (f"Commit {meta['commit']}; {meta['machine']} ({os.cpu_count()} cores, torch "
         f"{meta['torch']} on {meta['threads']} threads); {meta['date']}."),
        "",
        f"What else ran: {args.note or 'not recorded'}",
        "",
        (f"Backbone: {args.backbone}, its first {args.layers} layers, frozen; "
         f"{ITEM_TOKENS}-token titles, the last-token readout (spd-history: the mean). "
         "Training: the same `spdrank train` command but for `--head` (spd: attn; pointwise; "
         "spd-history: history) and that readout, "
         f"{args.train_slates} slates of the lexical teacher's labels, {args.epochs:g} epochs "
         "of batches of 16 at head lr 1e-3 after 10 warm-up steps, from a bfloat16 state "
         "cache of the frozen backbone; FIRST untrained (its weights are the backbone's)."),
        "",
        "| run | steps | training s (cache + steps) |",
        "| --- | --- | --- |",
        *[f"| {name} | {t.get('steps')} | {t.get('wall_s') or 0:,.0f} |"
          for name, t in training.items()],
        "",
        "## Latency and tokens",
        "",
        (f"Eval slates whose history holds {args.history} items ({args.latency_slates} a "
         "size), resized to N candidates; ms a slate of one `rank()` call in the dtype "
         "`--dtype auto` picks here, the models alternating slate by slate. Tokens: what the "
         "backbone processes for one slate (SPD and FIRST: one prompt; pointwise: its N "
         "sequences together). x SPD: the median over the slates of the row's ms over SPD's "
         "on the same slate. FIRST's one-letter labels stop at 52 candidates."),
        "",
        "| N | model | dtype | p50 ms | p95 ms | x SPD | tokens | prefill ms | readout ms | head ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in lat:
        st = r["stages_ms"]
        lines.append(
            f"| {r['n']} | {r['model']} | {r['dtype']} | {r['p50_ms']:,.1f} | "
            f"{r['p95_ms']:,.1f} | {r['over_spd_per_slate']:.2f} | {r['tokens_mean']:,.0f} | "
            f"{st['prefill']:,.1f} | {st['readout']:.1f} | {st['head']:.1f} |"
        )
    if teach:
        lines += [
            "",
            (f"The autoregressive teacher on the same {args.layers} layers (`spdrank teacher "
             "--backend hf --constrained`, the first slates of each size; its rankings from "
             "2 layers mean nothing, its time is what writing a ranking costs):"),
            "",
            "| N | slates | p50 ms | decode passes |",
            "| --- | --- | --- | --- |",
        ]
        lines += [f"| {t['n']} | {t['slates']} | {t['p50_ms']:,.0f} | "
                  f"{', '.join(map(str, t['decode_passes']))} |" for t in teach]
    lines += ["", "## Fidelity after the same training", "", *fidelity_lines(args), ""]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"meta": meta, "latency": lat, "teacher": teach}, indent=2) + "\n")
    return path


def sizes(text: str) -> list[int]:
    return [int(t) for t in text.split(",")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="bundled")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--labels", type=Path, default=LABELS,
                        help="folder of train.labels.slates.jsonl and eval.labels.slates.jsonl")
    parser.add_argument("--work", type=Path, default=WORK, help="runs and state caches")
    parser.add_argument("--out", type=Path, default=OUT, help="the report's folder")
    parser.add_argument("--train-slates", type=int, default=256)
    parser.add_argument("--epochs", type=float, default=8)
    parser.add_argument("--eval-slates", type=int, default=200)
    parser.add_argument("--sizes", type=sizes, default=sizes(SIZES), help="latency sizes N")
    parser.add_argument("--history", type=int, default=HISTORY,
                        help="history items of the slates timed")
    parser.add_argument("--latency-slates", type=int, default=10)
    parser.add_argument("--teacher-slates", type=int, default=3,
                        help="slates a size for the autoregressive teacher (0: skip it)")
    parser.add_argument("--skip", action="append", default=[],
                        choices=("train", "fidelity", "latency"), help="a phase to skip")
    parser.add_argument("--note", help="what else ran on the machine meanwhile")
    parser.add_argument("--commit", help="the commit the code is from, when run outside its checkout")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.dry_run:
        for row in ROWS:
            print(shlex.join(train_command(row, args)))
        print(shlex.join(bench_command(args)))
        return 0
    import torch

    meta = {
        "command": shlex.join([".venv/bin/python", "benchmarks/pointwise_cpu.py", *argv]),
        "commit": commit(args.commit), "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "train_commands": [shlex.join(train_command(r, args)) for r in ROWS],
        "bench_command": shlex.join(bench_command(args)),
    }
    if "train" not in args.skip:
        meta["training"] = train_all(args)
    save_first(args)
    if "fidelity" not in args.skip:
        meta["bench_s"] = run(bench_command(args), args.work / "logs" / "bench.log")
    lat = latency(args) if "latency" not in args.skip else []
    teach = teacher(args) if args.teacher_slates and "latency" not in args.skip else []
    print(f"report: {write_report(args, meta, lat, teach)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
