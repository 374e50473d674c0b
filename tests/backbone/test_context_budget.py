"""Long candidates: the budget fits the backbone's context, and a prompt over it is refused
with its numbers, never cut silently; what was cut is counted."""

from __future__ import annotations

import pytest
import torch

from spdrank.backbone.prompt import fitted_item_tokens
from spdrank.backbone.templates import SEARCH
from spdrank.core.slates import Slate, SlateError
from spdrank.model.ranker import SPDRanker
from tests.helpers import tiny_config, train_config


def _slate(n: int, words: int) -> Slate:
    return Slate.from_dict({
        "query": {"qid": "q1", "text": "flea"},
        "candidates": [{"docid": f"d{i}", "doc": {"text": " ".join(["flea"] * words)}}
                       for i in range(n)],
    })


def test_the_fitted_budget_shares_the_context_among_k_candidates() -> None:
    assert fitted_item_tokens(8192, 20, 512) == (8192 - 512 - 192) // 20 - 6
    assert fitted_item_tokens(8192, 1000, 512) == 8  # never below the floor
    assert fitted_item_tokens(1 << 20, 2, 512) == 512  # nor above the cap


def test_search_training_fits_the_budget_and_recommendation_keeps_32(tmp_path, tiny_backbone):
    rec = train_config(tmp_path, tiny_backbone, positions=16)
    rec.max_item_tokens = None
    assert rec.model_config().prompt.max_item_tokens == 32
    search = train_config(tmp_path, tiny_backbone, positions=16, prompt="search")
    search.max_item_tokens = None
    config = search.model_config()
    assert config.prompt.max_item_tokens is None
    model = SPDRanker.build(config)
    # The tiny Llama has 4,096 positions: the budget lets 16 candidates and the query fit.
    assert model.config.prompt.max_item_tokens == fitted_item_tokens(4096, 16, 512)
    model.save_pretrained(tmp_path / "m")
    again = SPDRanker.from_pretrained(tmp_path / "m")
    assert again.config.prompt.max_item_tokens == model.config.prompt.max_item_tokens


def test_a_prompt_over_the_backbones_positions_is_refused_with_its_numbers(tiny_backbone):
    torch.manual_seed(0)
    config = tiny_config(tiny_backbone, positions=16, item_tokens=600)
    config.prompt.template = SEARCH
    model = SPDRanker.build(config)
    model.rank(_slate(2, 50))  # fits
    with pytest.raises(SlateError, match=r"slate 'q1': its prompt is \d+ tokens, more than the "
                       r"backbone's 4096 positions \(16 candidates at up to 600 tokens"):
        model.rank(_slate(16, 400))
    assert model.cuts.candidates_cut == 0


def test_cuts_are_counted(tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone, positions=16, item_tokens=4))
    model.rank(_slate(3, 10))
    model.rank(_slate(2, 1))
    assert (model.cuts.candidates, model.cuts.candidates_cut) == (5, 3)
    assert model.cuts.summary(4).startswith("cut to the token budget: 3 of 5 candidates (at 4")


def test_the_cut_summary_says_how_to_keep_more_when_most_candidates_are_cut():
    from spdrank.backbone.prompt import Cuts

    cuts = Cuts()
    cuts.candidates, cuts.candidates_cut, cuts.queries = 100, 67, 1
    assert "67% of the candidates were read without their end" in cuts.summary(64)
    cuts.candidates_cut = 50
    assert "without their end" not in cuts.summary(64)
