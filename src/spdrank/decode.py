"""Decoders: an item-position score matrix M [n, K] -> a permutation of the n items.

Every decoder returns ``order``: item indices best first (``order[0]`` is the item placed at
rank 1). Each one returns a valid permutation for every finite matrix, ties included; a
matrix holding NaN or inf is rejected, since no ranking read from it would mean anything.

- ``hungarian``: the exact maximum-weight assignment of items to the first n positions
  (scipy's Jonker-Volgenant solver), the paper's decoder.
- ``greedy``: repeatedly take the largest remaining entry; cheaper, not optimal.
- ``argsort``: sort items by their rank-1 column; ignores the other positions.
- ``expected_rank``: Sinkhorn-normalise, then sort by each item's expected position.

The LAP solver is swappable: ``register_decoder("lapjv", fn)`` adds any function with the
same signature (e.g. a faster LAPJV binding) under a new name.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.optimize import linear_sum_assignment

Decoder = Callable[[np.ndarray], np.ndarray]


def _square(scores: np.ndarray) -> np.ndarray:
    m = np.asarray(scores, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"a score matrix must be 2-D [items, positions], got shape {m.shape}")
    n, k = m.shape
    if n == 0:
        raise ValueError("cannot decode an empty slate")
    if k < n:
        raise ValueError(f"{n} items need at least {n} positions; the matrix has {k}")
    if not np.isfinite(m).all():
        bad = np.argwhere(~np.isfinite(m))[0]
        raise ValueError(
            f"score matrix holds a non-finite value ({m[tuple(bad)]}) at item {bad[0]}, "
            f"position {bad[1]}: the model's output is broken, no ranking can be read from it"
        )
    return m[:, :n]


def _order_from_positions(position_of_item: np.ndarray) -> np.ndarray:
    order = np.empty_like(position_of_item)
    order[position_of_item] = np.arange(len(position_of_item))
    return order


def hungarian(scores: np.ndarray) -> np.ndarray:
    m = _square(scores)
    rows, cols = linear_sum_assignment(m, maximize=True)
    position = np.empty(len(rows), dtype=np.int64)
    position[rows] = cols
    return _order_from_positions(position)


def greedy(scores: np.ndarray) -> np.ndarray:
    m = _square(scores).copy()
    n = m.shape[0]
    position = np.empty(n, dtype=np.int64)
    for _ in range(n):
        i, j = np.unravel_index(np.argmax(m), m.shape)  # first maximum: ties are deterministic
        position[i] = j
        m[i, :] = -np.inf
        m[:, j] = -np.inf
    return _order_from_positions(position)


def argsort(scores: np.ndarray) -> np.ndarray:
    m = _square(scores)
    return np.argsort(-m[:, 0], kind="stable")


def expected_rank(scores: np.ndarray, tau: float = 1.0, iters: int = 20) -> np.ndarray:
    m = _square(scores)
    # Shift to a max of 0 and clip: finite matrices with huge ranges must not overflow to -inf.
    with np.errstate(over="ignore"):
        log_s = np.clip((m - m.max()) / tau, -1e300, 0.0)
    for _ in range(iters):
        log_s = log_s - _logsumexp(log_s, axis=1)
        log_s = log_s - _logsumexp(log_s, axis=0)
    expected = np.exp(log_s) @ np.arange(m.shape[1], dtype=np.float64)
    return np.argsort(expected, kind="stable")


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))


DECODERS: dict[str, Decoder] = {
    "hungarian": hungarian,
    "greedy": greedy,
    "argsort": argsort,
    "expected_rank": expected_rank,
}


def register_decoder(name: str, fn: Decoder) -> None:
    """Make ``fn`` (matrix -> item order) available by ``name`` everywhere a decoder is chosen."""
    DECODERS[name] = fn


def get_decoder(name: str) -> Decoder:
    try:
        return DECODERS[name]
    except KeyError:
        raise ValueError(f"unknown decoder {name!r}: choose one of {sorted(DECODERS)}") from None


def sort_scores(scores: np.ndarray) -> np.ndarray:
    """Item indices best first for one score per item (scalar and FIRST peers); stable on ties."""
    v = np.asarray(scores, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"item scores must be a non-empty vector, got shape {v.shape}")
    if not np.isfinite(v).all():
        bad = int(np.argwhere(~np.isfinite(v))[0][0])
        raise ValueError(f"item scores hold a non-finite value ({v[bad]}) at item {bad}")
    return np.argsort(-v, kind="stable")


def decode(scores: np.ndarray, name: str = "hungarian") -> np.ndarray:
    """Item indices best first, decoded from ``scores`` [n, K] with the named decoder."""
    return get_decoder(name)(scores)
