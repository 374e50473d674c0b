"""Run rankers side by side over the same slates: quality, validity, agreement, latency.

One pass over the slates, every ranker on every slate in turn, so all rankers see exactly
the same slates (a stream from :func:`spdrank.core.slates.read_slates` works; nothing is read
twice). Per slate and ranker it keeps the wall-clock time of ``rank()`` and the metrics of
:func:`spdrank.eval.metrics.slate_metrics`, so paired comparisons (bootstrap confidence
intervals, sign tests) can be run later on :attr:`RankerResult.records`.

An output that is not a permutation of the candidates is counted as invalid (the ``valid%``
column), never crashed on; its quality metrics are computed on the repaired ranking (its
valid ids in order, then the missing candidates in their original order, see
:func:`spdrank.eval.metrics.repair_ranking`), which is what a pipeline that repairs would serve.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from spdrank.core.files import atomic_writer
from spdrank.core.progress import track
from spdrank.core.ranking import Ranker, Ranking
from spdrank.core.slates import Slate, clicked_not_retrieved
from spdrank.eval.judged import DEFAULT_REL_LEVEL, has_relevant
from spdrank.eval.metrics import (
    TEACHER_METRICS,
    MetricSummary,
    SlateMetrics,
    aggregate,
    metric_names,
    slate_metrics,
)


@dataclass
class SlateRecord:
    """One ranker on one slate: what per-slate statistics need."""

    index: int  # position of the slate in the evaluated stream (the pairing key)
    qid: str
    latency_ms: float
    decode_passes: int
    metrics: SlateMetrics
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class RankerResult:
    """All per-slate records of one ranker, with the summaries derived from them."""

    name: str
    records: list[SlateRecord] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.records)

    def summary(self) -> dict[str, MetricSummary]:
        """``valid`` (fraction) and the mean of each metric over the slates defining it."""
        return aggregate(r.metrics for r in self.records)

    def latency(self) -> dict[str, float | None]:
        """Per-slate ``rank()`` latency in ms: median, p95, mean."""
        lat = [r.latency_ms for r in self.records]
        return {
            "median": percentile(lat, 50),
            "p95": percentile(lat, 95),
            "mean": sum(lat) / len(lat) if lat else None,
        }

    def mean_decode_passes(self) -> float | None:
        return sum(r.decode_passes for r in self.records) / self.n if self.records else None

    def stage_ms(self) -> dict[str, float]:
        """Mean milliseconds of each stage the ranker reported in ``Ranking.timings``."""
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for r in self.records:
            for k, v in r.timings.items():
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        return {k: sums[k] / counts[k] for k in sums}

    def to_dict(self, per_slate: bool = False) -> dict[str, Any]:
        summary = self.summary()
        valid = summary.pop("valid")
        out: dict[str, Any] = {
            "n_slates": self.n,
            "valid_pct": None if valid.mean is None else 100.0 * valid.mean,
            "n_invalid": sum(1 for r in self.records if not r.metrics.valid),
            "metrics": {k: {"mean": s.mean, "n": s.n} for k, s in summary.items()},
            "latency_ms": self.latency(),
            "decode_passes_mean": self.mean_decode_passes(),
            "stage_ms": self.stage_ms(),
        }
        if per_slate:
            out["per_slate"] = [record_row(r) for r in self.records]
        return out


@dataclass
class Results:
    """The outcome of :func:`evaluate`: one :class:`RankerResult` per ranker, in order."""

    rankers: list[RankerResult]
    n_slates: int
    ks: tuple[int, ...] = (1, 10)
    n_with_teacher: int = 0
    #: Free-form context a caller adds (command line, files, fit times); goes into JSON.
    meta: dict[str, Any] = field(default_factory=dict)
    #: The k of the MRR@k columns (none by default: MRR alone).
    mrr_ks: tuple[int, ...] = ()
    #: Slates with clicks; slates with graded judgements (``relevance``), and of those, the
    #: ones with no relevant document at ``rel_level`` (they score 0 whatever the ranking,
    #: as in trec_eval, and the table says how many there were).
    n_with_clicks: int = 0
    n_judged: int = 0
    n_no_relevant: int = 0
    rel_level: int = DEFAULT_REL_LEVEL

    def __getitem__(self, name: str) -> RankerResult:
        for r in self.rankers:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self, per_slate: bool = False) -> dict[str, Any]:
        """JSON-able summary; ``per_slate=True`` adds every per-slate record."""
        return {
            "n_slates": self.n_slates,
            "n_with_teacher": self.n_with_teacher,
            "ks": list(self.ks),
            **({"mrr_ks": list(self.mrr_ks)} if self.mrr_ks else {}),
            **(
                {"n_judged": self.n_judged, "n_no_relevant": self.n_no_relevant,
                 "rel_level": self.rel_level}
                if self.n_judged else {}
            ),
            "meta": self.meta,
            "rankers": {r.name: r.to_dict(per_slate) for r in self.rankers},
        }

    def per_slate_rows(self) -> Iterator[dict[str, Any]]:
        """Flat rows ``{ranker, index, qid, valid, latency_ms, decode_passes, <metrics>}``."""
        for r in self.rankers:
            for rec in r.records:
                yield {"ranker": r.name, **record_row(rec)}


def record_row(rec: SlateRecord) -> dict[str, Any]:
    return {
        "index": rec.index,
        "qid": rec.qid,
        "valid": rec.metrics.valid,
        "latency_ms": rec.latency_ms,
        "decode_passes": rec.decode_passes,
        **rec.metrics.values,
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default); ``None`` if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def evaluate(
    rankers: Sequence[Ranker],
    slates: Iterable[Slate],
    *,
    ks: Sequence[int] = (1, 10),
    warmup: int = 1,
    progress: bool | None = False,
    total: int | None = None,
    mrr_ks: Sequence[int] = (),
    prepare: Callable[[Slate], object] | None = None,
    rel: int = DEFAULT_REL_LEVEL,
    observe: Callable[[Ranker, Slate, Ranking], object] | None = None,
) -> Results:
    """Rank every slate with every ranker and measure it.

    ``warmup`` untimed ``rank()`` calls per ranker on the first slate come before its timed
    call, so one-off costs (lazy loading, kernel compilation, caches) do not land in the
    latency of slate 0; metrics always come from the timed call. ``progress``: a tqdm bar
    always (True), never (False), or on a terminal and log lines elsewhere (None,
    :func:`spdrank.core.progress.track`); ``total`` sizes it. ``ks``: the k of R@k and NDCG@k;
    ``mrr_ks``: of MRR@k. A slate's clicks the retriever did not return
    (:func:`spdrank.core.slates.clicked_not_retrieved`) count as misses. Ranker names must be
    unique: they key the results. ``prepare``, when given, is called untimed on each slate
    before the rankers rank it (e.g. a forward that has the backend build its kernels for the
    slate's prompt length, so no ranker pays that for the others). A slate's graded
    judgements (``relevance``) add the judged metrics (:mod:`spdrank.eval.judged`), binary ones at
    relevance level ``rel``. ``observe``, when given, sees every timed ranking (e.g. to
    write it to a TREC run).
    """
    names = [r.name for r in rankers]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"ranker names must be unique, and {', '.join(twice)} names two rows: "
                         "give each its own (--ranker, --run, --labels and --model take "
                         "NAME=...)")
    if not rankers:
        raise ValueError("no rankers to evaluate")
    ks = tuple(ks)
    mrr_ks = tuple(mrr_ks)
    results = [RankerResult(name) for name in names]
    it = track(slates, f"eval ({ranker_list(names)})", unit="slate", total=total, mode=progress)
    n_slates = n_teacher = n_clicks = n_judged = n_no_relevant = 0
    for index, slate in enumerate(it):
        n_slates += 1
        n_teacher += slate.teacher is not None
        n_clicks += slate.clicked is not None
        n_judged += slate.relevance is not None
        n_no_relevant += slate.relevance is not None and not has_relevant(slate.relevance, rel)
        docids = slate.docids
        missed = clicked_not_retrieved(slate)
        if prepare is not None:
            prepare(slate)
        for ranker, res in zip(rankers, results):
            if index == 0:
                for _ in range(warmup):
                    ranker.rank(slate)
                forget = getattr(ranker, "forget_warmup", None)
                if forget is not None:  # a warm-up is no slate of the evaluation's counts
                    forget()
            out, latency_ms = _timed_rank(ranker, slate)
            if observe is not None:
                observe(ranker, slate, out)
            sm = slate_metrics(
                list(out.docids), docids, slate.clicked, slate.teacher, ks, slate.teacher_scores,
                mrr_ks=mrr_ks, missed=missed, judgements=slate.relevance, rel=rel,
            )
            res.records.append(
                SlateRecord(
                    index=index,
                    qid=slate.query.qid,
                    latency_ms=latency_ms,
                    decode_passes=int(out.decode_passes),
                    metrics=sm,
                    timings=dict(out.timings),
                )
            )
    return Results(
        rankers=results, n_slates=n_slates, ks=ks, n_with_teacher=n_teacher, mrr_ks=mrr_ks,
        n_with_clicks=n_clicks, n_judged=n_judged, n_no_relevant=n_no_relevant, rel_level=rel,
    )


def ranker_list(names: Sequence[str], shown: int = 4) -> str:
    """``popularity, cooccurrence, spd`` (the first ``shown``, then how many more): which
    rankers a progress line is about, short enough for one line."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _timed_rank(ranker: Ranker, slate: Slate) -> tuple[Ranking, float]:
    """``ranker.rank(slate)`` and its wall-clock milliseconds, cyclic GC paused meanwhile.

    A ranking that carries ``recorded_ms`` (measured where the work was done, e.g. by a
    replayed teacher's run) reports that time instead: the lookup is not what a user would
    wait for.

    As :mod:`timeit` does: a collection made due by reading and scoring *other* slates would
    otherwise land on whichever ranker happens to run next, and a collection can take longer
    than a fast ranker's whole call. Reference counting still frees memory; collections resume right after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = ranker.rank(slate)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        return out, elapsed_ms if out.recorded_ms is None else float(out.recorded_ms)
    finally:
        if was_enabled:
            gc.enable()


def shown_metrics(results: Results) -> list[str]:
    """The metrics :func:`format_table` shows, in its order: the click metrics when some slate
    has clicks (or none is judged), the judged ones when some slate is judged, the teacher
    metrics when some slate has a teacher ranking. ``spdrank eval --reference`` pairs these."""
    names = metric_names(
        results.ks, results.mrr_ks, rel=results.rel_level if results.n_judged else None,
        clicks=bool(results.n_with_clicks) or not results.n_judged,
    )
    if not results.n_with_teacher:
        names = [m for m in names if m not in TEACHER_METRICS]
    return names


def format_table(results: Results) -> str:
    """A fixed-width table a person can read: one row per ranker, means over slates.

    Teacher columns (:data:`~spdrank.eval.metrics.TEACHER_METRICS`) appear only when some slate
    has a teacher ranking. A footer says over how many slates the click and teacher metrics
    were averaged when that differs from the number of slates; tau has its own count, since
    a slate whose teacher scored every candidate alike orders no pair.
    """
    names = shown_metrics(results)
    width = max([6, *(len(r.name) for r in results.rankers)])
    head = (
        f"{'ranker':<{width}} {'n':>6} {'valid%':>6} "
        + " ".join(f"{m:>7}" for m in names)
        + f" {'passes':>6} {'p50 ms':>9} {'p95 ms':>9}"
    )
    lines = [head, "-" * len(head)]
    counted: list[list[tuple[str, int, int]]] = []
    for r in results.rankers:
        d = r.to_dict()
        cells = []
        for m in names:
            mean = d["metrics"].get(m, {}).get("mean")
            cells.append(f"{mean:>7.4f}" if mean is not None else f"{'-':>7}")
        lat = d["latency_ms"]
        lines.append(
            f"{r.name:<{width}} {r.n:>6d} {_num(d['valid_pct'], 6, 1)} "
            + " ".join(cells)
            + f" {_num(d['decode_passes_mean'], 6, 2)} {_num(lat['median'], 9, 3)}"
            f" {_num(lat['p95'], 9, 3)}"
        )
        counted.append(_short_counts(r.n, d["metrics"], names))
    notes = _count_notes([r.name for r in results.rankers], counted)
    if results.n_judged and results.n_judged < results.n_slates:
        notes.append(f"judged metrics over the {results.n_judged} of {results.n_slates} slates "
                     "with relevance judgements")
    if results.n_no_relevant:
        notes.append(
            f"{results.n_no_relevant} judged slates have no document of grade >= "
            f"{results.rel_level}: they score 0 on every judged metric, as in trec_eval"
        )
    lines.extend(notes)
    return "\n".join(lines)


def _short_counts(
    n: int, metrics: dict[str, dict[str, Any]], shown: Sequence[str]
) -> list[tuple[str, int, int]]:
    """``(group, slates, of n)`` for each metric group averaged over fewer than all ``n``."""
    tau, top1 = TEACHER_METRICS[:2]
    groups = [("click metrics", "AUC"), ("teacher metrics", top1)]
    if metrics.get(tau, {}).get("n") != metrics.get(top1, {}).get("n"):
        groups.append(("tau", tau))  # a teacher that ties every candidate orders no pair
    out = []
    for group, metric in groups:
        n_m = metrics.get(metric, {}).get("n")
        if metric in shown and n_m is not None and n_m != n:
            out.append((group, n_m, n))
    return out


def _count_notes(names: Sequence[str], counted: Sequence[list[tuple[str, int, int]]]) -> list[str]:
    """Footer lines for the short counts: one line for a count every ranker shares (the
    slates' own, e.g. those whose teacher orders no pair), else one a ranker."""
    notes = []
    groups = dict.fromkeys(group for each in counted for group, _, _ in each)
    for group in groups:
        per = [next(((m, n) for g, m, n in each if g == group), None) for each in counted]
        if len(names) > 1 and None not in per and len(set(per)) == 1:
            n_m, n = per[0]
            notes.append(f"{group} over {n_m} of {n} slates (every ranker)")
            continue
        notes.extend(
            f"{name}: {group} over {c[0]} of {c[1]} slates"
            for name, c in zip(names, per) if c is not None
        )
    return notes


def _num(v: float | None, width: int, digits: int) -> str:
    return f"{v:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def write_per_slate(results: Results, path: str | os.PathLike[str]) -> int:
    """Write :meth:`Results.per_slate_rows` as JSONL, atomically; returns the row count."""
    n = 0
    with atomic_writer(path) as fh:
        for row in results.per_slate_rows():
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
            n += 1
    return n
