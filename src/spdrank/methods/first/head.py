"""FIRST's head: the LM's logits of the candidates' letters at the prompt's end -> [B, N]."""

from __future__ import annotations

import torch
from torch import nn

from spdrank.methods.heads import feature_projection, item_inputs


class FirstHead(nn.Module):
    """FIRST (Reddy et al. 2024): the LM's first-token logits over the candidates' identifiers.

    The prompt ends with "[" and each candidate is labelled by one token (a letter), so the
    logit of that token at the last position scores the candidate. The backbone's LM head does
    the work; this module only holds the identifier token ids. Returns [B, N].

    With features, a linear map of each candidate's features is added to its letter's logit:
    the letters stay the LM's own answer, and the features shift it, one weight per feature.
    """

    matrix = False

    def __init__(self, token_ids: list[int], features: int = 0) -> None:
        super().__init__()
        self.register_buffer("token_ids", torch.tensor(token_ids, dtype=torch.long))
        self.features = feature_projection(features, 1)

    def forward(
        self, logits: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        scores = logits[:, self.token_ids[: mask.size(1)]]
        if self.features is not None:
            scores = scores + item_inputs(None, None, self.features, features).squeeze(-1)
        return scores.masked_fill(~mask, 0.0)
