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

from spdrank.methods.spd import POSITION_WEIGHTS

NEG_INF = float("-inf")


def block_mask(sizes: torch.Tensor, width: int) -> torch.Tensor:
    """[B, P, P] True where both the item and the position are real (i < n and j < n)."""
    idx = torch.arange(width, device=sizes.device)
    real = idx.unsqueeze(0) < sizes.unsqueeze(1)  # [B, P]
    return real.unsqueeze(2) & real.unsqueeze(1)


def log_sinkhorn(
    scores: torch.Tensor, sizes: torch.Tensor, tau: float = 1.0, iters: int = 20,
    width: int | None = None,
) -> torch.Tensor:
    """log S for each slate's n x n block of ``scores`` [B, N, K]; returns [B, P, P], P = max n.

    Entries outside the real block are -inf except the padded diagonal (log 1 = 0). ``width``
    is P when the caller knows it (a training step does, from its slates): reading it from
    ``sizes`` on a GPU waits for every kernel queued before it.
    """
    if tau <= 0:
        raise ValueError(f"Sinkhorn temperature must be positive, got {tau}")
    width = int(sizes.max()) if width is None else width
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


def position_discounts(width: int, device: torch.device | None = None, dtype=torch.float32) -> torch.Tensor:
    """[width] DCG discounts 1 / log2(2 + j) of positions j = 0, 1, ...: what a top-heavy
    metric (NDCG, and in effect Recall@k) pays for an item at each position."""
    return 1.0 / torch.log2(torch.arange(width, device=device, dtype=dtype) + 2)


def permutation_cross_entropy(
    log_s: torch.Tensor,
    target: torch.Tensor,
    sizes: torch.Tensor,
    reduction: str = "mean",
    position_weights: str = "uniform",
) -> torch.Tensor:
    """-sum_ij P_ij w_j log S_ij over each slate's real block, divided by sum_ij P_ij w_j.

    ``target`` [B, P, P] is the target matrix: a permutation matrix for a teacher ranking, or
    any doubly-stochastic matrix (e.g. clicks spread over the first positions). Entries outside
    the real block are ignored. ``position_weights``: ``uniform`` (w = 1, the paper's loss: the
    mean over the n rows) or ``dcg`` (w_j = 1 / log2(2 + j)): a row counts by the DCG
    discount of its target position, so the top of the ranking, where the uniform loss spends
    1/n of its weight, carries as much as the metrics give it. ``reduction="none"`` gives the
    [B] per-slate losses, which a data-parallel trainer sums over its share of a batch.
    """
    if position_weights not in POSITION_WEIGHTS:
        raise ValueError(f"unknown position weights {position_weights!r}: use {list(POSITION_WEIGHTS)}")
    real = block_mask(sizes, log_s.size(1))
    safe = torch.where(real, log_s, torch.zeros_like(log_s))  # avoid 0 * -inf = nan
    weighted = target * real
    if position_weights == "dcg":
        weighted = weighted * position_discounts(log_s.size(2), log_s.device, log_s.dtype)
    per_slate = -(weighted * safe).sum((1, 2)) / weighted.sum((1, 2))
    return reduce_slates(per_slate, reduction)


def reduce_slates(per_slate: torch.Tensor, reduction: str) -> torch.Tensor:
    """[B] per-slate losses, or their mean (``reduction`` "none" or "mean")."""
    if reduction == "mean":
        return per_slate.mean()
    if reduction == "none":
        return per_slate
    raise ValueError(f"unknown reduction {reduction!r}: use mean or none")
