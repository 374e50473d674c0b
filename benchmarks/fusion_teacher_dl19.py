"""Is a fusion of the dense ranker and the first stage a teacher worth learning from at CPU
scale? Its quality and its cost a query on TREC DL19, beside what it fuses.

    .venv/bin/spdrank data search --retrieved ../shared/data/trec-dl19/retrieve_results_dl19.json \\
        --qrels ../shared/data/trec-dl19/qrels_dl19.json --rel-level 2 --out /tmp/dl19.jsonl
    .venv/bin/python benchmarks/fusion_teacher_dl19.py --slates /tmp/dl19.jsonl \\
        [--note "what else ran"] [--work DIR] [--out DIR]

The 43 judged queries, BM25's top 100 each, scored with trec_eval's semantics (nDCG@10 graded
over every judged passage; AP and R@100 at grade >= 2). Every row is ``spdrank eval --ranker``:

- ``retriever`` (BM25's own order), ``slate_bm25`` (BM25 over the slate alone), ``dense``
  (all-MiniLM-L6-v2), and the teachers ``fusion:rrf:dense+retriever`` (reciprocal-rank fusion,
  k = 60) and ``fusion:zscore:dense+retriever`` (z-scored cosines and BM25 scores, summed),
  each live: its milliseconds a query are what labelling a slate with it costs;
- RRF replays, from the dense row's own TREC run (``--trec-dir``) rather than the encoder
  again: the live two-way RRF, which must score every query exactly as the live one does (the
  check that a replay fuses what the live ranker fuses); the three-way RRF with ``slate_bm25``; and
  BM25 weighted down (0.5, 0.25), a sensitivity read on the test queries themselves, so no
  weight here is a tuned result. RRF reads only the run's order, which the run keeps; a run
  prints scores to 6 decimals and, where two print equal, rank-derived scores instead (8 of
  the 43 dense rankings of DL19), so score fusions are not replayed. A replay's milliseconds
  are not a teacher's cost.

Two evaluations run the encoder (the first with dense and RRF, the second with z-score
alone), so neither runs past a few minutes on 2 shared cores; a step whose outputs exist is
reused. Paired 95% bootstrap intervals over queries (``spdrank.eval.paired``) compare each
fusion with dense and with BM25. Writes ``report.md``, ``results.json`` and ``command.txt`` to
``--out`` (default ``benchmarks/results/fusion-teacher-dl19-cpu``); the evaluations' JSON,
per-query rows and runs go under ``--work`` (default ``data-out/fusion-teacher-dl19``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from serve_harness import ROOT, code_version, machine

from spdrank.eval.paired import difference_of

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "fusion-teacher-dl19-cpu"
DEFAULT_WORK = ROOT / "data-out" / "fusion-teacher-dl19"
RRF = "fusion:rrf:dense+retriever"
ZSCORE = "fusion:zscore:dense+retriever"
METRICS = ("nDCG@10", "AP(rel=2)", "R(rel=2)@100")
COMMON = ("--k", "10,100", "--rel-level", "2", "--no-progress")
#: The replayed fusions, ``DENSE`` the dense row's run: the live one first (the check).
REPLAYS = (
    "fusion:rrf:run:DENSE+retriever", "fusion:rrf:run:DENSE+retriever+slate_bm25",
    "fusion:rrf:run:DENSE+0.5*retriever", "fusion:rrf:run:DENSE+0.25*retriever",
)


def steps(slates: Path, work: Path) -> list[tuple[str, list[str]]]:
    """(name, spdrank arguments) of each evaluation, in order."""
    dense_run = work / "runs" / "dense.trec"
    return [
        ("live", ["eval", "--slates", str(slates), "--ranker", "retriever", "--ranker", "slate_bm25",
                  "--ranker", "dense", "--ranker", RRF, "--trec-dir", str(work / "runs")]),
        ("zscore", ["eval", "--slates", str(slates), "--ranker", ZSCORE]),
        ("replay", ["eval", "--slates", str(slates),
                    *(a for r in REPLAYS for a in ("--ranker", r.replace("DENSE", str(dense_run))))]),
    ]


def run_step(name: str, args: list[str], work: Path, log: list[str]) -> dict[str, Any]:
    """Run one evaluation (or reuse its outputs); when it ran and the load around it."""
    rows, result = work / f"{name}.rows.jsonl", work / f"{name}.json"
    full = [*args, *COMMON, "--json", str(result), "--per-slate", str(rows)]
    shown = [a.replace(f"{ROOT}/", "") for a in full]  # paths as from the repository's root
    log.append(" ".join(shlex.quote(a) for a in [".venv/bin/spdrank", *shown]))
    facts = work / f"{name}.facts.json"
    if rows.exists() and result.exists() and facts.exists():
        print(f"reusing {name}: {rows}", file=sys.stderr)
        return json.loads(facts.read_text())
    work.mkdir(parents=True, exist_ok=True)
    out = {"date": now(), "load_before": load_average()}
    subprocess.run([str(ROOT / ".venv" / "bin" / "spdrank"), *full], check=True, cwd=ROOT)
    out["load_after"] = load_average()
    facts.write_text(json.dumps(out) + "\n")
    return out


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def per_query(work: Path, names: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{ranker: {qid: per-slate row}}`` over the steps' per-slate files."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        for line in (work / f"{name}.rows.jsonl").read_text().splitlines():
            row = json.loads(line)
            out.setdefault(row["ranker"], {})[row["qid"]] = row
    return out


def summarize(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Means, p50 milliseconds and paired differences of nDCG@10 against dense and BM25."""
    qids = sorted(table["retriever"])
    rows: dict[str, Any] = {}
    for name, by_qid in table.items():
        if sorted(by_qid) != qids:
            raise SystemExit(f"row {name} does not rank the same queries")
        entry: dict[str, Any] = {m: float(np.mean([by_qid[q][m] for q in qids])) for m in METRICS}
        entry["ms_per_query_p50"] = float(np.median([by_qid[q]["latency_ms"] for q in qids]))
        for ref in ("dense", "retriever"):
            if ref != name:
                diffs = np.array([by_qid[q]["nDCG@10"] - table[ref][q]["nDCG@10"] for q in qids])
                d = difference_of(diffs)
                entry[f"nDCG@10 - {ref}"] = {"mean": d.mean, "low": d.low, "high": d.high}
        rows[name] = entry
    checks = {}
    for live in (RRF, ZSCORE):
        method = live.split(":")[1]
        replay = next((n for n in table if label(n) == replayed(method, "retriever")), None)
        if live in table and replay is not None:
            checks[live] = all(abs(table[replay][q][m] - table[live][q][m]) < 1e-12
                               for q in qids for m in METRICS)
    return {"queries": len(qids), "rows": rows, "replay_matches_live": checks}


def replayed(method: str, rest: str) -> str:
    """The report's name of a fusion replayed from the dense row's run."""
    return f"fusion:{method}:run:dense.trec+{rest} (replay of dense's run)"


def label(name: str) -> str:
    """A row's name in the report: the replayed dense run's path shortened to ``dense``."""
    if name.startswith("fusion:") and "run:" in name:
        parts = name.split("+")
        method = parts[0].rsplit(":run:", 1)[0].removeprefix("fusion:")
        return replayed(method, "+".join(parts[1:]))
    return name


def interval(d: dict[str, float] | None) -> str:
    return "-" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def report(meta: dict[str, Any], summary: dict[str, Any]) -> str:
    m = meta["machine"]
    lines = [
        "# A fusion teacher on TREC DL19, CPU scale: dense + BM25, reciprocal rank or z-scores",
        "",
        (f"Written by `benchmarks/fusion_teacher_dl19.py`; the commands are in "
         f"[command.txt](command.txt). {summary['queries']} judged queries, BM25's top 100 each; "
         "nDCG@10 graded over every judged passage, AP and R@100 at grade >= 2 (trec_eval's "
         "semantics); intervals are paired 95% bootstrap intervals over queries. Milliseconds "
         "are the p50 of one `rank()` call a query, on the evaluation's own clock."),
        "",
        f"- written: {meta['date']}; commit: {meta['commit']}",
        (f"- machine: {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}), "
         f"{m.get('ram_gib', '?')} GiB RAM; torch {m.get('torch')}"),
        *(f"- evaluation `{name}`: {f['date']}, load average before / after {f['load_before']} "
          f"/ {f['load_after']}" for name, f in meta["steps"].items()),
        *([f"- also running: {meta['note']}"] if meta["note"] else []),
        "",
        ("| row | nDCG@10 | AP(rel=2) | R(rel=2)@100 | nDCG@10 - dense | nDCG@10 - BM25 | "
         "ms a query (p50) |"),
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in summary["rows"].items():
        replay = "run:" in name
        ms = "-" if replay else f"{e['ms_per_query_p50']:.1f}"
        lines.append(
            f"| {label(name)} | {e['nDCG@10']:.3f} | {e['AP(rel=2)']:.3f} | "
            f"{e['R(rel=2)@100']:.3f} | {interval(e.get('nDCG@10 - dense'))} | "
            f"{interval(e.get('nDCG@10 - retriever'))} | {ms} |"
        )
    checks = summary["replay_matches_live"]
    said = "; ".join(f"`{replayed(live.split(':')[1], 'retriever')}` "
                     + ("scores every query exactly as" if ok else "does NOT score every query as")
                     + f" the live `{live}`" for live, ok in checks.items())
    rows = summary["rows"]
    dense = rows["dense"]["nDCG@10"]
    verdicts = []
    for live in (RRF, ZSCORE):
        d = rows[live]["nDCG@10 - dense"]
        where = ("above" if d["low"] > 0 else "below" if d["high"] < 0
                 else "not distinguishable from")
        verdicts.append(f"`{live}` reads {rows[live]['nDCG@10']:.3f}, {where} dense's {dense:.3f} "
                        f"({interval(d)}), {interval(rows[live]['nDCG@10 - retriever'])} over BM25")
    lines += [
        "",
        ("Reading: " + "; ".join(verdicts) + ". The teachers' cost a query is the encoder's: "
         f"dense {rows['dense']['ms_per_query_p50']:.0f} ms, RRF "
         f"{rows[RRF]['ms_per_query_p50']:.0f} ms, z-score {rows[ZSCORE]['ms_per_query_p50']:.0f}"
         " ms (the first stage's order and the fusion itself cost well under a millisecond)."),
        "",
        ("`retriever` is BM25's own order (the first stage), `slate_bm25` BM25 with the slate's "
         f"100 passages as its collection. Replays: {said}. The weighted rows were read on these 43 queries, "
         "the only judged ones at hand: a sensitivity to the weight, not a tuned teacher. A "
         "replay's milliseconds are not a teacher's cost (the encoder ran in the dense row), "
         "so none is given."),
        "",
    ]
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slates", required=True, type=Path, help="the DL19 search slates (JSONL)")
    p.add_argument("--note", default="", help="what else ran on the machine")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)

    meta: dict[str, Any] = {
        "date": now(), "commit": code_version(), "machine": machine(), "note": args.note,
    }
    log: list[str] = []
    chosen = steps(args.slates, args.work)
    meta["steps"] = {name: run_step(name, spd_args, args.work, log) for name, spd_args in chosen}
    summary = summarize(per_query(args.work, [name for name, _ in chosen]))

    args.out.mkdir(parents=True, exist_ok=True)
    script = " ".join(shlex.quote(a) for a in [".venv/bin/python",
                                               "benchmarks/fusion_teacher_dl19.py",
                                               *(sys.argv[1:] if argv is None else argv)])
    (args.out / "command.txt").write_text(
        "# the slates:\n.venv/bin/spdrank data search --retrieved "
        "../shared/data/trec-dl19/retrieve_results_dl19.json --qrels "
        "../shared/data/trec-dl19/qrels_dl19.json --rel-level 2 --out /tmp/dl19.jsonl\n"
        f"# {script} runs these, in order (a rerun reuses each step whose output is there):\n"
        + "\n".join(log) + "\n"
    )
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, **summary}, indent=2) + "\n")
    (args.out / "report.md").write_text(report(meta, summary))
    print(report(meta, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
