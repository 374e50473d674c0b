"""TREC DL 2019 passage reranking at CPU scale: SPD students beside BM25, a dense retriever, a
lexical baseline and the SmolLM2 teachers they are distilled from.

    .venv/bin/python benchmarks/search_dl19_cpu.py [--shared DIR] [--folds 5] [--dry-run]
    .venv/bin/python benchmarks/search_dl19_cpu.py --backbone PATH --layers 0 --device cuda \
        --dtype bfloat16 --listwise-url http://127.0.0.1:8000/v1 --listwise-model M \
        --distil-from listwise --out benchmarks/results/search-dl19-gpu   # benchmarks/gpu.sh

The 43 judged DL19 queries, BM25's top 100 passages each (``../shared/data/trec-dl19``, built
with ``spdrank data search``), NIST's graded judgements. Every row reranks the same top 100
and is scored with trec_eval's semantics (nDCG@10 with graded gains over every judged passage;
AP and R@100 at grade >= 2, TREC's convention for this task):

- ``bm25`` (the first stage's own order), ``random``, ``lexical`` (BM25 over the slate's own
  passages, ``--ranker slate_bm25``), ``dense`` (all-MiniLM-L6-v2 cosine, ``--ranker dense``);
- the SmolLM2-135M teachers: ``query-likelihood`` (log p(query | passage), UPR, all 30
  layers; ``spdrank teacher --backend likelihood --prompt search``) over the top 100, and
  ``constrained`` (the listwise teacher, decoding constrained to a valid permutation) over
  BM25's top 20, the rest in BM25's order, since a 100-passage listwise prompt costs minutes
  a query on a CPU;
- students distilled from the query-likelihood teacher by 5-fold cross-validation over
  queries: each fold's student trains on windows of 20 passages of the other folds' queries
  (the 9 sliding windows of 20 over BM25's order, stride 10, plus 6 random subsets of 20;
  the teacher's ranking restricted to each), reading SmolLM2's first 2 frozen layers with the
  default history head (the query read as one item, word by word), and ranks its fold's
  queries over the whole top 100 by sliding windows of 20 (stride 10: 9 prefills a query);
  one reads the text alone, one also BM25's score (``--features score``).

At scale (``benchmarks/gpu.sh``) the same experiment takes a real ``--backbone`` (all its
layers with ``--layers 0``), and ``--listwise-url`` adds a listwise teacher behind an
OpenAI-compatible server (a RankZephyr- or Qwen-style model on vLLM) over the whole top 100,
which ``--distil-from listwise`` makes the students' teacher.

Each query is ranked by exactly one fold's student, so every row holds the same 43 queries;
intervals are paired 95% bootstrap intervals over queries. Fidelity (tau, top-1) is against the
teacher the students distil. Writes ``benchmarks/results/search-dl19-cpu/`` (report.md,
results.json, command.txt); the work (slates, labels, runs, caches) goes under
``data-out/search-dl19`` and ``runs/search-dl19``, and every finished step is reused on a rerun.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
OUT = ROOT / "benchmarks" / "results" / "search-dl19-cpu"
WORK = ROOT / "data-out" / "search-dl19"
RUNS = ROOT / "runs" / "search-dl19"
SHARED = ROOT.parent / "shared" / "data" / "trec-dl19"

ITEM_TOKENS = 64
WINDOW, STRIDE = 20, 10
RANDOM_SUBSETS = 6
CONSTRAINED_DEPTH = 20
METRICS = ("nDCG@10", "AP(rel=2)", "R(rel=2)@100", "tau", "top1")
#: The rows of the table, in order: (name in the table, name in the evaluations).
ROWS = (
    ("BM25", "retriever"), ("random", "random"), ("lexical (BM25 over the slate)", "slate_bm25"),
    ("dense (all-MiniLM-L6-v2)", "dense"), ("teacher: query likelihood", "ql"),
    (f"teacher: constrained listwise, top {CONSTRAINED_DEPTH}", "constrained"),
    ("teacher: listwise LLM server (OpenAI-compatible)", "listwise"),
    ("student: LLM only", "student"), ("student: LLM + BM25 score", "student+bm25"),
)


def spdrank(
    *args: str | Path, dry_run: bool, log: list[str], done: Path | None = None
) -> None:
    """Run one ``spdrank`` command, recorded in ``log`` whether it runs or not: it runs unless
    ``dry_run``, or ``done`` names an output an earlier run left (the step is reused)."""
    argv = [str(BIN / "spdrank"), *map(str, args)]
    # Recorded as run from the repository: paths relative to it (and to ../shared).
    line = shlex.join(["spdrank", *map(str, args)])
    log.append(line.replace(f"{ROOT.parent}/shared/", "../shared/").replace(f"{ROOT}/", ""))
    reused = done is not None and done.exists()
    print("= (done)" if reused else "+", log[-1], flush=True)
    if not dry_run and not reused:
        subprocess.run(argv, check=True, cwd=ROOT)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)


def first_queries(path: Path, count: int) -> None:
    """Keep the first ``count`` slates (queries) of ``path``, in place (0: all): the size of a
    smoke run (``benchmarks/gpu.sh --smoke``), which runs every step on a few queries."""
    if count <= 0:
        return
    lines = path.read_text().splitlines(keepends=True)
    if len(lines) > count:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(lines[:count]))
        os.replace(tmp, path)


def folds_of(qids: list[str], k: int, seed: int = 0) -> list[list[str]]:
    """``k`` folds of the queries, a seeded shuffle dealt round-robin."""
    shuffled = sorted(qids)
    random.Random(seed).shuffle(shuffled)
    return [shuffled[i::k] for i in range(k)]


def constrained_run(top: Path, labels: Path, full: Path, out: Path) -> None:
    """A TREC run of the constrained teacher over BM25's top ``CONSTRAINED_DEPTH`` (its
    labelled order), the rest of the top 100 in BM25's order."""
    order = {json.loads(line)["query"]["qid"]: json.loads(line)["teacher"]
             for line in top.read_text().splitlines() if line.strip()}
    lines = []
    for slate in read_jsonl(full):
        qid = slate["query"]["qid"]
        head = order[qid]
        rest = [c["docid"] for c in slate["candidates"] if c["docid"] not in set(head)]
        ranked = head + rest
        lines += [f"{qid} Q0 {d} {r} {len(ranked) - r + 1} constrained"
                  for r, d in enumerate(ranked, start=1)]
    out.write_text("\n".join(lines) + "\n")


def per_query(rows_file: Path, rename: dict[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{row: {qid: per-slate row}}`` from an eval's ``--per-slate`` file."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in read_jsonl(rows_file):
        name = rename.get(row["ranker"], row["ranker"])
        out.setdefault(name, {})[row["qid"]] = row
    return out


def summarize(table: dict[str, dict[str, dict[str, Any]]], teacher: str = "ql") -> dict[str, Any]:
    """Means, latency and paired intervals (against BM25, and students against the teacher)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "src"))
    from spdrank.eval.paired import difference_of

    qids = sorted(table["retriever"])
    out: dict[str, Any] = {"queries": len(qids), "teacher": teacher, "rows": {}}
    for _, name in ROWS:
        rows = table.get(name)
        if rows is None:
            continue
        missing = sorted(set(qids) - set(rows))
        if missing:
            raise SystemExit(f"row {name} lacks queries {missing[:5]}")
        entry: dict[str, Any] = {}
        for metric in METRICS:
            values = [rows[q].get(metric) for q in qids]
            defined = [v for v in values if v is not None]
            entry[metric] = float(np.mean(defined)) if defined else None
        latency = sorted(rows[q]["latency_ms"] for q in qids)
        entry["ms_per_query_p50"] = float(np.median(latency))
        entry["decode_passes_mean"] = float(np.mean([rows[q]["decode_passes"] for q in qids]))
        for ref in ("retriever", teacher):
            if ref == name or ref not in table:
                continue
            for metric in ("nDCG@10", "AP(rel=2)", "R(rel=2)@100"):
                diffs = np.array([rows[q][metric] - table[ref][q][metric] for q in qids])
                d = difference_of(diffs)
                entry[f"{metric} - {ref}"] = {"mean": d.mean, "low": d.low, "high": d.high}
        out["rows"][name] = entry
    return out


def fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def interval(d: dict[str, Any] | None) -> str:
    if not d or d["mean"] is None:
        return "-"
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def report(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    rows = summary["rows"]
    distilled = summary.get("teacher", "ql")
    teacher = rows.get(distilled, {}).get("nDCG@10")
    lines = [
        "# TREC DL19 passage reranking, CPU scale",
        "",
        (f"Written by `benchmarks/search_dl19_cpu.py` ({meta['date']}, commit {meta['commit']}, "
        f"{meta['machine']}; {meta['other']}). The {summary['queries']} judged queries, "
        "BM25's top 100 each; nDCG@10 graded over every judged passage, AP and R@100 at grade "
        ">= 2 (trec_eval's semantics, held to ir-measures by the tests); tau and top-1 against "
        f"the teacher the students distil ({distilled}); intervals are paired 95% bootstrap "
        "intervals over "
        "queries. Students: 5-fold cross-validation over queries (each query ranked by the "
        "one student that never trained on it). The commands are in command.txt."),
        "",
        ("| row | nDCG@10 | AP | R@100 | tau | top-1 | nDCG@10 - BM25 | ms a query (p50) | "
         "prefills |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for title, name in ROWS:
        r = rows.get(name)
        if r is None:
            continue
        lines.append(
            f"| {title} | {fmt(r['nDCG@10'])} | {fmt(r['AP(rel=2)'])} | "
            f"{fmt(r['R(rel=2)@100'])} | {fmt(r['tau'])} | {fmt(r['top1'])} | "
            f"{interval(r.get('nDCG@10 - retriever'))} | {fmt(r['ms_per_query_p50'], 1)} | "
            f"{fmt(r['decode_passes_mean'], 1)} |"
        )
    lines += ["", "## Against the goals", ""]
    plus = rows.get("student+bm25", {}).get("nDCG@10 - retriever")
    if plus:
        verdict = "met" if plus["low"] is not None and plus["low"] > 0 else "not met"
        lines.append(f"- The student with BM25's score against BM25, nDCG@10: "
                     f"{interval(plus)}: **{verdict}** (goal: an interval above zero).")
    alone = rows.get("student", {}).get("nDCG@10")
    if alone is not None and teacher:
        share = alone / teacher
        verdict = "met" if share >= 0.9 else "not met"
        lines.append(f"- The LLM-only student keeps {share:.0%} of its teacher's nDCG@10 "
                     f"({fmt(alone)} of {fmt(teacher)}): **{verdict}** (goal: 90%); paired "
                     f"difference {interval(rows['student'].get(f'nDCG@10 - {distilled}'))}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED, help="the trec-dl19 folder")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--queries", type=int, default=0,
                        help="only the first N queries (default 0: all of them)")
    parser.add_argument("--epochs", default="8", help="training epochs of each student")
    parser.add_argument("--backbone", default="bundled",
                        help="the teachers' and students' LLM (default: the bundled SmolLM2)")
    parser.add_argument("--layers", type=int, default=2,
                        help="the students' frozen backbone layers (0: all of them)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", help="the backbones' dtype (default: auto)")
    parser.add_argument("--listwise-url", help="an OpenAI-compatible server of a listwise LLM")
    parser.add_argument("--listwise-model", help="its model name")
    parser.add_argument("--distil-from", choices=("ql", "listwise"), default="ql",
                        help="the teacher the students distil (default ql)")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    if args.distil_from == "listwise" and not args.listwise_url:
        parser.error("--distil-from listwise needs --listwise-url")
    work, runs, out = args.work, args.runs, args.out
    model = ("--model", args.backbone, "--device", args.device,
             *(("--dtype", args.dtype) if args.dtype else ()))
    student = ("--backbone", args.backbone, "--device", args.device,
               *(("--layers", str(args.layers)) if args.layers else ()),
               *(("--dtype", args.dtype) if args.dtype else ()))
    dry = args.dry_run
    log: list[str] = []

    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    slates = work / "dl19.jsonl"
    top = work / f"dl19-top{CONSTRAINED_DEPTH}.jsonl"
    common = ("--prompt", "search", "--max-item-tokens", str(ITEM_TOKENS))
    for depth, path in ((None, slates), (CONSTRAINED_DEPTH, top)):
        spdrank("data", "search", "--retrieved", args.shared / "retrieve_results_dl19.json",
                "--qrels", args.shared / "qrels_dl19.json", "--rel-level", "2",
                *(("--depth", str(depth)) if depth else ()), "--out", path,
                dry_run=dry, log=log, done=path)
        if args.queries:
            log.append(f"# the first {args.queries} queries of {path.name} kept (--queries)")
            if not dry:
                first_queries(path, args.queries)
    # The teachers (label files are appended to and resumed).
    ql = work / "ql.labels.jsonl"
    spdrank("teacher", "--slates", slates, "--out", ql, "--backend", "likelihood", *model,
            *common, "--no-progress", dry_run=dry, log=log)
    constrained = work / "constrained.labels.jsonl"
    spdrank("teacher", "--slates", top, "--out", constrained, "--backend", "hf", "--constrained",
            *model, *common, "--no-progress", dry_run=dry, log=log)
    labels = [f"ql={ql}"]
    if args.listwise_url:
        listwise = work / "listwise.labels.jsonl"
        spdrank("teacher", "--slates", slates, "--out", listwise, "--backend", "openai",
                "--base-url", args.listwise_url,
                *(("--model-name", args.listwise_model) if args.listwise_model else ()),
                *common, "--no-progress", dry_run=dry, log=log)
        labels.append(f"listwise={listwise}")
    labelled = work / f"{args.distil_from}.labels.slates.jsonl"
    run = work / "constrained-top20.trec"
    if not dry:
        constrained_run(work / "constrained.labels.slates.jsonl", constrained, slates, run)
    # Every row but the students, on all queries.
    baselines = work / "baselines.rows.jsonl"
    spdrank("eval", "--slates", labelled, "--ranker", "retriever", "--ranker", "random",
            "--ranker", "slate_bm25", "--ranker", "dense",
            *(x for spec in labels for x in ("--labels", spec)),
            "--run", f"constrained={run}", "--k", "10,100", "--rel-level", "2",
            "--per-slate", baselines, "--no-progress",
            dry_run=dry, log=log, done=baselines)
    # The students, fold by fold.
    queries = [] if dry else read_jsonl(labelled)
    qids = [s["query"]["qid"] for s in queries] or [f"q{i}" for i in range(43)]
    by_qid = {s["query"]["qid"]: s for s in queries}
    table = {} if dry else per_query(baselines, {})
    if not dry:  # the constrained run's row carries the time and passes its labels recorded
        for record in read_jsonl(constrained):
            row = table["constrained"][record["qid"]]
            row["latency_ms"], row["decode_passes"] = record["latency_ms"], record["decode_passes"]
    for f, held_out in enumerate(folds_of(qids, args.folds)):
        fold = runs / f"fold{f}"
        queries_in, train = fold / "train-queries.jsonl", fold / "train.jsonl"
        evaluate = fold / "eval.jsonl"
        if not dry:
            write_jsonl(queries_in, [by_qid[q] for q in qids if q not in held_out])
            write_jsonl(evaluate, [by_qid[q] for q in held_out])
        spdrank("data", "windows", "--slates", queries_in, "--window", str(WINDOW),
                "--stride", str(STRIDE), "--subsets", str(RANDOM_SUBSETS), "--out", train,
                dry_run=dry, log=log, done=train)
        for name, extra in (("student", ()), ("student+bm25", ("--features", "score"))):
            spdrank("train", "--slates", train, "--out", fold / name, *common, "--frozen",
                    *student, "--positions", str(WINDOW), "--epochs", args.epochs,
                    "--batch-size", "32", "--head-lr", "1e-3", *extra,
                    "--cache-states", fold / "cache", "--no-progress", dry_run=dry, log=log,
                    done=fold / name / "model" / "config.json")
        rows = fold / "students.rows.jsonl"
        spdrank("eval", "--slates", evaluate, "--model", f"student={fold / 'student'}",
                "--model", f"student+bm25={fold / 'student+bm25'}", "--window", str(WINDOW),
                "--window-stride", str(STRIDE), "--k", "10,100", "--rel-level", "2",
                "--device", args.device,
                *(("--dtype", args.dtype) if args.dtype else ()),
                "--per-slate", rows, "--no-progress", dry_run=dry, log=log, done=rows)
        if not dry:
            for name, got in per_query(rows, {}).items():
                table.setdefault(name, {}).update(got)
    if dry:
        return 0
    summary = summarize(table, args.distil_from)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, {platform.python_version()}",
        "other": os.environ.get("SEARCH_BENCH_OTHER", "nothing else named as running"),
        "minutes": round((time.time() - started) / 60, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, **summary}, indent=2) + "\n")
    (out / "report.md").write_text(report(summary, meta))
    (out / "command.txt").write_text(
        "# .venv/bin/python benchmarks/search_dl19_cpu.py runs these, in order (a rerun reuses "
        "each step whose output is there):\n"
        + "\n".join(log) + "\n"
    )
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
