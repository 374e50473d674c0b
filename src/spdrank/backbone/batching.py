"""Padded batches: every slate's rows, right-padded into one :class:`Batch`, in one place.

Three things build batches. :func:`collate` pads encoded prompts (token ids, item and history
spans, features) for a prefill; :func:`collate_candidates` pads slates of one sequence a
candidate (the pointwise read) for one; :func:`states_batch` pads readout states computed earlier
(:mod:`spdrank.model.state_cache`) for the head alone. Both pad with :func:`pad_rows` and
mask with :func:`lengths_mask`, so a slate's rows sit at the same places, with the same
padding, whichever way its batch was made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from spdrank.backbone.prompt import CandidatePrompts, EncodedPrompt

_T = TypeVar("_T")


@dataclass
class PromptTensors:
    """A batch's prompts, padded for one prefill: what the backbone reads and where each
    item's tokens sit in it.

    Kept apart from :class:`CachedStates` because a batch holds one or the other: the head
    reads a prefill of these, or states computed earlier, never both.
    """

    input_ids: torch.Tensor  # [B, T] (pointwise: [R, T], one row a real candidate)
    attention_mask: torch.Tensor  # [B, T]
    #: [B, N] first and last token of each candidate's text (inclusive; 0 for padded items).
    #: A pointwise batch indexes each candidate's own row.
    item_first: torch.Tensor
    item_last: torch.Tensor
    #: [B, H] first and last token of each history item (prompts read as history items only).
    history_first: torch.Tensor | None = None
    history_last: torch.Tensor | None = None
    #: [B, T, D] the states entering layer ``lower_layer``, cached for a backbone whose layers
    #: below it are frozen (:mod:`spdrank.backbone.split`): the prefill runs from there on.
    lower: torch.Tensor | None = None
    lower_layer: int = 0


@dataclass
class CachedStates:
    """Readout states computed earlier (:mod:`spdrank.model.state_cache`), padded as a
    prefill's readout is, so the head reads them in place of one.

    The fields are those of :class:`~spdrank.backbone.readout.HeadInputs`, which a batch of
    these becomes without a prefill.
    """

    items: torch.Tensor  # [B, N, D]; with a per-unit readout [B, N, W, D]
    history: torch.Tensor | None = None  # [B, H, D] / [B, H, W, D], for a head that reads it
    #: With a per-unit readout ("tokens", "words"), how many of each item's W slots are real.
    item_tokens: torch.Tensor | None = None  # [B, N]
    history_tokens: torch.Tensor | None = None  # [B, H]


@dataclass
class Batch:
    """A padded batch of slates: what every batch has (the items' mask and count, their
    features, the history items' mask), and either the ``prompt`` to prefill or the
    ``cached`` states to read instead.

    :func:`collate` sets ``prompt``, :func:`states_batch` sets ``cached``; a reader asks
    ``batch.cached is not None`` to know which it has.
    """

    item_mask: torch.Tensor  # [B, N] True for real items
    sizes: torch.Tensor  # [B] items per slate
    features: torch.Tensor | None = None  # [B, N, F] normalised upstream features (padded: 0)
    history_mask: torch.Tensor | None = None  # [B, H] True for real history items
    prompt: PromptTensors | None = None
    cached: CachedStates | None = None

    def to(self, device: torch.device | str) -> Batch:
        """The batch with every tensor, its prompt's and cached states' too, on ``device``."""
        return _moved(self, device)


def _moved(value: _T, device: torch.device | str) -> _T:
    """``value`` with its tensors on ``device``: a tensor, None, or a dataclass of them."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        return type(value)(**{f.name: _moved(getattr(value, f.name), device) for f in fields})
    return value


def pad_rows(
    rows: Sequence[Any],
    width: int,
    inner: tuple[int, ...] = (),
    fill: float = 0,
    dtype: type | np.dtype = np.int64,
) -> torch.Tensor:
    """Slates' rows [n_i, *inner] as one tensor [B, width, *inner], each right-padded with
    ``fill``.

    A row is anything numpy assigns from: a list of ints (token ids, token indices), an
    array, or a CPU tensor (cached states). The padding is built in numpy and handed to torch
    without a copy: converting a prompt's thousands of Python ints costs less there, and each
    torch operation on a small tensor costs more than its data.
    """
    out = np.full((len(rows), width, *inner), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def lengths_mask(
    lengths: Sequence[int] | np.ndarray, size: int, dtype: type = np.bool_
) -> torch.Tensor:
    """[B, size] of ``dtype``: true (1) at the first ``lengths[b]`` entries of row b."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return torch.from_numpy((np.arange(size) < lengths[:, None]).astype(dtype, copy=False))


def pad_features(features: Sequence[np.ndarray | None], n: int) -> torch.Tensor | None:
    """Slates' [n_i, F] feature arrays padded to [B, n, F] with zeros; None when none has any."""
    if all(f is None for f in features):
        return None
    if any(f is None for f in features):
        raise ValueError("some prompts carry features and others do not: encode them all alike")
    return pad_rows(features, n, (features[0].shape[1],), dtype=np.float32)


def collate(encoded: Sequence[EncodedPrompt], pad_id: int) -> Batch:
    """Right-pad token ids, item spans and history spans; indices are unaffected by right padding.

    The features travel with the prompts, so whatever encodes slates and collates them (the
    training loop, ``rank_batch``, the server) hands them to the head without knowing of them.
    """
    t = max(len(e.input_ids) for e in encoded)
    n = max(len(e.item_last) for e in encoded)
    sizes = np.array([len(e.item_last) for e in encoded], dtype=np.int64)
    prompt = PromptTensors(
        input_ids=pad_rows([e.input_ids for e in encoded], t, fill=pad_id),
        attention_mask=lengths_mask([len(e.input_ids) for e in encoded], t, np.int64),
        item_first=pad_rows([e.item_first for e in encoded], n),
        item_last=pad_rows([e.item_last for e in encoded], n),
    )
    batch = Batch(
        item_mask=lengths_mask(sizes, n),
        sizes=torch.from_numpy(sizes),
        features=pad_features([e.features for e in encoded], n),
        prompt=prompt,
    )
    if any(e.history is not None for e in encoded):
        spans = [e.history or [] for e in encoded]
        h = max(1, max(len(x) for x in spans))
        prompt.history_first = pad_rows([[a for a, _ in x] for x in spans], h)
        prompt.history_last = pad_rows([[z for _, z in x] for x in spans], h)
        batch.history_mask = lengths_mask([len(x) for x in spans], h)
    return batch


def collate_candidates(encoded: Sequence[CandidatePrompts], pad_id: int) -> Batch:
    """Slates of one sequence a candidate, padded into one batch: every real candidate's
    sequence one row of ``input_ids`` [R, T], slate after slate, right-padded to the longest.

    A padded candidate gets no row (it would cost a whole sequence of prefill for nothing);
    ``item_first`` and ``item_last`` stay [B, N] as in every batch, each index into its
    candidate's own row. So a head, the features and the targets see the slates' usual [B, N]
    layout, and only the read from the backbone knows the rows.
    """
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

@dataclass
class SlateStates:
    """The readout states of a batch's slates, one entry per slate, before padding.

    ``items[b]`` is [n_b, D] ([n_b, W, D] with a per-token readout, then ``item_tokens[b]``
    [n_b] says how many of the W slots are real); ``history`` and ``history_tokens`` the same
    for the slates' history items, for a head that reads them.
    """

    items: Sequence[torch.Tensor]
    item_tokens: Sequence[torch.Tensor] | None = None
    history: Sequence[torch.Tensor] | None = None
    history_tokens: Sequence[torch.Tensor] | None = None


def states_batch(states: SlateStates, features: Sequence[np.ndarray | None]) -> Batch:
    """The batch a head reads for slates whose readout states were computed earlier: the
    states and token counts padded as :func:`collate` pads prompts (its ``cached``; no
    ``prompt``, since there is nothing to prefill), and the slates' normalised ``features``
    ([n_b, F] each, or all None)."""
    items, item_mask, item_tokens = _pad_states(states.items, states.item_tokens)
    cached = CachedStates(items, item_tokens=item_tokens)
    history_mask = None
    if states.history is not None:
        cached.history, history_mask, cached.history_tokens = _pad_states(
            states.history, states.history_tokens
        )
    return Batch(
        item_mask=item_mask,
        sizes=item_mask.sum(1),
        features=pad_features(features, item_mask.shape[1]),
        history_mask=history_mask,
        cached=cached,
    )


def _pad_states(
    rows: Sequence[torch.Tensor], tokens: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Slates' float32 states [n_b, *inner] padded to [B, max(1, max n_b), *inner] with
    zeros, the mask of real rows and, with per-token states, each row's token count (0 where
    padded). Per-token states keep as many token slots as the longest row uses, as a live
    readout does, so a head computes on cached states exactly as on live ones."""
    sizes = [len(r) for r in rows]
    width = max(1, max(sizes))
    padded = pad_rows(rows, width, tuple(rows[0].shape[1:]), dtype=np.float32)
    lengths = None if tokens is None else pad_rows(tokens, width)
    if lengths is not None:
        padded = padded[:, :, : max(1, int(lengths.max()))].contiguous()
    return padded, lengths_mask(sizes, width), lengths

