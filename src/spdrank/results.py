"""Ranked outputs: rank_llm-style result records and TREC run files."""

from __future__ import annotations

from typing import IO, Any

from spdrank.ranking import Ranking
from spdrank.slates import Slate


def result_record(slate: Slate, ranking: Ranking) -> dict[str, Any]:
    """The slate with its candidates in ranked order, each carrying the ranker's score.

    Labels (``clicked``, ``teacher``) and extra fields travel along, so results can be
    evaluated later without the input file.
    """
    record = slate.to_dict()
    by_id = {c["docid"]: c for c in record["candidates"]}
    scores = _scores(ranking)
    record["candidates"] = [
        by_id[d] | {"score": float(s)} for d, s in zip(ranking.docids, scores)
    ]
    record["timings_ms"] = {k: round(v, 4) for k, v in ranking.timings.items()}
    return record


def write_trec_lines(fh: IO[str], slate: Slate, ranking: Ranking, tag: str) -> None:
    """``qid Q0 docid rank score tag`` lines, rank from 1."""
    scores = _scores(ranking)
    for rank, (docid, score) in enumerate(zip(ranking.docids, scores), start=1):
        fh.write(f"{slate.query.qid} Q0 {docid} {rank} {score:.6f} {tag}\n")


def _scores(ranking: Ranking) -> list[float]:
    """The ranker's scores, or ``n, n-1, ..., 1`` for a ranker that gives none."""
    n = len(ranking.docids)
    return list(ranking.scores) if ranking.scores else [float(n - r) for r in range(n)]
