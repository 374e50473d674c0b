"""Metrics against hand-computed values, plus brute-force cross-checks."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from spdrank.eval.metrics import (
    MetricSummary,
    SlateMetrics,
    aggregate,
    auc,
    auc_from_scores,
    is_valid_permutation,
    kendall_tau,
    metric_names,
    mrr,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    repair_ranking,
    slate_metrics,
    top1_agreement,
    topk_overlap,
)

TEN = list("abcdefghij")


# -- AUC ------------------------------------------------------------------------------------


def test_auc_by_hand():
    r = list("abcde")
    # positives b, d; negatives a, c, e: b beats c, e (2); d beats e (1) -> 3 / 6
    assert auc(r, ["b", "d"]) == pytest.approx(0.5)
    assert auc(r, ["a"]) == 1.0
    assert auc(r, ["e"]) == 0.0
    assert auc(r, ["c"]) == 0.5
    assert auc(r, ["b", "b"]) == 0.75  # repeated clicks count once


def test_auc_undefined():
    assert auc(list("abc"), []) is None
    assert auc(list("abc"), list("abc")) is None  # no negative


def test_auc_clicked_absent_from_ranking_is_ranked_last():
    # positives a (beats b, c) and x (absent: beats nothing) over negatives b, c -> 2 / 4
    assert auc(list("abc"), ["a", "x"]) == 0.5


def test_auc_from_scores_ties_count_half():
    scores = {"a": 0.9, "b": 0.5, "c": 0.5, "d": 0.1}
    # b vs a: 0, vs c: tie 0.5, vs d: 1 -> 1.5 / 3
    assert auc_from_scores(scores, ["b"]) == pytest.approx(0.5)
    # negatives a, c: b vs a 0, b vs c tie 0.5; d loses to both -> 0.5 / (2 * 2)
    assert auc_from_scores(scores, ["b", "d"]) == pytest.approx(0.125)
    # negatives b, d: c vs b tie 0.5, c vs d 1; a beats both -> 3.5 / 4
    assert auc_from_scores(scores, ["a", "c"]) == pytest.approx(0.875)
    assert auc_from_scores({"a": 1.0, "b": 1.0, "c": 1.0}, ["a"]) == 0.5
    assert auc_from_scores(scores, []) is None
    assert auc_from_scores(scores, list(scores)) is None


def test_auc_from_scores_forms_agree():
    scores = {"a": 0.9, "b": 0.5, "c": 0.5, "d": 0.1}
    ids, vals = list(scores), list(scores.values())
    want = auc_from_scores(scores, ["c"])
    assert auc_from_scores(vals, ["c"], docids=ids) == want
    assert auc_from_scores(vals, [0, 0, 1, 0]) == want
    with pytest.raises(ValueError):
        auc_from_scores(vals, [0, 1])
    with pytest.raises(ValueError):
        auc_from_scores(vals, ["a"], docids=ids[:2])


def test_auc_from_scores_matches_brute_force_and_ranking_auc():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(2, 12)
        vals = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)]  # many ties
        labels = [rng.random() < 0.3 for _ in range(n)]
        pos = [v for v, y in zip(vals, labels) if y]
        neg = [v for v, y in zip(vals, labels) if not y]
        got = auc_from_scores(vals, labels)
        if not pos or not neg:
            assert got is None
            continue
        wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
        assert got == pytest.approx(wins / (len(pos) * len(neg)))
        # without ties, the AUC of scores equals the AUC of the ranking they induce
        distinct = [v + i * 1e-6 for i, v in enumerate(vals)]
        ids = [str(i) for i in range(n)]
        ranking = sorted(ids, key=lambda d: -distinct[int(d)])
        clicked = [d for d, y in zip(ids, labels) if y]
        assert auc(ranking, clicked) == pytest.approx(auc_from_scores(distinct, labels))


# -- recall, NDCG, MRR ------------------------------------------------------------------------


def test_recall_by_hand():
    assert recall_at_k(TEN, ["c", "h"], 1) == 0.0
    assert recall_at_k(TEN, ["c", "h"], 3) == 0.5
    assert recall_at_k(TEN, ["c", "h"], 10) == 1.0
    assert recall_at_k(TEN, ["a"], 1) == 1.0
    assert recall_at_k(TEN, ["a", "x"], 10) == 0.5  # x is never retrieved
    assert recall_at_k(TEN, [], 10) is None


def test_ndcg_by_hand():
    # one hit at rank 3: DCG = 1/log2(4) = 0.5; ideal with two clicks: 1 + 1/log2(3)
    assert ndcg_at_k(TEN, ["c", "h"], 3) == pytest.approx(0.5 / (1 + 1 / math.log2(3)))
    # hits at 3 and 8: 1/log2(4) + 1/log2(9) = (1 + 1/log2(3)) / 2 exactly half the ideal
    assert ndcg_at_k(TEN, ["c", "h"], 10) == pytest.approx(0.5)
    assert ndcg_at_k(TEN, ["a"], 1) == 1.0
    assert ndcg_at_k(TEN, ["b"], 1) == 0.0
    # ideal DCG over min(k, |clicked|): at k=1 with two clicks the ideal is one hit
    assert ndcg_at_k(TEN, ["a", "b"], 1) == 1.0
    assert ndcg_at_k(TEN, ["b"], 10) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(TEN, [], 10) is None


def test_mrr_by_hand():
    assert mrr(TEN, ["c", "h"]) == pytest.approx(1 / 3)
    assert mrr(TEN, ["a"]) == 1.0
    assert mrr(TEN, ["x"]) == 0.0
    assert mrr(TEN, []) is None


# -- agreement --------------------------------------------------------------------------------


def test_kendall_tau_by_hand():
    ref = list("abcd")
    assert kendall_tau(list("abcd"), ref) == 1.0
    assert kendall_tau(list("dcba"), ref) == -1.0
    assert kendall_tau(list("bacd"), ref) == pytest.approx(2 / 3)  # 1 of 6 pairs discordant
    assert kendall_tau(["a"], ["a"]) is None


def test_kendall_tau_rejects_different_sets():
    with pytest.raises(ValueError):
        kendall_tau(list("abc"), list("abd"))
    with pytest.raises(ValueError):
        kendall_tau(list("aab"), list("abb"))
    with pytest.raises(ValueError):
        kendall_tau(list("ab"), list("abc"))


def test_kendall_tau_matches_brute_force():
    rng = random.Random(2)
    for n in range(2, 30):
        ref = [f"d{i}" for i in range(n)]
        ranking = ref[:]
        rng.shuffle(ranking)
        pos = {d: i for i, d in enumerate(ref)}
        s = sum(
            1 if pos[x] < pos[y] else -1 for x, y in itertools.combinations(ranking, 2)
        )
        assert kendall_tau(ranking, ref) == pytest.approx(s / (n * (n - 1) / 2))


def test_top1_agreement():
    assert top1_agreement(list("abc"), list("acb")) == 1.0
    assert top1_agreement(list("bac"), list("abc")) == 0.0
    assert top1_agreement([], list("abc")) is None


# -- agreement with a reference that has ties -------------------------------------------------


def test_kendall_tau_with_ties_counts_only_the_pairs_the_reference_orders():
    # reference a > {b, c} > d: of the 6 pairs, (b, c) is a tie; 5 are ordered.
    ref, scores = list("abcd"), [3.0, 1.0, 1.0, 0.0]
    assert kendall_tau(list("acbd"), ref, scores) == 1.0  # the tie's order costs nothing
    assert kendall_tau(list("acbd"), ref) == pytest.approx(2 / 3)  # tau-a counts (b, c): 5-1 / 6
    # b a d c: (a,b) discordant, (c,d) discordant; (a,c) (a,d) (b,d) concordant -> (3-2)/5
    assert kendall_tau(list("badc"), ref, scores) == pytest.approx(1 / 5)
    assert kendall_tau(list("badc"), ref) == pytest.approx((4 - 2) / 6)  # tau-a: (b, c) too
    assert kendall_tau(list("dcba"), ref, scores) == -1.0


def test_kendall_tau_is_none_when_the_reference_orders_no_pair():
    assert kendall_tau(list("cab"), list("abc"), [0.0, 0.0, 0.0]) is None
    assert kendall_tau(["a"], ["a"], [1.0]) is None
    # a above the tied b, c: two ordered pairs, (c, a) discordant and (a, b) concordant
    assert kendall_tau(list("cab"), list("abc"), [1.0, 0.0, 0.0]) == 0.0
    assert kendall_tau(list("bca"), list("abc"), [1.0, 0.0, 0.0]) == -1.0
    assert kendall_tau(list("ba"), list("ab"), [1.0, 1.0]) is None


def test_kendall_tau_with_distinct_scores_is_tau_a():
    rng = random.Random(5)
    for n in range(2, 20):
        ref = [f"d{i}" for i in range(n)]
        ranking = rng.sample(ref, n)
        scores = [float(n - i) for i in range(n)]
        assert kendall_tau(ranking, ref, scores) == kendall_tau(ranking, ref)


def test_kendall_tau_with_ties_matches_brute_force():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(2, 12)
        ref = [f"d{i}" for i in range(n)]
        scores = sorted((float(rng.randint(0, 3)) for _ in range(n)), reverse=True)
        ranking = rng.sample(ref, n)
        score = dict(zip(ref, scores))
        signs = [
            (score[x] > score[y]) - (score[x] < score[y])
            for x, y in itertools.combinations(ranking, 2)
        ]
        ordered = sum(1 for s in signs if s)
        expected = sum(signs) / ordered if ordered else None
        assert kendall_tau(ranking, ref, scores) == pytest.approx(expected)


@pytest.mark.parametrize(
    "scores,problem",
    [
        ([1.0, 2.0, 0.0], "non-increasing"),
        ([1.0, 0.0], "2 reference scores for 3 items"),
        ([1.0, float("nan"), 0.0], "finite"),
    ],
)
def test_reference_scores_must_fit_the_reference(scores, problem):
    with pytest.raises(ValueError, match=problem):
        kendall_tau(list("abc"), list("abc"), scores)
    with pytest.raises(ValueError, match=problem):
        top1_agreement(list("abc"), list("abc"), scores)


def test_top1_agreement_with_a_tied_top_group():
    ref, scores = list("abcd"), [0.5, 0.5, 0.5, 0.1]
    assert top1_agreement(list("cabd"), ref, scores) == 1.0  # c shares the top score
    assert top1_agreement(list("cabd"), ref) == 0.0  # without scores only a is first
    assert top1_agreement(list("dabc"), ref, scores) == 0.0
    assert top1_agreement(list("badc"), ref, [0.5, 0.4, 0.4, 0.1]) == 0.0  # no tie at the top


def test_topk_overlap_by_hand():
    ref = list("abcdef")
    assert topk_overlap(list("abcdef"), ref, 3) == 1.0
    assert topk_overlap(list("abdcef"), ref, 3) == pytest.approx(2 / 3)
    assert topk_overlap(list("fedcba"), ref, 3) == 0.0
    assert topk_overlap(list("fedcba"), ref, 6) == 1.0  # the whole slate
    assert topk_overlap(list("fedcba"), ref, 10) == 1.0  # k cut to the slate's size
    assert topk_overlap([], ref, 3) is None
    with pytest.raises(ValueError):
        topk_overlap(ref, ref, 0)


def test_topk_overlap_boundary_ties_cannot_penalise():
    # top 3 of a > b > {c, d, e} > f: the third place is a three-way tie
    ref, scores = list("abcdef"), [5.0, 4.0, 1.0, 1.0, 1.0, 0.0]
    assert topk_overlap(list("abedcf"), ref, 3, scores) == 1.0  # e is as good as c
    assert topk_overlap(list("abedcf"), ref, 3) == pytest.approx(2 / 3)  # tie ignored
    assert topk_overlap(list("abfcde"), ref, 3, scores) == pytest.approx(2 / 3)  # f is not
    # every item tied: any top k is the reference's, and the value stays at most 1
    assert topk_overlap(list("fedcba"), ref, 3, [0.0] * 6) == 1.0
    assert topk_overlap(list("cdabef"), ref, 2, scores) == 0.0  # a and b are not tied


# -- validity ---------------------------------------------------------------------------------


def test_is_valid_permutation():
    ids = list("abcd")
    assert is_valid_permutation(list("dcba"), ids)
    assert not is_valid_permutation(list("abc"), ids)  # missing
    assert not is_valid_permutation(list("abcdd"), ids)  # repeated
    assert not is_valid_permutation(list("abcx"), ids)  # unknown
    assert not is_valid_permutation(list("abcdx"), ids)  # extra
    assert not is_valid_permutation(list("aabc"), ids)


def test_repair_ranking():
    ids = list("abcd")
    assert repair_ranking(["c", "x", "c", "a"], ids) == ["c", "a", "b", "d"]
    assert repair_ranking([], ids) == ids
    assert repair_ranking(list("dcba"), ids) == list("dcba")


# -- per slate and aggregation ----------------------------------------------------------------


def test_slate_metrics_by_hand():
    sm = slate_metrics(TEN, TEN, clicked=["c", "h"], teacher=list(reversed(TEN)))
    assert sm.valid
    assert list(sm.values) == metric_names((1, 10))
    assert sm.values["AUC"] == pytest.approx((6 + 2) / (2 * 8))
    assert sm.values["R@1"] == 0.0 and sm.values["R@10"] == 1.0
    assert sm.values["NDCG@10"] == pytest.approx(0.5)
    assert sm.values["MRR"] == pytest.approx(1 / 3)
    assert sm.values["tau"] == -1.0 and sm.values["top1"] == 0.0
    assert sm.values["top10"] == 1.0  # ten candidates: every ranking keeps the whole slate


def test_mrr_at_k_cuts_the_reciprocal_rank_at_k():
    ranking = list("abcde")
    assert mrr_at_k(ranking, ["c"], 5) == mrr_at_k(ranking, ["c"], 3) == pytest.approx(1 / 3)
    assert mrr_at_k(ranking, ["c"], 2) == 0.0
    assert mrr_at_k(ranking, [], 2) is None
    sm = slate_metrics(TEN, TEN, clicked=["c"], ks=(1, 5), mrr_ks=(1, 5))
    assert list(sm.values) == metric_names((1, 5), (1, 5))
    assert list(sm.values)[:9] == [
        "AUC", "R@1", "R@5", "NDCG@1", "NDCG@5", "MRR@1", "MRR@5", "MRR", "tau",
    ]
    assert sm.values["MRR@1"] == 0.0 and sm.values["MRR@5"] == pytest.approx(1 / 3)
    assert "MRR@10" not in slate_metrics(TEN, TEN, clicked=["c"]).values  # opt-in


def test_a_click_the_retriever_missed_counts_as_a_miss():
    """A slate whose target was not retrieved: no ranking of its candidates can reach it."""
    sm = slate_metrics(list("abc"), list("abc"), clicked=[], missed=["z"], ks=(1, 3),
                       mrr_ks=(3,))
    assert sm.values["R@3"] == 0.0 and sm.values["NDCG@3"] == 0.0
    assert sm.values["MRR"] == 0.0 and sm.values["MRR@3"] == 0.0 and sm.values["AUC"] == 0.0
    both = slate_metrics(list("abc"), list("abc"), clicked=["a"], missed=["z"], ks=(1,))
    assert both.values["R@1"] == 0.5  # one of the two clicks found, the other never shown
    assert slate_metrics(list("abc"), list("abc"), clicked=[]).values["R@1"] is None


def test_slate_metrics_degenerate_slates_have_no_click_metrics():
    ids = list("abc")
    for clicked in (None, [], ids):
        sm = slate_metrics(ids, ids, clicked=clicked)
        assert all(sm.values[m] is None for m in ("AUC", "R@1", "R@10", "NDCG@1", "MRR"))
        assert sm.values["tau"] is None and sm.values["top1"] is None
        assert sm.values["top10"] is None


def test_slate_metrics_with_teacher_scores():
    ids = [f"d{i}" for i in range(12)]
    teacher = ids[:]
    scores = [1.0, 0.5] + [0.0] * 10  # the lexical teacher: most candidates at 0.0
    ranking = ["d1", "d0", *reversed(ids[2:])]  # top pair swapped, the 0.0 block reversed
    sm = slate_metrics(ranking, ids, teacher=teacher, teacher_scores=scores)
    # ordered pairs: (d0, d1) and each of d0, d1 with the 10 tied: 21; one discordant
    assert sm.values["tau"] == pytest.approx((21 - 2) / 21)
    assert sm.values["top1"] == 0.0
    assert sm.values["top10"] == 1.0  # the 10th best score is 0.0: every candidate is top 10
    plain = slate_metrics(ranking, ids, teacher=teacher)
    # tau-a: 1 + 45 of 66 pairs discordant; top 10: d0..d9, of which d2, d3 fell out
    assert plain.values["tau"] == pytest.approx((66 - 2 * 46) / 66)
    assert plain.values["top10"] == pytest.approx(0.8)
    tied = slate_metrics(ranking, ids, teacher=teacher, teacher_scores=[0.0] * 12)
    assert tied.values["tau"] is None and tied.values["top1"] == 1.0


def test_slate_metrics_repairs_invalid_output():
    ids = list("abcd")
    sm = slate_metrics(["x", "d", "d"], ids, clicked=["a"], teacher=ids)
    assert not sm.valid
    # repaired: d, a, b, c
    assert sm.values["R@1"] == 0.0 and sm.values["MRR"] == 0.5
    assert sm.values["tau"] == pytest.approx(0.0)  # 3 of 6 pairs discordant


def test_aggregate_skips_undefined():
    per = [
        SlateMetrics(True, {"AUC": 1.0, "tau": None}),
        SlateMetrics(False, {"AUC": None, "tau": 0.5}),
        SlateMetrics(True, {"AUC": 0.0, "tau": float("nan")}),
    ]
    agg = aggregate(per)
    assert agg["valid"].mean == pytest.approx(2 / 3) and agg["valid"].n == 3
    assert agg["AUC"] == MetricSummary(0.5, 2)
    assert agg["tau"] == MetricSummary(0.5, 1)
    assert aggregate([]) == {"valid": MetricSummary(None, 0)}
