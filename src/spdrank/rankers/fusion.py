"""``fusion:...``: several rankers' orders or scores of a slate combined into one ranking.

A teacher has to be better than what its student already reads, and at CPU scale no single
cheap ranker is: on TREC DL19 the first stage's BM25 reads nDCG@10 .506 and a bi-encoder .642,
and they err on different passages (one on vocabulary mismatch, the other on exact terms), so
their combination is the field's standard cheap improvement on either. Two ways are offered,
both over the candidates of one slate and nothing else:

- **reciprocal-rank fusion** (``rrf``; Cormack, Clarke & Büttcher 2009): a candidate's score is
  the sum over components of ``w / (k + r)``, ``r`` its 1-based rank in that component, ``k``
  60 by default (their value; larger ``k`` flattens the top's advantage). It reads ranks only,
  so components whose scores live on different scales (a cosine, a BM25 score, a log
  likelihood) need no calibration, and it is robust to one component's outliers.
- **normalised-score fusion** (``zscore`` or ``minmax``; CombSUM over normalised scores, Fox &
  Shaw 1994, Lee 1997): each component's scores are standardised over the slate (z-scores:
  mean 0, standard deviation 1; or min-max: onto [0, 1]) and summed with weights. Unlike RRF it
  keeps how far apart a component puts two candidates, which helps when one component is
  confident and the other is not. A component whose scores are all equal on a slate adds 0
  there: it cannot tell those candidates apart.

Ties are ties, deterministically. Within a component that orders by its scores alone
(``ranks_by_scores``), candidates with equal scores share the mean of the RRF terms of the
ranks they span, the expectation over the orders the tie allows, rather than terms the slate's
listing order would hand out; equal fused scores keep the slate's candidate order, and the
fused scores go along with the ranking, so a teacher records those ties as ties.

The spec's syntax (``spdrank eval --ranker``, ``spdrank teacher --backend ranker:...``) is
``fusion:[METHOD:]COMPONENT+COMPONENT[+...]``: METHOD ``rrf`` (the default; ``rrf=K`` sets
``k``), ``zscore`` or ``minmax``; a COMPONENT ``[WEIGHT*]NAME``, NAME any ranker a ``--ranker``
names (``dense``, ``slate_bm25``, ``retriever``, ``feature:NAME``, ...), ``run:PATH``, a TREC run,
or ``labels:PATH``, a teacher's label file (its repaired rankings, with its scores when it
recorded them; replayed by :mod:`spdrank.teacher.replay`, which the commands hand in).
This module parses specs and fuses; building the components by name is
:mod:`spdrank.rankers.baselines`'s, which owns the names. ``fusion:best:A+B[+...]``, a fusion
whose kind and weights are chosen on validation slates, is :mod:`spdrank.rankers.fusion_choice`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from spdrank.core.ranking import Ranker, Ranking
from spdrank.core.slates import Slate, SlateError

#: ``fusion:...`` names a :class:`FusionRanker`.
FUSION_PREFIX = "fusion:"
#: ``run:PATH`` names a TREC run as a fusion component.
RUN_PREFIX = "run:"
#: ``labels:PATH`` names a teacher's label file as a fusion component.
LABELS_PREFIX = "labels:"
#: The method word of ``fusion:best:...``, which :mod:`spdrank.rankers.fusion_choice` reads.
BEST = "best"
#: Cormack et al.'s constant, which the field has kept.
RRF_K = 60.0
METHODS = ("rrf", "zscore", "minmax")
#: The syntax, for help texts and errors.
SYNTAX = (
    "fusion:[METHOD:]COMPONENT+COMPONENT[+...] with METHOD rrf (reciprocal rank, the default, "
    "k=60; rrf=K sets k), zscore or minmax (normalised scores summed), COMPONENT "
    "[WEIGHT*]NAME with NAME a baseline's name, run:PATH (a TREC run) or labels:PATH (a "
    "teacher's label file), e.g. fusion:rrf:dense+retriever or "
    "fusion:zscore:dense+0.5*slate_bm25; fusion:best:A+B[+C[+D]] chooses the method and "
    "weights on validation slates (--choose-on FILE)"
)


@dataclass(frozen=True)
class FusionSpec:
    """What a ``fusion:...`` name asks for: a method, RRF's ``k``, weighted component names."""

    method: str
    components: tuple[tuple[str, float], ...]
    k: float = RRF_K


def parse_fusion(spec: str) -> FusionSpec:
    """A ``fusion:...`` spec read (see :data:`SYNTAX`); ``ValueError`` saying what is wrong."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{spec!r}: {why} (syntax: {SYNTAX})")

    if not spec.startswith(FUSION_PREFIX):
        raise bad(f"a fusion spec starts with {FUSION_PREFIX!r}")
    body = spec[len(FUSION_PREFIX) :]
    method, k = "rrf", RRF_K
    head, sep, tail = body.partition(":")
    if sep and head == BEST:
        raise bad(f"{FUSION_PREFIX}{BEST}:... is no fixed fusion: its method and weights are "
                  "chosen on validation slates (--choose-on FILE)")
    name, eq, value = head.partition("=")
    if sep and (name in METHODS):
        method, body = name, tail
        if eq:
            if name != "rrf":
                raise bad(f"only rrf takes a parameter (rrf=K), not {name}")
            try:
                k = float(value)
            except ValueError:
                raise bad(f"rrf's k must be a number, got {value!r}") from None
            if not math.isfinite(k) or k < 0:
                raise bad(f"rrf's k must be a finite number >= 0, got {value!r}")
    return FusionSpec(method, parse_components(body, bad), k)


def parse_components(body: str, bad: Callable[[str], ValueError]) -> tuple[tuple[str, float], ...]:
    """A spec's ``COMPONENT+COMPONENT[+...]`` read into ``(name, weight)`` pairs; ``bad`` makes
    the error that says what is wrong."""
    parts = body.split("+")
    if len(parts) < 2 or not all(parts):
        raise bad("it needs two or more components joined by '+', none empty")
    components: list[tuple[str, float]] = []
    for part in parts:
        weight, star, rest = part.partition("*")
        if star:
            try:
                w = float(weight)
            except ValueError:
                raise bad(f"{part!r}: a weight is a number before '*', got {weight!r}") from None
            if not math.isfinite(w) or w <= 0:
                raise bad(f"{part!r}: a weight must be a finite number > 0")
            part = rest
        else:
            w = 1.0
        if not part:
            raise bad("a component names no ranker")
        if part.startswith(FUSION_PREFIX) or part in METHODS:
            raise bad(f"{part!r} is not a component: fusions do not nest, and a method "
                      "comes first, once")
        if part in {name for name, _ in components}:
            raise bad(f"{part!r} is named twice: weight it instead (2*{part})")
        components.append((part, w))
    return tuple(components)


def component_files(spec: str) -> list[str]:
    """The files a fusion spec's components read (``run:PATH``, ``labels:PATH``), in its
    order: inputs no output may overwrite. Any other text names none."""
    files: list[str] = []
    with_component_files(spec, lambda path: files.append(path) or path)
    return files


def with_component_files(spec: str, change: Callable[[str], str]) -> str:
    """``spec`` with the path of each file its components read (``run:PATH``,
    ``labels:PATH``) replaced by ``change(PATH)``, each in its order; any other text as
    given. The one reading of where a fusion spec names files."""
    if not spec.startswith(FUSION_PREFIX):
        return spec
    body = spec[len(FUSION_PREFIX):]
    head, sep, tail = body.partition(":")
    method = ""
    if sep and head.partition("=")[0] in (*METHODS, BEST):
        method, body = head + sep, tail
    parts = []
    for part in body.split("+"):
        weight, star, name = part.partition("*") if "*" in part else ("", "", part)
        for prefix in (RUN_PREFIX, LABELS_PREFIX):
            if name.startswith(prefix) and len(name) > len(prefix):
                name = prefix + change(name[len(prefix):])
        parts.append(weight + star + name)
    return FUSION_PREFIX + method + "+".join(parts)


def rrf_terms(ranking: Ranking, k: float, ties: bool) -> dict[str, float]:
    """Each ranked docid's ``1 / (k + r)``, ``r`` its 1-based rank; with ``ties``, docids whose
    scores are equal (next to each other in a ranking by scores) share the mean of their ranks'
    terms."""
    terms = [1.0 / (k + r) for r in range(1, len(ranking.docids) + 1)]
    if not ties or ranking.scores is None:
        return dict(zip(ranking.docids, terms))
    out: dict[str, float] = {}
    start = 0
    scores = ranking.scores
    for end in range(1, len(scores) + 1):
        if end == len(scores) or scores[end] != scores[start]:
            shared = sum(terms[start:end]) / (end - start)
            out.update((d, shared) for d in ranking.docids[start:end])
            start = end
    return out


def normalised(scores: Sequence[float], method: str) -> list[float]:
    """Scores standardised over the slate: z-scores (population standard deviation) or min-max
    onto [0, 1]; all zeros when every score is equal (no order to contribute)."""
    n = len(scores)
    if method == "zscore":
        mean = math.fsum(scores) / n
        std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / n)
        return [0.0] * n if std == 0 else [(s - mean) / std for s in scores]
    low, high = min(scores), max(scores)
    return [0.0] * n if high == low else [(s - low) / (high - low) for s in scores]


def checked_ranking(ranker: Ranker, slate: Slate) -> Ranking:
    """A component's ranking of ``slate``, which must hold exactly the slate's candidates."""
    ranking = ranker.rank(slate)
    if sorted(ranking.docids) != sorted(slate.docids):
        raise SlateError(f"slate {slate.query.qid!r}: fusion component {ranker.name} "
                         "did not rank exactly the slate's candidates")
    return ranking


def component_values(
    ranker: Ranker, ranking: Ranking, docids: Sequence[str], method: str, k: float, fusion: str
) -> list[float]:
    """What one component adds to each candidate (in ``docids``' order) before its weight: its
    RRF terms (``rrf``), or its scores normalised over the slate (``zscore``, ``minmax``)."""
    if method == "rrf":
        terms = rrf_terms(ranking, k, getattr(ranker, "ranks_by_scores", False))
        return [terms[d] for d in docids]
    if ranking.scores is None:
        raise SlateError(
            f"fusion {fusion}: component {ranker.name} gives no scores to "
            f"normalise ({method}); fuse it by rank with rrf"
        )
    by_docid = dict(zip(ranking.docids, ranking.scores))
    return normalised([float(by_docid[d]) for d in docids], method)


class FusionRanker:
    """Several rankers' rankings of a slate fused into one (see the module's docstring).

    ``components``: the rankers, built, in the spec's order. Its latency is theirs added up
    (they run one after the other), which is what labelling with it costs.
    """

    ranks_by_scores = True

    def __init__(self, spec: FusionSpec, components: Sequence[Ranker], name: str) -> None:
        if len(components) != len(spec.components):
            raise ValueError("one built ranker a component of the spec")
        self.spec = spec
        self.components = list(components)
        self.weights = [w for _, w in spec.components]
        self.name = name
        self.needs_train = any(getattr(r, "needs_train", False) for r in self.components)
        self.needs_history = any(getattr(r, "needs_history", False) for r in self.components)

    def fit(self, train: Iterable[Slate]) -> None:
        """Fit the components that learn from training slates (one pass for one of them; the
        slates are held in memory when several need them)."""
        needing = [r for r in self.components if getattr(r, "needs_train", False)]
        slates = list(train) if len(needing) > 1 else train
        for ranker in needing:
            ranker.fit(slates)

    def scores(self, slate: Slate) -> list[float]:
        """The fused score of each candidate, in candidate order."""
        docids = slate.docids
        fused = [0.0] * len(docids)
        for ranker, weight in zip(self.components, self.weights):
            ranking = checked_ranking(ranker, slate)
            values = component_values(ranker, ranking, docids, self.spec.method, self.spec.k,
                                      self.name)
            for i, v in enumerate(values):
                fused[i] += weight * v
        return fused

    def coverage_note(self) -> str | None:
        """What its components did not rank (a ``run:PATH`` of another id space keeps every
        slate's given order, which would pass for the run's), in their own words
        (:func:`spdrank.rankers.run_ranker.coverage_line`), once the slates are ranked."""
        notes = (getattr(r, "coverage_note", None) for r in self.components)
        lines = [line for note in notes if note is not None and (line := note())]
        return "; ".join(f"{self.name}: {line}" for line in lines) or None

    def rank(self, slate: Slate) -> Ranking:
        docids = slate.docids
        scores = self.scores(slate)
        order = sorted(range(len(docids)), key=lambda i: -scores[i])  # stable: ties keep order
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])
