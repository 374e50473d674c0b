"""benchmarks/dense_speed.py and benchmarks/fusion_teacher_dl19.py: their batches, padding
counts and summaries, on hand-made numbers (the scripts' measurements need the real encoder)."""

from __future__ import annotations

import importlib

import pytest

from tests.helpers import ROOT


@pytest.fixture
def scripts(monkeypatch):
    """The two scripts as modules (they import serve_harness from their own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("dense_speed"), importlib.import_module("fusion_teacher_dl19")


def test_the_code_before_batched_in_order_and_padded_to_each_batchs_longest(scripts):
    dense, _ = scripts
    assert dense.in_order_batches(5, size=2) == [[0, 1], [2, 3], [4]]
    lengths = [3, 10, 2, 2]
    assert dense.padded_tokens(lengths, dense.in_order_batches(4, size=2)) == 2 * 10 + 2 * 2
    sorted_batches = dense.length_batches(lengths, 8)
    assert dense.padded_tokens(lengths, sorted_batches) == 2 * 2 + 3 + 10


def test_dense_summary_is_medians_speedups_and_padding(scripts):
    dense, _ = scripts
    rows = [{"real_tokens": 10, "ms": {"a": 100.0, "b": 40.0}, "padded_tokens": {"a": 20, "b": 11},
             "score_diff": {"a": 0.0, "b": 1e-7}},
            {"real_tokens": 10, "ms": {"a": 300.0, "b": 60.0}, "padded_tokens": {"a": 20, "b": 11},
             "score_diff": {"a": 0.0, "b": 3e-7}}]
    a, b = dense.summarize(rows, ["a", "b"])
    assert (a["p50_ms"], b["p50_ms"]) == (200.0, 50.0)
    assert b["speedup_p50"] == 4.0 and a["speedup_p50"] == 1.0
    assert (a["padded_over_real_tokens"], b["padded_over_real_tokens"]) == (2.0, 1.1)
    assert b["max_score_diff_vs_before"] == 3e-7


def test_fusion_summary_pairs_rows_and_checks_the_replay(scripts):
    _, fusion = scripts
    names = ["retriever", "dense", fusion.RRF, "fusion:rrf:run:/x/dense.trec+retriever"]
    ndcg = {"retriever": [0.5, 0.4], "dense": [0.7, 0.6], fusion.RRF: [0.8, 0.6],
            names[3]: [0.8, 0.6]}
    table = {n: {q: {"nDCG@10": ndcg[n][i], "AP(rel=2)": 0.1, "R(rel=2)@100": 0.5,
                     "latency_ms": 1.0 + i} for i, q in enumerate(["q1", "q2"])} for n in names}
    out = fusion.summarize(table)
    assert out["queries"] == 2 and out["replay_matches_live"] == {fusion.RRF: True}
    assert out["rows"][fusion.RRF]["nDCG@10"] == pytest.approx(0.7)
    assert out["rows"][fusion.RRF]["nDCG@10 - dense"]["mean"] == pytest.approx(0.05)
    assert out["rows"]["dense"]["ms_per_query_p50"] == 1.5
    table[names[3]]["q2"]["nDCG@10"] = 0.5
    assert fusion.summarize(table)["replay_matches_live"] == {fusion.RRF: False}
    assert fusion.label(names[3]) == "fusion:rrf:run:dense.trec+retriever (replay of dense's run)"
