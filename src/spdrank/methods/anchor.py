"""A ranker's order as the student's starting point: a prior plus a learned correction.

A reranker is given a list its first stage (BM25, a dense retriever, a recommender's candidate
generator) has already ordered, and often the scores of other rankers beside it (a dense
cosine, SASRec's score). The strongest of them is what a team already runs, and a head
trained from random weights starts far from it and, on little data, may never get back: a
student that ranks below the best ranker it reads is worse than no reranker. An anchored
model scores

    M = head(...) + strength * prior

where ``prior`` holds a ranker's order (:mod:`spdrank.methods.anchor_spec` says which): item i
at rank r_i of n (0-based: the order the candidates were given in, or the order of a feature
the model reads, or of a weighted sum of them) at position k scores ``-|r_i - k| / (n - 1)``
(a matrix head) or ``-r_i / (n - 1)`` (one score per item), so the prior's spread is the same
for any n. The head's output layers start at zero (:func:`zero_correction`), so an untrained
model decodes exactly that order: the prior alone is maximised by the assignment of each
item to its own rank, and its Sinkhorn normalisation keeps expected positions in that order
(``exp(-|r - k|)`` is a totally positive kernel, diagonal scaling keeps that, and permuting
rows permutes the normalised matrix alike). Training moves the head away from zero only as
far as the targets pull it, and may weaken or strengthen the prior itself (``strength``). This
is the residual form of zero-initialised output layers (as LoRA's B or ReZero's gate): the
correction starts at zero, its gradient does not.

A feature's order is read from the normalised features the head reads (a z-score keeps each
feature's order). Items of equal score are pulled to the span of ranks they fill together,
with no order among them but a tie-break small enough to assert nothing and large enough that
every decoder keeps the order they were given in, as ``spdrank eval --ranker feature:NAME``
ranks them (:meth:`Anchor.prior`). The ``order`` prior reads nothing but the
candidates' order, so it needs slates whose candidates come in the first stage's order:
search slates, rank_llm and Cohere requests; slates whose candidates are shuffled
(recommendation slates built from logs) are anchored to a feature, or not at all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from spdrank.methods.anchor_spec import AnchorSpec, check_anchor_features

#: How strongly, against a step of rank, the prior keeps items of equal score in the order
#: they were given in: enough for every decoder to keep it, too little to assert it.
TIE_BREAK = 1e-3


class Ranks(NamedTuple):
    """Where each item sits in an anchor's order, float32 [B, N] each: the span of ranks its
    equal-scored group fills (``low`` to ``high``; one rank for an item alone) and its rank
    with equal scores in the order given (``stable``)."""

    low: torch.Tensor
    high: torch.Tensor
    stable: torch.Tensor


#: The prior's strength at initialisation: the first and the last of the given order differ
#: by this much at any position, enough to keep the order against a head's early noise, and
#: little enough that a head's scores can move a passage many places. (A run on clicks starts
#: it weaker: :data:`spdrank.training.train.CLICKS_STRENGTH`.)
INITIAL_STRENGTH = 5.0


class Anchor(nn.Module):
    """Adds a ranker's order as a prior to a head's scores.

    ``matrix``: the head scores an N x K item-position matrix (else one score per item).
    ``spec``: what orders the items (:func:`~spdrank.methods.anchor_spec.parse_anchor`'s
    ``order`` or ``feature`` kind); ``features``: the names of the features the model reads,
    in the order of its feature rows, which a feature anchor weighs.
    """

    def __init__(self, matrix: bool, spec: AnchorSpec | None = None,
                 features: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.matrix = matrix
        self.spec = spec or AnchorSpec("order")
        if not self.spec.anchored:
            raise ValueError("an anchor needs an order to start from, not 'none'")
        check_anchor_features(self.spec, features)
        weights = torch.zeros(len(features))
        for name, weight in self.spec.weights:
            weights[features.index(name)] = weight
        #: Each feature row's weight in the ranking score a feature anchor sorts by; derived
        #: from the config, so not saved with the head's weights.
        self.register_buffer("feature_weights", weights, persistent=False)
        #: log of the prior's strength, so the strength stays positive as it learns.
        self.log_strength = nn.Parameter(torch.tensor(math.log(INITIAL_STRENGTH)))

    def set_strength(self, strength: float) -> None:
        """Start the prior at ``strength`` (above 0): any strength ranks an untrained model
        exactly as the anchor; it sets how hard the head must pull to move an item."""
        if not strength > 0:
            raise ValueError(f"an anchor's strength must be above 0, got {strength}")
        with torch.no_grad():
            self.log_strength.fill_(math.log(strength))

    def ranks(self, mask: torch.Tensor, features: torch.Tensor | None) -> Ranks:
        """Where each item sits in the anchor's order, float32 [B, N] each; padded items last.

        The given order is ``0..n-1``, each item alone at its rank. A feature anchor sorts its
        weighted score, highest first: items of equal score share the span of ranks they fill
        together (``low`` to ``high``), and ``stable`` is each one's rank with equal scores in
        the order given (a stable sort).
        """
        items = mask.size(1)
        steps = torch.arange(items, device=mask.device, dtype=torch.float32)
        if self.spec.kind == "order":
            given = steps.expand(mask.size(0), items)
            return Ranks(given, given, given)
        if features is None:
            raise ValueError(f"anchor {self.spec.text()!r} orders by features, and this batch "
                             "carries none")
        score = features.to(torch.float32) @ self.feature_weights.to(features.device)
        score = score.masked_fill(~mask, float("-inf"))
        order = torch.sort(score, dim=1, descending=True, stable=True).indices
        stable = torch.empty_like(score).scatter_(1, order, steps.expand_as(score).contiguous())
        real = mask[:, None, :]
        above = ((score[:, None, :] > score[:, :, None]) & real).sum(-1).to(torch.float32)
        equal = ((score[:, None, :] == score[:, :, None]) & real).sum(-1).to(torch.float32)
        low = torch.where(mask, above, stable)
        high = torch.where(mask, above + (equal - 1).clamp(min=0), stable)
        return Ranks(low, high, stable)

    def prior(self, lengths: torch.Tensor, ranks: Ranks, positions: int) -> torch.Tensor:
        """The anchor order's scores for slates of ``lengths`` items at ``ranks``:
        [B, N, positions] for a matrix head, else [B, N].

        A matrix head's item scores ``-d / (n - 1)`` at position k, d the distance from k to
        the item's span of ranks: an item alone at rank r is pulled to r, items a feature
        does not tell apart are pulled to the span they fill together and not ordered within
        it, since an order the head cannot see (the given one, among equal scores) is one it
        could not learn to correct, and a click target, which orders nothing after its first
        item, would fight it. Within a span, :data:`TIE_BREAK` of a step keeps each decoder
        to the order given. One score per item: its span's middle, the same tie-break.

        Each slate's own n sets its scale, so a slate scores the same padded beside a longer
        one as ranked alone (the padded rows are masked by the caller).
        """
        scale = 1.0 / (lengths.to(torch.float32) - 1).clamp(min=1)
        tied = (ranks.high > ranks.low).to(torch.float32)
        if not self.matrix:
            middle = (ranks.low + ranks.high) / 2
            return -(middle + TIE_BREAK * tied * (ranks.stable - middle)) * scale[:, None]
        k = torch.arange(positions, device=lengths.device, dtype=torch.float32)[None, None, :]
        low, high = ranks.low[:, :, None], ranks.high[:, :, None]
        outside = (low - k).clamp(min=0) + (k - high).clamp(min=0)
        within = TIE_BREAK * tied[:, :, None] * (ranks.stable[:, :, None] - k).abs()
        return -(outside + within) * scale[:, None, None]

    def forward(self, scores: torch.Tensor, mask: torch.Tensor,
                features: torch.Tensor | None = None) -> torch.Tensor:
        """``scores`` ([B, N, K] or [B, N]) of the head, anchored; padded items stay 0.
        ``features``: the batch's normalised features [B, N, F], which a feature anchor
        orders by."""
        prior = self.prior(mask.sum(dim=1), self.ranks(mask, features), scores.size(-1))
        anchored = scores + self.log_strength.exp() * prior.to(scores.dtype)
        fill = ~mask.unsqueeze(-1) if self.matrix else ~mask
        return anchored.masked_fill(fill, 0.0)


def zero_correction(head: nn.Module) -> None:
    """Zero the weights of the layers whose outputs are ``head``'s scores (its
    ``correction_layers``), so that its scores start at zero and an anchored model at the
    prior; a head that names none cannot be anchored."""
    names = getattr(head, "correction_layers", None)
    if not names:
        raise ValueError(f"a {type(head).__name__} cannot be anchored: its scores have no "
                         "output layer to start at zero (--anchor none)")
    with torch.no_grad():
        for name in names:
            layer = getattr_path(head, name)
            if layer is None:  # an optional layer this head was built without
                continue
            for param in layer.parameters():
                param.zero_()


def getattr_path(module: nn.Module, path: str) -> nn.Module | None:
    """The submodule at a dotted ``path`` (``proj.1``), None where a step is None."""
    for step in path.split("."):
        if module is None:
            return None
        module = module[int(step)] if step.isdigit() else getattr(module, step)
    return module
