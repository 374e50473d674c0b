"""Non-LLM rankers to compare against: random, popularity, item co-occurrence, a feature, SASRec.

They set the floor any learned ranker has to clear, and they cost microseconds, so they
also anchor the latency column. Each implements :class:`spdrank.core.ranking.Ranker`: ``fit``
reads the training slates once, as a stream (a :func:`spdrank.core.slates.read_slates` iterator
works; nothing holds all slates), and ``rank`` returns a full permutation, always.

Only training slates feed the statistics: an evaluation slate's clicked item is never
counted, so an item that is popular only among evaluation targets earns no credit.

:class:`FeatureRanker` (``feature:NAME``) learns nothing: it orders by a number the upstream
system wrote into each candidate, e.g. the lexical retriever's ``title_similarity`` of the
Beauty builder (also registered under that name), which makes it a lexical baseline and a
cheap, deterministic teacher whose ties are real ties.

``fusion:...`` fuses several of these by reciprocal rank or normalised scores
(:mod:`spdrank.rankers.fusion`), and ``fusion:best:...`` chooses such a fusion on validation
slates (:mod:`spdrank.rankers.fusion_choice`): the components are built here, by the names
they have alone (``run:PATH`` a TREC run; ``labels:PATH`` a label file, replayed by what the
caller hands in as ``replay``, since label files are the teacher layer's).

A ranker whose ``ranks_by_scores`` is true orders by ``Ranking.scores`` alone, equal scores
kept in candidate order: its equal scores are ties, which a teacher run records as such.

The statistics also feed models as upstream features (:mod:`spdrank.datasets.interaction_features`),
which is why the count-based rankers can fit on plain interaction sequences and score a slate
as if one fitted sequence had been left out.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path

from spdrank.core.features import TITLE_SIMILARITY, raw_features
from spdrank.core.ranking import Ranker, Ranking
from spdrank.core.slates import SCORE_FEATURE, Slate, training_sequence
from spdrank.rankers.fusion import (
    FUSION_PREFIX,
    LABELS_PREFIX,
    RUN_PREFIX,
    SYNTAX,
    FusionRanker,
    parse_fusion,
)
from spdrank.rankers.fusion_choice import ChosenFusion, is_chosen, parse_choice

log = logging.getLogger(__name__)

#: ``feature:NAME`` names the :class:`FeatureRanker` of feature ``NAME``.
FEATURE_PREFIX = "feature:"


def _sorted_by(keys: list[tuple[float, ...]]) -> list[int]:
    """Candidate indices by descending keys; equal keys keep the original candidate order."""
    negated = [tuple(-k for k in key) for key in keys]
    return sorted(range(len(keys)), key=negated.__getitem__)


class RandomRanker:
    """A uniformly random permutation, the same one every time for the same slate.

    The generator is seeded from ``seed``, the qid and the candidate ids through SHA-256
    (Python's ``hash()`` changes between processes), so reruns give the same bytes and a
    slate's ranking does not depend on which slates were ranked before it.
    """

    needs_train = False

    def __init__(self, seed: int = 0, name: str = "random") -> None:
        self.seed = seed
        self.name = name

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn."""

    def rank(self, slate: Slate) -> Ranking:
        key = "\x1f".join([str(self.seed), slate.query.qid, *slate.docids]).encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        docids = slate.docids
        rng.shuffle(docids)
        return Ranking(docids=docids)


class PopularityRanker:
    """Candidates by how often they appear in the training interactions.

    Counts, per training slate, every item of ``query.history`` plus its clicked items. Ties
    (including unseen items, count 0) keep the original candidate order.
    """

    needs_train = True
    #: It learns from users' interaction histories: a search slate (no history) has none.
    needs_history = True
    ranks_by_scores = True
    #: ``scores`` and ``rank`` take ``leave_out``: one fitted sequence not counted, exactly.
    leaves_one_out = True

    def __init__(self, name: str = "popularity") -> None:
        self.name = name
        self.counts: Counter[str] | None = None
        #: Slates ranked, and those none of whose candidates the fit counted.
        self.ranked = self.unseen = 0

    def fit(self, train: Iterable[Slate]) -> None:
        self.fit_sequences(training_sequence(s) for s in train)

    def fit_sequences(self, sequences: Iterable[Sequence[str]]) -> None:
        """Count the items of interaction sequences (each a training slate's, in time order)."""
        counts: Counter[str] = Counter()
        for seq in sequences:
            counts.update(seq)
        self.counts = counts

    def scores(self, slate: Slate, leave_out: Sequence[str] | None = None) -> list[float]:
        """Each candidate's count, in candidate order.

        ``leave_out``: one of the fitted sequences, whose items are not counted (the counts of
        a fit without it), so a training slate's features do not count its own target.
        """
        if self.counts is None:
            raise RuntimeError(f"{self.name}: call fit() on training slates before rank()")
        own = Counter(leave_out or ())
        return [float(self.counts.get(d, 0) - own.get(d, 0)) for d in slate.docids]

    def observe(self, slate: Slate) -> None:
        """Count ``slate`` as ranked, and as unseen when the fit counted none of its candidates."""
        self.ranked += 1
        self.unseen += not any(self.counts.get(d) for d in slate.docids) if self.counts else 1

    def forget_warmup(self) -> None:
        """Forget the untimed warm-up ranks, so the note counts each slate evaluated once."""
        self.ranked = self.unseen = 0

    def coverage_note(self, name: str | None = None) -> str | None:
        """A line when most slates ranked held no candidate the fit counted: a ``--train`` of
        other items (another catalogue, search slates) ranks them all in their given order."""
        if not self.ranked or self.unseen * 2 <= self.ranked:
            return None
        return (f"{name or self.name}: the training slates it was fitted on hold none of the "
                f"candidates of {self.unseen:,} of the {self.ranked:,} slates ranked, so it ranked "
                "them in their given order: does --train hold these slates' items?")

    def rank(self, slate: Slate, leave_out: Sequence[str] | None = None) -> Ranking:
        """The candidates by count; ``leave_out`` as :meth:`scores` takes it."""
        docids = slate.docids
        scores = self.scores(slate, leave_out)
        self.observe(slate)
        order = _sorted_by([(s,) for s in scores])
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])


class CooccurrenceRanker:
    """Item-to-item co-occurrence with the user's most recent items ("bought together").

    From each training sequence (history + clicked target, in time order) every pair of
    items at most ``window`` positions apart is counted: ``after -> later`` with weight 1 and
    the reverse direction with weight ``backward`` (the next item depends mostly on what came
    just before, but the reverse pairs double the evidence for sparse items). A candidate's
    score is ``sum_j decay**j * co[h_j][c]`` over the ``recent`` last history items ``h_0``
    (most recent), ``h_1``, ... Ties, which include every candidate that never co-occurred with
    the history, fall back to popularity and then to the original candidate order, so this
    ranker is never worse informed than :class:`PopularityRanker`.

    Defaults (``window=20, recent=10, decay=0.8, backward=0.5``) are tuned on held-out Amazon
    Beauty users: a window of more than a few items matters most; a partial weight for reverse
    pairs and a mild decay help a little; larger settings change nothing beyond noise.
    """

    needs_train = True
    #: It learns from users' interaction histories: a search slate (no history) has none.
    needs_history = True
    #: Its score ties are ordered by popularity, so equal scores are not ties of its ranking.
    ranks_by_scores = False
    #: ``scores`` and ``rank`` take ``leave_out``: one fitted sequence not counted, exactly.
    leaves_one_out = True

    def __init__(
        self,
        window: int = 20,
        recent: int = 10,
        decay: float = 0.8,
        backward: float = 0.5,
        name: str = "cooccurrence",
    ) -> None:
        if window < 1 or recent < 1:
            raise ValueError("window and recent must be at least 1")
        self.window = window
        self.recent = recent
        self.decay = decay
        self.backward = backward
        self.name = name
        self.co: dict[str, dict[str, float]] | None = None
        self.popularity = PopularityRanker()

    def fit(self, train: Iterable[Slate]) -> None:
        self.fit_sequences(training_sequence(s) for s in train)

    def fit_sequences(self, sequences: Iterable[Sequence[str]]) -> None:
        """Count item pairs (and items, for the popularity fallback) of interaction sequences."""
        self.co, counts = self._count(sequences)
        self.popularity.counts = counts

    def _count(
        self, sequences: Iterable[Sequence[str]]
    ) -> tuple[dict[str, dict[str, float]], Counter[str]]:
        co: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
        counts: Counter[str] = Counter()
        for seq in sequences:
            counts.update(seq)
            for a, b, weight in self._pairs(seq):
                co[a][b] += weight
        return {a: dict(row) for a, row in co.items()}, counts

    def _pairs(self, seq: Sequence[str]) -> Iterator[tuple[str, str, float]]:
        """``(earlier, later, 1)`` and ``(later, earlier, backward)`` within the window."""
        for i, a in enumerate(seq):
            for b in seq[i + 1 : i + 1 + self.window]:
                if a == b:
                    continue
                yield a, b, 1.0
                if self.backward:
                    yield b, a, self.backward

    def scores(self, slate: Slate, leave_out: Sequence[str] | None = None) -> list[float]:
        """Co-occurrence score of each candidate, in candidate order.

        ``leave_out``: one of the fitted sequences, whose pairs are not counted. The counts are
        sums of 1 and ``backward``, exact in floating point, so the scores are exactly those of
        a fit without that sequence, at the cost of counting one sequence's pairs.
        """
        if self.co is None:
            raise RuntimeError(f"{self.name}: call fit() on training slates before rank()")
        own: dict[tuple[str, str], float] = {}
        for a, b, weight in self._pairs(leave_out or ()):
            own[a, b] = own.get((a, b), 0.0) + weight
        index = {d: i for i, d in enumerate(slate.docids)}
        recent = list(slate.query.history or ())[::-1][: self.recent]
        out = [0.0] * len(index)
        for j, h in enumerate(recent):
            row = self.co.get(h)
            if not row:
                continue
            w = self.decay**j
            # Each candidate's terms are added in the order of j, whatever order the set gives.
            for d in row.keys() & index.keys():
                c = row[d] - own.get((h, d), 0.0)
                if c:
                    out[index[d]] += w * c
        return out

    def forget_warmup(self) -> None:
        self.popularity.forget_warmup()

    def coverage_note(self) -> str | None:
        """As :meth:`PopularityRanker.coverage_note`: its counts are this ranker's fallback."""
        return self.popularity.coverage_note(self.name)

    def rank(self, slate: Slate, leave_out: Sequence[str] | None = None) -> Ranking:
        """The candidates by score, ties by popularity; ``leave_out``: one of the fitted
        sequences, left out of both (the ranking of a fit without it)."""
        docids = slate.docids
        scores = self.scores(slate, leave_out)
        counts = (
            self.popularity.scores(slate, leave_out) if self.popularity.counts is not None
            else [0.0] * len(docids)
        )
        self.popularity.observe(slate)
        order = _sorted_by(list(zip(scores, counts)))
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])


class FeatureRanker:
    """Candidates by one feature the slate carries (``Candidate.feature``), highest first.

    Nothing to fit: the upstream system computed the values. ``Ranking.scores`` are the
    values, best first; equal values (a lexical score is 0.0 for most candidates) keep the
    slate's candidate order, so the output is deterministic and its ties visible in the
    scores. A candidate without the feature is an error naming the slate, the candidate and
    the feature: ranking it by a made-up default would hide a file built without it. The one
    exception is ``score`` left out: rank_llm's format lists candidates in the first stage's
    order and may omit their scores, so they read as 0 and this ranks them as listed, which
    is that first stage's order (the ``retriever`` row).
    """

    needs_train = False
    ranks_by_scores = True

    def __init__(self, feature: str, name: str | None = None) -> None:
        if not feature:
            raise ValueError("a feature ranker needs a feature name (feature:NAME)")
        self.feature = feature
        self.name = name or f"{FEATURE_PREFIX}{feature}"

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: every slate carries its own values."""

    def scores(self, slate: Slate) -> list[float]:
        """The feature's value of each candidate, in candidate order."""
        return raw_features(slate, [self.feature], reader=f"{self.name} ranks by",
                            unscored=0.0)[:, 0].tolist()

    def rank(self, slate: Slate) -> Ranking:
        docids = slate.docids
        scores = self.scores(slate)
        order = _sorted_by([(s,) for s in scores])
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])


#: Baselines by the name the CLI uses (``spdrank eval --ranker NAME``); with no ``--ranker``,
#: eval runs all of these (they need nothing but the slates' ids and histories).
BASELINES: dict[str, Callable[..., Ranker]] = {
    "random": RandomRanker,
    "popularity": PopularityRanker,
    "cooccurrence": CooccurrenceRanker,
}

#: Named feature baselines: alias -> the feature it ranks by (as ``feature:NAME`` would).
FEATURE_BASELINES: dict[str, str] = {
    "title_similarity": TITLE_SIMILARITY,
    # The first stage's own order: its score, equal scores in the order it listed them.
    "retriever": SCORE_FEATURE,
}


def _bm25(**kwargs: object) -> Ranker:
    """:class:`spdrank.rankers.bm25.BM25Ranker`, imported on demand (it needs bm25s)."""
    from spdrank.rankers.bm25 import BM25Ranker

    return BM25Ranker(**kwargs)  # type: ignore[arg-type]


def _dense(**kwargs: object) -> Ranker:
    """:class:`spdrank.rankers.dense.DenseRanker`, imported on demand (it needs torch)."""
    from spdrank.rankers.dense import DenseRanker

    return DenseRanker(**kwargs)  # type: ignore[arg-type]


#: Baselines that read the query's and the candidates' texts: search's lexical floor
#: (slate_bm25: BM25 with the slate as its collection) and the bi-encoder a team would
#: otherwise deploy (dense: all-MiniLM-L6-v2).
TEXT_BASELINES: dict[str, Callable[..., Ranker]] = {
    "slate_bm25": _bm25,
    "dense": _dense,
}

#: Names that still work, each for the ranker now named otherwise, with the one line that
#: says so whenever one is built: ``bm25`` read as the first stage's BM25, which it is not.
DEPRECATED_NAMES: dict[str, tuple[str, str]] = {
    "bm25": ("slate_bm25", ("BM25 with the slate's own passages as its collection, not the "
                            "first stage's BM25 (that order is `retriever`)")),
}

#: What eval runs without ``--ranker`` on slates whose queries carry no history (search):
#: every ranker here needs only the slate itself.
SEARCH_DEFAULTS: tuple[str, ...] = ("random", "retriever", "slate_bm25")


def _sasrec(**kwargs: object) -> Ranker:
    """:class:`spdrank.rankers.sasrec.SASRecRanker`, imported on demand (it needs torch)."""
    from spdrank.rankers.sasrec import SASRecRanker

    return SASRecRanker(**kwargs)  # type: ignore[arg-type]


#: Baselines that train a model (minutes, torch): run only when named with ``--ranker``.
MODEL_BASELINES: dict[str, Callable[..., Ranker]] = {
    "sasrec": _sasrec,
}


def baseline_names() -> list[str]:
    """Every registered name, for help texts and messages (``feature:NAME`` besides)."""
    return sorted([*BASELINES, *MODEL_BASELINES, *FEATURE_BASELINES, *TEXT_BASELINES])


#: Builds a ``labels:PATH`` component from its path and name (the commands hand in the
#: teacher's label replay).
Replay = Callable[[str, str], Ranker]


def _fusion(spec: str, replay: Replay | None = None) -> Ranker:
    """The :class:`~spdrank.rankers.fusion.FusionRanker` a ``fusion:...`` name asks for, its
    components built by name here, so a component means what the same name means alone."""
    parsed = parse_fusion(spec)
    return FusionRanker(parsed, [_component(name, replay) for name, _ in parsed.components],
                        name=spec)


def _chosen(spec: str, choose_on: Path | None = None, replay: Replay | None = None) -> Ranker:
    """The :class:`~spdrank.rankers.fusion_choice.ChosenFusion` a ``fusion:best:...`` name asks
    for, its components built as :func:`_fusion` builds them; ``choose_on`` its validation
    slates."""
    names = parse_choice(spec)
    return ChosenFusion(spec, [_component(name, replay) for name in names], choose_on)


def _component(name: str, replay: Replay | None) -> Ranker:
    if name.startswith(RUN_PREFIX):
        from spdrank.rankers.run_ranker import RunRanker

        return RunRanker(name[len(RUN_PREFIX) :], name=name)
    if name.startswith(LABELS_PREFIX):
        if replay is None:
            raise ValueError(f"component {name!r}: a label file is replayed by spdrank's "
                             "commands (eval --ranker, teacher --backend ranker:)")
        return replay(name[len(LABELS_PREFIX) :], name)
    return make_baseline(name)


def _check_fusion(spec: str) -> None:
    """A ``fusion:...`` or ``fusion:best:...`` name's syntax and every component's name,
    checked before anything is built (a model loaded, a run read); ``ValueError`` naming the
    spec and what is wrong."""
    names = parse_choice(spec) if is_chosen(spec) else [n for n, _ in parse_fusion(spec).components]
    for name in names:
        for prefix, what in ((RUN_PREFIX, "TREC run"), (LABELS_PREFIX, "label")):
            if name.startswith(prefix):
                path = Path(name[len(prefix) :])
                if not path.is_file():  # missing, a device, a directory: say which
                    from spdrank.core.inputs import check_rereadable
                    from spdrank.core.slates import SlateError

                    try:
                        check_rereadable(path, f"{what} file")
                    except SlateError as exc:
                        raise ValueError(f"{spec!r}: component {name!r}: {exc}") from None
                break
        else:
            try:
                baseline_factory(name)
            except ValueError as exc:
                raise ValueError(f"{spec!r}: component {name!r}: {exc}") from None


def baseline_factory(name: str) -> Callable[..., Ranker]:
    """The constructor behind a baseline name; ``ValueError`` naming the choices if unknown.

    A registry name (:data:`BASELINES`, :data:`MODEL_BASELINES`), an alias of
    :data:`FEATURE_BASELINES`, ``feature:NAME`` for any feature the slates carry,
    ``fusion:...`` for several of them fused (:mod:`spdrank.rankers.fusion`; ``fusion:best:...``
    chosen on validation slates, :mod:`spdrank.rankers.fusion_choice`), or a name of
    :data:`DEPRECATED_NAMES` (the constructor of the name it stands for).
    """
    if name.startswith(FUSION_PREFIX):
        _check_fusion(name)
        return partial(_chosen if is_chosen(name) else _fusion, name)
    if name.startswith(FEATURE_PREFIX):
        feature = name[len(FEATURE_PREFIX) :]
        if not feature:
            raise ValueError(f"baseline {name!r} names no feature: use feature:NAME")
        return partial(FeatureRanker, feature)
    if name in DEPRECATED_NAMES:
        return baseline_factory(DEPRECATED_NAMES[name][0])
    if name in FEATURE_BASELINES:
        return partial(FeatureRanker, FEATURE_BASELINES[name], name=name)
    if name in MODEL_BASELINES:
        return MODEL_BASELINES[name]
    if name in TEXT_BASELINES:
        return TEXT_BASELINES[name]
    try:
        return BASELINES[name]
    except KeyError:
        raise ValueError(
            f"unknown baseline {name!r}; choose from {', '.join(baseline_names())}, "
            f"{FEATURE_PREFIX}NAME to rank by a candidate feature, or {SYNTAX}"
        ) from None


def make_baseline(name: str, **kwargs: object) -> Ranker:
    """Build a baseline by name (see :func:`baseline_factory`); keyword arguments go to its
    constructor. A deprecated name builds the ranker it stands for, under that ranker's own
    name, and says so in one line."""
    if name in DEPRECATED_NAMES:
        current, meaning = DEPRECATED_NAMES[name]
        log.warning("ranker %r is deprecated: it is %r, %s; name it %r", name, current,
                    meaning, current)
    return baseline_factory(name)(**kwargs)
