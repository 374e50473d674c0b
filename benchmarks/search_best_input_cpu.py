"""Search students that start as the best ranker they read: DL19 and DL21 against dense.

    .venv/bin/python benchmarks/search_best_input_cpu.py [--shared DIR] [--layers 2] [--dry-run]

A search team runs BM25 and a dense retriever; a student is worth deploying only where it
ranks better than the stronger of them. This benchmark runs the documented recipe
(docs/search.md) end to end with nothing but ``spdrank`` commands:

1. BM25's top 100 for DL19, DL21 (scored, never trained on) and DL22 (trained on: no
   judgements), and validation slates from DL22's passage pool alone: synthetic queries
   written by the bundled SmolLM2 (``spdrank data queries``), each judged by its source
   passage;
2. the dense cosine of all-MiniLM-L6-v2 added to every candidate (``spdrank data features
   --add dense``), beside BM25's ``score``;
3. the teacher: the fusion of dense and BM25 whose kind and weights rank the validation
   slates best (``ranker:fusion:best:feature:dense+retriever --choose-on``);
4. two students from the same recipe, both reading ``score`` and ``dense`` and starting as the
   input that ranks the validation slates best (``--anchor best``, the default), their epoch
   chosen on the validation slates, and saved as their best input where no epoch beats it:
   the LLM student (SmolLM2's first ``--layers`` frozen layers, the query-matched history
   head) and the features-only student (no LLM: what the LLM must add to);
5. ``spdrank eval`` on DL19 and DL21: BM25, dense, the teacher and both students, paired by
   query.

Every step is skipped when its output exists, so a rerun resumes. The report goes to
benchmarks/results/search-best-input-cpu/ with the commands in command.txt.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine
from search_dl19_cpu import fmt, interval, per_query, spdrank
from search_queries_cpu import pool_corpus

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "search-best-input-cpu"
WORK = ROOT / "data-out" / "search-best-input"
SHARED = ROOT.parent / "shared" / "data"
TEACHER = "fusion:best:feature:dense+retriever"
ITEM_TOKENS = 64
POSITIONS = 100
TEST_SETS = ("dl19", "dl21")
#: Where the teacher, the anchors and the epochs are chosen: name -> (validation set, the
#: test sets scored with what it chose) for each choice made.
PLANS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "synthetic": (("synth", TEST_SETS),),
    "other": (("dl21", ("dl19",)), ("dl19", ("dl21",))),
}
#: The students: name -> (title, spdrank train flags beyond the common ones).
STUDENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llm": ("student: SmolLM2 states + BM25 and dense scores",
            ("--head", "history", "--features", "score,dense")),
    "features": ("no LLM: the head on BM25 and dense scores",
                 ("--head", "attn", "--features-only", "--features", "score,dense")),
}
#: How the report names each validation set.
VALIDATION = {"synth": "synthetic queries written from DL22's passage pool (each judged by its "
                       "source passage)", "dl19": "DL19's judged queries",
              "dl21": "DL21's judged queries"}
#: The rows of the report, by the name eval gives them.
ROWS = {"retriever": "BM25 (the first stage)", "feature:dense": "dense (all-MiniLM-L6-v2)",
        "teacher": f"teacher: {TEACHER}"}


def shown(path: Path) -> str:
    """A path as the command log shows it: relative to the repository when under it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()


def paired(table: dict[str, dict[str, dict[str, Any]]], row: str, ref: str) -> dict[str, Any]:
    """The paired mean difference of nDCG@10 between two rows, with its 95% interval."""
    import numpy as np

    from spdrank.eval.paired import difference_of

    qids = sorted(set(table[row]) & set(table[ref]))
    diff = difference_of(np.array([table[row][q]["nDCG@10"] - table[ref][q]["nDCG@10"]
                                   for q in qids]))
    return {"mean": diff.mean, "low": diff.low, "high": diff.high}


def summarize(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}
    for name, rows in table.items():
        entry: dict[str, Any] = {"queries": len(rows), "ms": float(np.median(
            [r["latency_ms"] for r in rows.values()]))}
        for metric in ("nDCG@10", "AP(rel=2)"):
            values = [r[metric] for r in rows.values() if r.get(metric) is not None]
            entry[metric] = float(np.mean(values)) if values else None
        for ref in ("retriever", "feature:dense", "features"):
            if ref != name and ref in table:
                entry[f"- {ref}"] = paired(table, name, ref)
        out[name] = entry
    return out


def report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Search students that start as the best ranker they read: DL19 and DL21, CPU scale",
        "",
        (f"Written by `benchmarks/search_best_input_cpu.py --choose-on {meta['choose_on']}` "
         f"({meta['date']}, commit {meta['commit']}, {meta['machine']}; {meta['load']}; "
         f"{meta['minutes']:.1f} min). Students trained on DL22's {meta['train_queries']} "
         "queries (no judgements) labelled by the teacher; the teacher's fusion, each student's "
         "start and its epoch chosen on validation queries: "
         + "; ".join(f"{VALIDATION[v]} ({n} queries)" for v, n in meta["valid_queries"].items())
         + f". {meta['layers']} frozen SmolLM2 layers read in one prefill of the whole top 100 "
         f"(K = {POSITIONS}, {ITEM_TOKENS} tokens a passage). nDCG@10 graded over every judged "
         "passage, AP at grade >= 2; paired 95% bootstrap intervals over queries. The commands "
         "are in command.txt. A feature row's ms is reading the feature: the dense cosine "
         "itself costs its encoder's pass over the query and the 100 passages, which "
         "`data features` timed (about 1.4 s a query here)."),
        "",
        "## What training chose",
        "",
    ]
    for name, chosen in results["chosen"].items():
        student, _, on = name.partition("-on-")
        lines.append(f"- {STUDENTS[student][0]}{f' (chosen on {on.upper()})' if on else ''}: "
                     f"{chosen}")
    for valid, chosen in results.get("teacher_choice", {}).items():
        if chosen:
            lines.append(f"- teacher, chosen on {VALIDATION[valid]}: {chosen.get('spec')} "
                         f"({chosen.get('metric')} {chosen.get('score', 0):.3f})")
    for test in TEST_SETS:
        found = results[test]
        rows = found["rows"]
        lines += ["", (f"## {test.upper()} ({rows['retriever']['queries']} queries; chosen on "
                  f"{VALIDATION[found['validation']]})"), "",
                  "| row | nDCG@10 | AP | - BM25 | - dense | - no-LLM student | ms a query (p50) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, entry in rows.items():
            title = ROWS.get(name) or STUDENTS.get(name, (name,))[0]
            lines.append(
                f"| {title} | {fmt(entry['nDCG@10'])} | {fmt(entry['AP(rel=2)'])} | "
                f"{interval(entry.get('- retriever'))} | {interval(entry.get('- feature:dense'))} | "
                f"{interval(entry.get('- features'))} | {entry['ms']:.1f} |")
    lines += ["", "## Against the goals", ""]
    for test in TEST_SETS:
        rows = results[test]["rows"]
        if "llm" not in rows:
            continue
        dense = rows["llm"]["- feature:dense"]
        llm = rows["llm"].get("- features")
        met = dense["mean"] >= 0 and dense["low"] > -0.01
        lines.append(f"- {test.upper()}, (b) the student at least dense, the interval's lower "
                     f"bound above -.01: {interval(dense)}: **{'met' if met else 'not met'}**.")
        if llm:
            above = llm["low"] > 0
            lines.append(f"- {test.upper()}, (c) the LLM above the features-only student: "
                         f"{interval(llm)}: **{'met' if above else 'not met'}**.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--passages", type=int, default=200,
                        help="DL22 passages to write a validation query for")
    parser.add_argument("--epochs", default="20")
    parser.add_argument("--students", default="features,llm")
    parser.add_argument("--choose-on", choices=sorted(PLANS), default="synthetic",
                        help="the validation queries: synthetic ones from DL22's pool, or the "
                        "other test set's judged queries (DL21 for DL19, DL19 for DL21)")
    parser.add_argument("--load", default="nothing else running",
                        help="what else ran on the machine, for the report")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    dry, log, work = args.dry_run, [], args.work
    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    sources = {
        "dl19": ("trec-dl19/retrieve_results_dl19.json", "trec-dl19/qrels_dl19.json"),
        "dl21": ("trec-dl21/retrieve_results_dl21.json", "trec-dl21/qrels_dl21.txt"),
        "dl22": ("trec-dl22/retrieve_results_dl22.json", None),
    }
    featured: dict[str, Path] = {}
    for name, (retrieved, qrels) in sources.items():
        slates = work / f"{name}.jsonl"
        spdrank("data", "search", "--retrieved", args.shared / retrieved,
                *(("--qrels", args.shared / qrels, "--rel-level", "2") if qrels else ()),
                "--out", slates, dry_run=dry, log=log, done=slates)
        featured[name] = work / f"{name}.dense.jsonl"
    pool = work / "dl22-pool.jsonl"
    log.append(f"# DL22's distinct passages as a corpus (pool_corpus) -> {pool.name}")
    if not dry:
        pool_corpus(args.shared / sources["dl22"][0], pool)
    synth = work / "synth.jsonl"
    spdrank("data", "queries", "--corpus", pool, "--passages", str(args.passages), "--seed",
            "0", "--out", synth, dry_run=dry, log=log, done=synth)
    featured["synth"] = work / "synth.dense.jsonl"
    for name, out in featured.items():
        spdrank("data", "features", "--slates", work / f"{name}.jsonl", "--out", out,
                "--add", "dense", "--no-progress", dry_run=dry, log=log, done=out)
    common = ("--prompt", "search", "--max-item-tokens", str(ITEM_TOKENS), "--frozen",
              "--backbone", "bundled", "--device", "cpu", "--layers", str(args.layers),
              "--positions", str(POSITIONS), "--epochs", args.epochs, "--batch-size", "8",
              "--head-lr", "1e-3", "--eval-every", "0", "--select", "best", "--eval-limit",
              "1000", "--no-progress")
    students = [s for s in args.students.split(",") if s]
    out = args.out / args.choose_on
    results: dict[str, Any] = {"chosen": {}, "teacher_choice": {}}
    for valid, tests in PLANS[args.choose_on]:
        # The synthetic plan's paths carry no suffix: one validation set for both test sets.
        tag = "" if valid == "synth" else f"-on-{valid}"
        labels = work / f"dl22.teacher{tag}.labels.jsonl"
        labelled = work / f"dl22.teacher{tag}.labels.slates.jsonl"
        spdrank("teacher", "--slates", featured["dl22"], "--out", labels, "--backend",
                f"ranker:{TEACHER}", "--choose-on", featured[valid], "--prompt", "search",
                "--no-progress", dry_run=dry, log=log, done=labelled)
        runs = ROOT / "runs" / "search-best-input"
        shared_train, own_train = runs / "cache-words" / "train", runs / f"cache-words{tag}" / "train"
        if tag and shared_train.is_dir() and not own_train.exists() and not dry:
            # The same training texts whoever labelled them: their states are computed once.
            log.append(f"# {shown(shared_train)} copied to {shown(own_train)}")
            shutil.copytree(shared_train, own_train)
        for name in students:
            cache = () if name == "features" else (
                "--cache-states", runs / f"cache-words{tag}", "--cache-batch-size", "1")
            spdrank("train", "--slates", labelled, "--eval-slates", featured[valid], "--out",
                    runs / f"{name}{tag}", *common, *STUDENTS[name][1], *cache, dry_run=dry,
                    log=log, done=runs / f"{name}{tag}" / "model" / "config.json")
        for test in tests:
            rows = out / f"{test}.rows.jsonl"
            spdrank("eval", "--slates", featured[test], "--ranker", "retriever", "--ranker",
                    "feature:dense", "--ranker", TEACHER, "--choose-on", featured[valid],
                    *(x for s in students for x in ("--model", f"{s}={runs / f'{s}{tag}'}")),
                    "--k", "10,100", "--rel-level", "2", "--per-slate", rows, "--no-progress",
                    dry_run=dry, log=log, done=rows)
            if dry:
                continue
            results[test] = {"validation": valid,
                             "rows": summarize(per_query(rows, {TEACHER: "teacher"}))}
            for name in students:
                summary = json.loads((runs / f"{name}{tag}" / "train.json").read_text())
                choice = summary.get("anchor", {})
                results["chosen"][f"{name}{tag}"] = (
                    f"started as {choice.get('anchor')} (validation "
                    + ", ".join(f"{k} {v:.3f}" for k, v in choice.get("inputs", {}).items())
                    + f"); {summary.get('verdict', '')}")
            with labels.open() as fh:  # each label records the fusion the teacher chose
                results["teacher_choice"][valid] = json.loads(fh.readline()).get("chosen")
        results["train_queries"] = 0 if dry else sum(1 for _ in labelled.open())
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text("\n".join(log) + "\n")
    if dry:
        return 0
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit(),
            "machine": f"{machine()}, Python {platform.python_version()}",
            "load": args.load, "minutes": (time.time() - started) / 60, "layers": args.layers,
            "train_queries": results.pop("train_queries"), "choose_on": args.choose_on,
            "valid_queries": {valid: sum(1 for _ in featured[valid].open())
                              for valid, _ in PLANS[args.choose_on]}}
    (out / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    (out / "report.md").write_text(report(results, meta))
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
