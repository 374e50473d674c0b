"""Constrained decoding for the ``hf`` teacher: every answer is a full permutation by construction.

A free-running listwise teacher repeats, skips and invents ids, and the repair in
:mod:`~spdrank.teacher.parse` then fills the ranking's tail in slate order, which is noise in
the training target. Here the model may only emit what continues a valid answer in the
format the parser reads (``[i] > [j] > ...``): the first piece is ``[i]`` for any ``i`` in
``1..n``, each later piece is `` > [j]`` for a ``j`` not named yet, and end-of-sequence is
allowed only once all ``n`` are named (and then it is the only choice). The status is then
always ``ok``, and the generated tokens (decode passes) are exactly the pieces' tokens plus
one end-of-sequence token.

The state machine works on the tokenizer's own tokenization of each piece, each tokenized
alone, so it is right whether a number is one token or several. Pieces are prefix-free as
strings (each ends at its only ``]``), so their token sequences are too, and a piece is
complete exactly when its last token is emitted: no look-ahead is needed. The answer is the
concatenation of canonical piece tokenizations, which may differ from how the tokenizer would
split the whole string; decoding it gives the same text, which is all the parser reads.

State advances by the tokens appended since the last call, so the processor suits greedy
decoding and sampling, where a row stays the same sequence; beam search reorders rows and is
not supported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
from transformers import LogitsProcessor


@dataclass(frozen=True)
class Pieces:
    """Token ids of each candidate's first piece ``[i]`` and later piece `` > [i]``."""

    first: tuple[tuple[int, ...], ...]
    later: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return len(self.first)

    def max_tokens(self) -> int:
        """An upper bound on the answer's tokens, end-of-sequence included: a safe token cap."""
        return max(map(len, self.first)) + sum(map(len, self.later)) + 1


def build_pieces(tokenizer: Any, n: int) -> Pieces:
    """The pieces of a slate of ``n`` candidates, as ``tokenizer`` splits each alone."""
    if n < 1:
        raise ValueError("a slate has at least one candidate")

    def ids(text: str) -> tuple[int, ...]:
        out = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return tuple(out)

    pieces = Pieces(
        first=tuple(ids(f"[{i}]") for i in range(1, n + 1)),
        later=tuple(ids(f" > [{i}]") for i in range(1, n + 1)),
    )
    for kind in (pieces.first, pieces.later):
        _check_prefix_free(kind)
    return pieces


def _check_prefix_free(seqs: Sequence[tuple[int, ...]]) -> None:
    # In sorted order a sequence that is a prefix of another is a prefix of its successor.
    ordered = sorted(seqs)
    for a, b in pairwise(ordered):
        if not a or b[: len(a)] == a:
            raise ValueError(f"this tokenizer splits the answer pieces ambiguously: {a} / {b}")


@dataclass
class PermutationState:
    """Where one answer stands: the ids named so far and the piece being emitted."""

    pieces: Pieces
    eos_ids: frozenset[int]
    #: 0-based candidates named so far, in order.
    named: list[int] = field(default_factory=list)
    remaining: set[int] = field(default_factory=set)
    #: Candidates whose piece agrees with the tokens of the current piece so far; None between
    #: pieces.
    live: list[int] | None = None
    #: Tokens of the current piece emitted so far.
    depth: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        if not self.named and not self.remaining:
            self.remaining = set(range(self.pieces.n))

    def _table(self) -> tuple[tuple[int, ...], ...]:
        return self.pieces.later if self.named else self.pieces.first

    def allowed(self) -> list[int] | None:
        """Token ids that may come next; None once the answer has ended (anything goes)."""
        if self.done:
            return None
        table = self._table()
        if self.live is None:
            if not self.remaining:
                return sorted(self.eos_ids)
            return sorted({table[i][0] for i in self.remaining})
        return sorted({table[i][self.depth] for i in self.live})

    def advance(self, token: int) -> None:
        """Take one emitted token; a token the state did not allow is an error."""
        if self.done:
            return
        if self.live is None:
            if not self.remaining:
                if token not in self.eos_ids:
                    raise ValueError(f"token {token} after a complete ranking (expected the end)")
                self.done = True
                return
            self.live, self.depth = sorted(self.remaining), 0
        table = self._table()
        live = [i for i in self.live if table[i][self.depth] == token]
        if not live:
            raise ValueError(f"token {token} continues no valid answer")
        self.depth += 1
        complete = [i for i in live if len(table[i]) == self.depth]
        if complete:  # prefix-free pieces: the one that ended is the only live one
            self.named.append(complete[0])
            self.remaining.discard(complete[0])
            self.live, self.depth = None, 0
        else:
            self.live = live

    def advance_all(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.advance(token)


class PermutationLogitsProcessor(LogitsProcessor):
    """Masks every token that does not continue a valid answer, row by row.

    ``prompt_width`` is the (left-padded) prompt length: what follows it in ``input_ids`` is
    the answer so far. Allowed tokens keep their score (raised to the lowest finite float if
    an earlier processor set it to ``-inf``), so the choice is always a valid one.
    """

    def __init__(
        self, pieces: Sequence[Pieces], eos_ids: Iterable[int], prompt_width: int
    ) -> None:
        eos = frozenset(eos_ids)
        if not eos:
            raise ValueError("constrained decoding needs an end-of-sequence token")
        self.states = [PermutationState(p, eos) for p in pieces]
        self.prompt_width = prompt_width
        self._seen = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        new = input_ids[:, self.prompt_width + self._seen :].tolist()
        self._seen = input_ids.shape[1] - self.prompt_width
        out = torch.full_like(scores, -torch.inf)
        floor = torch.finfo(scores.dtype).min
        for row, (state, tokens) in enumerate(zip(self.states, new)):
            state.advance_all(tokens)
            allowed = state.allowed()
            if allowed is None:
                out[row] = scores[row]
            else:
                index = torch.tensor(allowed, device=scores.device)
                out[row, index] = scores[row, index].clamp_min(floor)
        return out
