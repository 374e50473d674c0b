"""A TREC run replayed as a ranker, so any system's run sits in the same results table.

A search team's rankers live elsewhere (pyserini, a cross-encoder, a hosted reranker) and
leave TREC runs behind. Replaying one ranks each slate's candidates in the run's order as
trec_eval reads it (score descending, equal scores by docid descending), so its row scores
exactly what trec_eval would score on the same candidates.

A run ranks a collection and a slate holds part of it, so a run seldom ranks exactly a slate's
candidates. One rule, :func:`run_ranking`, says what a run's ranking of a slate is, wherever a
run is read: ``eval --run`` and ``fusion:...+run:PATH`` (:class:`RunRanker`) and the teacher's
``file:RUN.trec`` (:class:`spdrank.teacher.backends.FileBackend`, which ranks with a
:class:`RunRanker`):

- the candidates the run ranks come first, in its order, with its scores;
- the candidates it does not rank follow, in the slate's given order, all with one score just
  below its lowest: a tie among themselves, below every ranked candidate. An evaluation reads
  the order (the given one for them, a full permutation, so valid); a teacher records the
  scores, so training shares their positions among them (``training/targets.py``) rather than
  learn an order the run never gave;
- docids it ranks that are not candidates are left out, since no ranking of the slate holds
  them: a run that ranks more than a slate is no error.

A slate of which the run ranks less than :data:`MIN_RANKED_SHARE` of the candidates is ranked
mostly in its given order, so its row (or its teacher label) would pass for the first stage's:
:func:`coverage_line` says how many such slates there were, in the same words for every path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError
from spdrank.core.trec import read_run

#: The share of a slate's candidates a run must rank for its ranking of the slate to be the
#: run's more than the slate's given order; below it the slate is reported.
MIN_RANKED_SHARE = 0.5


def run_ranking(slate: Slate, ranked: Sequence[tuple[str, float]]) -> tuple[Ranking, int]:
    """The run's ranking of ``slate`` (``ranked``: the run's ``(docid, score)`` for its query,
    best first), by the module's one rule, and how many candidates the run ranked."""
    candidates = set(slate.docids)
    pairs = [(d, s) for d, s in ranked if d in candidates]
    seen = {d for d, _ in pairs}
    rest = [d for d in slate.docids if d not in seen]
    floor = math.nextafter(min(s for _, s in pairs), -math.inf) if pairs else 0.0
    ranking = Ranking(
        docids=[d for d, _ in pairs] + rest,
        scores=[s for _, s in pairs] + [floor] * len(rest),
    )
    return ranking, len(pairs)


def coverage_line(name: str, path: str | os.PathLike[str],
                  counts: Iterable[tuple[str, int, int]]) -> str | None:
    """One line on what of the slates a run did not rank, or None when it ranked every
    candidate; ``counts``: ``(qid, candidates ranked, candidates)`` of each slate ranked.

    Slates of which it ranks none come first (a run of another collection, or docids written
    otherwise: every such slate keeps its given order), then slates of which it ranks less than
    :data:`MIN_RANKED_SHARE`, else how many candidates followed the ranked ones."""
    counts = list(counts)
    none = [qid for qid, ranked, n in counts if ranked == 0 and n]
    thin = [qid for qid, ranked, n in counts if 0 < ranked < MIN_RANKED_SHARE * n]
    slates = len(counts)
    if none:
        also = (f" It ranks less than {MIN_RANKED_SHARE:.0%} of the candidates of {len(thin)} more."
                if thin else "")
        return (
            f"{name}: {path} ranks none of the candidates of {len(none)} "
            f"slate{'s' if len(none) != 1 else ''} ({_listed(none)}), which keep their given "
            f"order: are its docids the slates'?{also}"
        )
    if thin:
        return (
            f"{name}: {path} ranks less than {MIN_RANKED_SHARE:.0%} of the candidates of "
            f"{len(thin)} of {slates} "
            f"slates ({_listed(thin)}): their unranked candidates follow in the slate's given "
            "order, tied below the ranked ones, so those slates keep mostly their given order"
        )
    unranked = sum(n - ranked for _, ranked, n in counts)
    if unranked:
        total = sum(n for _, _, n in counts)
        return (f"{name}: {path} leaves {unranked} of {total} candidates "
                "unranked; they follow the ranked ones in slate order")
    return None


def _listed(qids: list[str]) -> str:
    """``'a', 'b', 'c' and K more``."""
    more = len(qids) - 3
    return ", ".join(map(repr, qids[:3])) + (f" and {more} more" if more > 0 else "")


class RunRanker:
    """Answers ``rank(slate)`` with the run's ranking of that slate's query
    (:func:`run_ranking`)."""

    needs_train = False
    ranks_by_scores = True

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.run = read_run(self.path)
        self.name = name or f"run:{self.path.stem}"
        #: By qid of each slate ranked: how many of its candidates the run ranked, and how
        #: many it has. Kept by query, so a slate ranked twice (a warm-up call) counts once.
        self.ranked: dict[str, tuple[int, int]] = {}

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the run was made elsewhere."""

    def ranks(self, qid: str) -> bool:
        """Whether the run has a line for ``qid``."""
        return qid in self.run

    def rank(self, slate: Slate) -> Ranking:
        ranked = self.run.get(slate.query.qid)
        if ranked is None:
            raise SlateError(
                f"qid {slate.query.qid!r} has no line in the TREC run {self.path}"
            )
        ranking, n_ranked = run_ranking(slate, ranked)
        self.ranked[slate.query.qid] = (n_ranked, len(slate))
        return ranking

    def coverage_note(self) -> str | None:
        """:func:`coverage_line` of the slates ranked so far."""
        return coverage_line(self.name, self.path,
                             ((qid, k, n) for qid, (k, n) in self.ranked.items()))
