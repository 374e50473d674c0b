"""``spdrank eval`` normalises a slate's features once per trained model: its check's result is
what the model's prompt reads, whole or window by window (warm-up calls included), and the
rankings are the model's own."""

from __future__ import annotations

import json

import pytest

from tests.helpers import save_features_only_model

K = 8  # the model's positions


def slate_dict(qid: str, n: int, shift: int) -> dict:
    """A slate of ``n`` candidates whose features differ with ``shift``, so that one slate's
    features ranking another would show in its order."""
    return {"query": {"qid": qid, "text": "1. rose shampoo"}, "candidates": [
        {"docid": f"d{i}", "doc": {"title": f"item {i}"}, "score": ((7 * i + shift) % n) / n,
         "features": {"pop": (3 * i + shift) % 5}} for i in range(n)
    ]}


def ranked_docids(run: str) -> dict[str, list[str]]:
    """A TREC run's docids per qid, in the order written (rank 1 first)."""
    out: dict[str, list[str]] = {}
    for line in run.splitlines():
        qid, _, docid, *_ = line.split()
        out.setdefault(qid, []).append(docid)
    return out


@pytest.mark.parametrize("n", [3, 20])
def test_an_evaluated_slate_has_its_features_normalised_once(tmp_path, monkeypatch, n):
    from spdrank.commands.cli import build_parser
    from spdrank.core.features import FeatureNormalizer
    from spdrank.core.slates import Slate
    from spdrank.model.ranker import SPDRanker
    from spdrank.rankers.windows import WindowedRanker, Windows

    model_dir = save_features_only_model(tmp_path / "features-spd", K, std=(2.0, 0.25))
    slates = [slate_dict("u1", n, 0), slate_dict("u2", n, 3)]
    path = tmp_path / "slates.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in slates))
    model = SPDRanker.from_pretrained(model_dir)
    expected = {}
    for raw in slates:
        alone = Slate.from_dict(raw, text_fields=model.config.text_fields)
        ranking = (model.rank(alone.query, alone.candidates) if n <= K
                   else WindowedRanker(model, Windows(K, K // 2)).rank(alone))
        expected[alone.query.qid] = ranking.docids
    normalised = []
    real = FeatureNormalizer.__call__
    monkeypatch.setattr(FeatureNormalizer, "__call__",
                        lambda self, s: normalised.append(len(s)) or real(self, s))
    runs = tmp_path / "runs"
    argv = ["eval", "--slates", str(path), "--model", f"spd={model_dir}", "--device", "cpu",
            "--trec-dir", str(runs), "--no-progress",
            *(["--window", str(K)] if n > K else [])]
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    assert normalised == [n, n]  # each slate once, by its check; the warm-up reads it too
    assert ranked_docids((runs / "spd.trec").read_text()) == expected


def test_the_cut_counts_eval_prints_count_each_slate_once(tmp_path, tiny_backbone, capsys):
    """The untimed warm-up ranks the first slate again; what it cut is not counted, so the
    line says as many queries as there are slates."""
    from spdrank.commands.cli import main
    from spdrank.model.ranker import SPDRanker
    from tests.helpers import tiny_config

    SPDRanker.build(tiny_config(tiny_backbone, frozen=True, item_tokens=2)).save_pretrained(
        tmp_path / "m")
    path = tmp_path / "slates.jsonl"
    path.write_text("".join(json.dumps(slate_dict(f"u{i}", 4, i)) + "\n" for i in range(3)))
    assert main(["eval", "--slates", str(path), "--model", f"spd={tmp_path / 'm'}",
                 "--device", "cpu", "--ranker", "random", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "of 12 candidates (at 2 tokens), " in printed and " of 3 queries" in printed
