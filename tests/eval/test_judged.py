"""The judged metrics against ir-measures (trec_eval's own code, through pytrec_eval), on
generated runs and qrels: every metric, every query, to 1e-6."""

from __future__ import annotations

import random

import ir_measures
import pytest

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError
from spdrank.eval.evaluate import evaluate, format_table
from spdrank.eval.judged import judged_metric_names, judged_metrics


def _generated(seed: int) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """Runs and qrels with the cases trec_eval is particular about: judged documents outside
    the run, unjudged documents in it, queries whose judgements hold no relevant document,
    short runs, every document relevant."""
    rng = random.Random(seed)
    runs: dict[str, list[str]] = {}
    qrels: dict[str, dict[str, int]] = {}
    for q in range(40):
        qid = f"q{q}"
        pool = [f"d{q}_{i}" for i in range(rng.randint(1, 60))]
        ranked = rng.sample(pool, rng.randint(1, len(pool)))
        judged = rng.sample(pool, rng.randint(1, len(pool)))
        kind = q % 5
        grades = {
            0: lambda: rng.choice([0, 1, 2, 3]),
            1: lambda: 0,  # judged, nothing relevant
            2: lambda: rng.choice([2, 3]),  # every judged document relevant
            3: lambda: rng.choice([0, 0, 0, 1]),
            4: lambda: rng.choice([0, 1, 2, 3, 4]),
        }[kind]
        qrels[qid] = {d: grades() for d in judged}
        # Judged documents the run never retrieved still count.
        for extra in range(rng.randint(0, 5)):
            qrels[qid][f"x{q}_{extra}"] = rng.choice([1, 2, 3])
        runs[qid] = ranked
    return runs, qrels


def _reference(
    runs: dict[str, list[str]], qrels: dict[str, dict[str, int]], names: list[str]
) -> dict[tuple[str, str], float]:
    # Strictly decreasing scores along each ranking: trec_eval sorts by score, so it reads
    # the ranking's own order.
    run = {qid: {d: float(len(r) - i) for i, d in enumerate(r)} for qid, r in runs.items()}
    measures = [ir_measures.parse_measure(n) for n in names]
    return {
        (m.query_id, str(m.measure)): m.value
        for m in ir_measures.iter_calc(measures, qrels, run)
    }


@pytest.mark.parametrize("rel", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_metric_agrees_with_ir_measures(seed: int, rel: int) -> None:
    runs, qrels = _generated(seed)
    ks = (1, 5, 10, 20, 100)
    names = judged_metric_names(ks, rel)
    reference = _reference(runs, qrels, names)
    assert len(reference) == len(runs) * len(names)
    for qid, ranking in runs.items():
        ours = judged_metrics(ranking, qrels[qid], ks, rel)
        for name in names:
            assert ours[name] == pytest.approx(reference[(qid, name)], abs=1e-6), (qid, name)


def test_names_are_ir_measures_own() -> None:
    names = judged_metric_names((10, 100), 2) + judged_metric_names((10,), 1)
    assert names == [
        "nDCG@10", "nDCG@100", "AP(rel=2)", "R(rel=2)@10", "R(rel=2)@100", "RR(rel=2)",
        "P(rel=2)@10", "P(rel=2)@100", "nDCG@10", "AP", "R@10", "RR", "P@10",
    ]
    for name in names:
        assert str(ir_measures.parse_measure(name)) == name


def test_unjudged_query_is_none_and_unanswerable_query_is_zero() -> None:
    assert set(judged_metrics(["a", "b"], None, (10,)).values()) == {None}
    zero = judged_metrics(["a", "b"], {"a": 0, "z": 0}, (10,))
    assert set(zero.values()) == {0.0}


def _slate(qid: str, relevance: dict[str, int] | None) -> Slate:
    data = {
        "query": {"qid": qid, "text": "q"},
        "candidates": [{"docid": d, "doc": {"text": d}, "score": s}
                       for d, s in (("a", 3.0), ("b", 2.0), ("c", 1.0))],
    }
    if relevance is not None:
        data["relevance"] = relevance
    return Slate.from_dict(data)


class _Fixed:
    name = "fixed"

    def rank(self, slate: Slate) -> Ranking:
        return Ranking(docids=slate.docids)


def test_evaluate_counts_unanswerable_queries_and_never_drops_them() -> None:
    slates = [_slate("1", {"a": 2, "out": 3}), _slate("2", {"a": 0, "b": 1}), _slate("3", None)]
    results = evaluate([_Fixed()], slates, ks=(10,), warmup=0, rel=2)
    summary = results["fixed"].summary()
    # Query 2 has no document of grade >= 2: it scores 0 and is averaged in; query 3 has no
    # judgements at all and is left out, as trec_eval leaves out a query the qrels lack.
    assert summary["AP(rel=2)"].n == 2
    assert summary["AP(rel=2)"].mean == pytest.approx((1.0 / 2 + 0.0) / 2)
    table = format_table(results)
    assert "1 judged slates have no document of grade >= 2" in table
    assert "judged metrics over the 2 of 3 slates" in table
    assert "AUC" not in table  # no slate has clicks: the click columns are not shown


@pytest.mark.parametrize(
    ("relevance", "message"),
    [([1], "must be an object"), ({"a": -1}, "integer grade"), ({"a": 1.5}, "integer grade"),
     ({"a": True}, "integer grade"), ({"a": "2"}, "integer grade")],
)
def test_bad_relevance_is_refused_by_name(relevance: object, message: str) -> None:
    with pytest.raises(SlateError, match=message):
        _slate("1", relevance)  # type: ignore[arg-type]


def test_relevance_round_trips() -> None:
    slate = _slate("1", {"a": 2, "elsewhere": 1})
    assert Slate.from_dict(slate.to_dict()).relevance == {"a": 2, "elsewhere": 1}


def test_relevance_targets_order_the_grades() -> None:
    import numpy as np

    from spdrank.training.targets import target_matrix

    slate = Slate.from_dict({
        "query": {"qid": "1", "text": "q"},
        "candidates": [{"docid": d, "doc": {"text": d}} for d in ("a", "b", "c", "d")],
        "relevance": {"b": 2, "c": 1, "d": 1, "outside": 3},
        "teacher": ["d", "a", "c", "b"],
    })
    m = target_matrix(slate, "relevance")
    # b (grade 2) takes position 0; c and d (grade 1) share 1-2; a (unjudged) takes 3.
    np.testing.assert_allclose(m, [[0, 0, 0, 1], [1, 0, 0, 0], [0, .5, .5, 0], [0, .5, .5, 0]])
    t = target_matrix(slate, "teacher+relevance")
    # Grades first, the teacher's order within each: b, then d before c, then a.
    np.testing.assert_allclose(t, [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0]])
    slate.relevance = {"a": 0}
    with pytest.raises(ValueError, match="no candidate graded above 0"):
        target_matrix(slate, "relevance")
