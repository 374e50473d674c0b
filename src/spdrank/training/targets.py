"""Training targets: what permutation (or soft assignment) a slate should be decoded into.

- ``teacher``: the teacher's ranking as a permutation matrix (the paper's distillation).
  When the teacher ranked by scores (``teacher_scores``), items it scored equally are a tie,
  not an order: like clicks, each tie group spreads its mass over its block of positions.
- ``clicks``: clicked items share the first c positions, the others share the rest (the
  paper's Track 1). Clicks say nothing about the order among clicked or among unclicked
  items, so the target spreads mass uniformly there rather than inventing an order.
- ``teacher+clicks``: the teacher's ranking with the clicked items moved to the top, each
  group keeping the teacher's order (ours, beyond the paper).
- ``relevance``: graded judgements, as clicks are binary ones: candidates of a higher grade
  take the earlier positions, each grade's candidates sharing their block uniformly
  (candidates without a judgement count as grade 0).
- ``teacher+relevance``: the teacher's ranking within each grade, the grades in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from spdrank.core.slates import Slate

TARGETS = ("teacher", "clicks", "teacher+clicks", "relevance", "teacher+relevance")
#: The targets that read graded judgements (``relevance``).
RELEVANCE_TARGETS = ("relevance", "teacher+relevance")


#: The share of slates whose teacher ranks the one clicked item first above which a teacher is
#: taken to have seen the clicks, and the fewest such slates that say so: a teacher that ranks
#: a user's next item first nine times in ten among its candidates has read that item.
CLICK_COPY_SHARE = 0.9
CLICK_COPY_SLATES = 50


def ranks_clicks_first(
    slates: Iterable[Slate], ranking: Callable[[Slate], Sequence[str] | None]
) -> tuple[int, int] | None:
    """Of ``slates`` with exactly one clicked item that ``ranking`` orders, how many it ranks
    with that item first, and how many there are, when at least :data:`CLICK_COPY_SHARE` of
    at least :data:`CLICK_COPY_SLATES` do: an order that saw the clicks (a teacher fitted on
    the slates' own clicks, candidates listed with the clicked item first), which teaches
    where the click is rather than why. None otherwise."""
    first = total = 0
    for slate in slates:
        order = ranking(slate)
        if order and slate.clicked and len(slate.clicked) == 1:
            total += 1
            first += order[0] == slate.clicked[0]
    if total >= CLICK_COPY_SLATES and first >= CLICK_COPY_SHARE * total:
        return first, total
    return None


def orders_no_pair(slate: Slate) -> bool:
    """Whether the teacher labelled ``slate`` and its ranking orders no pair of candidates:
    every one scored equally (``teacher_scores`` all one value), so its target matrix is
    uniform and asks the student for no order at all."""
    scores = slate.teacher_scores
    return bool(slate.teacher) and scores is not None and len(set(scores)) <= 1


def teacher_ties(slates: Iterable[Slate]) -> tuple[int, int]:
    """How many of ``slates`` the teacher labelled with a ranking that orders no pair
    (:func:`orders_no_pair`), and how many it labelled at all."""
    tied = labelled = 0
    for slate in slates:
        if slate.teacher:
            labelled += 1
            tied += orders_no_pair(slate)
    return tied, labelled


def _block_matrix(docids: list[str], ranking: list[str], keys: list[object]) -> np.ndarray:
    """Rows: ``docids``; columns: positions. Consecutive items of ``ranking`` with equal
    ``keys`` form a block that shares its positions uniformly (a permutation matrix when
    every key differs from its neighbours')."""
    row = {d: i for i, d in enumerate(docids)}
    out = np.zeros((len(docids), len(docids)), dtype=np.float32)
    start = 0
    for end in range(1, len(ranking) + 1):
        if end == len(ranking) or keys[end] != keys[start]:
            for d in ranking[start:end]:
                out[row[d], start:end] = 1.0 / (end - start)
            start = end
    return out


def _teacher_matrix(slate: Slate, with_clicks: bool) -> np.ndarray:
    """The teacher's ranking (clicked items first with ``with_clicks``), its ties shared."""
    ranking = clicks_first(slate.teacher, slate.clicked) if with_clicks else slate.teacher
    scores = slate.teacher_scores
    score_of = dict(zip(slate.teacher, scores)) if scores is not None else None
    hit = set(slate.clicked or ()) if with_clicks else set()
    keys: list[object] = [
        (d in hit, score_of[d]) if score_of is not None else i for i, d in enumerate(ranking)
    ]
    return _block_matrix(slate.docids, ranking, keys)


def grades(slate: Slate) -> dict[str, int]:
    """Each candidate's grade in the slate's judgements (0 when unjudged)."""
    judged = slate.relevance or {}
    return {d: judged.get(d, 0) for d in slate.docids}


def has_relevant_candidate(slate: Slate) -> bool:
    """Whether a relevance target can learn anything: some candidate is graded above 0."""
    return any(g > 0 for g in grades(slate).values())


def _relevance_matrix(slate: Slate, with_teacher: bool) -> np.ndarray:
    """Grades in order, best first; within a grade, shared uniformly or in the teacher's order."""
    grade = grades(slate)
    if with_teacher:
        ranking = sorted(slate.teacher, key=lambda d: -grade[d])  # stable: the teacher's order
        return _block_matrix(slate.docids, ranking, list(range(len(ranking))))
    ranking = sorted(slate.docids, key=lambda d: -grade[d])
    return _block_matrix(slate.docids, ranking, [grade[d] for d in ranking])


def clicks_first(ranking: list[str], clicked: list[str]) -> list[str]:
    """``ranking`` with the clicked items moved to the top, both groups in their given order."""
    hit = set(clicked)
    return [d for d in ranking if d in hit] + [d for d in ranking if d not in hit]


def target_matrix(slate: Slate, kind: str) -> np.ndarray:
    """The n x n target for ``slate``: rows are candidates (slate order), columns positions."""
    docids = slate.docids
    n = len(docids)
    if kind not in TARGETS:
        raise ValueError(f"unknown target {kind!r}: choose one of {list(TARGETS)}")
    if kind in ("teacher", "teacher+clicks", "teacher+relevance") and slate.teacher is None:
        raise ValueError(
            f"slate {slate.query.qid!r} has no 'teacher' ranking; label it with `spdrank teacher` "
            "or train with --target clicks"
        )
    if kind in ("clicks", "teacher+clicks") and not slate.clicked:
        raise ValueError(f"slate {slate.query.qid!r} has no 'clicked' items for target {kind!r}")
    if kind in RELEVANCE_TARGETS:
        if not has_relevant_candidate(slate):
            raise ValueError(
                f"slate {slate.query.qid!r} has no candidate graded above 0 in 'relevance' for "
                f"target {kind!r}"
            )
        return _relevance_matrix(slate, with_teacher=kind == "teacher+relevance")
    if kind in ("teacher", "teacher+clicks"):
        return _teacher_matrix(slate, with_clicks=kind == "teacher+clicks")
    hit = set(slate.clicked)
    c = len(hit)
    out = np.zeros((n, n), dtype=np.float32)
    for i, d in enumerate(docids):
        if d in hit:
            out[i, :c] = 1.0 / c
        elif c < n:
            out[i, c:] = 1.0 / (n - c)
    return out
