"""A TREC run replayed as a ranker, so any system's run sits in the same results table.

A search team's rankers live elsewhere (pyserini, a cross-encoder, a hosted reranker) and
leave TREC runs behind. Replaying one ranks each slate's candidates in the run's order as
trec_eval reads it (score descending, equal scores by docid descending), so its row scores
exactly what trec_eval would score on the same candidates. Candidates the run does not rank
for a query follow, in the slate's order (a run cut shorter than the slate), and how many
there were is counted in :attr:`RunRanker.unranked`; docids the run ranks that are not
candidates are left out, since no ranking of the slate holds them.
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
        #: Candidates of the ranked slates that the run did not rank, summed over slates.
        self.unranked = 0

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
        self.unranked += len(rest)
        floor = min((s for _, s in pairs), default=0.0)
        return Ranking(
            docids=[d for d, _ in pairs] + rest,
            scores=[s for _, s in pairs] + [floor] * len(rest),
        )
