"""Ranked outputs: rank_llm-style result records and TREC run files."""

from __future__ import annotations

from itertools import pairwise
from typing import IO, Any

from spdrank.core.ranking import Ranking, rank_scores
from spdrank.core.slates import Slate, SlateError
from spdrank.core.validation import ID_RULE, id_problem

#: The field every ranked result carries (the stages' milliseconds), by which a reader knows
#: a file of them: its candidates' ``score`` is the ranking model's, not a first stage's.
RANKED_MARK = "timings_ms"


def result_record(slate: Slate, ranking: Ranking) -> dict[str, Any]:
    """The slate with its candidates in ranked order, each carrying the ranker's score.

    Labels (``clicked``, ``teacher``) and extra fields travel along, so results can be
    evaluated later without the input file.
    """
    record = slate.to_dict()
    by_id = {c["docid"]: c for c in record["candidates"]}
    scores = ranking.reported_scores()
    record["candidates"] = [
        by_id[d] | {"score": s} for d, s in zip(ranking.docids, scores)
    ]
    record[RANKED_MARK] = {k: round(v, 4) for k, v in ranking.timings.items()}
    return record


def check_trec_ids(slate: Slate, where: str | None = None) -> None:
    """Refuse ids a TREC run line cannot carry: it is split on whitespace into 6 fields, so an
    id must be one non-empty field (:func:`spdrank.core.validation.id_problem`, the rule every
    slate's ids pass as they are read). The qid is checked again here because a slate may
    leave it out, and a run line may not.

    Refused rather than escaped: any escape would change the ids, and the qrels they are
    scored against would no longer match.
    """
    qid = slate.query.qid
    problem = id_problem(qid)
    if problem:
        raise SlateError(
            f"query.qid {qid!r} cannot go into a TREC run line: it {problem} ({ID_RULE}); "
            "fix the qid or leave out --trec",
            where,
            field="query.qid",
        )
    for i, docid in enumerate(slate.docids):
        problem = id_problem(docid)
        if problem:
            raise SlateError(
                f"candidates[{i}].docid {docid!r} {problem}, which a TREC run line cannot "
                "carry: fix the docid or leave out --trec",
                where,
                field=f"candidates[{i}].docid",
            )


def write_trec_lines(fh: IO[str], slate: Slate, ranking: Ranking, tag: str) -> None:
    """``qid Q0 docid rank score tag`` lines, rank from 1 (ids checked by :func:`check_trec_ids`).

    trec_eval orders a run by its scores, not its ranks, so the scores written must decrease
    strictly along the ranking, or a tie would be re-ordered by docid: they are the ranker's
    own when they do (as printed), else the rank-derived ``1 - r/n`` for the whole query.
    """
    check_trec_ids(slate)
    printed = [f"{s:.6f}" for s in ranking.reported_scores()]
    if any(float(b) >= float(a) for a, b in pairwise(printed)):
        printed = [f"{s:.6f}" for s in rank_scores(len(ranking.docids))]
    for rank, (docid, score) in enumerate(zip(ranking.docids, printed), start=1):
        fh.write(f"{slate.query.qid} Q0 {docid} {rank} {score} {tag}\n")

