"""A TREC run replayed as a ranker, so any system's run sits in the same results table.

A search team's rankers live elsewhere (pyserini, a cross-encoder, a hosted reranker) and
leave TREC runs behind. Replaying one ranks each slate's candidates in the run's order as
trec_eval reads it (score descending, equal scores by docid descending), so its row scores
exactly what trec_eval would score on the same candidates. Candidates the run does not rank
for a query follow, in the slate's order (a run cut shorter than the slate), and how many
there were is kept by query (:attr:`RunRanker.left`); docids the run ranks that are not
candidates are left out, since no ranking of the slate holds them. A slate of which the run
ranks no candidate at all keeps its given order, so its row would pass for the first stage's:
:meth:`RunRanker.coverage_note` says how many there were.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError
from spdrank.core.trec import read_run


class RunRanker:
    """Answers ``rank(slate)`` with the run's ranking of that slate's query."""

    needs_train = False
    ranks_by_scores = True

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.run = read_run(self.path)
        self.name = name or f"run:{self.path.stem}"
        #: By qid of each slate ranked: how many of its candidates the run did not rank, and
        #: how many it has. Kept by query, so a slate ranked twice (a warm-up call) counts once.
        self.left: dict[str, tuple[int, int]] = {}

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the run was made elsewhere."""

    def rank(self, slate: Slate) -> Ranking:
        ranked = self.run.get(slate.query.qid)
        if ranked is None:
            raise SlateError(
                f"qid {slate.query.qid!r} has no line in the TREC run {self.path}"
            )
        candidates = set(slate.docids)
        pairs = [(d, s) for d, s in ranked if d in candidates]
        seen = {d for d, _ in pairs}
        rest = [d for d in slate.docids if d not in seen]
        self.left[slate.query.qid] = (len(rest), len(slate))
        floor = min((s for _, s in pairs), default=0.0)
        return Ranking(
            docids=[d for d, _ in pairs] + rest,
            scores=[s for _, s in pairs] + [floor] * len(rest),
        )

    def coverage_note(self) -> str | None:
        """One line on the candidates the run did not rank, or None when it ranked them all:
        the slates of which it ranks none (a run of another collection, or docids written
        otherwise, ranks every slate in its given order), else how many candidates followed
        the ranked ones in slate order."""
        unmatched = [qid for qid, (rest, n) in self.left.items() if rest == n]
        if unmatched:
            shown = ", ".join(map(repr, unmatched[:3]))
            more = len(unmatched) - 3
            return (
                f"{self.name}: {self.path} ranks none of the candidates of {len(unmatched)} "
                f"slate{'s' if len(unmatched) != 1 else ''} "
                f"({shown}{f' and {more} more' if more > 0 else ''}), which keep their given "
                "order: are its docids the slates'?"
            )
        unranked = sum(rest for rest, _ in self.left.values())
        if unranked:
            total = sum(n for _, n in self.left.values())
            return (f"{self.name}: {self.path} leaves {unranked} of {total} candidates "
                    "unranked; they follow the ranked ones in slate order")
        return None
