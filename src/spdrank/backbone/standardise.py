"""The backbone's states standardised per dimension before a head reads them.

Some backbones keep most of a hidden state's norm in one or two dimensions that every token
shares (the "massive activations" of Sun et al., 2024; Gemma 3's first layers are one case). A
head's LayerNorm does not remove them, so after it
every token's state points the same way and two different words have almost the cosine of two
copies of one word: the query-matched head's match, which relies on that difference, then
starts blind and must first learn to undo the shared dimensions from a few hundred queries.

Standardising each dimension (subtract its mean, divide by its standard deviation, both fitted
once on the training slates' states, as the ``--features`` normalisation is fitted on their
features) removes what every token shares and puts the dimensions on one scale, whatever the
backbone: the statistics are the head's buffers, saved and loaded with its weights, and the
same for a live prefill and for cached states (the cache holds the states as the backbone gave
them). Unfitted, the map is the identity.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from spdrank.backbone.readout import HeadInputs

#: The smallest standard deviation a dimension is divided by: a dimension constant over the
#: training states is centred, not blown up.
MIN_SCALE = 1e-4


class StateStandardiser(nn.Module):
    """``(state - shift) / scale`` per dimension, the statistics fitted by :meth:`fit`."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(hidden))
        self.register_buffer("scale", torch.ones(hidden))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """``states`` [..., D] standardised (their own dtype kept)."""
        return ((states - self.shift) / self.scale).to(states.dtype)

    def inputs(self, inputs: HeadInputs) -> HeadInputs:
        """What a head reads, its candidates' and history items' states standardised."""
        history = inputs.history
        return inputs._replace(
            items=self(inputs.items) if inputs.items is not None else None,
            history=self(history) if history is not None else None,
        )

    @torch.no_grad()
    def fit(self, states: Iterable[torch.Tensor]) -> int:
        """Fit the shift and scale to every row of ``states`` (tensors [M, D] of real states,
        no padding), accumulated in float64; returns how many rows were read. With none, the
        map stays as it was."""
        count, total, squares = 0, None, None
        for rows in states:
            rows = rows.detach().to(torch.float64).reshape(-1, rows.size(-1))
            total = rows.sum(0) if total is None else total + rows.sum(0)
            squares = rows.pow(2).sum(0) if squares is None else squares + rows.pow(2).sum(0)
            count += rows.size(0)
        if count < 2 or total is None or squares is None:
            return count
        mean = total / count
        variance = (squares / count - mean.pow(2)).clamp(min=0) * count / (count - 1)
        self.shift.copy_(mean.to(self.shift.dtype))
        self.scale.copy_(variance.sqrt().clamp(min=MIN_SCALE).to(self.scale.dtype))
        return count


def real_states(inputs: HeadInputs, item_mask: torch.Tensor,
                history_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """The rows of ``inputs`` that are real states [M, D]: padded candidates, history items and
    (with a per-unit readout) unit slots left out, so padding never moves the statistics."""
    rows = []
    for states, mask, units in ((inputs.items, item_mask, inputs.item_tokens),
                                (inputs.history, history_mask, inputs.history_tokens)):
        if states is None or mask is None:
            continue
        if units is not None:  # [B, N, W, D]: the first ``units`` slots of a real item
            slots = torch.arange(states.size(2), device=states.device)
            mask = mask.unsqueeze(-1) & (slots < units.unsqueeze(-1))
        rows.append(states[mask.to(torch.bool)])
    return rows
