"""ListNet (Cao et al. 2007) for the one-score-per-item peers (scalar head, FIRST).

The loss is the cross-entropy between the target's top-one distribution and the softmax of
the predicted scores. A target is given as the same n x n item-position matrix SPD trains on,
so every method learns from exactly the same targets; it becomes a top-one distribution by
giving each item the DCG weight 1 / log2(2 + position) of its target position(s), normalised.
"""

from __future__ import annotations

import torch

from spdrank.methods.spd.loss import position_discounts, reduce_slates


def top_one_distribution(target: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """[B, P, P] target matrices -> [B, P] distributions over each slate's real items."""
    width = target.size(1)
    weights = position_discounts(width, target.device, target.dtype)
    real = torch.arange(width, device=target.device).unsqueeze(0) < sizes.unsqueeze(1)
    gain = (target * weights).sum(2) * real
    return gain / gain.sum(1, keepdim=True)


def listnet_loss(
    scores: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Mean over slates of -sum_i q_i log softmax(scores)_i, padded items excluded.

    ``reduction="none"`` gives the [B] per-slate losses instead.
    """
    width = target.size(1)
    scores = scores[:, :width]
    real = torch.arange(width, device=scores.device).unsqueeze(0) < sizes.unsqueeze(1)
    log_p = torch.log_softmax(scores.masked_fill(~real, float("-inf")), dim=1)
    q = top_one_distribution(target, sizes)
    per_slate = -(q * torch.where(real, log_p, torch.zeros_like(log_p))).sum(1)
    return reduce_slates(per_slate, reduction)
