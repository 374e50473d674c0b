"""The pointwise peer's head: each candidate's state -> one score [B, N], ranked by sorting."""

from __future__ import annotations

import torch
from torch import nn

from spdrank.methods.heads import (
    HeadConfig,
    check_inputs,
    feature_projection,
    item_inputs,
    renamed_from,
    state_projection,
)


class ScalarHead(nn.Module):
    """The classic pointwise peer: one score per item, ranked by sorting (no positions).

    Returns [B, N] (padded items 0). Trained with a listwise loss (ListNet), decoded by argsort.
    """

    matrix = False

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        check_inputs(hidden, features)
        self.proj = state_projection(hidden, cfg.width)
        self.features = feature_projection(features, cfg.width)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(cfg.width, 1))
        self.register_load_state_dict_pre_hook(
            renamed_from({"mlp.0.": "proj.0.", "mlp.1.": "proj.1.", "mlp.3.": "out.1."})
        )

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = item_inputs(self.proj, h, self.features, features)
        return self.out(x).squeeze(-1).masked_fill(~mask, 0.0)
