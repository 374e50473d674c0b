"""Ranked outputs: rank_llm-style result records and TREC run files."""

from __future__ import annotations

import re
from typing import IO, Any

from spdrank.ranking import Ranking
from spdrank.slates import Slate, SlateError

_BLANK = re.compile(r"\s")


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
    record["timings_ms"] = {k: round(v, 4) for k, v in ranking.timings.items()}
    return record


def check_trec_ids(slate: Slate, where: str | None = None) -> None:
    """Refuse ids a TREC run line cannot carry: it is split on whitespace into 6 fields, so a
    qid or docid holding whitespace (or an empty qid) would shift every field after it.

    Refused rather than escaped: any escape would change the ids, and the qrels they are
    scored against would no longer match.
    """
    qid = slate.query.qid
    if not qid or _BLANK.search(qid):
        raise SlateError(
            f"query.qid {qid!r} cannot go into a TREC run line (ids there must be non-empty and "
            "hold no whitespace): fix the qid or leave out --trec",
            where,
            field="query.qid",
        )
    for i, docid in enumerate(slate.docids):
        if _BLANK.search(docid):
            raise SlateError(
                f"candidates[{i}].docid {docid!r} holds whitespace, which a TREC run line "
                "cannot carry: fix the docid or leave out --trec",
                where,
                field=f"candidates[{i}].docid",
            )


def write_trec_lines(fh: IO[str], slate: Slate, ranking: Ranking, tag: str) -> None:
    """``qid Q0 docid rank score tag`` lines, rank from 1 (ids checked by :func:`check_trec_ids`)."""
    check_trec_ids(slate)
    scores = ranking.reported_scores()
    for rank, (docid, score) in enumerate(zip(ranking.docids, scores), start=1):
        fh.write(f"{slate.query.qid} Q0 {docid} {rank} {score:.6f} {tag}\n")

