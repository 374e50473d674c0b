"""Log-domain Sinkhorn relaxation and the permutation cross-entropy (the paper's Eq. 3).

Sinkhorn turns a score matrix into a (nearly) doubly-stochastic matrix S by alternately
normalising rows and columns of exp(M / tau). Working with logsumexp in the log domain keeps it
finite at low temperatures, where exp(M / tau) would overflow.

A slate of n items is ranked into its first n positions, so for a batch padded to P = max n
items, each slate uses the top-left n x n block of M. The rest is filled so that the padded
block is the identity and no mass crosses between real and padded entries: every row and column
then keeps at least one finite entry (no NaN from an all -inf logsumexp) and the real block is
normalised exactly as if it stood alone.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def block_mask(sizes: torch.Tensor, width: int) -> torch.Tensor:
    """[B, P, P] True where both the item and the position are real (i < n and j < n)."""
    idx = torch.arange(width, device=sizes.device)
    real = idx.unsqueeze(0) < sizes.unsqueeze(1)  # [B, P]
    return real.unsqueeze(2) & real.unsqueeze(1)


def log_sinkhorn(
    scores: torch.Tensor, sizes: torch.Tensor, tau: float = 1.0, iters: int = 20
) -> torch.Tensor:
    """log S for each slate's n x n block of ``scores`` [B, N, K]; returns [B, P, P], P = max n.

    Entries outside the real block are -inf except the padded diagonal (log 1 = 0).
    """
    if tau <= 0:
        raise ValueError(f"Sinkhorn temperature must be positive, got {tau}")
    width = int(sizes.max())
    if width > scores.size(2):
        raise ValueError(f"a slate of {width} items needs at least {width} positions, head has {scores.size(2)}")
    log_alpha = scores[:, :width, :width] / tau
    real = block_mask(sizes, width)
    eye = torch.eye(width, dtype=torch.bool, device=scores.device).unsqueeze(0)
    filler = torch.full_like(log_alpha, NEG_INF).masked_fill(eye, 0.0)
    log_alpha = torch.where(real, log_alpha, filler)
    for _ in range(iters):
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=2, keepdim=True)
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=1, keepdim=True)
    return log_alpha


def permutation_cross_entropy(
    log_s: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """-sum_ij P_ij log S_ij over each slate's real block, divided by its n; mean over slates.

    ``target`` [B, P, P] is the target matrix: a permutation matrix for a teacher ranking, or
    any doubly-stochastic matrix (e.g. clicks spread over the first positions). Entries outside
    the real block are ignored. ``reduction="none"`` gives the [B] per-slate losses, which a
    data-parallel trainer sums over its share of a batch.
    """
    real = block_mask(sizes, log_s.size(1))
    safe = torch.where(real, log_s, torch.zeros_like(log_s))  # avoid 0 * -inf = nan
    per_slate = -(target * safe * real).sum((1, 2)) / sizes
    return reduce_slates(per_slate, reduction)


def reduce_slates(per_slate: torch.Tensor, reduction: str) -> torch.Tensor:
    """[B] per-slate losses, or their mean (``reduction`` "none" or "mean")."""
    if reduction == "mean":
        return per_slate.mean()
    if reduction == "none":
        return per_slate
    raise ValueError(f"unknown reduction {reduction!r}: use mean or none")
