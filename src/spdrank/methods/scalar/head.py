"""The scalar peer's head: each candidate's state -> one score [B, N], ranked by sorting."""

from __future__ import annotations

import torch
from torch import nn

from spdrank.methods.head_config import HeadConfig
from spdrank.methods.heads import ItemHead


class ScalarHead(ItemHead):
    """One score per item from the slate's one prefill, ranked by sorting (no positions).

    Returns [B, N] (padded items 0). Trained with a listwise loss (ListNet), decoded by argsort.
    """

    matrix = False
    #: The layer whose output is the score (zeroed for an anchored model).
    correction_layers = ("out.1",)

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__(hidden, cfg.width, features)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(cfg.width, 1))

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.item_inputs(h, features)
        return self.out(x).squeeze(-1).masked_fill(~mask, 0.0)
