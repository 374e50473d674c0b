"""Recommendation students that start as the best ranker they read: Amazon Beauty against
SASRec fitted on every history.

    .venv/bin/python benchmarks/beauty_best_input_cpu.py [--settings uniform,retrieved]
        [--limit 4096] [--dry-run]

A recommendation team runs SASRec; a student is worth deploying only where it ranks better.
Per setting (``uniform``: the next item among 49 uniform negatives; ``retrieved``: SASRec's
own top 50, the next item not added), with nothing but ``spdrank`` commands:

1. ``spdrank data beauty`` with popularity, co-occurrence, title similarity and SASRec's score
   as features (SASRec fitted on every history the build has: every user's items but the last,
   never a slate's target), 1,000 training users held out as validation slates;
2. two students trained on clicks from the same recipe, both reading the four features and
   starting as the one that ranks the validation users best (``--anchor best``, the
   default), their epoch chosen there and saved as that feature where no epoch beats it: the
   LLM student (SmolLM2's first 2 frozen layers, the history head, words matched as a soft
   TF-IDF) and the features-only student (no LLM);
3. ``spdrank eval`` on the eval users: popularity, co-occurrence, title similarity, SASRec
   and both students, paired by user, and the students against each other on slices where
   text should matter most: the next item's interaction count and the history's length.

Every step is skipped when its output exists. The report goes to
benchmarks/results/beauty-best-input-cpu/ with the commands in command.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine
from run import Command, execute, interval
from run import number as fmt

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "beauty-best-input-cpu"
WORK = ROOT / "data-out" / "beauty-best-input"
FEATURES = "popularity,cooccurrence,title_similarity,sasrec"
SETTINGS = {"uniform": (), "retrieved": ("--retriever", "sasrec")}
STUDENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llm": ("student: SmolLM2 states + the four features",
            ("--head", "history", "--frozen", "--layers", "2", "--backbone", "bundled")),
    "features": ("no LLM: the head on the four features", ("--head", "attn", "--features-only")),
}
BASELINES = ("popularity", "cooccurrence", "feature:title_similarity", "feature:sasrec")
TITLES = {"feature:sasrec": "SASRec fitted on every history", "cooccurrence": "co-occurrence",
          "popularity": "popularity", "feature:title_similarity": "title similarity"}
METRICS = ("NDCG@10", "R@10", "MRR")
#: Slices by the next item's interactions in the training users' counts (from its log1p
#: popularity feature) and by the history's length in items.
ITEM_SLICES = ((0, 5), (6, 20), (21, 10**9))
HISTORY_SLICES = ((1, 3), (4, 7), (8, 10**9))


def spdrank(*args: str | Path, dry_run: bool, log: list[str], done: Path | None = None) -> None:
    """Run one ``spdrank`` command, recorded in ``log`` whether it runs or not: it runs unless
    ``dry_run``, or ``done`` names an output an earlier run left (the step is reused)."""
    line = shlex.join(["spdrank", *map(str, args)])
    log.append(line.replace(f"{ROOT}/", ""))
    reused = done is not None and done.exists()
    print("= (done)" if reused else "+", log[-1], flush=True)
    if not dry_run and not reused:
        execute(Command(["spdrank", *map(str, args)], done=None, stdout=None))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSONL, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".tmp")
    partial.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    partial.replace(path)


def paired(rows: dict[str, dict[str, Any]], a: str, b: str, metric: str,
           qids: list[str] | None = None) -> dict[str, Any]:
    import numpy as np

    from spdrank.eval.paired import difference_of

    qids = qids if qids is not None else sorted(set(rows[a]) & set(rows[b]))
    values = [(rows[a][q].get(metric), rows[b][q].get(metric)) for q in qids]
    diffs = np.array([x - y for x, y in values if x is not None and y is not None])
    diff = difference_of(diffs)
    return {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": len(diffs)}


def mean(rows: dict[str, Any], metric: str, qids: list[str] | None = None) -> float | None:
    values = [rows[q].get(metric) for q in (qids if qids is not None else rows)]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def slices(eval_file: Path) -> dict[str, list[str]]:
    """The eval users in each slice: by the clicked item's interaction count, by the
    history's length."""
    out: dict[str, list[str]] = {}
    for slate in read_jsonl(eval_file):
        clicked = set(slate.get("clicked") or ())
        target = next((c for c in slate["candidates"] if c["docid"] in clicked), None)
        length = len(slate["query"].get("history") or ())  # the user's items, oldest first
        if target is not None:
            count = round(math.expm1(target["features"]["popularity"]))
            for low, high in ITEM_SLICES:
                if low <= count <= high:
                    out.setdefault(f"next item seen {low}-{high if high < 10**9 else ''} times",
                                   []).append(slate["query"]["qid"])
        for low, high in HISTORY_SLICES:
            if low <= length <= high:
                out.setdefault(f"history of {low}-{high if high < 10**9 else ''} items",
                               []).append(slate["query"]["qid"])
    return out


def run_line(args: argparse.Namespace, minutes: float) -> str:
    """When, where and beside what one setting ran, for its section of the report."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT,
                            text=True, capture_output=True).stdout.strip()
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
            f"{machine()}, Python {platform.python_version()}; {args.load}; "
            f"{minutes:.1f} min for the steps this invocation ran")


def clicked_only(train: Path, log: list[str]) -> Path:
    """``train``, or where some of its slates have no clicked item (SASRec's top 50 missed the
    user's next item), a copy that keeps only the slates with one: what a click-trained
    student can learn from (``train`` would leave the others out itself), so that ``--limit``
    counts the same slates for both students."""
    slates = read_jsonl(train)
    kept = [s for s in slates if s.get("clicked")]
    if len(kept) == len(slates):
        return train
    out = train.with_name("train.clicked.jsonl")
    log.append(f"# keep the {len(kept):,} of {len(slates):,} slates of {train} with a clicked "
               f"item: {out}")
    if not out.exists():
        write_jsonl(out, kept)
    return out


def below(diff: dict[str, Any] | None) -> str:
    """Whether a paired difference leaves the student not below the other: above (the
    interval above zero), a tie (the interval holds zero), or below."""
    if diff is None:
        return "not measured"
    if diff["low"] > 0:
        return "met, above"
    return "met, a tie" if diff["high"] >= 0 else "not met, below"


def report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        ("# Recommendation students that start as the best ranker they read: Amazon Beauty, "
        "CPU scale"),
        "",
        ("Written by `benchmarks/beauty_best_input_cpu.py`, each setting's run (date, commit, "
         "machine, load) under its heading. "
         "Beauty 2014 (bundled), a user's last 10 items as history, 50 candidates; 1,000 "
         "training users held out as validation slates; students trained on the clicks of the "
         f"first {meta['limit']:,} training slates, 4 epochs of 16, the epoch and the start "
         "chosen on the validation users; eval users scored once. Paired 95% bootstrap "
         "intervals over users. The commands are in command.txt."),
    ]
    for setting, found in results["settings"].items():
        rows = found["rows"]
        lines += ["", f"## {setting}: {found['what']} ({found['users']:,} eval users)", "",
                  f"Run: {found.get('run', 'not recorded')}.", "",
                  "What training chose: " + "; ".join(
                      f"{STUDENTS[n][0]}: {c}" for n, c in found["chosen"].items()), "",
                  ("| row | NDCG@10 | R@10 | MRR | NDCG@10 - SASRec | NDCG@10 - no-LLM student | "
                  "ms a user (p50) |"), "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, entry in rows.items():
            title = TITLES.get(name) or STUDENTS.get(name, (name,))[0]
            lines.append(f"| {title} | " + " | ".join(fmt(entry[m]) for m in METRICS)
                         + f" | {interval(entry.get('- feature:sasrec'))} | "
                           f"{interval(entry.get('- features'))} | {entry['ms']:.1f} |")
        if found.get("slices"):
            lines += ["", ("The LLM student against the features-only student, by slice "
                      "(NDCG@10):"), "", ("| slice | users | LLM student | no-LLM student | "
                      "difference |"), "| --- | --- | --- | --- | --- |"]
            for name, entry in found["slices"].items():
                lines.append(f"| {name} | {entry['users']} | {fmt(entry['llm'])} | "
                             f"{fmt(entry['features'])} | {interval(entry['diff'])} |")
    lines += ["", "## Against the goals", ""]
    for setting, found in results["settings"].items():
        rows = found["rows"]
        if "llm" not in rows:
            continue
        vs_sasrec, vs_features = rows["llm"]["- feature:sasrec"], rows["llm"].get("- features")
        lines.append(f"- {setting}, (a) the student above SASRec fitted on every history: "
                     f"{interval(vs_sasrec)}: "
                     f"**{'met' if vs_sasrec['low'] > 0 else 'not met'}**; not below the "
                     f"features-only student: {interval(vs_features)}: "
                     f"**{below(vs_features)}**.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="uniform,retrieved")
    parser.add_argument("--students", default="features,llm")
    parser.add_argument("--limit", type=int, default=4096,
                        help="training slates the students learn from")
    parser.add_argument("--load", default="nothing else running")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="write report.md again from the committed results.json")
    args = parser.parse_args()
    if args.report_only:
        stored = json.loads((args.out / "results.json").read_text())
        (args.out / "report.md").write_text(report(stored, stored["meta"]))
        return 0
    dry, log = args.dry_run, []
    started = time.time()
    students = [s for s in args.students.split(",") if s]
    previous = args.out / "results.json"
    # A run of some settings keeps the others' committed results, each with its own run line.
    results: dict[str, Any] = {"settings": json.loads(previous.read_text())["settings"]
                               if previous.exists() and not dry else {}}
    for setting in [s for s in args.settings.split(",") if s]:
        setting_started, first_command = time.time(), len(log)
        data = args.work / setting
        spdrank("data", "beauty", "--out", data, "--validation", "1000", "--candidates", "50",
                "--features", FEATURES, "--seed", "0", *SETTINGS[setting], "--no-progress",
                dry_run=dry, log=log, done=data / "manifest.json")
        train = data / "train.jsonl" if dry else clicked_only(data / "train.jsonl", log)
        runs = args.work / "runs" / setting
        for name in students:
            cache = () if name == "features" else (
                "--cache-states", args.work / "cache" / setting)
            spdrank("train", "--slates", train, "--eval-slates",
                    data / "valid.jsonl", "--eval-limit", "1000", "--out", runs / name,
                    "--target", "clicks", "--features", FEATURES, *STUDENTS[name][1], *cache,
                    "--limit", str(args.limit), "--epochs", "4", "--batch-size", "16",
                    "--select", "best", "--eval-every", "0", "--no-progress",
                    dry_run=dry, log=log, done=runs / name / "train.json")
        per_slate = args.out / f"{setting}.rows.jsonl"
        spdrank("eval", "--slates", data / "eval.jsonl", "--train", data / "train.jsonl",
                *(x for r in BASELINES for x in ("--ranker", r)),
                *(x for s in students for x in ("--model", f"{s}={runs / s}")),
                "--per-slate", per_slate, "--no-progress", dry_run=dry, log=log,
                done=per_slate)
        if dry:
            continue
        table: dict[str, dict[str, Any]] = {}
        for row in read_jsonl(per_slate):
            table.setdefault(row["ranker"], {})[row["qid"]] = row
        rows = {}
        for name, found in table.items():
            entry: dict[str, Any] = {m: mean(found, m) for m in METRICS}
            entry["ms"] = sorted(r["latency_ms"] for r in found.values())[len(found) // 2]
            for ref in ("feature:sasrec", "features"):
                if ref != name and ref in table:
                    entry[f"- {ref}"] = paired(table, name, ref, "NDCG@10")
            rows[name] = entry
        found_slices = {}
        if {"llm", "features"} <= set(table):
            for name, qids in slices(data / "eval.jsonl").items():
                found_slices[name] = {"users": len(qids),
                                      "llm": mean(table["llm"], "NDCG@10", qids),
                                      "features": mean(table["features"], "NDCG@10", qids),
                                      "diff": paired(table, "llm", "features", "NDCG@10", qids)}
        chosen = {}
        for name in students:
            summary = json.loads((runs / name / "train.json").read_text())
            choice = summary.get("anchor", {})
            chosen[name] = (f"started as {choice.get('anchor')} ("
                            + ", ".join(f"{k} {v:.3f}" for k, v in
                                        choice.get("inputs", {}).items() if v is not None)
                            + f"), {summary.get('verdict', '')}")
        results["settings"][setting] = {
            "what": "the next item among 49 uniform negatives" if setting == "uniform"
                    else "SASRec's top 50, the next item not added",
            "users": len(next(iter(table.values()))), "rows": rows, "slices": found_slices,
            "chosen": chosen, "run": run_line(args, (time.time() - setting_started) / 60),
            "commands": log[first_command:]}
    args.out.mkdir(parents=True, exist_ok=True)
    commands = log if dry else [c for found in results["settings"].values()
                                for c in found.get("commands", ())]
    (args.out / "command.txt").write_text("\n".join(commands) + "\n")
    if dry:
        return 0
    meta = {"limit": args.limit, "minutes": (time.time() - started) / 60}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    (args.out / "report.md").write_text(report(results, meta))
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
