"""Upstream features a model reads next to the LLM's hidden states: names and normalisation.

A slate's candidates may carry ``features: {name: number}`` (and ``score``, read as the
feature named ``score``). A model trained with ``--features a,b`` reads those values, as one
small vector per candidate, through its head; a candidate lacking one (``score`` left out or
null too) is refused, at training and at inference alike.

Normalisation is a z-score per feature, ``(x - mean) / std``, with the mean and standard
deviation of that feature over every candidate of the training slates. It is fitted once,
stored in the checkpoint's ``config.json`` and applied unchanged at inference, so ``spdrank
rank``, ``eval`` and ``serve`` see exactly what training saw. A z-score needs no knowledge of a
feature's scale (retriever scores, counts, probabilities all arrive on their own), and keeps
every input near unit size, which the head's learning rate assumes. Heavy-tailed signals are
best sent already log-scaled (the Beauty builder writes ``log1p`` counts); a feature with one
value on every training candidate carries no signal and is refused rather than divided by 0.

This module needs numpy only (no torch), so the training config can fit it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spdrank.core.slates import SCORE_FEATURE, Slate, SlateError

#: The title-similarity feature's name, as it appears in a candidate's ``features``
#: (:mod:`spdrank.datasets.title_similarity` computes it; a baseline ranks by it).
TITLE_SIMILARITY = "title_similarity"

#: The most standard deviations from its training mean a normalised feature may lie. No
#: training value can exceed it (in a sample of n values none lies more than sqrt(n) standard
#: deviations from their mean: 1e6 would take 1e12 training candidates), and it stays far
#: below where the head's float32 arithmetic overflows (squares past about 1.8e19).
MAX_ABS_Z = 1e6


def parse_feature_names(text: str) -> tuple[str, ...]:
    """``"score,popularity"`` -> ``("score", "popularity")``; empty or repeated names are errors."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise ValueError(f"--features {text!r}: feature names are comma-separated and non-empty")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--features {text!r} names {', '.join(repeated)} more than once")
    return names


def raw_features(
    slate: Slate, names: Sequence[str], reader: str = "this model reads",
    unscored: float | None = None,
) -> np.ndarray:
    """The candidates' values of ``names``, unnormalised, as float64 [n, len(names)].

    A candidate without one of them is an error naming the slate's qid, the candidate, the
    feature and who reads it (``reader``), since a ranker that silently read a default would
    rank on a value nobody sent. ``unscored``: the value read as ``score`` for a candidate
    whose score was not given, for a reader that means the first stage's order by it (equal
    values keep the listed order); None, a model's reading, refuses it as a missing feature.
    """
    out = np.empty((len(slate), len(names)), dtype=np.float64)
    for i, cand in enumerate(slate.candidates):
        for j, name in enumerate(names):
            value = cand.feature(name)
            if value is None and name == SCORE_FEATURE:
                value = unscored
            if value is None:
                have = sorted(cand.features or ())
                blank = " (its 'score' is left out or null)" if name == SCORE_FEATURE else ""
                raise SlateError(
                    f"slate {slate.query.qid!r}: candidates[{i}] (docid {cand.docid!r}) has no "
                    f"feature {name!r}{blank}, which {reader} (features: {', '.join(names)}); "
                    f"it has {', '.join(have) or 'none'}"
                )
            out[i, j] = value
    if not np.isfinite(out).all():  # only 'score' can get here unchecked
        i, j = map(int, np.argwhere(~np.isfinite(out))[0])
        raise SlateError(
            f"slate {slate.query.qid!r}: candidates[{i}] (docid {slate.candidates[i].docid!r}) "
            f"has a non-finite {names[j]!r}: {out[i, j]}"
        )
    return out


@dataclass(frozen=True)
class FeatureNormalizer:
    """The features a model reads, in order, and the z-score fitted on its training slates."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: Training candidates the moments were fitted on (0: not recorded, an older checkpoint).
    count: int = 0

    def __post_init__(self) -> None:
        if not self.names or not len(self.names) == len(self.mean) == len(self.std):
            raise ValueError("a feature normalizer needs one mean and one std per feature name")
        if not all(s > 0 for s in self.std):
            raise ValueError(f"feature standard deviations must be positive, got {self.std}")

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def fit(cls, names: Sequence[str], slates: Iterable[Slate]) -> FeatureNormalizer:
        """Mean and std of each feature over every candidate of ``slates`` (read as a stream).

        Per-slate moments are merged with Chan et al.'s parallel update, stable for large
        counts and large means alike.
        """
        names = tuple(names)
        count = 0
        mean = np.zeros(len(names))
        m2 = np.zeros(len(names))  # sum of squared deviations from the mean
        for slate in slates:
            values = raw_features(slate, names)
            n = len(values)
            with np.errstate(over="ignore", invalid="ignore"):
                batch_mean = values.mean(axis=0)
                delta = batch_mean - mean
                total = count + n
                mean = mean + delta * (n / total)
                m2 = m2 + ((values - batch_mean) ** 2).sum(axis=0) + delta**2 * (count * n / total)
            count = total
            overflow = [j for j, v in enumerate(m2) if not np.isfinite(v)]
            if overflow:
                j = overflow[0]
                raise SlateError(
                    f"slate {slate.query.qid!r}: feature {names[j]!r} spreads past what float64 "
                    f"holds squared (values up to {np.abs(values[:, j]).max():.3g}): send "
                    "heavy-tailed signals log-scaled"
                )
        if count == 0:
            raise ValueError("no training slates to fit the feature normalisation on")
        std = np.sqrt(m2 / count)
        constant = [n for n, s, m in zip(names, std, mean) if s <= 1e-12 * max(1.0, abs(m))]
        if constant:
            raise ValueError(
                f"feature(s) {', '.join(constant)} take one value on every training candidate: "
                "they carry no signal (do the slates hold them?)"
            )
        return cls(names, tuple(float(m) for m in mean), tuple(float(s) for s in std), count)

    def __call__(self, slate: Slate) -> np.ndarray:
        """The slate's normalised features, float32 [n, len(names)].

        A value finite as sent can still be one the head cannot compute with: its LayerNorms
        square their inputs in float32, so a normalised value near 1e19 (``1e20`` against a
        std of 0.5) turns the score matrix into NaN. That is the input's fault, not the
        model's, so a value more than :data:`MAX_ABS_Z` standard deviations from the training
        mean is refused here, naming the candidate, before the model sees it.
        """
        raw = raw_features(slate, self.names)
        with np.errstate(over="ignore", invalid="ignore"):
            z = (raw - np.array(self.mean)) / np.array(self.std)
        if not (np.abs(z) <= MAX_ABS_Z).all():  # NaN (inf - inf) fails the test too
            i, j = map(int, np.argwhere(~(np.abs(z) <= MAX_ABS_Z))[0])
            raise SlateError(
                f"slate {slate.query.qid!r}: candidates[{i}] (docid "
                f"{slate.candidates[i].docid!r}) has {self.names[j]!r} = {raw[i, j]:g}, beyond "
                f"what this model can represent: {z[i, j]:.3g} standard deviations from its "
                f"training mean {self.mean[j]:g} (std {self.std[j]:g}), where the model reads "
                f"at most {MAX_ABS_Z:g} (send heavy-tailed signals log-scaled)"
            )
        return z.astype(np.float32)

    @property
    def training_bound(self) -> float | None:
        """How many standard deviations from the mean a training value can lie at most:
        sqrt(n - 1) over n values (Samuelson's inequality); None when n is not recorded."""
        return math.sqrt(self.count - 1) if self.count > 1 else None

    def to_dict(self) -> dict[str, Any]:
        out = {"names": list(self.names), "mean": list(self.mean), "std": list(self.std)}
        return out | ({"count": self.count} if self.count else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureNormalizer:
        return cls(tuple(data["names"]), tuple(data["mean"]), tuple(data["std"]),
                   int(data.get("count", 0)))


class FeatureDrift:
    """Slates whose features lie where no training value could: further from the training
    mean than :attr:`FeatureNormalizer.training_bound`, which the model was never shown. A
    feature computed otherwise than in training (raw counts where training had ``log1p``,
    another scale, another first stage) ranks without an error; this counts it, for the one
    line a command prints after ranking."""

    def __init__(self) -> None:
        self.slates = self.beyond = 0
        self.example: str | None = None

    def add(self, normalizer: FeatureNormalizer | None, z: np.ndarray | None, slate: Slate,
            where: str | None) -> None:
        if normalizer is None or z is None or normalizer.training_bound is None:
            return
        bound = normalizer.training_bound
        self.slates += 1
        outside = np.abs(z) > bound
        if not outside.any():
            return
        self.beyond += 1
        if self.example is None:
            i, j = map(int, np.argwhere(outside)[0])
            value = slate.candidates[i].feature(normalizer.names[j])
            self.example = (f"{normalizer.names[j]} = {value:g} at {where or slate.query.qid}, "
                            f"{abs(float(z[i, j])):.0f} standard deviations from its training "
                            f"mean, where no training value lies beyond {bound:.0f}")

    def summary(self) -> str | None:
        """The line to print, or None when every slate's features lie where training's did."""
        if not self.beyond:
            return None
        return (f"features beyond every training value on {self.beyond:,} of {self.slates:,} "
                f"slates (e.g. {self.example}): are they computed as in training (the same "
                "scale, log1p where it was)?")
