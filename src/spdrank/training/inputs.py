"""The rankers a student reads, scored on the slates that choose it: what it must beat.

A student that reads upstream features reads rankers a team already runs: the order its
candidates arrive in (the first stage's) and each feature (BM25's score, a dense cosine,
SASRec's score). It is worth deploying only where it ranks better than the strongest of them,
so training scores each of them once on the slates it chooses by (held-out queries or users),
starts the student as the best one (``--anchor best``), and compares what it keeps with every
one of them, slate by slate, with the paired interval.

An input ranks a slate as ``spdrank eval`` would: ``order`` as the candidates are listed,
``feature:NAME`` by the feature's value, highest first, equal values in the order listed
(:class:`spdrank.rankers.baselines.FeatureRanker`'s rule, which the feature anchor's stable
sort follows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdrank.core.features import raw_features
from spdrank.core.slates import Slate
from spdrank.eval.metrics import SlateMetrics, slate_metrics
from spdrank.methods.anchor_spec import feature_anchor

#: The given order's name as an input and as an anchor.
ORDER = "order"


def input_names(features: Sequence[str]) -> list[str]:
    """The inputs of a student reading ``features``: the given order, then each feature as
    the anchor spec that starts from it (``feature:NAME``)."""
    return [ORDER, *(feature_anchor(name) for name in features)]


def input_ranking(slate: Slate, name: str) -> list[str]:
    """``slate``'s docids as the input ``name`` ranks them."""
    if name == ORDER:
        return slate.docids
    feature = name.split(":", 1)[1]
    values = raw_features(slate, [feature], reader=f"the input {name}")[:, 0]
    order = sorted(range(len(values)), key=lambda i: -values[i])  # stable: ties as listed
    return [slate.docids[i] for i in order]


def slates_metrics(slates: Sequence[Slate], rankings: Sequence[Sequence[str]]
                   ) -> list[SlateMetrics]:
    """Every metric of one ranking a slate (docids best first) against what each slate holds:
    clicks or graded judgements, and the teacher's ranking when labelled."""
    return [
        slate_metrics(ranking, slate.docids, slate.clicked, slate.teacher,
                      teacher_scores=slate.teacher_scores, judgements=slate.relevance)
        for slate, ranking in zip(slates, rankings, strict=True)
    ]


def per_slate(slates: Sequence[Slate], rankings: Sequence[Sequence[str]], metric: str
              ) -> list[float | None]:
    """Each slate's value of ``metric`` for one ranking a slate (None where undefined)."""
    return [found.values.get(metric) for found in slates_metrics(slates, rankings)]


def mean_of(values: Sequence[float | None]) -> float | None:
    """The mean over the slates that define the metric; None when none does."""
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def score_inputs(slates: Sequence[Slate], names: Sequence[str], metric: str
                 ) -> dict[str, list[float | None]]:
    """Each input's per-slate ``metric`` on ``slates``, by name (:func:`input_names`)."""
    return {name: per_slate(slates, [input_ranking(s, name) for s in slates], metric)
            for name in names}
