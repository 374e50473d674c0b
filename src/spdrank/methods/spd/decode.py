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

:func:`decode_batch` decodes a padded batch of matrices: ``expected_rank`` and ``argsort`` run
once over every slate of one size together (their orders are those of the one-slate call),
the others slate by slate. :func:`rank_batch` is what a ranking call runs: each slate's order
with the scores its ranking reports (:func:`ranked_relevance`), in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from spdrank.core.defaults import PAPER_DECODER

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
    return expected_rank_batch(_square(scores)[None], tau, iters)[0]


#: Largest spread (max - min, over tau) of a matrix Sinkhorn-normalised as exp(M) with
#: scaling vectors: the vectors then stay within about e^(±(spread + log n)), far from float64's
#: limits (e^±709). A wider matrix is normalised in the log domain.
_EXP_SPREAD = 200.0


def expected_rank_batch(m: np.ndarray, tau: float = 1.0, iters: int = 20) -> np.ndarray:
    """:func:`expected_rank` of each square float64 matrix of ``m`` [B, n, n] (already
    checked): item orders [B, n]."""
    return np.argsort(expected_positions(m, tau, iters), axis=1, kind="stable")


def relevance(scores: np.ndarray, tau: float = 1.0, iters: int = 20) -> np.ndarray:
    """Each item's relevance under its score matrix [n, K]: ``1 - E[position] / n`` of the
    Sinkhorn-normalised matrix, in (0, 1], 1 for an item sure to be first. It is the quantity
    ``expected_rank`` sorts by, so its ranking is descending in it, and a score comparable
    across the slate's items (thresholds, fusion with a first-stage score)."""
    m = _square(scores)
    return 1.0 - expected_positions(m[None], tau, iters)[0] / len(m)


def expected_positions(m: np.ndarray, tau: float = 1.0, iters: int = 20) -> np.ndarray:
    """Each item's expected position [B, n] under ``iters`` Sinkhorn normalisations of
    exp(M / tau), for square float64 matrices ``m`` [B, n, n].

    The reference is :func:`spdrank.methods.spd.loss.log_sinkhorn`, the relaxation training learns
    through: this is the same normalisation (tested to agree to 1e-6), written apart because
    the two jobs differ. Training needs autograd over padded torch batches, in the log
    domain; decoding runs on the host after the head, one slate at a time as a request
    arrives, where numpy's matrix-vector products cost less than torch's per-call dispatch
    of a log-sum-exp over the whole matrix.

    Alternating row and column normalisation of exp(M / tau) is diag(u) exp(M / tau) diag(v)
    for two scaling vectors, so each step is a matrix-vector product rather than a
    log-sum-exp over the whole matrix: the same matrix up to float rounding, at a fraction of
    the exponentials. A matrix whose spread could overflow the vectors is normalised in the
    log domain instead.
    """
    with np.errstate(over="ignore"):
        top = m.max(axis=(1, 2), keepdims=True)
        log_s = np.clip((m - top) / tau, -1e300, 0.0)
    safe = log_s.min(axis=(1, 2)) >= -_EXP_SPREAD
    if safe.all():
        return _expected_scaled(np.exp(log_s, out=log_s), iters)
    expected = np.empty(m.shape[:2])
    if safe.any():
        expected[safe] = _expected_scaled(np.exp(log_s[safe]), iters)
    expected[~safe] = _expected_log(log_s[~safe], iters)
    return expected


def _expected_scaled(k: np.ndarray, iters: int) -> np.ndarray:
    """Each item's expected position under ``iters`` row-then-column normalisations of the
    positive matrices ``k`` [B, n, n], kept as scaling vectors u (rows) and v (columns)."""
    if k.shape[0] == 1:
        return _expected_scaled_one(k[0], iters)[None]
    v = np.ones(k.shape[:2])
    u = v
    for _ in range(iters):
        u = 1.0 / np.matmul(k, v[..., None])[..., 0]
        v = 1.0 / np.matmul(u[:, None, :], k)[:, 0, :]
    positions = np.arange(k.shape[2], dtype=np.float64)
    return u * np.matmul(k, (v * positions)[..., None])[..., 0]


def _expected_scaled_one(k: np.ndarray, iters: int) -> np.ndarray:
    """:func:`_expected_scaled` of one matrix [n, n]: the same products as plain matrix-vector
    calls, which skip the stacked call's per-call setup (most of a small matrix's time)."""
    v = np.ones(k.shape[0])
    u = v
    for _ in range(iters):
        u = 1.0 / k.dot(v)
        v = 1.0 / u.dot(k)
    return u * k.dot(v * np.arange(k.shape[1], dtype=np.float64))


def _expected_log(log_s: np.ndarray, iters: int) -> np.ndarray:
    """Each item's expected position under the same normalisations, in the log domain, for
    matrices [B, n, n] whose entries span more than exp can hold."""
    for _ in range(iters):
        log_s = log_s - _logsumexp(log_s, axis=2)
        log_s = log_s - _logsumexp(log_s, axis=1)
    return np.exp(log_s) @ np.arange(log_s.shape[2], dtype=np.float64)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))


def argsort_batch(m: np.ndarray) -> np.ndarray:
    """:func:`argsort` of each square matrix of ``m`` [B, n, n]: items by their rank-1 column."""
    return np.argsort(-m[:, :, 0], axis=1, kind="stable")


DECODERS: dict[str, Decoder] = {
    "hungarian": hungarian,
    "greedy": greedy,
    "argsort": argsort,
    "expected_rank": expected_rank,
}


#: Most float64 entries (256 KiB) :func:`decode_batch` stacks into one batched call.
_STACK_ENTRIES = 32_768

#: Decoders that also run over a stack of same-sized square matrices [B, n, n] at once.
BATCH_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "expected_rank": expected_rank_batch,
    "argsort": argsort_batch,
}


def register_decoder(name: str, fn: Decoder) -> None:
    """Make ``fn`` (matrix -> item order) available by ``name`` everywhere a decoder is chosen."""
    DECODERS[name] = fn
    BATCH_DECODERS.pop(name, None)  # a batched version of what ``name`` meant before is stale


def get_decoder(name: str) -> Decoder:
    try:
        return DECODERS[name]
    except KeyError:
        raise ValueError(f"unknown decoder {name!r}: choose one of {sorted(DECODERS)}") from None


def decode(scores: np.ndarray, name: str = PAPER_DECODER) -> np.ndarray:
    """Item indices best first, decoded from ``scores`` [n, K] with the named decoder."""
    return get_decoder(name)(scores)


def decode_batch(
    scores: np.ndarray, sizes: Sequence[int], name: str = PAPER_DECODER
) -> list[np.ndarray]:
    """Item orders of a padded batch ``scores`` [B, N, K] whose slate b has ``sizes[b]`` items:
    ``decode(scores[b, :sizes[b]], name)`` for each b, slates of one size decoded together
    where the decoder runs over a batch."""
    fn = get_decoder(name)
    batched = BATCH_DECODERS.get(name)
    if batched is None:
        return [fn(scores[b, :n]) for b, n in enumerate(sizes)]
    orders: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(sizes)
    for n in sorted(set(sizes)):
        members = [b for b, size in enumerate(sizes) if size == n]
        # A stack stays within a core's cache: past that, memory traffic costs more than the
        # per-call overhead the stacking saves.
        chunk = max(1, _STACK_ENTRIES // (n * n))
        for start in range(0, len(members), chunk):
            part = members[start : start + chunk]
            stack = np.stack([_square(scores[b, :n]) for b in part])
            for b, order in zip(part, batched(stack)):
                orders[b] = order
    return orders


def ranked_relevance(scores: np.ndarray, order: np.ndarray) -> list[float]:
    """Each ranked item's :func:`relevance` (1 - its expected position over n), best first, as
    a running minimum down the ranking, for a slate's ``scores`` [n, K] (padded items may follow
    the real ones) ranked in ``order``: exactly the relevance under ``expected_rank``, whose
    order it sorts by, and never rising down the list under a decoder that orders otherwise (an
    assignment can place an item above one the soft assignment expects higher)."""
    ranked = relevance(scores[: len(order)])[order]
    return np.minimum.accumulate(ranked).tolist()


def rank_batch(
    scores: np.ndarray, sizes: Sequence[int], name: str = PAPER_DECODER
) -> list[tuple[np.ndarray, list[float]]]:
    """Each slate's order (:func:`decode_batch`) and the scores its ranking reports
    (:func:`ranked_relevance`), for a padded batch ``scores`` [B, N, K] whose slate b has
    ``sizes[b]`` items."""
    orders = decode_batch(scores, sizes, name)
    return [(order, ranked_relevance(scores[b], order)) for b, order in enumerate(orders)]
