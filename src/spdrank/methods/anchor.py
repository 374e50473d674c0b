"""The first stage's order as the student's starting point: a prior plus a learned correction.

A reranker is given a list its first stage (BM25, a dense retriever, a recommender's candidate
generator) has already ordered, and that order is usually good. A head trained from random
weights starts far from it and, on little data, may never get back: a student that ranks
below the retriever it was given is worse than no reranker. An anchored model scores

    M = head(...) + strength * prior

where ``prior`` holds the first stage's order: item i of n (0-based in the order the
candidates were given) at position k scores ``-|i - k| / (n - 1)`` (a matrix head) or
``-i / (n - 1)`` (one score per item), so the prior's spread is the same for any n. The
head's output layers start at zero (:func:`zero_correction`), so an untrained model decodes
exactly the given order: the prior alone is maximised by the identity assignment, and its
Sinkhorn normalisation keeps expected positions in the given order (``exp(-|i - k|)`` is a
totally positive kernel, and diagonal scaling keeps that). Training moves the head away from
zero only as far as the targets pull it, and may weaken or strengthen the prior itself
(``strength``). This is the residual form of zero-initialised output layers (as LoRA's B or
ReZero's gate): the correction starts at zero, its gradient does not.

The prior reads nothing but the candidates' order, so it needs slates whose candidates come
in the first stage's order: search slates, rank_llm and Cohere requests. Slates whose
candidates are shuffled (recommendation slates built from logs) must not be anchored.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: The prior's strength at initialisation: the first and the last of the given order differ
#: by this much at any position, enough to keep the order against a head's early noise, and
#: little enough that a head's scores can move a passage many places.
INITIAL_STRENGTH = 5.0


class FirstStageAnchor(nn.Module):
    """Adds the given order's prior to a head's scores.

    ``matrix``: the head scores an N x K item-position matrix (else one score per item).
    """

    def __init__(self, matrix: bool) -> None:
        super().__init__()
        self.matrix = matrix
        #: log of the prior's strength, so the strength stays positive as it learns.
        self.log_strength = nn.Parameter(torch.tensor(math.log(INITIAL_STRENGTH)))

    def prior(self, lengths: torch.Tensor, items: int, positions: int) -> torch.Tensor:
        """The given order's scores for slates of ``lengths`` items padded to ``items``:
        [B, items, positions] for a matrix head, else [B, items].

        Each slate's own n sets its scale, so a slate scores the same padded beside a longer
        one as ranked alone (the padded rows are masked by the caller).
        """
        scale = 1.0 / (lengths.to(torch.float32) - 1).clamp(min=1)
        steps = torch.arange(max(items, positions), device=lengths.device, dtype=torch.float32)
        order = steps[None, :items] * scale[:, None]
        if not self.matrix:
            return -order
        position = steps[None, :positions] * scale[:, None]
        return -(order[:, :, None] - position[:, None, :]).abs()

    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``scores`` ([B, N, K] or [B, N]) of the head, anchored; padded items stay 0."""
        prior = self.prior(mask.sum(dim=1), scores.size(1), scores.size(-1))
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
