"""Ranking metrics: quality against clicks, agreement with a reference ranking, validity.

Everything here is a pure function over docid lists (no torch, no numpy), so the numbers a
benchmark reports can be checked by hand and reused by any caller.

Undefined values are ``None``, never a made-up number, and aggregation skips them:

- every click metric (:func:`auc`, :func:`auc_from_scores`, :func:`recall_at_k`,
  :func:`ndcg_at_k`, :func:`mrr`, :func:`mrr_at_k`) returns ``None`` when ``clicked`` is
  empty (no positive);
- :func:`auc` and :func:`auc_from_scores` also return ``None`` when every item is clicked
  (no negative to order a positive against). Recall, NDCG and MRR stay defined there
  (trivially: NDCG = MRR = 1), but :func:`slate_metrics` drops *all* click metrics for such
  a slate, because no ranking can do better or worse on it and because every click metric
  should average over the same slates;
- :func:`kendall_tau` returns ``None`` when the reference orders no pair (fewer than two
  items, or all of them tied), :func:`top1_agreement` and :func:`topk_overlap` for an empty
  ranking.

Agreement with a reference takes the reference's scores when it has them (a teacher that
ranks by a score gives many candidates the same one): tied items are not an order to imitate,
so only the pairs the reference orders strictly count, and a tie at the top or at the k-th
place counts every tied item as the reference's choice.

Clicked ids that a ranking does not contain are treated as ranked below everything (a miss),
which is what a truncated top-k list means, and what a click the retriever never returned
(``missed`` in :func:`slate_metrics`) is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from spdrank.eval.judged import DEFAULT_REL_LEVEL, judged_metric_names, judged_metrics

#: The k of the teacher overlap metric ``top{k}`` (:func:`topk_overlap`).
OVERLAP_K = 10

#: The metrics against the teacher (fidelity), in table order; the rest are click metrics.
TEACHER_METRICS: tuple[str, ...] = ("tau", "top1", f"top{OVERLAP_K}")


def metric_names(
    ks: Sequence[int] = (1, 10),
    mrr_ks: Sequence[int] = (),
    rel: int | None = None,
    clicks: bool = True,
) -> list[str]:
    """The names :func:`slate_metrics` fills, in table order: click metrics (unless
    ``clicks`` is False), the judged metrics when ``rel`` (their relevance level) is given,
    then the teacher's."""
    click = [
        "AUC", *(f"R@{k}" for k in ks), *(f"NDCG@{k}" for k in ks),
        *(f"MRR@{k}" for k in mrr_ks), "MRR",
    ] if clicks else []
    judged = judged_metric_names(ks, rel) if rel is not None else []
    return [*click, *judged, *TEACHER_METRICS]


# -- validity -------------------------------------------------------------------------------


def is_valid_permutation(ranking: Sequence[str], docids: Collection[str]) -> bool:
    """True iff ``ranking`` holds every docid exactly once and nothing else."""
    seen = set(ranking)
    return len(seen) == len(ranking) and seen == set(docids)


def repair_ranking(ranking: Iterable[str], docids: Sequence[str]) -> list[str]:
    """Make any output a permutation of ``docids``, the way rank_llm repairs LLM output.

    Keeps the first occurrence of each known docid in the order given, drops unknown and
    repeated ids, then appends the missing candidates in their original order. A valid
    ranking comes back unchanged.
    """
    known = set(docids)
    seen: set[str] = set()
    out: list[str] = []
    for d in ranking:
        if d in known and d not in seen:
            seen.add(d)
            out.append(d)
    out.extend(d for d in docids if d not in seen)
    return out


# -- click metrics --------------------------------------------------------------------------


def auc(ranking: Sequence[str], clicked: Collection[str]) -> float | None:
    """Fraction of (clicked, non-clicked) pairs of ``ranking`` where the clicked one is above.

    Negatives are the ranking's non-clicked items; a clicked id absent from the ranking sits
    below all of them. ``None`` without a positive or without a negative.
    """
    pos = set(clicked)
    if not pos:
        return None
    n_neg = sum(1 for d in ranking if d not in pos)
    if n_neg == 0:
        return None
    wins = 0
    negs_above = 0
    for d in ranking:
        if d in pos:
            wins += n_neg - negs_above
        else:
            negs_above += 1
    return wins / (len(pos) * n_neg)


def auc_from_scores(
    scores: Mapping[str, float] | Sequence[float],
    clicked: Collection[str] | Sequence[bool | int],
    docids: Sequence[str] | None = None,
) -> float | None:
    """AUC of real-valued scores (higher = better), ties counted as half a win.

    Three forms: ``auc_from_scores({"a": .9, "b": .1}, ["a"])``;
    ``auc_from_scores([.9, .1], ["a"], docids=["a", "b"])``; and, with no ``docids``,
    ``auc_from_scores([.9, .1], [1, 0])`` where ``clicked`` is 0/1 labels aligned with
    ``scores``. ``None`` without a positive or without a negative.
    """
    if isinstance(scores, Mapping):
        vals = [float(v) for v in scores.values()]
        pos = set(clicked)
        labels = [k in pos for k in scores]
    elif docids is not None:
        if len(docids) != len(scores):
            raise ValueError(f"{len(scores)} scores but {len(docids)} docids")
        vals = [float(v) for v in scores]
        pos = set(clicked)
        labels = [d in pos for d in docids]
    else:
        labels = [bool(x) for x in clicked]
        if len(labels) != len(scores):
            raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
        vals = [float(v) for v in scores]
    n_pos = sum(labels)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    # Mann-Whitney U with average ranks: a tie group shares the mean of its ranks, which is
    # exactly "a tied (positive, negative) pair counts 0.5".
    order = sorted(range(len(vals)), key=vals.__getitem__)
    rank_sum = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and vals[order[j + 1]] == vals[order[i]]:
            j += 1
        avg_rank = (i + j) / 2 + 1  # ranks are 1-based
        rank_sum += avg_rank * sum(1 for t in order[i : j + 1] if labels[t])
        i = j + 1
    u = rank_sum - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def recall_at_k(ranking: Sequence[str], clicked: Collection[str], k: int) -> float | None:
    """|clicked ∩ top-k| / |clicked|: with one target, the hit rate at k."""
    pos = set(clicked)
    if not pos:
        return None
    return sum(1 for d in ranking[:k] if d in pos) / len(pos)


def ndcg_at_k(ranking: Sequence[str], clicked: Collection[str], k: int) -> float | None:
    """NDCG@k with binary relevance; the ideal DCG puts min(k, |clicked|) hits on top."""
    pos = set(clicked)
    if not pos:
        return None
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranking[:k]) if d in pos)
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(pos))))
    return dcg / idcg


def mrr(ranking: Sequence[str], clicked: Collection[str]) -> float | None:
    """1 / (1-based rank of the first clicked item); 0 if none is ranked."""
    pos = set(clicked)
    if not pos:
        return None
    for i, d in enumerate(ranking):
        if d in pos:
            return 1.0 / (i + 1)
    return 0.0


def mrr_at_k(ranking: Sequence[str], clicked: Collection[str], k: int) -> float | None:
    """MRR cut at k: 1 / (1-based rank of the first clicked item) if it is in the top k, else 0."""
    return mrr(ranking[:k], clicked)


# -- agreement with a reference ranking -----------------------------------------------------


def kendall_tau(
    ranking: Sequence[str],
    reference: Sequence[str],
    reference_scores: Sequence[float] | None = None,
) -> float | None:
    """Kendall's tau between a ranking and a reference over the same items: 1 same, -1 reversed.

    Without ``reference_scores`` every pair is ordered by the reference (tau-a). With them
    (aligned with ``reference``, non-increasing), a pair the reference scores equally is a
    tie, not an order to imitate, and is left out: tau is (concordant - discordant) over the
    pairs with different reference scores. ``None`` when the reference orders no pair (fewer
    than two items, or all tied). Raises ``ValueError`` if the two hold different items or
    repeat one (a tau between different sets means nothing), or for unusable scores.
    """
    if len(set(reference)) != len(reference) or len(set(ranking)) != len(ranking):
        raise ValueError("kendall_tau: a ranking repeats an item")
    if set(ranking) != set(reference):
        extra = sorted(set(ranking) ^ set(reference))[:5]
        raise ValueError(f"kendall_tau: the rankings hold different items, e.g. {extra}")
    group = tie_groups(reference, reference_scores)
    n = len(reference)
    sizes = Counter(group.values())
    ordered = n * (n - 1) // 2 - sum(t * (t - 1) // 2 for t in sizes.values())
    if ordered == 0:
        return None
    discordant = _count_inversions([group[d] for d in ranking])
    return (ordered - 2 * discordant) / ordered


def tie_groups(
    reference: Sequence[str], reference_scores: Sequence[float] | None = None
) -> dict[str, int]:
    """Each item's tie group in the reference: 0 for the best, counting up.

    Without scores every item is its own group (its position). With them, consecutive items
    with equal scores share a group; the scores must be finite, one per item and
    non-increasing, else the order and the scores would disagree (``ValueError``).
    """
    if reference_scores is None:
        return {d: i for i, d in enumerate(reference)}
    scores = [float(s) for s in reference_scores]
    if len(scores) != len(reference):
        raise ValueError(f"{len(scores)} reference scores for {len(reference)} items")
    if not all(math.isfinite(s) for s in scores):
        raise ValueError("reference scores must be finite")
    if any(b > a for a, b in pairwise(scores)):
        raise ValueError("reference scores must be non-increasing along the reference")
    out: dict[str, int] = {}
    current = 0
    for i, (d, s) in enumerate(zip(reference, scores)):
        if i and s != scores[i - 1]:
            current += 1
        out[d] = current
    return out


def _count_inversions(seq: list[int]) -> int:
    """Pairs i < j with seq[i] > seq[j] strictly (equal values are no inversion), by merge
    sort (O(n log n))."""
    if len(seq) < 2:
        return 0
    mid = len(seq) // 2
    left, right = seq[:mid], seq[mid:]
    inv = _count_inversions(left) + _count_inversions(right)
    left.sort()
    right.sort()
    i = 0
    for r in right:
        while i < len(left) and left[i] <= r:
            i += 1
        inv += len(left) - i
    return inv


def top1_agreement(
    ranking: Sequence[str],
    reference: Sequence[str],
    reference_scores: Sequence[float] | None = None,
) -> float | None:
    """1.0 if the ranking's first item is the reference's first, else 0.0.

    With ``reference_scores`` any item of the reference's top-scored tie group counts as its
    first. ``None`` if either is empty.
    """
    if not ranking or not reference:
        return None
    group = tie_groups(reference, reference_scores)
    return 1.0 if group.get(ranking[0]) == 0 else 0.0


def topk_overlap(
    ranking: Sequence[str],
    reference: Sequence[str],
    k: int,
    reference_scores: Sequence[float] | None = None,
) -> float | None:
    """|ranking[:k] ∩ the reference's top k| / k: how much of the reference's head is kept.

    With ``reference_scores`` the reference's top k is every item scoring at least its k-th
    best score, so which of the items tied at the boundary a ranking keeps cannot cost it;
    the value still cannot pass 1, as ``ranking[:k]`` holds at most k items. ``k`` is cut to
    the reference's length (a slate of fewer than k items is kept whole by any ranking).
    ``None`` if either is empty.
    """
    if k < 1:
        raise ValueError(f"topk_overlap: k must be at least 1, got {k}")
    if not ranking or not reference:
        return None
    k = min(k, len(reference))
    group = tie_groups(reference, reference_scores)
    last = group[reference[k - 1]]
    head = {d for d, g in group.items() if g <= last}
    return sum(1 for d in ranking[:k] if d in head) / k


# -- per slate and aggregated ---------------------------------------------------------------


@dataclass
class SlateMetrics:
    """One ranker's metrics on one slate. ``values`` maps metric name to value or ``None``.

    ``valid`` says whether the raw output was a permutation of the candidates; the values
    are computed on the repaired ranking either way (see :func:`repair_ranking`).
    """

    valid: bool
    values: dict[str, float | None] = field(default_factory=dict)


def slate_metrics(
    ranking: Sequence[str],
    docids: Sequence[str],
    clicked: Collection[str] | None = None,
    teacher: Sequence[str] | None = None,
    ks: Sequence[int] = (1, 10),
    teacher_scores: Sequence[float] | None = None,
    mrr_ks: Sequence[int] = (),
    missed: Collection[str] = (),
    judgements: Mapping[str, int] | None = None,
    rel: int = DEFAULT_REL_LEVEL,
) -> SlateMetrics:
    """All metrics of one ranker output on one slate.

    Click metrics are ``None`` when the slate has no clicks or every candidate is clicked
    (nothing a ranking can get right or wrong there); teacher metrics are ``None`` without
    a teacher ranking. ``teacher_scores`` (aligned with ``teacher``) make the teacher metrics
    count the teacher's ties as ties (see :func:`kendall_tau`). ``mrr_ks`` adds ``MRR@k``.
    ``missed``: clicked items that are not candidates (the retriever did not return them),
    positives no ranking of the candidates can reach, so each counts as ranked last.
    ``judgements`` (graded, ``{docid: grade}``, the slate's ``relevance``) add the judged
    metrics of :mod:`spdrank.eval.judged` at relevance level ``rel``.
    """
    valid = is_valid_permutation(ranking, docids)
    ranked = list(ranking) if valid else repair_ranking(ranking, docids)
    values: dict[str, float | None] = {}
    shown = set(clicked or ()) & set(docids)
    pos = shown | (set(missed) - set(docids))
    informative = bool(pos) and len(shown) < len(docids)
    values["AUC"] = auc(ranked, pos) if informative else None
    for k in ks:
        values[f"R@{k}"] = recall_at_k(ranked, pos, k) if informative else None
    for k in ks:
        values[f"NDCG@{k}"] = ndcg_at_k(ranked, pos, k) if informative else None
    for k in mrr_ks:
        values[f"MRR@{k}"] = mrr_at_k(ranked, pos, k) if informative else None
    values["MRR"] = mrr(ranked, pos) if informative else None
    if judgements is not None:
        values.update(judged_metrics(ranked, judgements, ks, rel))
    values.update(_teacher_metrics(ranked, teacher, teacher_scores))
    return SlateMetrics(valid=valid, values=values)


def _teacher_metrics(
    ranked: Sequence[str], teacher: Sequence[str] | None, scores: Sequence[float] | None
) -> dict[str, float | None]:
    """The :data:`TEACHER_METRICS` of a repaired ranking; all ``None`` without a teacher."""
    if not teacher:
        return dict.fromkeys(TEACHER_METRICS)
    tau, top1, overlap = TEACHER_METRICS
    return {
        tau: kendall_tau(ranked, teacher, scores),
        top1: top1_agreement(ranked, teacher, scores),
        overlap: topk_overlap(ranked, teacher, OVERLAP_K, scores),
    }


@dataclass
class MetricSummary:
    """Mean over the slates where the metric is defined, and how many those were."""

    mean: float | None
    n: int


def aggregate(per_slate: Iterable[SlateMetrics]) -> dict[str, MetricSummary]:
    """Means over slates, skipping ``None`` and NaN; plus ``valid`` (fraction valid).

    Keys keep the order in which metrics first appear, so tables line up.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    n_valid = 0
    n = 0
    for sm in per_slate:
        n += 1
        n_valid += sm.valid
        for name, v in sm.values.items():
            sums.setdefault(name, 0.0)
            counts.setdefault(name, 0)
            if v is None or math.isnan(v):
                continue
            sums[name] += v
            counts[name] += 1
    out = {"valid": MetricSummary(n_valid / n if n else None, n)}
    for name, total in sums.items():
        c = counts[name]
        out[name] = MetricSummary(total / c if c else None, c)
    return out
