"""Search students against the number of queries they learn from: DL22's real queries, then
hundreds more written by an LLM from DL22's own passages, scored on DL19 and DL21.

    .venv/bin/python benchmarks/search_queries_cpu.py [--passages 1200] [--curve 250,all]
        [--layers 2] [--dry-run]

A user with a corpus and no judgements gets training queries from ``spdrank data queries``
(InPars' recipe: the bundled SmolLM2 writes a query for each sampled passage; a query is kept
when BM25 over the corpus finds its passage again in the top 20; each kept query becomes a
slate of BM25's top 100 over the corpus). Here the corpus is the pool of DL22's passages (the
7,580 distinct passages of BM25's top 100 for its 76 queries, MS MARCO v2), so nothing of
DL19 or DL21 is read to make training data.

Every training slate, real or synthetic, is labelled by the same teacher as in
``search_onepass_cpu.py`` (RRF of the dense retriever and BM25's order), and every student is
trained as there (frozen SmolLM2 layers read in one prefill of the whole top 100, the
query-matched history head, 16 DL22 queries held out to select the epoch). A curve point
``n`` trains on DL22's 60 training queries and the first ``n`` synthetic slates; the point
``0`` is ``search_onepass_cpu.py``'s own students, reused. Larger sets get fewer epochs (at
least as many steps as the point ``0``): see :func:`epochs_for`.

The training files of the curve are prefixes of one another, so one state cache serves them
all (it grows with the curve: :mod:`spdrank.model.state_cache`), and the test sets' caches
are ``search_onepass_cpu.py``'s. Writes ``benchmarks/results/search-queries-cpu/`` (report.md,
results.json, command.txt); a rerun reuses every finished step.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_dl19_cpu import fmt, interval, per_query, read_jsonl, spdrank, write_jsonl
from search_onepass_cpu import (
    ITEM_TOKENS,
    POSITIONS,
    ROOT,
    RUNS,
    SHARED,
    STUDENTS,
    TEACHER,
    WORK,
    cached_rows,
    label,
    prepare,
    shown,
    summarize,
)

OUT = ROOT / "benchmarks" / "results" / "search-queries-cpu"
QUERIES = ROOT / "data-out" / "search-queries"
#: The students of the curve: the LLM-only one (goal c), and the anchored ones reading BM25's
#: score (goal a) and BM25's and dense's (goal b).
CURVE_STUDENTS = ("matched", "anchored+bm25", "anchored+bm25+dense")
#: Epochs of the point 0 (DL22's 60 queries), as in ``search_onepass_cpu.py``.
BASE_EPOCHS = 20
METRICS = ("nDCG@10", "tau", "top1")


def epochs_for(slates: int, base_slates: int) -> int:
    """Epochs for a training set of ``slates``: the point 0's ``BASE_EPOCHS`` scaled down by
    the set's growth, so a larger set is not passed over 20 times (hours at CPU scale), but
    never fewer than 3 passes nor fewer steps than the point 0 took."""
    return max(3, -(-BASE_EPOCHS * base_slates // slates))


def pool_corpus(retrieved: Path, out: Path) -> None:
    """The distinct passages of a retrieve-results file as a BEIR corpus (``_id``, ``text``),
    in the order first seen."""
    if out.exists():
        return
    hits = {h["docid"]: h["content"] for r in json.loads(retrieved.read_text()) for h in r["hits"]}
    write_jsonl(out, [{"_id": d, "text": t} for d, t in hits.items()])


def training_prefix(base: Path, synthetic: Path, count: int, out: Path) -> None:
    """DL22's training slates followed by the first ``count`` synthetic ones: each curve
    point's file begins with the smaller point's, so their state caches are one."""
    rows = read_jsonl(base) + read_jsonl(synthetic)[:count]
    if not out.exists() or read_jsonl(out) != rows:
        write_jsonl(out, rows)


def curve_report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Search students against the number of training queries, CPU scale",
        "",
        (f"Written by `benchmarks/search_queries_cpu.py` ({meta['date']}, commit "
         f"{meta['commit']}, {meta['machine']}; {meta['other']}; {meta['minutes']} min). "
         f"Students trained on DL22's {meta['base_slates']} training queries plus the first n "
         f"synthetic queries written by the bundled SmolLM2 from DL22's passage pool "
         f"(`spdrank data queries`, {meta['passages']} passages sampled, {meta['synthetic']} "
         f"queries kept), every slate labelled by `{TEACHER}`; {meta['layers']} frozen "
         f"SmolLM2 layers read in one prefill of the whole top 100 (K = {POSITIONS}, "
         f"{ITEM_TOKENS} tokens a passage); the epoch chosen on 16 held-out DL22 queries; "
         "scored on DL19 and DL21, which no step read. nDCG@10 graded over every judged "
         "passage; tau and top-1 against the teacher; paired 95% bootstrap intervals over "
         "queries. The commands are in command.txt."),
        "",
        "## What the training queries cost",
        "",
        "| step | wall time |",
        "| --- | --- |",
    ]
    for step, seconds in meta["costs"].items():
        lines.append(f"| {step} | {seconds / 60:.1f} min |")
    for test in ("dl19", "dl21"):
        summary = results[test]
        base = summary["rows"]
        lines += [
            "", f"## {test.upper()} ({summary['queries']} queries)", "",
            (f"BM25 {fmt(base['retriever']['nDCG@10'])}, dense "
             f"{fmt(base['dense']['nDCG@10'])}, teacher {fmt(base['teacher']['nDCG@10'])} "
             "nDCG@10."),
            "",
            ("| student | training queries | epochs | nDCG@10 | tau | top-1 | nDCG@10 - BM25 | "
             "nDCG@10 - dense | share of the teacher |"),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        teacher = base["teacher"]["nDCG@10"]
        for name in meta["students"]:
            for point in meta["points"]:
                r = base.get(f"{name}@{point.get('run', point['n'])}")
                if r is None:
                    continue
                lines.append(
                    f"| {STUDENTS[name][0].removeprefix('student: ')} | "
                    f"{point['queries']} ({meta['base_slates']} + {point['n']}) | "
                    f"{point['epochs']} | {fmt(r['nDCG@10'])} | {fmt(r['tau'])} | "
                    f"{fmt(r['top1'])} | {interval(r.get('nDCG@10 - retriever'))} | "
                    f"{interval(r.get('nDCG@10 - dense'))} | {r['nDCG@10'] / teacher:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder")
    parser.add_argument("--passages", type=int, default=1200,
                        help="DL22 pool passages to write a query for")
    parser.add_argument("--curve", default="250,all",
                        help="synthetic slates at each curve point beyond 0 ('all': every kept)")
    parser.add_argument("--layers", type=int, default=2, help="the students' frozen layers")
    parser.add_argument("--students", default=",".join(CURVE_STUDENTS))
    parser.add_argument("--epochs", type=int, default=0,
                        help="epochs at every curve point beyond 0 (default: epochs_for); "
                             "its students are separate runs, named NAME@Nx<epochs>")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    dry, log = args.dry_run, []
    started = time.time()
    onepass = RUNS / f"layers{args.layers}"
    runs = ROOT / "runs" / "search-queries" / f"layers{args.layers}"
    QUERIES.mkdir(parents=True, exist_ok=True)
    labelled, train, valid = prepare(args.shared, WORK, dry, log)

    pool = QUERIES / "dl22-pool.jsonl"
    log.append(f"# DL22's distinct passages as a corpus (pool_corpus) -> {shown(pool)}")
    if not dry:
        pool_corpus(args.shared / "trec-dl22/retrieve_results_dl22.json", pool)
    synthetic = QUERIES / "synth.jsonl"
    costs: dict[str, float] = {}
    journal = QUERIES / "synth.queries.jsonl"
    before = len(read_jsonl(journal)) if journal.exists() else 0
    clock = time.time()
    spdrank("data", "queries", "--corpus", pool, "--passages", str(args.passages), "--seed", "0",
            "--out", synthetic, dry_run=dry, log=log)
    written = (len(read_jsonl(journal)) if journal.exists() else 0) - before
    costs[f"writing {written} queries (this run; {before} were journalled before it), "
          "screening, BM25 slates"] = time.time() - clock
    clock = time.time()
    synthetic_labelled = label(synthetic, QUERIES / "synth", dry, log)
    costs["labelling them: dense over the pool, then the teacher"] = time.time() - clock

    base_slates = 0 if dry else len(read_jsonl(train))
    kept = 0 if dry else len(read_jsonl(synthetic_labelled))
    # A dry run knows no counts yet: it shows the points as given.
    counts = [kept if c == "all" else min(int(c), kept) for c in args.curve.split(",")] \
        if not dry else [0 if c == "all" else int(c) for c in args.curve.split(",")]
    common = ("--prompt", "search", "--max-item-tokens", str(ITEM_TOKENS), "--frozen",
              "--backbone", "bundled", "--device", "cpu", "--layers", str(args.layers),
              "--positions", str(POSITIONS))
    students = [s for s in args.students.split(",") if s]
    points = [{"n": 0, "queries": base_slates, "epochs": BASE_EPOCHS, "run": "0"}]
    tag = f"x{args.epochs}" if args.epochs else ""
    models: dict[str, Path] = {}
    for name in students:
        models[f"{name}@0"] = onepass / name
        spdrank("train", "--slates", train, "--eval-slates", valid, "--out", onepass / name,
                *common, *STUDENTS[name][2], "--cache-states", onepass / "cache-words",
                "--cache-batch-size", "1", "--epochs", str(BASE_EPOCHS), "--batch-size", "8",
                "--head-lr", "1e-3", "--eval-every", "0", "--select", "best", "--no-progress",
                dry_run=dry, log=log, done=onepass / name / "model" / "config.json")
    for n in sorted(set(counts)):
        prefix = QUERIES / f"train-{n}.jsonl"
        log.append(f"# DL22's training slates and the first {n} synthetic ones "
                   f"(training_prefix) -> {shown(prefix)}")
        if not dry:
            training_prefix(train, synthetic_labelled, n, prefix)
        epochs = args.epochs or (epochs_for(base_slates + n, base_slates) if not dry else 3)
        points.append({"n": n, "queries": base_slates + n, "epochs": epochs, "run": f"{n}{tag}"})
        for name in students:
            out = runs / f"{name}@{n}{tag}"
            models[f"{name}@{n}{tag}"] = out
            spdrank("train", "--slates", prefix, "--eval-slates", valid, "--out", out,
                    *common, *STUDENTS[name][2], "--cache-states", runs / "cache-words",
                    "--cache-batch-size", "1", "--epochs", str(epochs), "--batch-size", "8",
                    "--head-lr", "1e-3", "--eval-every", "0", "--select", "best",
                    "--no-progress", dry_run=dry, log=log, done=out / "model" / "config.json")

    results: dict[str, Any] = {}
    for test in ("dl19", "dl21"):
        baselines = onepass / f"{test}.baselines.rows.jsonl"
        spdrank("eval", "--slates", labelled[test], "--ranker", "retriever", "--ranker",
                "dense", "--labels", f"teacher={WORK / f'{test}.teacher.labels.jsonl'}",
                "--k", "10,100", "--rel-level", "2", "--device", "cpu",
                "--per-slate", baselines, "--no-progress", dry_run=dry, log=log, done=baselines)
        rows_file = runs / f"{test}.students.rows.jsonl"
        log.append(f"# {test}: every student ranks it from cached states (cached_rows) -> "
                   f"{shown(rows_file)}")
        if dry:
            continue
        table = per_query(baselines, {})
        done = per_query(rows_file, {}) if rows_file.exists() else {}
        for name, model in models.items():
            if name not in done:
                got = cached_rows(model, labelled[test], onepass / f"cache-words-{test}", name)
                done[name] = {r["qid"]: r for r in got}
                write_jsonl(rows_file, [r for v in done.values() for r in v.values()])
        table.update(done)
        rows = [("BM25", "retriever"), ("dense", "dense"), ("teacher", "teacher"),
                *((name, name) for name in models)]
        results[test] = summarize(table, rows, {})
    if dry:
        return 0
    results["training"] = {}
    for name, model in models.items():
        summary = json.loads((model / "train.json").read_text())
        results["training"][name] = {
            k: summary.get(k) for k in ("selected", "verdict", "wall_s_this_run", "state_cache_s",
                                       "train_slates")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                       if line.startswith("Model name")), platform.processor())
    for name in students:
        for point in points[1:]:
            got = results["training"][f"{name}@{point['run']}"]
            costs[f"training {name} on {point['queries']} queries (its states cached: "
                  f"{(got.get('state_cache_s') or 0) / 60:.1f} min)"] = got["wall_s_this_run"]
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "layers": args.layers, "passages": args.passages,
        "synthetic": kept, "base_slates": base_slates, "points": points,
        "students": students, "costs": costs,
        "machine": f"{model_name}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "other": os.environ.get("SEARCH_BENCH_OTHER", "nothing else named as running"),
        "minutes": round((time.time() - started) / 60, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    (args.out / "report.md").write_text(curve_report(results, meta))
    (args.out / "command.txt").write_text(
        "# .venv/bin/python benchmarks/search_queries_cpu.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:])
        + " runs these, in order (a rerun reuses each step whose output is there):\n"
        + "\n".join(log) + "\n")
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
