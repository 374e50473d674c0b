"""Sliding windows: RankGPT's bottom-up scheme, a permutation of the whole slate, passes counted."""

from __future__ import annotations

import pytest

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate
from spdrank.rankers.windows import WindowedRanker, Windows, rank_windowed


def _slate(n: int) -> Slate:
    return Slate.from_dict({
        "query": "q",
        "candidates": [{"docid": f"d{i}", "doc": {"text": f"t{i}"}} for i in range(n)],
        "relevance": {"d0": 1},
    })


class _ByNumber:
    """Ranks by the number in the docid, highest first: a perfect oracle for 'high is best'."""

    name = "oracle"

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def rank(self, slate: Slate) -> Ranking:
        self.sizes.append(len(slate))
        assert slate.relevance is None  # a window carries no labels of the whole slate
        ids = sorted(slate.docids, key=lambda d: -int(d[1:]))
        return Ranking(docids=ids, decode_passes=1, timings={"prefill": 2.0})


def test_spans_go_bottom_up_and_cover_the_slate() -> None:
    assert Windows(20, 10).spans(100)[:2] == [(80, 100), (70, 90)]
    assert Windows(20, 10).spans(100)[-1] == (0, 20)
    assert Windows(20, 10).passes(100) == 9
    assert Windows(20, 10).spans(15) == [(0, 15)]
    assert Windows(4, 4).spans(10) == [(6, 10), (2, 6), (0, 2)]


def test_the_best_candidates_bubble_to_the_top() -> None:
    oracle = _ByNumber()
    ranking = rank_windowed(_slate(100), Windows(20, 10), oracle.rank)
    # One bottom-up sweep brings the best window - stride items to the top in order.
    assert ranking.docids[:10] == [f"d{i}" for i in range(99, 89, -1)]
    assert sorted(ranking.docids) == sorted(_slate(100).docids)
    assert ranking.decode_passes == 9 and oracle.sizes == [20] * 9
    assert ranking.timings == {"prefill": 18.0}


def test_a_slate_within_a_window_is_ranked_once() -> None:
    oracle = _ByNumber()
    slate = _slate(5)
    slate.relevance = None
    assert WindowedRanker(oracle, Windows(20, 10)).rank(slate).decode_passes == 1


def test_indices_point_into_the_slate() -> None:
    ranking = WindowedRanker(_ByNumber(), Windows(3, 2)).rank(_slate(7))
    assert [f"d{i}" for i in ranking.indices] == ranking.docids


@pytest.mark.parametrize(("window", "stride"), [(1, 1), (10, 0), (10, 11)])
def test_bad_schemes_are_refused(window: int, stride: int) -> None:
    with pytest.raises(ValueError, match="window|stride"):
        Windows(window, stride)


def _long_slates(path, n: int = 20) -> None:
    import json

    rows = [{"query": {"qid": f"q{j}", "text": "red gel"},
             "candidates": [{"docid": f"d{i}", "doc": {"title": f"blue soap number {i}"}}
                            for i in range(n)]} for j in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rank_and_eval_run_a_model_over_windows(tmp_path, tiny_backbone, capsys):
    import json

    import torch

    from spdrank.commands.cli import main
    from spdrank.model.ranker import SPDRanker
    from tests.helpers import tiny_config

    torch.manual_seed(0)
    SPDRanker.build(tiny_config(tiny_backbone, positions=8)).save_pretrained(tmp_path / "m")
    _long_slates(tmp_path / "s.jsonl")
    args = ["rank", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "s.jsonl"),
            "--output", str(tmp_path / "out.jsonl")]
    assert main(args) == 2  # 20 candidates, K = 8: refused without windows
    assert "at most 8" in capsys.readouterr().err
    assert main([*args, "--window", "8", "--window-stride", "4"]) == 0
    out = capsys.readouterr().out
    assert f"{2 * Windows(8, 4).passes(20)} prefills for 2 slates" in out
    assert "cut to the token budget" in out
    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        ranked = [c["docid"] for c in json.loads(line)["candidates"]]
        assert sorted(ranked) == sorted(f"d{i}" for i in range(20))
    assert main(["eval", "--slates", str(tmp_path / "s.jsonl"), "--model",
                 f"w={tmp_path / 'm'}", "--window", "8", "--json", str(tmp_path / "e.json"),
                 "--no-progress"]) == 0
    row = json.loads((tmp_path / "e.json").read_text())["rankers"]["w"]
    assert row["valid_pct"] == 100.0
    assert row["decode_passes_mean"] == Windows(8, 4).passes(20)  # the default stride: W / 2


class _FakeModel:
    """A model as the windowed ranker sees one: a K, ``encode`` (every second candidate cut)
    and ``rank_batch`` from the encoded prompts."""

    name = "model"

    def __init__(self, k: int) -> None:
        from types import SimpleNamespace

        self.config = SimpleNamespace(head=SimpleNamespace(positions=k))
        self.decoders: list[str | None] = []

    def encode(self, slate: Slate, features=None):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[0] * (3 * len(slate)), query_truncated=False,
                               truncated=[int(d[1:]) % 2 == 1 for d in slate.docids])

    def rank_batch(self, slates, decoder=None, encoded=None):
        assert encoded is not None and len(encoded) == len(slates)  # ranked from its prompts
        self.decoders.append(decoder)
        return [_ByNumber().rank(s) for s in slates]


def test_a_model_is_ranked_from_its_prompts_and_counted() -> None:
    model = _FakeModel(k=4)
    windowed = WindowedRanker(model, Windows(4, 2), decoder="greedy")
    ranking = windowed.rank(_slate(7))
    assert ranking.docids[:2] == ["d6", "d5"] and model.decoders == ["greedy"] * 3
    prompts = windowed.prompts
    assert prompts.truncated == {f"d{i}": i % 2 == 1 for i in range(7)}
    assert prompts.tokens == 3 * (4 + 4 + 3)  # windows [3, 7), [1, 5), [0, 3)
    small = _slate(3)
    small.relevance = None
    windowed.rank_batch([small, _slate(7)])
    assert (windowed.passes, windowed.slates) == (3 + 1 + 3, 3)
    assert windowed.summary() == "7 prefills for 3 slates (windows of 4, stride 2)"


def test_a_window_over_the_models_k_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--window 5 is over m's K \(4\)"):
        WindowedRanker(_FakeModel(k=4), Windows(5, 2), whose="m's")


def test_a_window_stops_when_asked() -> None:
    class Gone(Exception):
        pass

    def stop(part: Slate) -> None:
        raise Gone

    with pytest.raises(Gone):
        WindowedRanker(_FakeModel(k=4), Windows(4, 2)).rank(_slate(7), stop)
