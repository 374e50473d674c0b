"""A weighted sum of the features a student reads, searched on the slates that choose it.

The strongest ranker a student reads is often not one feature but a blend of them: a
recommender's SASRec score ranks better with a little popularity and co-occurrence beside it,
a dense cosine with a little of BM25's score (the search fusion teams tune by hand). A
student anchored to the best single feature spends its first epochs learning that blend from
clicks, and a student whose text-reading weights are noisy (a frozen LLM's states on few
clicks) may end below the blend it could have started from. So ``--anchor best`` also tries
weighted sums of the z-scored features (the anchor :mod:`spdrank.methods.anchor` computes
as ``feature:1*sasrec+0.25*popularity``) and starts from the best one.

The search is coordinate ascent over a coarse grid of weights relative to the best single
feature's 1: for each other feature in turn, the weight among :data:`BLEND_WEIGHTS` (0
included: left out) that ranks the choosing slates best is kept, for :data:`BLEND_PASSES`
passes. A weight is taken only when it ranks strictly better than the blend without it, so
a feature that adds nothing stays out, and a blend is chosen only when it beats the single
feature. Coarse on purpose: a handful of weights fitted on the validation slates that also
choose the student's epoch overfit them little, and the prior fixes only an order, which a
few ratios decide.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdrank.core.features import FeatureNormalizer
from spdrank.core.slates import Slate
from spdrank.methods.anchor_spec import AnchorSpec
from spdrank.training.inputs import mean_of, per_slate

#: The weights a feature may take in a blend, relative to the best single feature's 1.
BLEND_WEIGHTS = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0)
#: How many times the search goes over the features.
BLEND_PASSES = 2


def blend_rankings(slates: Sequence[Slate], normalised: Sequence[np.ndarray],
                   weights: np.ndarray) -> list[list[str]]:
    """Each slate's docids ranked by the weighted sum of its normalised features, highest
    first, equal sums in the order listed (the anchor's stable order)."""
    rankings = []
    for slate, features in zip(slates, normalised, strict=True):
        order = np.argsort(-(features.astype(np.float64) @ weights), kind="stable")
        rankings.append([slate.docids[i] for i in order])
    return rankings


def best_blend(slates: Sequence[Slate], normalizer: FeatureNormalizer, start: str,
               metric: str) -> tuple[AnchorSpec, float | None]:
    """The blend of ``normalizer``'s features that ranks ``slates`` best by ``metric``,
    searched from the feature ``start`` at weight 1, and its mean ``metric``; ``start``
    alone when no blend ranks them better."""
    names = normalizer.names
    normalised = [normalizer(slate) for slate in slates]
    weights = np.zeros(len(names))
    weights[names.index(start)] = 1.0

    def figure(w: np.ndarray) -> float | None:
        return mean_of(per_slate(slates, blend_rankings(slates, normalised, w), metric))

    best = figure(weights)
    if best is None:
        return AnchorSpec("feature", ((start, 1.0),)), None
    others = [j for j, name in enumerate(names) if name != start]
    for _ in range(BLEND_PASSES):
        moved = False
        for j in others:
            for weight in BLEND_WEIGHTS:
                if weight == weights[j]:
                    continue
                trial = weights.copy()
                trial[j] = weight
                value = figure(trial)
                if value is not None and value > best:
                    best, weights, moved = value, trial, True
        if not moved:
            break
    blend = tuple((name, float(weights[j])) for j, name in enumerate(names) if weights[j])
    ordered = tuple(sorted(blend, key=lambda pair: pair[0] != start))  # the start first
    return AnchorSpec("feature", ordered), best
