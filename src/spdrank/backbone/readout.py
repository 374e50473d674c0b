"""How a slate is read from the backbone: the readers, and the pooling of a prefill's states.

A ranking method says which way its head reads (:attr:`~spdrank.methods.base.RankingMethod.reads`)
and the model builds that reader over its own parts (backbone, prompt builder, pad token), so a
method never handles the model:

- ``prompt`` (:class:`PromptReader`): one prompt holding every candidate, one prefill, its
  states pooled at the readout positions as the prompt's ``readout`` says (SPD, scalar);
- ``candidates`` (:class:`CandidateReader`): one sequence a candidate with the user context,
  the sequences batched into one padded pass (the pointwise peer);
- ``logits`` (:class:`LogitsReader`): one prompt, the LM's next-token logits at its end (FIRST).

Each reader encodes a slate (``encode``), pads encoded slates into one batch (``collate``) and
reads a batch into what the head reads (``read``, timing the ``prefill`` and ``readout`` stages).

A prompt's items (the candidates, and the user's history items for a head that reads them) are
token spans; the prompt settings' ``readout`` says how each span becomes the head's input: its
last token's state or the mean of its tokens (one vector an item), all its token states
(``tokens``) or the mean of each of its words' tokens (``words``; several vectors an item,
with a count of the real ones). :func:`read_items` applies it to a batch; the state cache stores
what it returns, so a head reads cached states exactly as it reads a live prefill's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from spdrank.backbone.batching import Batch, collate, collate_candidates
from spdrank.backbone.prompt import (
    UNIT_READOUTS,
    CandidatePrompts,
    EncodedPrompt,
    PromptBuilder,
    PromptSettings,
    encode_candidates,
)
from spdrank.backbone.split import last_hidden, last_token_logits, prompt_hidden
from spdrank.core.clock import StageClock, timed

if TYPE_CHECKING:
    from torch import nn

    from spdrank.backbone.words import WordSplitter
    from spdrank.core.slates import Slate

#: The one unit of an item without words: the prompt's first token.
_FIRST_TOKEN = np.zeros((1, 2), dtype=np.int64)


class HeadInputs(NamedTuple):
    """What a head reads of a batch: the readout of one prefill, or of cached states."""

    #: The candidates' states [B, N, D] ([B, N, W, D] with a per-unit readout; FIRST: the
    #: LM's logits [B, V]); None without an LLM.
    items: torch.Tensor | None
    #: The history items' states, for a head that reads them; else None.
    history: torch.Tensor | None = None
    #: With a per-unit readout, the real unit slots of each candidate [B, N] and history
    #: item [B, H].
    item_tokens: torch.Tensor | None = None
    history_tokens: torch.Tensor | None = None


@dataclass
class PromptReader:
    """One prompt holding every candidate; the prefill's states pooled at the readout positions."""

    backbone: nn.Module
    prompts: PromptBuilder
    pad_id: int
    settings: PromptSettings
    text_fields: tuple[str, ...]
    #: Splits an item's tokens into words, for the ``words`` readout (else None).
    words: WordSplitter | None = None
    #: The head reads the history items' states too.
    history: bool = False
    #: Waits for queued GPU work, so a stage's timer stops after it.
    sync: Callable[[], None] | None = None

    def encode(self, slate: Slate) -> EncodedPrompt:
        """The backbone's input for ``slate``: one prompt with its user context and every
        candidate's text."""
        return self.prompts.encode(slate.query.text, slate.candidate_texts(self.text_fields))

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        """Encoded slates right-padded into one batch for one prefill."""
        return collate(encoded, self.pad_id)

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """One prefill of ``batch``, pooled as the prompt's ``readout`` says."""
        with timed(clock, "prefill", self.sync):
            hidden = prompt_hidden(self.backbone, batch.prompt)
        with timed(clock, "readout", self.sync):
            return read_items(batch, hidden, self.settings, self.words, self.history)


class LogitsReader(PromptReader):
    """One prompt holding every candidate; the LM's next-token logits at its end."""

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """One prefill of ``batch``: the LM's next-token logits at each prompt's end [B, V]."""
        with timed(clock, "prefill", self.sync):
            prompt = batch.prompt
            logits = last_token_logits(self.backbone, prompt.input_ids, prompt.attention_mask)
        return HeadInputs(logits.float())


class CandidateReader(PromptReader):
    """One sequence a candidate with the user context, the sequences prefilled as one batch."""

    def encode(self, slate: Slate) -> CandidatePrompts:
        """One sequence a candidate: the user context, then that candidate alone."""
        texts = slate.candidate_texts(self.text_fields)
        return encode_candidates(self.prompts, slate.query.text, texts)

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        """Every candidate's sequence a row, right-padded into one batch."""
        return collate_candidates(encoded, self.pad_id)  # type: ignore[arg-type]

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """The candidates' states from their own sequences' prefills, [B, N, D]."""
        return read_candidates(self.backbone, batch, self.settings.readout, clock, self.sync)


#: The reader of each way a method's head reads (``RankingMethod.reads``).
READERS: dict[str, type[PromptReader]] = {
    "prompt": PromptReader,
    "candidates": CandidateReader,
    "logits": LogitsReader,
}


def reader_for(reads: str, **parts: Any) -> PromptReader:
    """The reader for a head that ``reads`` so, over the model's ``parts``."""
    try:
        return READERS[reads](**parts)
    except KeyError:
        raise ValueError(f"no reader reads {reads!r}: choose one of {list(READERS)}") from None


def read_items(
    batch: Batch,
    hidden: torch.Tensor,
    settings: PromptSettings,
    words: WordSplitter | None = None,
    history: bool = False,
) -> HeadInputs:
    """The items' (and, with ``history``, the history items') float32 states from one
    prefill's ``hidden`` [B, T, D], pooled as ``settings.readout`` says (``words`` splits an
    item's tokens into words for the ``words`` readout)."""
    prompt = batch.prompt
    spans = [(prompt.item_first, prompt.item_last)]
    if history and prompt.history_first is not None:
        spans.append((prompt.history_first, prompt.history_last))
    how = settings.readout
    if how in UNIT_READOUTS:
        width = settings.max_item_tokens
        if words is not None:
            read = pool_words(hidden, prompt.input_ids, spans, width, words)
        else:
            read = [span_tokens(hidden, a, z, width) for a, z in spans]
        states = [x.float() for x, _ in read]
        lengths = [n for _, n in read]
        if len(read) == 1:
            return HeadInputs(states[0], None, lengths[0])
        return HeadInputs(states[0], states[1], lengths[0], lengths[1])
    return HeadInputs(*(pool_spans(hidden, a, z, how).float() for a, z in spans))


#: Padded tokens a chunk of a pointwise batch's rows holds at most (at least one row a chunk,
#: however long).
CHUNK_TOKENS = 16_384


def read_candidates(
    backbone: nn.Module,
    batch: Batch,
    how: str,
    clock: StageClock | None = None,
    sync: Callable[[], None] | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
) -> HeadInputs:
    """The candidates' float32 states [B, N, D] from their own sequences' prefills, each
    pooled over its text's tokens as ``how`` says ("last": its sequence's last state, or
    "mean"); padded candidates are zeros. ``clock`` times the backbone's forwards as the
    ``prefill`` stage and the pooling as ``readout``.

    The rows go through the backbone in chunks of at most ``chunk_tokens`` padded tokens, each
    chunk cut to its own longest row: a training batch of 32 slates of 50 candidates is 1,600
    sequences, whose activations at once would take gigabytes for nothing (no row attends to
    another). The chunks' states are pooled as they come, so only the pooled [R, D] is kept.
    """
    mask = batch.item_mask
    prompt = batch.prompt
    first = prompt.item_first[mask]  # [R]: the real candidates, slate after slate, as the rows
    last = prompt.item_last[mask]
    rows = prompt.input_ids.size(0)
    if rows != len(last):
        raise ValueError(
            f"a pointwise batch holds one token row a real candidate: {rows} rows for "
            f"{len(last)} candidates"
        )
    lengths = prompt.attention_mask.sum(1)
    pooled = []
    start = 0
    while start < rows:
        width = int(lengths[start])
        stop = start + 1
        while stop < rows and (stop - start + 1) * max(width, int(lengths[stop])) <= chunk_tokens:
            width = max(width, int(lengths[stop]))
            stop += 1
        with timed(clock, "prefill", sync):
            hidden = last_hidden(
                backbone, prompt.input_ids[start:stop, :width],
                prompt.attention_mask[start:stop, :width],
            )
        with timed(clock, "readout", sync):
            span = slice(start, stop)
            pooled.append(pool_spans(hidden, first[span, None], last[span, None], how)[:, 0])
        start = stop
    with timed(clock, "readout", sync):
        states = torch.cat(pooled).float() if pooled else prompt.input_ids.new_zeros((0, 0)).float()
        items = states.new_zeros((*mask.shape, states.size(-1)))
        items[mask] = states
    return HeadInputs(items)


def pool_spans(
    hidden: torch.Tensor, first: torch.Tensor, last: torch.Tensor, how: str = "last"
) -> torch.Tensor:
    """One vector per token span: the state at ``last``, or the mean over ``first..last``.

    ``hidden``: [B, T, D]; ``first``/``last``: [B, M] inclusive token indices (padded spans may
    point anywhere valid, e.g. 0..0). Returns [B, M, D]. The mean reads only the spans'
    tokens (:func:`span_means`).
    """
    if how == "last":
        return torch.gather(hidden, 1, last.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
    if how != "mean":
        raise ValueError(f"unknown readout {how!r}: use last or mean")
    b, m = first.shape
    rows = span_means(hidden, torch.arange(b, device=first.device).repeat_interleave(m),
                      first.reshape(-1), last.reshape(-1))
    return rows.view(b, m, -1).to(hidden.dtype)


def span_means(
    hidden: torch.Tensor, row: torch.Tensor, first: torch.Tensor, last: torch.Tensor
) -> torch.Tensor:
    """The float32 mean of ``hidden[row[s], first[s]..last[s]]`` for each span s: [S, D].

    Only the spans' own tokens are read (gathered once, summed into their spans), so the cost
    follows the spans' tokens, not the prompt's length. An empty span (last < first) reads
    its first token.
    """
    lengths = (last - first + 1).clamp(min=1)
    span = torch.arange(len(lengths), device=lengths.device).repeat_interleave(lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(len(span), device=span.device) - starts[span]
    index = row[span] * hidden.size(1) + first[span] + offset
    flat = hidden.reshape(-1, hidden.size(-1))
    if flat.dtype != torch.float32:  # averaged in float32: gather the tokens, then widen
        flat = flat.index_select(0, index).float()
        index = torch.arange(len(index), device=index.device)
    return F.embedding_bag(index, flat, starts, mode="mean")


def span_tokens(
    hidden: torch.Tensor, first: torch.Tensor, last: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token state of each span, padded: [B, M, width, D], and each span's length [B, M]
    (at most ``width``; a span's padded slots repeat its last token and are masked by length)."""
    steps = torch.arange(width, device=hidden.device)
    index = torch.minimum(first.unsqueeze(-1) + steps, last.unsqueeze(-1))
    b, m = first.shape
    d = hidden.size(-1)
    flat = index.reshape(b, m * width, 1).expand(-1, -1, d)
    states = torch.gather(hidden, 1, flat).reshape(b, m, width, d)
    return states, (last - first + 1).clamp(min=1, max=width)



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
