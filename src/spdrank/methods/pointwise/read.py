"""The pointwise read: every candidate's sequence prefilled, its state pooled, back to [B, N, D].

The rows go through the backbone in chunks of at most :data:`CHUNK_TOKENS` padded tokens,
each chunk cut to its own longest row: a training batch of 32 slates of 50 candidates is
1,600 sequences, whose activations at once would take gigabytes for nothing (no row attends
to another). The chunks' states are pooled as they come, so only the pooled [R, D] is kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from spdrank.backbone.batching import Batch
from spdrank.backbone.load import last_hidden
from spdrank.backbone.readout import HeadInputs, pool_spans
from spdrank.core.clock import StageClock, timed

#: Padded tokens a chunk of rows holds at most (at least one row a chunk, however long).
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
    ``prefill`` stage and the pooling as ``readout``."""
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
