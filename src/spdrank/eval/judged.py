"""Quality against graded relevance judgements, with trec_eval's semantics.

Search is judged in grades (TREC DL: 0 irrelevant to 3 perfectly relevant), and judged
documents the retriever never returned still count: they are what a perfect system would have
found. So these metrics read a query's judgements (``{docid: grade}``, every judged document,
candidate or not) and follow trec_eval, the reference every search paper reports against
(``tests/eval/test_judged.py`` holds each to ir-measures to 1e-6):

- ``nDCG@k``: gain = the grade (trec_eval's ``ndcg_cut``, linear gains), discount
  ``log2(rank + 1)``; the ideal ranking holds *every* judged document, best grades first;
- ``AP(rel=L)``, ``R(rel=L)@k``, ``RR(rel=L)``, ``P(rel=L)@k``: binary, a document is relevant
  when its grade is at least L (trec_eval's ``-l L``); AP and recall divide by all relevant
  judged documents, retrieved or not;
- a query with judgements but no relevant one scores 0 on every metric (as trec_eval does),
  never dropped; :func:`judged_metrics` returns ``None`` only for a query with no judgements.

A ranking is scored in its own order (its ids best first); ties are not re-broken. A TREC run
written by spdrank carries strictly decreasing scores along that order, so trec_eval, which
sorts by score, reads the same order.

Names are ir-measures' own measure strings (``nDCG@10``, ``AP(rel=2)``), so a number in a
table can be recomputed by pasting its column name into ir-measures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

#: trec_eval's default relevance level for binary measures (``-l 1``).
DEFAULT_REL_LEVEL = 1


def judged_metric_names(ks: Sequence[int], rel: int = DEFAULT_REL_LEVEL) -> list[str]:
    """The names :func:`judged_metrics` fills, in table order (ir-measures' notation)."""
    r = _rel(rel)
    return [
        *(f"nDCG@{k}" for k in ks), f"AP{r}", *(f"R{r}@{k}" for k in ks), f"RR{r}",
        *(f"P{r}@{k}" for k in ks),
    ]


def _rel(rel: int) -> str:
    """ir-measures writes the default level without a parameter: ``AP`` is ``AP(rel=1)``."""
    return "" if rel == DEFAULT_REL_LEVEL else f"(rel={rel})"


def ndcg_at_k(ranking: Sequence[str], judgements: Mapping[str, int], k: int) -> float:
    """trec_eval's ``ndcg_cut.k``: graded gains, ideal DCG over every judged document."""
    dcg = sum(
        judgements.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k])
        if judgements.get(d, 0) > 0
    )
    ideal = sorted((g for g in judgements.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def _relevant(judgements: Mapping[str, int], rel: int) -> set[str]:
    return {d for d, g in judgements.items() if g >= rel}


def average_precision(ranking: Sequence[str], judgements: Mapping[str, int], rel: int) -> float:
    """trec_eval's ``map``: mean precision at each relevant document, over all relevant."""
    relevant = _relevant(judgements, rel)
    if not relevant:
        return 0.0
    hits = 0
    total = 0.0
    for i, d in enumerate(ranking):
        if d in relevant:
            hits += 1
            total += hits / (i + 1)
    return total / len(relevant)


def recall_at_k(ranking: Sequence[str], judgements: Mapping[str, int], k: int, rel: int) -> float:
    """trec_eval's ``recall.k``: relevant documents in the top k over all relevant judged."""
    relevant = _relevant(judgements, rel)
    if not relevant:
        return 0.0
    return sum(1 for d in ranking[:k] if d in relevant) / len(relevant)


def precision_at_k(
    ranking: Sequence[str], judgements: Mapping[str, int], k: int, rel: int
) -> float:
    """trec_eval's ``P.k``: relevant documents in the top k over k (a short list too)."""
    relevant = _relevant(judgements, rel)
    return sum(1 for d in ranking[:k] if d in relevant) / k


def reciprocal_rank(ranking: Sequence[str], judgements: Mapping[str, int], rel: int) -> float:
    """trec_eval's ``recip_rank``: 1 / the rank of the first relevant document; 0 if none."""
    relevant = _relevant(judgements, rel)
    for i, d in enumerate(ranking):
        if d in relevant:
            return 1.0 / (i + 1)
    return 0.0


def judged_metrics(
    ranking: Sequence[str],
    judgements: Mapping[str, int] | None,
    ks: Sequence[int],
    rel: int = DEFAULT_REL_LEVEL,
) -> dict[str, float | None]:
    """Every judged metric of one ranking (named as :func:`judged_metric_names`).

    All ``None`` when the query has no judgements at all (trec_eval skips a query missing from
    the qrels); a query judged with no relevant document scores 0 on each.
    """
    names = judged_metric_names(ks, rel)
    if judgements is None:
        return dict.fromkeys(names)
    r = _rel(rel)
    out: dict[str, float | None] = {}
    for k in ks:
        out[f"nDCG@{k}"] = ndcg_at_k(ranking, judgements, k)
    out[f"AP{r}"] = average_precision(ranking, judgements, rel)
    for k in ks:
        out[f"R{r}@{k}"] = recall_at_k(ranking, judgements, k, rel)
    out[f"RR{r}"] = reciprocal_rank(ranking, judgements, rel)
    for k in ks:
        out[f"P{r}@{k}"] = precision_at_k(ranking, judgements, k, rel)
    return out


def has_relevant(judgements: Mapping[str, int] | None, rel: int = DEFAULT_REL_LEVEL) -> bool:
    """Whether a judged query has a relevant document at level ``rel`` (for the count of
    queries that score 0 whatever the ranking, which a table reports)."""
    return judgements is not None and any(g >= rel for g in judgements.values())


def unused_judgements(
    judged: Iterable[str], qids: Sequence[str], source: str, shown: int = 3
) -> list[str]:
    """One line for each gap between a judgements file and the slates an evaluation ranked,
    so that none passes unseen: the slates (``qids``, in order) it judges none of, or those it
    leaves unjudged; and its judged queries (``judged``) that no slate asks. ``source`` names
    the file in the lines (``--qrels runs/dl19.qrels``).

    A file that judges no slate at all usually speaks of other queries (another collection,
    or qids written otherwise): the line shows a qid of each side to compare.
    """
    judged = list(dict.fromkeys(judged))
    judged_set, asked = set(judged), set(qids)
    unjudged = [q for q in dict.fromkeys(qids) if q not in judged_set]
    unasked = [q for q in judged if q not in asked]
    if qids and len(unjudged) == len(set(qids)):
        return [(f"{source} judges none of the {len(qids)} slates: its queries "
                 f"({_examples(judged, shown)}) are not theirs ({_examples(unjudged, shown)}), "
                 "so no slate is judged")]
    lines = []
    if unjudged:
        lines.append(f"{source} judges no document of {len(unjudged)} of the {len(qids)} "
                     f"slates ({_examples(unjudged, shown)}): they count in no judged metric")
    if unasked:
        lines.append(f"{source}: {len(unasked)} of its {len(judged)} judged queries match no "
                     f"slate ({_examples(unasked, shown)}): their judgements are not used")
    return lines


def _examples(qids: Sequence[str], shown: int) -> str:
    """``'q1', 'q2', 'q3' and 7 more``: the first ``shown`` qids, then how many others."""
    more = len(qids) - shown
    return ", ".join(map(repr, qids[:shown])) + (f" and {more} more" if more > 0 else "")
