"""``spdrank rank`` normalises a slate's features once: its check's result is what the prompt
reads, whole or window by window, and the ranking is the model's own."""

from __future__ import annotations

import json

import pytest

from tests.helpers import save_features_only_model

K = 8  # the model's positions


@pytest.mark.parametrize("n", [3, 20])
def test_a_ranked_slate_has_its_features_normalised_once(tmp_path, monkeypatch, n):
    from spdrank.commands.cli import build_parser
    from spdrank.core.features import FeatureNormalizer
    from spdrank.core.slates import Slate
    from spdrank.model.ranker import SPDRanker
    from spdrank.rankers.windows import WindowedRanker, Windows

    model_dir = save_features_only_model(tmp_path / "features-spd", K, std=(2.0, 0.25))
    slate = {"query": {"qid": "u1", "text": "1. rose shampoo"}, "candidates": [
        {"docid": f"d{i}", "doc": {"title": f"item {i}"}, "score": (7 * i % n) / n,
         "features": {"pop": (3 * i) % 5}} for i in range(n)
    ]}
    slates = tmp_path / "slates.jsonl"
    slates.write_text(json.dumps(slate) + "\n")
    model = SPDRanker.from_pretrained(model_dir)
    alone = Slate.from_dict(slate, text_fields=model.config.text_fields)
    expected = (model.rank(alone.query, alone.candidates) if n <= K
                else WindowedRanker(model, Windows(K, K // 2)).rank(alone))
    normalised = []
    real = FeatureNormalizer.__call__
    monkeypatch.setattr(FeatureNormalizer, "__call__",
                        lambda self, s: normalised.append(len(s)) or real(self, s))
    out = tmp_path / "ranked.jsonl"
    argv = ["rank", "--model", str(model_dir), "--input", str(slates), "--output", str(out),
            "--device", "cpu", *(["--window", str(K)] if n > K else [])]
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    assert normalised == [n]
    ranked = json.loads(out.read_text())
    assert [c["docid"] for c in ranked["candidates"]] == expected.docids


def test_a_features_only_model_reports_no_token_budget(tmp_path, capsys):
    """A model that reads no text cuts none: its run says what it ranked, not "0 of 0
    candidates cut", and with windows it still says the prefills spent."""
    from spdrank.commands.cli import build_parser

    model_dir = save_features_only_model(tmp_path / "features-spd", K, std=(2.0, 0.25))
    slate = {"query": {"qid": "u1", "text": "1. rose shampoo"}, "candidates": [
        {"docid": f"d{i}", "doc": {"title": f"item {i}"}, "score": i / 12,
         "features": {"pop": i % 5}} for i in range(12)]}
    slates = tmp_path / "slates.jsonl"
    for window in ([], ["--window", str(K)]):
        kept = slate["candidates"] if window else slate["candidates"][:K]
        slates.write_text(json.dumps(slate | {"candidates": kept}) + "\n")
        argv = ["rank", "--model", str(model_dir), "--input", str(slates), "--output",
                str(tmp_path / "ranked.jsonl"), "--device", "cpu", *window]
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert "ranked 1 slates" in out
        assert "token budget" not in out
        assert ("windows" in out) == bool(window), out
