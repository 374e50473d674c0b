"""Training targets: what permutation (or soft assignment) a slate should be decoded into.

- ``teacher``: the teacher's ranking as a permutation matrix (the paper's distillation).
- ``clicks``: clicked items share the first c positions, the others share the rest (the
  paper's Track 1). Clicks say nothing about the order among clicked or among unclicked
  items, so the target spreads mass uniformly there rather than inventing an order.
- ``teacher+clicks``: the teacher's ranking with the clicked items moved to the top, each
  group keeping the teacher's order (ours, beyond the paper).
"""

from __future__ import annotations

import numpy as np

from spdrank.slates import Slate

TARGETS = ("teacher", "clicks", "teacher+clicks")
#: How the loss weighs a target's positions (:func:`spdrank.sinkhorn.permutation_cross_entropy`).
POSITION_WEIGHTS = ("uniform", "dcg")


def _permutation_matrix(docids: list[str], ranking: list[str]) -> np.ndarray:
    pos = {d: j for j, d in enumerate(ranking)}
    out = np.zeros((len(docids), len(docids)), dtype=np.float32)
    for i, d in enumerate(docids):
        out[i, pos[d]] = 1.0
    return out


def clicks_first(ranking: list[str], clicked: list[str]) -> list[str]:
    """``ranking`` with the clicked items moved to the top, both groups in their given order."""
    hit = set(clicked)
    return [d for d in ranking if d in hit] + [d for d in ranking if d not in hit]


def target_matrix(slate: Slate, kind: str) -> np.ndarray:
    """The n x n target for ``slate``: rows are candidates (slate order), columns positions."""
    docids = slate.docids
    n = len(docids)
    if kind not in TARGETS:
        raise ValueError(f"unknown target {kind!r}: choose one of {list(TARGETS)}")
    if kind in ("teacher", "teacher+clicks") and slate.teacher is None:
        raise ValueError(
            f"slate {slate.query.qid!r} has no 'teacher' ranking; label it with `spdrank teacher` "
            "or train with --target clicks"
        )
    if kind in ("clicks", "teacher+clicks") and not slate.clicked:
        raise ValueError(f"slate {slate.query.qid!r} has no 'clicked' items for target {kind!r}")
    if kind == "teacher":
        return _permutation_matrix(docids, slate.teacher)
    if kind == "teacher+clicks":
        return _permutation_matrix(docids, clicks_first(slate.teacher, slate.clicked))
    hit = set(slate.clicked)
    c = len(hit)
    out = np.zeros((n, n), dtype=np.float32)
    for i, d in enumerate(docids):
        if d in hit:
            out[i, :c] = 1.0 / c
        elif c < n:
            out[i, c:] = 1.0 / (n - c)
    return out
