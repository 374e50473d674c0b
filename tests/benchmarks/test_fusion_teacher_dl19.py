"""benchmarks/fusion_teacher_dl19.py: its summary, on hand-made numbers (the script's
measurements need the real encoder)."""

from __future__ import annotations

import importlib

import pytest

from tests.helpers import ROOT


@pytest.fixture
def fusion(monkeypatch):
    """The script as a module (it imports serve_harness from its own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("fusion_teacher_dl19")


def test_fusion_summary_pairs_rows_and_checks_the_replay(fusion):
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
