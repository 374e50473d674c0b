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

from spdrank.backbone.load import span_means

_WORD = re.compile(r"[^\W_]+")

#: The one unit of an item without words: the prompt's first token.
_FIRST_TOKEN = np.zeros((1, 2), dtype=np.int64)

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
        self._cached_split = lru_cache(maxsize=cache_size)(self._split_table)

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
        return [(int(a), int(z)) for a, z in self.table(ids)]

    def table(self, ids: Sequence[int]) -> np.ndarray:
        """:meth:`spans` as a read-only int64 array [words, 2], the form pooling reads."""
        return self._cached_split(tuple(ids))

    def _split_table(self, ids: tuple[int, ...]) -> np.ndarray:
        table = np.asarray(self._split(ids), dtype=np.int64).reshape(-1, 2)
        table.flags.writeable = False  # cached and shared by every caller
        return table

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
    spans: Sequence[tuple[torch.Tensor, torch.Tensor]],
    width: int,
    splitter: WordSplitter,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each item's words as the mean of their token states, for each set of items in
    ``spans`` (the candidates, the history items): per set, [B, M, W, D] in float32 and each
    item's word count [B, M] (at most ``width``). W is the most words any item of the set has
    (at most ``width``): slots beyond an item's count are zero and masked by the count.

    ``hidden`` [B, T, D] is one prefill; each ``(first, last)`` in ``spans`` holds a set's
    token spans [B, M]. An item without tokens reads one unit, the prompt's first token. All
    sets are pooled in one pass over the prefill's states: at a slate's size each tensor
    operation's fixed cost outweighs its arithmetic, so the work is batched, and the items'
    words are laid out with array operations rather than item by item.
    """
    ids = input_ids.tolist()
    batch = input_ids.size(0)
    table = splitter.table
    tables: list[np.ndarray] = []
    starts: list[int] = []
    for first, last in spans:
        for row, row_first, row_last in zip(ids, first.tolist(), last.tolist()):
            tables += [table(row[a : z + 1]) for a, z in zip(row_first, row_last)]
            starts += row_first
    counts = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    offsets = np.asarray(starts, dtype=np.int64)
    empty = counts == 0
    if empty.any():  # items without tokens: the prompt's first token, at offset 0
        tables = [_FIRST_TOKEN if len(t) == 0 else t for t in tables]
        counts[empty], offsets[empty] = 1, 0
    word_spans = np.concatenate(tables) if tables else np.zeros((0, 2), dtype=np.int64)
    item = np.repeat(np.arange(len(tables)), counts)  # each word's item, over all sets
    word = np.arange(len(word_spans)) - np.repeat(np.cumsum(counts) - counts, counts)
    kept = word < width
    word_spans = word_spans[kept] + offsets[item[kept], None]
    item, word = item[kept], word[kept]
    counts = np.minimum(counts, width)
    item_row = np.concatenate(
        [np.repeat(np.arange(batch), first.size(1)) for first, _ in spans]
    ) if spans else np.zeros(0, dtype=np.int64)
    device = hidden.device
    means = span_means(hidden, torch.from_numpy(item_row[item]).to(device),
                       torch.from_numpy(word_spans[:, 0]).to(device),
                       torch.from_numpy(word_spans[:, 1]).to(device))
    pooled = []
    item_start = word_start = 0
    for first, _ in spans:
        items = first.size(1)
        n_items = batch * items
        set_counts = counts[item_start : item_start + n_items]
        n_words = int(set_counts.sum())
        used = int(set_counts.max()) if n_items else 1
        slots = (item[word_start : word_start + n_words] - item_start) * used \
            + word[word_start : word_start + n_words]
        out = means.new_zeros(n_items * used, hidden.size(-1))
        out[torch.from_numpy(slots).to(device)] = means[word_start : word_start + n_words]
        pooled.append((out.view(batch, items, used, -1),
                       torch.from_numpy(set_counts.reshape(batch, items)).to(device)))
        item_start += n_items
        word_start += n_words
    return pooled
