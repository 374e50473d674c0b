"""Words from token ids (spdrank.backbone.words): spans that decode to the text's words, and their
pooled states."""

import re

import pytest
import torch

from spdrank.backbone.readout import pool_words
from spdrank.backbone.words import WordSplitter

WORD = re.compile(r"[^\W_]+")


@pytest.fixture(scope="module")
def splitter(tokenizer):
    return WordSplitter(tokenizer)


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("text", [
    "Maybelline New York Great Lash Mascara, Blackest Black",
    "#1 BEST Hydra B5 Gel - 1fl oz / 30ml",
    "L'Oreal Paris\nTrue Match  Super-Blendable Foundation, 8.5 Ounce",
    "Crème brûlée 💄 lipstick [3] <|im_end|>",
])
def test_each_span_decodes_to_one_word_of_the_text(tokenizer, splitter, text):
    ids = ids_of(tokenizer, text)
    spans = splitter.spans(ids)
    words = WORD.findall(tokenizer.decode(ids))
    assert len(spans) == len(words)
    for (first, last), word in zip(spans, words):
        assert 0 <= first <= last < len(ids)
        assert word in "".join(splitter.piece(i) for i in ids[first : last + 1])


def test_a_word_the_tokenizer_splits_is_one_span(tokenizer, splitter):
    ids = ids_of(tokenizer, "Maybelline Mascara")
    spans = splitter.spans(ids)
    assert len(spans) == 2
    first, last = spans[0]
    assert last > first  # "Maybelline" is several tokens, read as one word


def test_text_without_words_is_one_span_and_no_text_none(tokenizer, splitter):
    ids = ids_of(tokenizer, "!!! --- ...")
    assert splitter.spans(ids) == [(0, len(ids) - 1)]
    assert splitter.spans([]) == []


def test_the_cache_is_bounded(tokenizer):
    small = WordSplitter(tokenizer, cache_size=2)
    for text in ("one", "two words", "three more words"):
        small.spans(ids_of(tokenizer, text))
    assert small._cached_split.cache_info().currsize == 2


def test_pool_words_averages_each_words_token_states(tokenizer, splitter):
    text_ids = ids_of(tokenizer, "Maybelline Great Lash, Mascara")
    prefix = ids_of(tokenizer, "Items:\n")
    ids = torch.tensor([prefix + text_ids + prefix])
    hidden = torch.randn(1, ids.size(1), 8)
    first = torch.tensor([[len(prefix), 0]])
    last = torch.tensor([[len(prefix) + len(text_ids) - 1, 0]])
    [(pooled, counts)] = pool_words(hidden, ids, [(first, last)], 3, splitter)
    spans = splitter.spans(text_ids)
    assert len(spans) == 4 and counts.tolist() == [[3, 1]]  # cut to the width
    assert pooled.shape == (1, 2, 3, 8)
    for k, (a, z) in enumerate(spans[:3]):
        a, z = a + len(prefix), z + len(prefix)
        torch.testing.assert_close(pooled[0, 0, k], hidden[0, a : z + 1].mean(0))


def test_pool_words_keeps_only_as_many_slots_as_the_longest_item_uses(tokenizer, splitter):
    """Slots beyond every item's word count are neither computed nor returned; an item's own
    unused slots are zero."""
    a, b = ids_of(tokenizer, "Great Lash Mascara"), ids_of(tokenizer, "Lipstick")
    ids = torch.tensor([a + b])
    hidden = torch.randn(1, ids.size(1), 8)
    first, last = torch.tensor([[0, len(a)]]), torch.tensor([[len(a) - 1, len(a) + len(b) - 1]])
    [(pooled, counts)] = pool_words(hidden, ids, [(first, last)], 32, splitter)
    assert counts.tolist() == [[3, 1]]
    assert pooled.shape == (1, 2, 3, 8)
    assert (pooled[0, 1, 1:] == 0).all()
    torch.testing.assert_close(pooled[0, 1, 0], hidden[0, len(a) :].mean(0))


def test_pool_words_pools_several_sets_as_each_alone(tokenizer, splitter):
    """Candidates and history items pooled in one pass equal each set pooled alone, across a
    batch of two prompts, with an item without tokens (last < first) reading the first token."""
    a, b = ids_of(tokenizer, "Great Lash Mascara"), ids_of(tokenizer, "Lipstick red")
    ids = torch.tensor([a + b, b + a])
    hidden = torch.randn(2, ids.size(1), 8)
    cand = (torch.tensor([[0, len(a)], [0, len(b)]]),
            torch.tensor([[len(a) - 1, len(a) + len(b) - 1], [len(b) - 1, len(b) - 1]]))
    hist = (torch.tensor([[len(a)], [len(b)]]), torch.tensor([[len(a) + 1], [len(b) + 2]]))
    together = pool_words(hidden, ids, [cand, hist], 2, splitter)
    alone = [pool_words(hidden, ids, [s], 2, splitter)[0] for s in (cand, hist)]
    for (p, n), (q, m) in zip(together, alone):
        torch.testing.assert_close(p, q)
        assert n.tolist() == m.tolist()
    pooled, counts = together[0]
    assert counts.tolist() == [[2, 2], [2, 1]]  # "Great Lash Mascara" cut to the width
    torch.testing.assert_close(pooled[1, 1, 0], hidden[1, 0])  # no tokens: the first one
    assert (pooled[1, 1, 1:] == 0).all()
