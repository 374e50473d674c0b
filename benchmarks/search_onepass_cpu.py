"""Search students that rank BM25's whole top 100 in one pass, trained on queries without
judgements and scored on two TREC test sets they never saw, at CPU scale.

    .venv/bin/python benchmarks/search_onepass_cpu.py [--shared DIR] [--layers 2] [--dry-run]

What the students learn from: TREC DL22's 76 real queries with BM25's top 100 and no
judgements (``../shared/data/trec-dl22``), labelled by a teacher that needs no LLM at CPU
scale: the fusion of the dense retriever (all-MiniLM-L6-v2) with BM25's own order
(``spdrank teacher --backend ranker:TEACHER``). 16 of the 76 queries are held out to select
each student's epoch (by tau with the teacher; the untrained start of an anchored student,
which ranks as BM25 did, is one of the candidates). What they are scored on: TREC DL19 (43
queries) and DL21 (53), BM25's top 100 each and NIST's graded judgements, neither seen in
training; nDCG@10 graded over every judged passage, AP and R@100 at grade >= 2 (trec_eval's
semantics).

Every student is a frozen backbone's first ``--layers`` layers (``--backbone``; SmolLM2-135M by
default) read in ONE prefill of the whole top 100 (K = 100, 64 tokens a passage, 6.8k tokens a
prompt with SmolLM2's tokenizer), and a head:

- ``paper head``: the paper's self-attention head over each passage's last-token state, not
  anchored;
- ``query-matched``: the history head with the query in the history's place: each passage's
  words matched against the query's words (``--readout words --match tfidf``), the passages
  attending to the query; not anchored;
- ``+ anchor``: the same, starting as BM25's order (``--anchor order``, the default for search
  prompts) and learning a correction;
- ``+ BM25 score`` and ``+ BM25 and dense scores``: the anchored student reading those scores
  too (``--features score`` / ``score,dense``);
- ``no LLM``: the anchored head on the BM25 and dense scores alone (``--features-only``), the
  control that says what the LLM adds;
- ``LoRA on the top layers`` (``--adapted``): a frozen student's head and LoRA on the backbone's
  top ``--lora-layers`` layers trained on together, each step running only those layers over
  the cached states entering them (``spdrank train --lora-layers N --cache-states``);
- ``by windows`` (``--windowed``): a frozen student's flags with K = 20, trained on DL22's
  sliding windows (``spdrank data windows``) and ranking the top 100 through nine windows
  (``spdrank eval --window 20``): what one pass replaces.

``--teachers likelihood`` scores one more teacher beside the fusion teacher, taught from by no
student: the query-likelihood teacher (the bundled SmolLM2 with all its layers scoring
log p(query | passage), ``spdrank teacher --backend likelihood``), its ms a query its own.

The frozen students are scored from cached backbone states (the same states a live prefill gives:
tests/training/test_state_cache.py), so the quality columns cost minutes; the ms column is the live
``spdrank eval`` time a query (tokenize, one prefill, head, decode) over the first
``--latency-queries`` DL21 queries. The LoRA students are scored live by ``spdrank eval``,
which times every query. Intervals are paired 95% bootstrap intervals over queries.

Writes ``benchmarks/results/search-onepass-cpu/`` (report.md, results.json, command.txt); the
work goes under ``data-out/search-onepass`` and ``runs/search-onepass``, and a rerun reuses
every finished step.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_dl19_cpu import (
    first_queries,
    fmt,
    interval,
    per_query,
    read_jsonl,
    spdrank,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "search-onepass-cpu"
WORK = ROOT / "data-out" / "search-onepass"
RUNS = ROOT / "runs" / "search-onepass"
SHARED = ROOT.parent / "shared" / "data"

#: The teacher: reciprocal-rank fusion of the dense retriever (its cosine, computed once into
#: each candidate's features) with BM25's order.
TEACHER = "fusion:rrf:feature:dense+retriever"
ITEM_TOKENS = 64
POSITIONS = 100
VALIDATION_QUERIES = 16
TEST_SETS = ("dl19", "dl21")
#: How the provenance line says the report was rewritten from a run's finished steps.
REWRITTEN = "; this report rewritten from its finished steps"
METRICS = ("nDCG@10", "AP(rel=2)", "R(rel=2)@100", "tau", "top1")
#: The students: name -> (title, cache family, spdrank train flags).
STUDENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "paper": ("student: paper head (last token), no anchor", "last",
              ("--head", "attn", "--readout", "last", "--anchor", "none")),
    "matched": ("student: query-matched head, no anchor", "words",
                ("--head", "history", "--anchor", "none")),
    "anchored": ("student: query-matched + anchor", "words", ("--head", "history")),
    "anchored+bm25": ("student: query-matched + anchor + BM25 score", "words",
                      ("--head", "history", "--features", "score")),
    "anchored+bm25+dense": ("student: query-matched + anchor + BM25 and dense scores", "words",
                            ("--head", "history", "--features", "score,dense")),
    "features": ("no LLM: anchored head on BM25 and dense scores", "",
                 ("--head", "attn", "--features-only", "--features", "score,dense")),
}
#: Students whose top layers adapt with LoRA over cached states of the frozen layers below
#: (``--lora-layers``), each starting from a frozen student's head: name -> (title, the
#: frozen student it starts from). They are scored live: their states are no longer the
#: frozen backbone's.
ADAPTED: dict[str, tuple[str, str]] = {
    "matched+lora": ("student: query-matched head, LoRA on the top layers", "matched"),
    "anchored+bm25+lora": ("student: query-matched + anchor + BM25 score, LoRA on top",
                           "anchored+bm25"),
}
#: The window and stride of a windowed student (RankGPT's): it is trained on DL22's windows
#: and ranks the top 100 bottom-up, one prefill a window.
WINDOW, STRIDE = 20, 10
BASELINE_ROWS = (("BM25", "retriever"), ("dense (all-MiniLM-L6-v2)", "dense"),
                 (f"teacher: {TEACHER}", "teacher"))
#: The students trained unless ``--students`` names others.
DEFAULT_STUDENTS = tuple(STUDENTS)
#: Teachers scored beside the fusion teacher (``--teachers``), none of them taught from: each
#: one's row name and its ``spdrank teacher`` flags. The query-likelihood teacher is the LLM
#: teacher a CPU can afford: the bundled SmolLM2, all 30 layers, scoring log p(query | passage).
TEACHERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "likelihood": ("teacher: query likelihood (SmolLM2, all layers)",
                   ("--backend", "likelihood", "--model", "bundled", "--device", "cpu",
                    "--max-item-tokens", str(ITEM_TOKENS))),
}


def shown(path: Path) -> str:
    """A path as the command log shows it: relative to the repository when under it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def with_dense_feature(source: Path, out: Path) -> None:
    """The slates with each candidate's dense cosine as the feature ``dense``, beside BM25's
    ``score``: what a search team that runs both retrievers hands the reranker. Each distinct
    text is embedded once, however many slates hold it (synthetic queries' slates share a
    pool of passages); the cosines are the dense ranker's own (``DenseRanker.scores``).
    Left alone when ``out`` holds the same queries already."""
    from spdrank.core.slates import load_slates, write_slates
    from spdrank.rankers.dense import TEXT_FIELDS, DenseRanker

    slates = load_slates(source)
    if out.exists() and [s.query.qid for s in load_slates(out)] == [s.query.qid for s in slates]:
        return
    texts = {t: None for s in slates for t in (s.query.text, *s.candidate_texts(TEXT_FIELDS))}
    order = list(texts)
    vectors = DenseRanker().embed(order)
    row = {t: i for i, t in enumerate(order)}
    for slate in slates:
        query = vectors[row[slate.query.text]]
        for candidate, text in zip(slate.candidates, slate.candidate_texts(TEXT_FIELDS)):
            value = float(vectors[row[text]] @ query)
            candidate.features = {**(candidate.features or {}), "dense": value}
    write_slates(out, slates)


def without_anchor(flags: tuple[str, ...]) -> list[str]:
    """A student's flags without its ``--anchor``: a run from its checkpoint keeps the anchor
    the checkpoint was saved with, which is its best input's when training kept that input."""
    out = list(flags)
    if "--anchor" in out:
        at = out.index("--anchor")
        del out[at : at + 2]
    return out


def split_validation(source: Path, train: Path, valid: Path, count: int) -> None:
    """The last ``count`` queries of a seeded shuffle held out to select epochs."""
    slates = read_jsonl(source)
    qids = sorted(s["query"]["qid"] for s in slates)
    random.Random(0).shuffle(qids)
    held = set(qids[-min(count, len(qids) // 2):])  # a few queries (--queries): half of them
    for path, part in ((train, [s for s in slates if s["query"]["qid"] not in held]),
                       (valid, [s for s in slates if s["query"]["qid"] in held])):
        # Left alone when already there: a run may be reading it (its index is of this file).
        if not path.exists() or read_jsonl(path) != part:
            write_jsonl(path, part)


def prepare(shared: Path, work: Path, dry: bool, log: list[str], queries: int = 0
            ) -> tuple[dict[str, Path], Path, Path]:
    """DL19, DL21 and DL22 as slates with the dense cosine as a feature, labelled by the
    teacher, and DL22 split into training and validation queries: the labelled slates of each
    set, and DL22's two parts."""
    sources = {
        "dl19": ("trec-dl19/retrieve_results_dl19.json", "trec-dl19/qrels_dl19.json"),
        "dl21": ("trec-dl21/retrieve_results_dl21.json", "trec-dl21/qrels_dl21.txt"),
        "dl22": ("trec-dl22/retrieve_results_dl22.json", None),
    }
    labelled: dict[str, Path] = {}
    for name, (retrieved, qrels) in sources.items():
        slates = work / f"{name}.jsonl"
        spdrank("data", "search", "--retrieved", shared / retrieved,
                *(("--qrels", shared / qrels, "--rel-level", "2") if qrels else ()),
                "--out", slates, dry_run=dry, log=log, done=slates)
        if queries:
            log.append(f"# the first {queries} queries of {slates.name} kept (--queries)")
            if not dry:
                first_queries(slates, queries)
        labelled[name] = label(slates, work / name, dry, log)
    train, valid = work / "dl22-train.jsonl", work / "dl22-valid.jsonl"
    log.append(f"# DL22: {VALIDATION_QUERIES} queries held out (split_validation) -> "
               f"{shown(train)}, {shown(valid)}")
    if not dry:
        split_validation(labelled["dl22"], train, valid, VALIDATION_QUERIES)
    return labelled, train, valid


def label(slates: Path, stem: Path, dry: bool, log: list[str]) -> Path:
    """``slates`` with the dense cosine added (``STEM.features.jsonl``) and labelled by the
    teacher (``STEM.teacher.labels.jsonl``): the labelled slates' path."""
    featured = stem.with_name(f"{stem.name}.features.jsonl")
    log.append(f"# {stem.name}: each candidate's dense cosine added as the feature 'dense' "
               f"(with_dense_feature) -> {shown(featured)}")
    if not dry:
        with_dense_feature(slates, featured)
    labels = stem.with_name(f"{stem.name}.teacher.labels.jsonl")
    labelled = stem.with_name(f"{stem.name}.teacher.labels.slates.jsonl")
    spdrank("teacher", "--slates", featured, "--out", labels, "--backend",
            f"ranker:{TEACHER}", "--prompt", "search", "--no-progress",
            dry_run=dry, log=log, done=labelled)
    return labelled


def scored_teacher(work: Path, test: str, labelled: Path, teacher: str, dry: bool,
                   log: list[str]) -> Path:
    """``teacher``'s labels of the test set's slates (``TEST.TEACHER.labels.jsonl``, resumable)
    replayed by ``spdrank eval`` as a row named ``teacher``: the per-query rows' path. Its ms a
    query is the teacher's own, as its labels recorded it."""
    labels = work / f"{test}.{teacher}.labels.jsonl"
    spdrank("teacher", "--slates", work / f"{test}.jsonl", "--out", labels,
            *TEACHERS[teacher][1], "--prompt", "search", "--no-progress", dry_run=dry, log=log,
            done=labels.with_name(f"{labels.stem}.slates.jsonl"))
    rows = work / f"{test}.{teacher}.rows.jsonl"
    spdrank("eval", "--slates", labelled, "--labels", f"{teacher}={labels}", "--k", "10,100",
            "--rel-level", "2", "--per-slate", rows, "--no-progress", dry_run=dry, log=log,
            done=rows)
    return rows


def cached_rows(model_dir: Path, slates_path: Path, cache: Path, name: str,
                device: str = "cpu", progress: bool = False) -> list[dict[str, Any]]:
    """Per-query rows (as ``spdrank eval --per-slate`` writes them) of a frozen student ranking
    ``slates_path`` from its cached states; the states are computed once into ``cache``."""
    from spdrank.core.slates import load_slates
    from spdrank.eval.metrics import slate_metrics
    from spdrank.model.ranker import SPDRanker
    from spdrank.model.state_cache import open_state_cache

    model = SPDRanker.from_pretrained(model_dir, device=device, dtype="float32")
    slates = load_slates(slates_path)
    states = None if model.config.features_only else open_state_cache(
        cache, model, slates_path, len(slates), batch_size=1, progress=progress)
    rows = []
    for i, slate in enumerate(slates):
        batch = None if states is None else states.batch([i], [slate], model)
        ranking = model.rank_batch([slate], batch=batch)[0]
        metrics = slate_metrics(ranking.docids, slate.docids, slate.clicked, slate.teacher,
                                ks=(10, 100), teacher_scores=slate.teacher_scores,
                                judgements=slate.relevance, rel=2)
        rows.append({"ranker": name, "qid": slate.query.qid, "latency_ms": None,
                     "decode_passes": 1, **metrics.values})
    return rows


def summarize(table: dict[str, dict[str, dict[str, Any]]], rows: list[tuple[str, str]],
              latency: dict[str, float]) -> dict[str, Any]:
    """Means and paired intervals against BM25, dense and the teacher, per row."""
    import numpy as np

    from spdrank.eval.paired import difference_of

    qids = sorted(table["retriever"])
    out: dict[str, Any] = {"queries": len(qids), "rows": {}}
    for _, name in rows:
        got = table.get(name)
        if got is None:
            continue
        entry: dict[str, Any] = {}
        for metric in METRICS:
            values = [got[q].get(metric) for q in qids]
            defined = [v for v in values if v is not None]
            entry[metric] = float(np.mean(defined)) if defined else None
        for ref in ("retriever", "dense", "teacher"):
            if ref == name or ref not in table:
                continue
            diffs = np.array([got[q]["nDCG@10"] - table[ref][q]["nDCG@10"] for q in qids])
            d = difference_of(diffs)
            entry[f"nDCG@10 - {ref}"] = {"mean": d.mean, "low": d.low, "high": d.high}
        if name in latency:
            entry["ms_per_query_p50"] = latency[name]
        elif all(got[q]["latency_ms"] is not None for q in qids):
            entry["ms_per_query_p50"] = float(np.median([got[q]["latency_ms"] for q in qids]))
        out["rows"][name] = entry
    return out


def backbone_title(name: str) -> str:
    """The students' backbone as the report names it: a packaged name's title, else ``name``."""
    from spdrank.backbone.gguf import PACKAGED

    return "SmolLM2" if name == "bundled" else PACKAGED[name].title if name in PACKAGED else name


def report(results: dict[str, Any], meta: dict[str, Any], rows: list[tuple[str, str]]) -> str:
    lines = [
        "# One pass over BM25's top 100: search students on DL19 and DL21, CPU scale",
        "",
        (f"Written by `benchmarks/search_onepass_cpu.py` ({meta['date']}, commit "
         f"{meta['commit']}, {meta['machine']}; {meta['other']}; {meta['minutes']} min). "
         f"Students trained on DL22's queries (no judgements) labelled by `{TEACHER}`, "
         f"{meta['layers']} frozen {meta.get('backbone', 'SmolLM2')} layers read in one "
         "prefill of the whole top 100 "
         f"(K = {POSITIONS}, {ITEM_TOKENS} tokens a passage); scored on test sets they never "
         "saw. nDCG@10 graded over every judged passage, AP and R@100 at grade >= 2; tau and "
         "top-1 against the teacher; paired 95% bootstrap intervals over queries. The "
         "commands are in command.txt."),
        "",
        ("The teacher ranks from the dense cosine already in each candidate's features, so its "
         "cost a query is the dense row's plus the milliseconds shown. A student's ms is the "
         "live `spdrank eval` time a query (tokenize, one prefill of the whole top 100, head, "
         f"decode; `--dtype auto`) over the first {meta['latency_queries']} DL21 queries, for "
         "the students timed; every frozen student's quality comes from its cached states, "
         "which equal a live prefill's in float32."),
    ]
    if meta.get("lora_layers"):
        lines += ["", (
            f"A student \"with LoRA on the top layers\" adapts the top {meta['lora_layers']} of "
            f"the {meta['layers']} layers with LoRA (rank 64) beside its head, for "
            f"{meta['lora_epochs']} epochs from the frozen student of the same head, each step "
            "running only those layers over the cached states entering them; it is scored "
            "live (`spdrank eval`, every query timed).")]
    if meta.get("window"):
        lines += ["", (
            f"A student \"by windows of {meta['window']}\" has K = {meta['window']}, is trained "
            "on the sliding windows of the same DL22 queries (`spdrank data windows`) and ranks "
            f"the top 100 bottom-up through windows of {meta['window']} moving by "
            f"{meta['stride']}, one prefill a window; it is scored live.")]
    for test in TEST_SETS:
        summary = results[test]
        lines += [
            "", f"## {test.upper()} ({summary['queries']} queries)", "",
            ("| row | nDCG@10 | AP | R@100 | tau | top-1 | nDCG@10 - BM25 | nDCG@10 - dense | "
             "nDCG@10 - teacher | ms a query (p50) |"),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for title, name in rows:
            r = summary["rows"].get(name)
            if r is None:
                continue
            lines.append(
                f"| {title} | {fmt(r['nDCG@10'])} | {fmt(r['AP(rel=2)'])} | "
                f"{fmt(r['R(rel=2)@100'])} | {fmt(r['tau'])} | {fmt(r['top1'])} | "
                f"{interval(r.get('nDCG@10 - retriever'))} | {interval(r.get('nDCG@10 - dense'))}"
                f" | {interval(r.get('nDCG@10 - teacher'))} | "
                f"{fmt(r.get('ms_per_query_p50'), 0)} |")
    lines += ["", "## Against the goals", ""]
    for test in TEST_SETS:
        got = results[test]["rows"]
        for name, ref, goal in (
            ("anchored+bm25", "retriever", "(a) the student with BM25's score beats BM25"),
            ("anchored+bm25+lora", "retriever",
             "(a) the student with BM25's score, LoRA on its top layers, beats BM25"),
            ("anchored+bm25+dense", "dense",
             "(b) the student with BM25's and dense's scores beats dense"),
        ):
            d = got.get(name, {}).get(f"nDCG@10 - {ref}")
            if d:
                met = "met" if d["low"] is not None and d["low"] > 0 else "not met"
                lines.append(f"- {test.upper()}, {goal}: {interval(d)}: **{met}** (an interval "
                             "above zero).")
        teacher = got.get("teacher", {}).get("nDCG@10")
        for name, which in (("matched", "the LLM-only student"),
                            ("matched+lora", "the LLM-only student with LoRA on its top layers")):
            alone = got.get(name, {}).get("nDCG@10")
            if alone is None or not teacher:
                continue
            met = "met" if alone / teacher >= 0.9 else "not met"
            lines.append(f"- {test.upper()}, (c) {which} keeps {alone / teacher:.0%} of its "
                         f"teacher's nDCG@10 ({fmt(alone)} of {fmt(teacher)}): **{met}** (90%).")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder")
    parser.add_argument("--layers", type=int, default=2,
                        help="the students' frozen layers (0: all of them)")
    parser.add_argument("--backbone", default="bundled",
                        help="the students' LLM (default: the bundled SmolLM2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="the students' dtype when they rank (default: auto)")
    parser.add_argument("--epochs", default="20", help="training epochs of each student")
    parser.add_argument("--latency-queries", type=int, default=8)
    parser.add_argument("--queries", type=int, default=0,
                        help="only the first N queries of each set (default 0: all of them)")
    parser.add_argument("--students", default=",".join(DEFAULT_STUDENTS),
                        help="the students to train, comma-separated")
    parser.add_argument("--adapted", default="",
                        help=f"LoRA students to train, comma-separated, of {list(ADAPTED)}")
    parser.add_argument("--lora-layers", type=int, default=1,
                        help="the top layers the LoRA students adapt")
    parser.add_argument("--lora-epochs", default="2", help="training epochs of a LoRA student")
    parser.add_argument("--teachers", default="",
                        help=f"more teachers to score, comma-separated, of {list(TEACHERS)}")
    parser.add_argument("--windowed", default="",
                        help="frozen students to train and rank by windows too, comma-separated")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from finished steps, keeping the recorded "
                        "run's date, duration and what ran beside it")
    args = parser.parse_args()
    work, runs, dry = args.work, args.runs / f"layers{args.layers or 'all'}", args.dry_run
    log: list[str] = []
    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    labelled, train, valid = prepare(args.shared, work, dry, log, args.queries)

    common = ("--prompt", "search", "--max-item-tokens", str(ITEM_TOKENS), "--frozen", "--backbone", args.backbone, "--device", args.device,
              *(("--layers", str(args.layers)) if args.layers else ()))
    chosen = [s for s in args.students.split(",") if s]
    for name in sorted(chosen, key=lambda s: STUDENTS[s][1] == "last"):
        _, family, flags = STUDENTS[name]
        caches = ("--cache-states", runs / f"cache-{family}", "--cache-batch-size", "1") \
            if family else ()
        spdrank("train", "--slates", train, "--eval-slates", valid, "--out", runs / name,
                *common, "--positions", str(POSITIONS), *flags, *caches, "--epochs", args.epochs, "--batch-size", "8",
                "--head-lr", "1e-3", "--eval-every", "0", "--select", "best", "--no-progress",
                dry_run=dry, log=log, done=runs / name / "model" / "config.json")
    adapted = [s for s in args.adapted.split(",") if s]
    for name in adapted:
        base = ADAPTED[name][1]
        spdrank("train", "--slates", train, "--eval-slates", valid, "--out", runs / name,
                *(x for x in common if x != "--frozen"), "--positions", str(POSITIONS),
                *without_anchor(STUDENTS[base][2]),
                "--lora-layers", str(args.lora_layers), "--init-from", runs / base,
                "--cache-states", runs / f"cache-lora{args.lora_layers}",
                "--cache-batch-size", "1", "--epochs", args.lora_epochs, "--batch-size", "8",
                "--head-lr", "1e-3", "--eval-every", "0", "--select", "best", "--no-progress",
                dry_run=dry, log=log, done=runs / name / "model" / "config.json")

    windowed = [s for s in args.windowed.split(",") if s]
    if windowed:
        parts = {}
        for part, source in (("train", train), ("valid", valid)):
            parts[part] = work / f"dl22-{part}.windows.jsonl"
            spdrank("data", "windows", "--slates", source, "--window", str(WINDOW), "--stride",
                    str(STRIDE), "--out", parts[part], dry_run=dry, log=log, done=parts[part])
    for name in windowed:
        spdrank("train", "--slates", parts["train"], "--eval-slates", parts["valid"],
                "--out", runs / f"{name}@windows",
                *common, "--positions", str(WINDOW),
                *STUDENTS[name][2], "--cache-states", runs / f"cache-windows-{STUDENTS[name][1]}",
                "--cache-batch-size", "1", "--epochs", args.epochs, "--batch-size", "8",
                "--head-lr", "1e-3", "--eval-every", "0", "--select", "best", "--no-progress",
                dry_run=dry, log=log, done=runs / f"{name}@windows" / "model" / "config.json")

    results: dict[str, Any] = {}
    live_students = [*adapted, *(f"{s}@windows" for s in windowed)]
    teachers = [t for t in args.teachers.split(",") if t]
    rows = [*BASELINE_ROWS, *((TEACHERS[t][0], t) for t in teachers),
            *((STUDENTS[s][0], s) for s in chosen),
            *((ADAPTED[s][0], s) for s in adapted),
            *((f"{STUDENTS[s][0]}, by windows of {WINDOW}", f"{s}@windows") for s in windowed)]
    latency: dict[str, float] = {}
    for test in TEST_SETS:
        baselines = runs / f"{test}.baselines.rows.jsonl"
        spdrank("eval", "--slates", labelled[test], "--ranker", "retriever", "--ranker",
                "dense", "--labels", f"teacher={work / f'{test}.teacher.labels.jsonl'}",
                "--k", "10,100", "--rel-level", "2", "--per-slate", baselines,
                "--no-progress", dry_run=dry, log=log, done=baselines)
        teacher_rows = [scored_teacher(work, test, labelled[test], t, dry, log) for t in teachers]
        live = [s for s in ("anchored+bm25", "paper") if s in chosen]  # the students timed
        if test == "dl21" and live:
            timed = runs / "dl21.latency.rows.jsonl"
            spdrank("eval", "--slates", labelled[test], "--limit", str(args.latency_queries),
                    *(x for s in live for x in ("--model", f"{s}={runs / s}")),
                    "--k", "10,100", "--rel-level", "2", "--device", args.device,
                    *(("--dtype", args.dtype) if args.dtype else ()), "--per-slate", timed, "--no-progress", dry_run=dry, log=log, done=timed)
            if not dry:
                import numpy as np

                for name, got in per_query(timed, {}).items():
                    latency[name] = float(np.median([r["latency_ms"] for r in got.values()]))
        live_rows = {}
        for group, names, window in (("adapted", adapted, ()),
                                     ("windowed", [f"{s}@windows" for s in windowed],
                                      ("--window", str(WINDOW)))):
            if not names:
                continue
            live_rows[group] = runs / f"{test}.{group}.rows.jsonl"
            spdrank("eval", "--slates", labelled[test],
                    *(x for s in names for x in ("--model", f"{s}={runs / s}")), *window,
                    "--k", "10,100", "--rel-level", "2", "--device", args.device,
                    *(("--dtype", args.dtype) if args.dtype else ()),
                    "--per-slate", live_rows[group], "--no-progress", dry_run=dry, log=log,
                    done=live_rows[group])
        student_rows = runs / f"{test}.students.rows.jsonl"
        log.append(f"# {test}: every student ranks it from cached states (cached_rows) -> "
                   f"{shown(student_rows)}")
        if dry:
            continue
        table = per_query(baselines, {})
        for path in teacher_rows:
            table.update(per_query(path, {}))
        done = per_query(student_rows, {}) if student_rows.exists() else {}
        for name in chosen:
            if name not in done:
                family = STUDENTS[name][1]
                got = cached_rows(runs / name, labelled[test], runs / f"cache-{family}-{test}",
                                  name, args.device)
                done[name] = {r["qid"]: r for r in got}
                write_jsonl(student_rows, [r for v in done.values() for r in v.values()])
        table.update(done)
        for path in live_rows.values():
            table.update({k: v for k, v in per_query(path, {}).items() if k in live_students})
        results[test] = summarize(table, rows, latency)
    if dry:
        return 0
    for name in [*chosen, *live_students]:
        summary = json.loads((runs / name / "train.json").read_text())
        results.setdefault("training", {})[name] = {
            k: summary.get(k) for k in ("selected", "verdict", "wall_s_this_run", "state_cache_s",
                                       "train_slates")
        }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                       if line.startswith("Model name")), platform.processor())
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "layers": args.layers, "latency_queries": args.latency_queries,
        "backbone": backbone_title(args.backbone),
        "machine": f"{model_name}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "other": os.environ.get("SEARCH_BENCH_OTHER", "nothing else named as running"),
        "minutes": round((time.time() - started) / 60, 1),
        **({"lora_layers": args.lora_layers, "lora_epochs": args.lora_epochs} if adapted
           else {}),
        **({"window": WINDOW, "stride": STRIDE} if windowed else {}),
    }
    recorded = args.out / "results.json"
    if args.report_only and recorded.exists():
        earlier = json.loads(recorded.read_text())["meta"]
        rewritten = meta["date"]
        meta |= {k: earlier[k] for k in ("date", "commit", "other", "minutes") if k in earlier}
        other = meta["other"].split(REWRITTEN)[0]
        meta["other"] = f"{other}{REWRITTEN} {rewritten}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    (args.out / "report.md").write_text(report(results, meta, rows))
    (args.out / "command.txt").write_text(
        "# .venv/bin/python benchmarks/search_onepass_cpu.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--report-only")
        + " runs these, in order (a rerun reuses each step whose output is there):\n" + "\n".join(log) + "\n")
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
