"""Is a reranker below the first stage it was given? One metric, one line.

A reranker is only worth deploying when it ranks better than the order its first stage
handed it (BM25's, a dense retriever's): a student that undoes its retriever makes search
worse, and a table of absolute numbers does not say so. ``spdrank train`` (on its validation
slates) and ``spdrank eval`` (beside its table) judge every student against that order on one
metric, chosen by what the slates hold, and say in one line when the student falls below it.

The metric: judged nDCG@10 (the field's measure) when the slates carry graded judgements;
else Kendall's tau with the teacher, the fidelity a distilled student is trained for; else
NDCG@10 against the clicks (first, for a student trained on clicks); else none, and nothing
is said.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate
from spdrank.eval.evaluate import Results
from spdrank.eval.metrics import TEACHER_METRICS
from spdrank.eval.paired import difference_of

#: The rows that stand for the first stage in ``spdrank eval``, the first found taken: the
#: first stage's scores (``--ranker retriever``), else the order the candidates were given in.
FIRST_STAGE = ("retriever", "order")
#: The cut-off of the judged metric, the one TREC's deep-learning tracks report.
JUDGED_CUTOFF = 10
#: The metric against clicks that judges a student with neither judgements nor a teacher,
#: or one trained on clicks: the next item's NDCG@10, as sequential recommenders report it.
CLICK_METRIC = "NDCG@10"


class GivenOrder:
    """The candidates in the order the slate lists them: the first stage's order for search
    slates and rerank requests, whether or not their candidates carry its scores."""

    name = FIRST_STAGE[1]
    needs_train = False

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn."""

    def rank(self, slate: Slate) -> Ranking:
        return Ranking(docids=slate.docids)


def selection_metric(available: Iterable[str], clicks_first: bool = False) -> str | None:
    """The metric a student is judged by, among the names ``available`` defined on the
    slates: ``nDCG@10`` (else the judged nDCG at the smallest cut-off above 10, else the
    largest below), else the teacher's ``tau``, else NDCG@10 against the clicks; None when
    none is there. ``clicks_first``: a student trained on clicks is judged by them before the
    teacher, since they are what it learned to predict."""
    names = set(available)
    judged = sorted(
        (int(name.split("@", 1)[1]) for name in names
         if name.startswith("nDCG@") and name.split("@", 1)[1].isdigit()),
        key=lambda k: (k < JUDGED_CUTOFF, abs(k - JUDGED_CUTOFF)),
    )
    if judged:
        return f"nDCG@{judged[0]}"
    tau = TEACHER_METRICS[0]
    order = (CLICK_METRIC, tau) if clicks_first else (tau, CLICK_METRIC)
    return next((name for name in order if name in names), None)


#: How a verdict names the ranker it compares a student with, unless told another.
FIRST_STAGE_WORDS = "the first stage's order"


@dataclass(frozen=True)
class Verdict:
    """A student's figure beside another ranker's (the first stage's, or any input the student
    reads), on one metric over the same slates."""

    name: str
    metric: str
    value: float
    first_stage: float
    slates: int
    #: The paired 95% interval of ``value - first_stage``, when one could be computed.
    interval: tuple[float, float] | None = None
    #: The ranker compared with, as the line names it.
    against: str = FIRST_STAGE_WORDS

    @property
    def below(self) -> bool:
        return self.value < self.first_stage

    def line(self) -> str:
        """The one line that says where the student stands against the other ranker."""
        where = "below" if self.below else "not below"
        diff = self.value - self.first_stage
        spread = "" if self.interval is None else \
            f" [{self.interval[0]:+.3f}, {self.interval[1]:+.3f}]"
        return (
            f"{self.name} ranks {where} {self.against} on these {self.slates} slates: "
            f"{self.metric} {self.value:.3f} against {self.first_stage:.3f} "
            f"({diff:+.3f}{spread})"
        )


def verdict(
    name: str, metric: str, student: Sequence[float | None], first_stage: Sequence[float | None],
    against: str = FIRST_STAGE_WORDS,
) -> Verdict | None:
    """The verdict from per-slate values of the student and of the other ranker (the first
    stage by default, else named by ``against``; aligned, None where a slate does not define
    the metric), with the paired bootstrap interval of the difference; None when no slate
    defines the metric for both."""
    pairs = [(s, f) for s, f in zip(student, first_stage) if s is not None and f is not None]
    if not pairs:
        return None
    values = np.asarray(pairs, dtype=np.float64)
    diff = difference_of(values[:, 0] - values[:, 1])
    interval = None if diff.low is None or diff.high is None else (diff.low, diff.high)
    return Verdict(name, metric, float(values[:, 0].mean()), float(values[:, 1].mean()),
                   len(pairs), interval, against)


def input_verdicts(results: Results, student: str, inputs: Sequence[str]) -> list[Verdict]:
    """The verdict of the row ``student`` against each row named in ``inputs`` (the rankers
    it reads: ``feature:NAME`` rows) that the evaluation holds, on the metric that judges it
    (:func:`selection_metric` of what its row defines), each named by the input's row."""
    names = {r.name for r in results.rankers}
    metric = selection_metric(k for k, s in results[student].summary().items() if s.n)
    if metric is None:
        return []
    mine = [r.metrics.values.get(metric) for r in results[student].records]
    out = []
    for name in inputs:
        if name not in names or name == student:
            continue
        other = {rec.index: rec.metrics.values.get(metric) for rec in results[name].records}
        found = verdict(student, metric, mine,
                        [other.get(r.index) for r in results[student].records], against=name)
        if found is not None:
            out.append(found)
    return out


def results_verdicts(results: Results, students: Sequence[str]) -> list[Verdict]:
    """The verdict of each ranker named in ``students`` against the first stage's row of one
    evaluation (:data:`FIRST_STAGE`; its slates paired by index); none without such a row or
    a metric."""
    names = [r.name for r in results.rankers]
    found = [name for name in FIRST_STAGE if name in names]
    if not found:
        return []
    reference = results[found[0]]
    metric = selection_metric(k for k, s in reference.summary().items() if s.n)
    if metric is None:
        return []
    first = {rec.index: rec.metrics.values.get(metric) for rec in reference.records}
    out = []
    for name in students:
        records = results[name].records
        found = verdict(name, metric, [r.metrics.values.get(metric) for r in records],
                        [first.get(r.index) for r in records])
        if found is not None:
            out.append(found)
    return out
