"""Slates of one sequence a candidate, padded into one :class:`~spdrank.backbone.batching.Batch`.

The batch's token rows are every real candidate's sequence, slate after slate (no row for a
padded candidate: it would cost a whole sequence of prefill for nothing), right-padded to the
longest; ``item_first`` and ``item_last`` stay [B, N] as in every batch, each index into its
candidate's own row. So a head, the features and the targets see the slates' usual [B, N]
layout, and only the read from the backbone knows the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from spdrank.backbone.batching import Batch, PromptTensors, lengths_mask, pad_features, pad_rows
from spdrank.methods.pointwise.prompt import CandidatePrompts


def collate_candidates(encoded: Sequence[CandidatePrompts], pad_id: int) -> Batch:
    """Every candidate's sequence as one row of ``input_ids`` [R, T] (R: the slates' real
    candidates, in order), with the slates' [B, N] item spans, mask and features."""
    for i, e in enumerate(encoded):
        if not isinstance(e, CandidatePrompts):
            raise TypeError(
                f"prompt {i} is a {type(e).__name__}: a pointwise batch collates the "
                "CandidatePrompts its method encodes"
            )
    rows = [seq for e in encoded for seq in e.sequences()]
    lengths = [len(seq) for seq in rows]
    t = max(lengths, default=0)
    n = max(len(e.item_last) for e in encoded)
    sizes = np.array([len(e.item_last) for e in encoded], dtype=np.int64)
    return Batch(
        item_mask=lengths_mask(sizes, n),
        sizes=torch.from_numpy(sizes),
        features=pad_features([e.features for e in encoded], n),
        prompt=PromptTensors(
            input_ids=pad_rows(rows, t, fill=pad_id),
            attention_mask=lengths_mask(lengths, t, np.int64),
            item_first=pad_rows([e.item_first for e in encoded], n),
            item_last=pad_rows([e.item_last for e in encoded], n),
        ),
    )
