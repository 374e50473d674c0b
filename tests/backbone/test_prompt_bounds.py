"""A text is cut to a character bound derived from its token budget before it is tokenized:
a huge title costs what its budget does, and no ordinary text's tokens change."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdrank.backbone.prompt import CHARS_PER_TOKEN_BOUND, PromptBuilder, PromptSettings
from spdrank.teacher.prompt import cut_head, cut_tail
from tests.helpers import WORDS

#: Words of several scripts and shapes: what titles are made of, and what tokenizers split
#: differently (accents, CJK, emoji, digits, punctuation runs).
PIECES = [*WORDS, "crème", "Größe", "日本語", "한국어", "😀", "e\u0301", "2024", "10ml", "!!!",
          "...", "-", "—", "\t", "  ", "\n", "<|im_end|>", "www.example.com", "x" * 40]

texts = st.lists(st.sampled_from(PIECES), min_size=0, max_size=400).map(" ".join)


def full_ids(tokenizer, text: str) -> list[int]:
    """``text``'s token ids as the prompt tokenizes a text, the whole text at once."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, budget=st.integers(1, 8))
def test_the_character_bound_changes_no_ordinary_texts_tokens(tokenizer, text, budget):
    builder = PromptBuilder(tokenizer, PromptSettings(max_item_tokens=budget, max_query_tokens=budget))
    ids = full_ids(tokenizer, text)
    assert builder.item_tokens(text) == ids[:budget]
    encoded = builder.encode(text, [text])
    assert encoded.truncated == [len(ids) > budget]
    assert encoded.query_truncated == (len(ids) > budget)
    # The teacher's cuts keep the same head and end as cutting the whole text's tokens.
    head = cut_head(text, budget, tokenizer)
    tail = cut_tail(text, budget, tokenizer)
    if len(ids) <= budget:
        assert head == text and tail == text
    else:
        assert head == tokenizer.decode(ids[:budget]).rstrip("\ufffd").rstrip()
        assert tail == tokenizer.decode(ids[-budget:]).lstrip("\ufffd").lstrip()


@pytest.mark.parametrize("where", ["title", "query"])
def test_a_huge_text_is_cut_before_it_is_tokenized(tokenizer, where):
    huge = "argan oil shampoo " * 600_000  # about 11 MB: tens of seconds to tokenize whole
    builder = PromptBuilder(tokenizer, PromptSettings(max_item_tokens=8, max_query_tokens=16))
    started = time.perf_counter()
    if where == "title":
        encoded = builder.encode("1. rose shampoo", [huge, "lotion"])
        assert encoded.truncated == [True, False]
    else:
        encoded = builder.encode(huge, ["lotion"])
        assert encoded.query_truncated
    assert cut_head(huge, 8, tokenizer).startswith("argan oil")
    assert cut_tail(huge, 8, tokenizer).rstrip().endswith("shampoo")
    assert time.perf_counter() - started < 3
    assert len(encoded.input_ids) < 200


def test_the_bound_is_generous():
    """A token longer than the bound's characters is past what vocabularies hold."""
    assert CHARS_PER_TOKEN_BOUND >= 32
