"""Metrics against hand-computed values, plus brute-force cross-checks."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from spdrank.metrics import (
    MetricSummary,
    SlateMetrics,
    aggregate,
    auc,
    auc_from_scores,
    is_valid_permutation,
    kendall_tau,
    metric_names,
    mrr,
    ndcg_at_k,
    recall_at_k,
    repair_ranking,
    slate_metrics,
    top1_agreement,
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


def test_slate_metrics_degenerate_slates_have_no_click_metrics():
    ids = list("abc")
    for clicked in (None, [], ids):
        sm = slate_metrics(ids, ids, clicked=clicked)
        assert all(sm.values[m] is None for m in ("AUC", "R@1", "R@10", "NDCG@1", "MRR"))
        assert sm.values["tau"] is None and sm.values["top1"] is None


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
