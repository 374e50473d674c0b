"""The pointwise head: one linear score from each candidate's state.

As RankLLaMA scores a passage by a linear map of its sequence's last state, the head is a
LayerNorm (a frozen backbone's states are far from unit scale, and differ by orders of
magnitude between dimensions) and one linear layer to a score; features, when the model reads
any, add one learned weight each. Whatever a candidate's score depends on beyond its own
features has to come from the backbone, which read the candidate with the user context.
"""

from __future__ import annotations

import torch
from torch import nn


class PointwiseHead(nn.Module):
    """[B, N, D] states (and [B, N, F] features) -> [B, N] scores, padded items 0."""

    matrix = False
    #: The layers whose outputs are the score (zeroed for an anchored model).
    correction_layers = ("score", "features")

    def __init__(self, hidden: int, features: int = 0) -> None:
        super().__init__()
        if hidden < 1 or features < 0:
            raise ValueError(
                f"the pointwise head reads hidden states: hidden={hidden}, features={features}"
            )
        self.norm = nn.LayerNorm(hidden)
        self.score = nn.Linear(hidden, 1)
        self.features = nn.Linear(features, 1, bias=False) if features else None

    def forward(
        self, h: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        scores = self.score(self.norm(h)).squeeze(-1)
        if self.features is not None:
            if features is None:
                raise ValueError("this head reads features, but none were given")
            scores = scores + self.features(features).squeeze(-1)
        return scores.masked_fill(~mask, 0.0)
