"""``fusion:best:A+B[+C[+D]]``: a fusion whose method and weights are chosen on validation slates.

A fixed fusion can rank below its best component: reciprocal-rank fusion gives a weak
component as much say as a strong one, and a student distilled from such a teacher learns
the weaker order. Which fusion helps depends on the components and the data, so it is
measured rather than assumed: every candidate below ranks the validation slates, and the one
with the best mean is kept.

The candidates, for N components (two to :data:`MAX_COMPONENTS`):

- each component alone (a fusion never has to be worse on validation than its best part);
- ``rrf`` with k 60 and 10 (:data:`RRF_KS`), ``zscore`` and ``minmax``, each with the weights
  of a simplex grid (steps of 0.1 for two components, 0.25 for three or four; a grid point
  whose weights leave a component out fuses the rest) and equal weights over every subset of
  two or more components. That is at most 38 candidates for two components, 55 for three and
  144 for four. ``zscore`` and ``minmax`` read scores, so a component that gives none (an
  LLM's label file) enters only the ``rrf`` candidates.

What judges them: graded ``relevance`` (judged nDCG@10, :mod:`spdrank.eval.judged`, over the
slates that carry it), else clicks (NDCG@10 over ``clicked``, :mod:`spdrank.eval.metrics`,
over the slates where a ranking can matter), else nothing, and the choice is refused. Equal
means are decided for the simpler candidate: fewer components, then equal weights, then
``rrf`` with k 60, ``rrf`` with k 10, ``zscore``, ``minmax``, then the weights nearest to
equal, then the order the spec names the components in.

Each candidate is written as the plain spec that reproduces it (a component's own name, or a
``fusion:...`` spec whose weights are read from that very text), so the chosen one can be
reused as it is (``--ranker``, ``--backend ranker:``) and ranks every slate as it did here:
the candidates' scores are summed in the order and arithmetic of
:class:`~spdrank.rankers.fusion.FusionRanker`, and the chosen ranker is that fusion, or the
component alone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spdrank.core.progress import track
from spdrank.core.ranking import Ranker, Ranking
from spdrank.core.slates import Slate, SlateError, clicked_not_retrieved
from spdrank.eval import judged, metrics
from spdrank.rankers.fusion import (
    BEST,
    FUSION_PREFIX,
    RRF_K,
    SYNTAX,
    FusionRanker,
    checked_ranking,
    component_values,
    parse_components,
    parse_fusion,
)

#: ``fusion:best:...`` names a :class:`ChosenFusion`.
BEST_PREFIX = f"{FUSION_PREFIX}{BEST}:"
#: More components would grow the grid past what a validation pass should rank.
MAX_COMPONENTS = 4
#: Grid steps per unit of weight, by the number of components.
GRID_STEPS = {2: 10, 3: 4, 4: 4}
#: RRF's ``k`` values tried: the field's 60, and 10, which gives the top ranks more say.
RRF_KS = (RRF_K, 10.0)
#: The cut-off of the nDCG that judges the candidates.
CUTOFF = 10
#: The candidates a printed choice shows (each component alone is shown besides).
SHOWN = 15


def is_chosen(name: str) -> bool:
    """Whether ``name`` asks for a fusion chosen on validation slates."""
    return name.startswith(BEST_PREFIX)


def parse_choice(spec: str) -> tuple[str, ...]:
    """The component names of a ``fusion:best:...`` spec; ``ValueError`` saying what is wrong."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{spec!r}: {why} (syntax: {SYNTAX})")

    if not is_chosen(spec):
        raise bad(f"a chosen fusion starts with {BEST_PREFIX!r}")
    components = parse_components(spec[len(BEST_PREFIX):], bad)
    weighted = [name for name, w in components if w != 1.0]
    if weighted:
        raise bad(f"{weighted[0]!r} is weighted, and {BEST_PREFIX}... chooses the weights: "
                  "name each component unweighted")
    if len(components) > MAX_COMPONENTS:
        raise bad(f"at most {MAX_COMPONENTS} components (the candidates grow with each)")
    return tuple(name for name, _ in components)


@dataclass(frozen=True)
class Candidate:
    """One way to rank: ``spec`` the plain spec that reproduces it; ``method`` None for a
    component alone; ``weights`` one per component of the ``fusion:best`` spec (0: left out),
    as ``spec`` reads them; ``simplicity`` the key that decides equal means (lower: simpler)."""

    spec: str
    method: str | None
    k: float
    weights: tuple[float, ...]
    simplicity: tuple[float, ...]


def _method_text(method: str, k: float) -> str:
    if method == "rrf" and k != RRF_K:
        return f"{FUSION_PREFIX}rrf={k:g}:"
    return f"{FUSION_PREFIX}{method}:"


def _weight_vectors(n: int) -> list[tuple[float, ...]]:
    """The grid's points with two or more weights above 0, then equal weights over every
    subset of two or more components; each direction once (weights that differ by a factor
    rank alike), the grid's own spelling first."""
    steps = GRID_STEPS[n]
    vectors = [tuple(c / steps for c in counts)
               for counts in itertools.product(range(steps + 1), repeat=n)
               if sum(counts) == steps and sum(1 for c in counts if c) >= 2]
    for size in range(2, n + 1):
        for subset in itertools.combinations(range(n), size):
            vectors.append(tuple(1.0 if i in subset else 0.0 for i in range(n)))
    seen: set[tuple[float, ...]] = set()
    out = []
    for vector in vectors:
        total = sum(vector)
        direction = tuple(round(w / total, 9) for w in vector)
        if direction not in seen:
            seen.add(direction)
            out.append(vector)
    return out


def candidates(names: Sequence[str], scoreless: Iterable[int] = ()) -> list[Candidate]:
    """Every candidate of a ``fusion:best`` over ``names`` (see the module's docstring);
    ``scoreless``: the indices of components that give no scores, left out of ``zscore`` and
    ``minmax``."""
    n = len(names)
    if n not in GRID_STEPS:
        raise ValueError(f"a chosen fusion fuses 2 to {MAX_COMPONENTS} components, not {n}")
    scoreless = set(scoreless)
    out = [Candidate(name, None, RRF_K, tuple(float(i == j) for j in range(n)),
                     (1, 0, 0, 0.0, i)) for i, name in enumerate(names)]
    variants = [("rrf", k) for k in RRF_KS] + [("zscore", RRF_K), ("minmax", RRF_K)]
    for index, vector in enumerate(_weight_vectors(n)):
        used = [i for i, w in enumerate(vector) if w]
        equal = len({vector[i] for i in used}) == 1
        total = sum(vector)
        spread = math.fsum(abs(vector[i] / total - 1 / len(used)) for i in used)
        parts = [names[i] if equal else f"{vector[i]:g}*{names[i]}" for i in used]
        for order, (method, k) in enumerate(variants):
            if method != "rrf" and scoreless & set(used):
                continue
            spec = _method_text(method, k) + "+".join(parts)
            read = dict(parse_fusion(spec).components)  # the weights as the text reads them
            weights = tuple(read.get(name, 0.0) if i in used else 0.0
                            for i, name in enumerate(names))
            out.append(Candidate(spec, method, k, weights,
                                 (len(used), 0 if equal else 1, order, spread, index)))
    return out


@dataclass(frozen=True)
class Scored:
    """A candidate's mean over the validation slates."""

    spec: str
    score: float
    alone: bool


@dataclass
class Choice:
    """What a ``fusion:best`` chose: ``spec`` (plain, reusable) for ``asked``, its mean
    ``metric`` over ``slates`` validation slates of ``source``, and every candidate's mean,
    best first (equal means: simpler first)."""

    asked: str
    spec: str
    metric: str
    score: float
    slates: int
    source: str
    candidates: list[Scored] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The choice without its candidates: what each label record carries."""
        return {"from": self.asked, "spec": self.spec, "metric": self.metric,
                "score": self.score, "slates": self.slates, "on": self.source}

    def to_dict(self) -> dict[str, Any]:
        return {**self.record(),
                "candidates": [{"spec": c.spec, "score": c.score} for c in self.candidates]}


def format_choice(choice: Choice, shown: int = SHOWN) -> str:
    """The choice in a few lines: what was chosen, then the best ``shown`` candidates and each
    component alone, best first, and how many more were tried."""
    head = (f"{choice.asked}: chose {choice.spec}, {choice.metric} {choice.score:.4f} over "
            f"{choice.slates} slates of {choice.source} ({len(choice.candidates)} candidates)")
    lines = [head, f"  {choice.metric:>9}  candidate"]
    hidden = []
    for i, c in enumerate(choice.candidates):
        if i < shown or c.alone:
            note = "  (chosen)" if i == 0 else "  (alone)" if c.alone else ""
            lines.append(f"  {c.score:>9.4f}  {c.spec}{note}")
        else:
            hidden.append(c.score)
    if hidden:
        lines.append(f"  ... {len(hidden)} more, from {max(hidden):.4f} down to "
                     f"{min(hidden):.4f}")
    return "\n".join(lines)


def _judge(slates: Sequence[Slate], source: str, asked: str) -> str:
    """``relevance`` or ``clicks``: what the validation slates are judged by."""
    if any(s.relevance is not None for s in slates):
        return "relevance"
    if any(s.clicked for s in slates):
        return "clicks"
    raise ValueError(
        f"{asked}: none of the {len(slates)} slates of {source} carries graded 'relevance' or "
        "'clicked', so there is nothing to choose by; judge them (`spdrank data search "
        "--qrels`), or choose on synthetic queries (`spdrank data queries`, whose slates carry "
        "their source passage as relevance)"
    )


def _slate_value(order: Sequence[str], slate: Slate, judge: str) -> float | None:
    """A ranking's nDCG@10 on one slate: judged, or over its clicks; None where the slate
    does not count (unjudged, or clicks no ranking can get right or wrong)."""
    if judge == "relevance":
        if slate.relevance is None:
            return None
        return judged.ndcg_at_k(order, slate.relevance, CUTOFF)
    docids = slate.docids
    shown = set(slate.clicked or ()) & set(docids)
    positives = shown | (set(clicked_not_retrieved(slate)) - set(docids))
    if not positives or len(shown) == len(docids):
        return None
    return metrics.ndcg_at_k(order, positives, CUTOFF)


class ChosenFusion:
    """A ``fusion:best:...`` ranker: :meth:`choose` on validation slates first, then it ranks
    as the chosen candidate does (see the module's docstring).

    ``components``: the rankers, built, in the spec's order; ``choose_on``: the validation
    slates' file, which the commands read for :meth:`choose`.
    """

    def __init__(self, spec: str, components: Sequence[Ranker],
                 choose_on: Path | None = None) -> None:
        self.names = parse_choice(spec)
        if len(components) != len(self.names):
            raise ValueError("one built ranker a component of the spec")
        self.name = spec
        self.components = list(components)
        self.choose_on = choose_on
        self.choice: Choice | None = None
        self.chosen: Ranker | None = None
        self.needs_train = any(getattr(r, "needs_train", False) for r in self.components)
        self.needs_history = any(getattr(r, "needs_history", False) for r in self.components)

    @property
    def ranks_by_scores(self) -> bool:
        """Whether the chosen ranker orders by its scores alone (a fusion does)."""
        return self.chosen is None or bool(getattr(self.chosen, "ranks_by_scores", False))

    def fit(self, train: Iterable[Slate]) -> None:
        """Fit the components that learn from training slates (held in memory when several
        need them), before they are chosen among."""
        needing = [r for r in self.components if getattr(r, "needs_train", False)]
        slates = list(train) if len(needing) > 1 else train
        for ranker in needing:
            ranker.fit(slates)

    def choose(self, slates: Iterable[Slate], source: str,
               progress: bool | None = False) -> Choice:
        """Rank ``slates`` (validation, named ``source``) with every component once, score
        every candidate on them and keep the best; the :class:`Choice` is returned and kept."""
        slates = list(slates)
        judge = _judge(slates, source, self.name)
        counted = [s for s in slates if _slate_value(s.docids, s, judge) is not None]
        if not counted:
            raise ValueError(f"{self.name}: no slate of {source} has clicks a ranking can get "
                             "right or wrong (every candidate clicked, or none)")
        rankings: list[list[Ranking]] = []
        for slate in track(counted, f"choose {self.name}", unit="slate", mode=progress):
            rankings.append([checked_ranking(r, slate) for r in self.components])
        scoreless = {i for per_slate in rankings for i, r in enumerate(per_slate)
                     if r.scores is None}
        tried = candidates(self.names, scoreless)
        values: list[list[float]] = [[] for _ in tried]
        for slate, per_slate in zip(counted, rankings):
            docids = slate.docids
            cache: dict[tuple[str, float, int], np.ndarray] = {}
            for c, into in zip(tried, values):
                if c.method is None:
                    order = per_slate[c.weights.index(1.0)].docids
                else:
                    fused = np.zeros(len(docids))
                    for i, w in enumerate(c.weights):
                        if w:
                            key = (c.method, c.k, i)
                            if key not in cache:
                                cache[key] = np.asarray(component_values(
                                    self.components[i], per_slate[i], docids, c.method, c.k,
                                    self.name), dtype=np.float64)
                            fused += w * cache[key]  # FusionRanker's sum, term by term
                    order = [docids[j] for j in np.argsort(-fused, kind="stable")]
                value = _slate_value(order, slate, judge)
                if value is None:  # counted slates always score
                    raise SlateError(f"slate {slate.query.qid!r}: no value to choose by")
                into.append(value)
        means = [math.fsum(v) / len(v) for v in values]
        ranked = sorted(range(len(tried)), key=lambda j: (-means[j], tried[j].simplicity))
        best = tried[ranked[0]]
        self.chosen = self._build(best)
        self.choice = Choice(
            asked=self.name, spec=best.spec,
            metric=f"nDCG@{CUTOFF}" if judge == "relevance" else f"NDCG@{CUTOFF} (clicks)",
            score=means[ranked[0]], slates=len(counted), source=source,
            candidates=[Scored(tried[j].spec, means[j], tried[j].method is None)
                        for j in ranked],
        )
        return self.choice

    def _build(self, best: Candidate) -> Ranker:
        """The chosen candidate as a ranker: the component alone, or the fusion its spec
        reads, over the components already built (and fitted)."""
        if best.method is None:
            return self.components[best.weights.index(1.0)]
        spec = parse_fusion(best.spec)
        used = [self.components[self.names.index(name)] for name, _ in spec.components]
        return FusionRanker(spec, used, name=best.spec)

    def rank(self, slate: Slate) -> Ranking:
        if self.chosen is None:
            raise RuntimeError(f"{self.name}: choose it on validation slates (--choose-on "
                               "FILE) before rank()")
        return self.chosen.rank(slate)
