"""Words from token ids: which tokens of an item's text make up each of its words.

A tokenizer splits rare words into pieces ("Maybelline" into "May", "bel", "line"), and a
piece alone says little: "line" ends a brand and is also a word of its own. A reader that
matches titles word by word (the history head's ``words`` readout) therefore pools each
word's token states into one vector. Words are the runs of letters and digits of the text the
tokens decode to (the same rule as :mod:`spdrank.datasets.title_similarity`'s terms), found
in the text and mapped back to the tokens that overlap them; punctuation and spaces belong to
no word. Working from the decoded text, not from a tokenizer's markers (``Ġ``, ``▁``), keeps
this right for any tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from spdrank.backbone import span_means

_WORD = re.compile(r"[^\W_]+")

#: A word as the inclusive (first, last) indices of its tokens within the item's tokens.
Span = tuple[int, int]


class WordSplitter:
    """Each item's words as token spans, for one tokenizer; cached by the item's token ids
    (a catalogue's titles come back slate after slate)."""

    def __init__(self, tokenizer: Any, cache_size: int = 65536) -> None:
        self.tokenizer = tokenizer
        # A token's text is read after an anchor so that a leading space survives decoding
        # (SentencePiece drops it from a text's first token).
        self._anchor = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        self._anchor_text = tokenizer.decode(self._anchor)
        self._pieces: dict[int, str] = {}
        self._cached_split = lru_cache(maxsize=cache_size)(self._split)

    def piece(self, token_id: int) -> str:
        """The text token ``token_id`` adds after another token."""
        text = self._pieces.get(token_id)
        if text is None:
            whole = self.tokenizer.decode([*self._anchor, token_id])
            text = whole.removeprefix(self._anchor_text)
            self._pieces[token_id] = text
        return text

    def spans(self, ids: Sequence[int]) -> list[Span]:
        """The words of the text ``ids`` decode to, as token spans, in order. Text without a
        letter or digit is one span over all its tokens, so every item has a unit to read."""
        return self._cached_split(tuple(ids))

    def _split(self, ids: tuple[int, ...]) -> list[Span]:
        if not ids:
            return []
        ends = []
        text = ""
        for token_id in ids:
            text += self.piece(token_id)
            ends.append(len(text))
        spans = []
        first = 0
        for word in _WORD.finditer(text):
            while ends[first] <= word.start():
                first += 1
            last = first
            while ends[last] < word.end():
                last += 1
            spans.append((first, last))
        return spans or [(0, len(ids) - 1)]


def pool_words(
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    first: torch.Tensor,
    last: torch.Tensor,
    width: int,
    splitter: WordSplitter,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each span's words as the mean of their token states: [B, M, W, D] in float32, and each
    span's word count [B, M] (at most ``width``). W is the most words any span has (at most
    ``width``): slots beyond a span's count are zero and masked by the count.

    ``hidden`` [B, T, D] is one prefill; ``first``/``last`` [B, M] the items' token spans. An
    item without tokens reads one unit, the prompt's first token."""
    ids = input_ids.tolist()
    batch, items = first.shape
    counts = np.ones((batch, items), dtype=np.int64)
    # Each word as (its slot among all [B, M, W] slots, first token, last token), to start
    # with as (batch, item, word) and absolute token indices.
    slots: list[tuple[int, int, int, int, int]] = []
    for b, (row_first, row_last) in enumerate(zip(first.tolist(), last.tolist())):
        for m, (a, z) in enumerate(zip(row_first, row_last)):
            words = splitter.spans(ids[b][a : z + 1])[:width]
            if not words:
                slots.append((b, m, 0, 0, 0))
                continue
            counts[b, m] = len(words)
            slots.extend((b, m, w, a + i, a + j) for w, (i, j) in enumerate(words))
    used = int(counts.max()) if counts.size else 1
    table = torch.from_numpy(np.array(slots, dtype=np.int64).reshape(-1, 5))
    b_idx, m_idx, w_idx = table[:, 0], table[:, 1], table[:, 2]
    device = hidden.device
    means = span_means(hidden, b_idx.to(device), table[:, 3].to(device), table[:, 4].to(device))
    pooled = means.new_zeros(batch * items * used, hidden.size(-1))
    pooled[((b_idx * items + m_idx) * used + w_idx).to(device)] = means
    return pooled.view(batch, items, used, -1), torch.from_numpy(counts).to(device)
