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
