"""Ranking by one score per item: what every method without positions to assign does.

The scalar, FIRST and pointwise heads score each item once; their ranking is a sort, the
same for all of them, so it lives here rather than in any one method (SPD's decoders, which
assign items to positions, are :mod:`spdrank.methods.spd.decode`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def sort_scores(scores: np.ndarray) -> np.ndarray:
    """Item indices best first for one score per item; stable on ties."""
    v = np.asarray(scores, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"item scores must be a non-empty vector, got shape {v.shape}")
    if not np.isfinite(v).all():
        bad = int(np.argwhere(~np.isfinite(v))[0][0])
        raise ValueError(f"item scores hold a non-finite value ({v[bad]}) at item {bad}")
    return np.argsort(-v, kind="stable")


def rank_by_sorting(scores: np.ndarray, sizes: Sequence[int]) -> list[tuple[np.ndarray, list[float]]]:
    """Each slate's items sorted by their scores, with those scores, for a padded batch
    ``scores`` [B, N] whose slate b has ``sizes[b]`` items."""
    ranked = []
    for b, n in enumerate(sizes):
        order = sort_scores(scores[b, :n])
        ranked.append((order, scores[b][order].astype(float).tolist()))
    return ranked
