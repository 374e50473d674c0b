"""What every method's heads share: their settings and the layers they are built from.

A head maps per-candidate hidden states [B, N, D] to scores: an item-position matrix M
[B, N, K] for SPD's heads (:mod:`spdrank.methods.spd.heads`, :mod:`spdrank.methods.spd.history`),
one score per item [B, N] for the peers' (:mod:`spdrank.methods.scalar.head`,
:mod:`spdrank.methods.first.head`). The method that serves a head kind builds it
(:meth:`spdrank.methods.base.RankingMethod.build_head`) from its settings,
:class:`~spdrank.methods.head_config.HeadConfig`, saved as a checkpoint's ``head`` field.

A head may also read F upstream features per candidate ([B, N, F], already normalised; see
:mod:`spdrank.core.features`). Each head maps the features into the space where it first meets
the hidden state (the attention width; K scores for the probe) and adds them there
(:func:`item_inputs`), so the hidden state's path, and a checkpoint trained without features,
are unchanged. A head built with ``hidden=0`` reads the features alone: the backbone-free
ablation.

All heads take a padding mask [B, N] (True = real item) so slates of different N share a
batch. Padded items are excluded from every attention, so a real item's scores do not depend
on how much padding sits next to it. Padded rows of the scores are set to 0; the Sinkhorn and
decoders mask them anyway.
"""

from __future__ import annotations

import torch
from torch import nn


class ItemHead(nn.Module):
    """A head whose items enter as their projected states plus their projected features.

    Every head over the candidates' states starts alike: the states [B, N, D] and the features
    [B, N, F] are each mapped to the head's ``width`` (:func:`state_projection`,
    :func:`feature_projection`) and summed (:meth:`item_inputs`). With ``history``, the
    history items' states get a map of their own (``history_proj``). The layers are built in
    this order, so a head's initial weights follow from the seed alone.
    """

    #: Its scores are an N x K matrix (else one score per item).
    matrix: bool = True

    def __init__(self, hidden: int, width: int, features: int, history: bool = False) -> None:
        super().__init__()
        check_inputs(hidden, features)
        self.proj = state_projection(hidden, width)
        if history:
            self.history_proj = state_projection(hidden, width)
        self.features = feature_projection(features, width)

    def item_inputs(self, h: torch.Tensor | None, features: torch.Tensor | None) -> torch.Tensor:
        """The items' inputs [B, N, width]: projected states plus projected features."""
        return item_inputs(self.proj, h, self.features, features)


def state_projection(hidden: int, width: int) -> nn.Module | None:
    """LayerNorm + linear from the backbone's D to the head's width; None without states."""
    return nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, width)) if hidden else None


def feature_projection(features: int, width: int) -> nn.Module | None:
    """A linear map of the (already normalised) features to the width; None without features."""
    return nn.Linear(features, width) if features else None


def check_inputs(hidden: int, features: int) -> None:
    """Refuse a head with nothing to read: it needs hidden states, features, or both."""
    if hidden < 0 or features < 0 or not (hidden or features):
        raise ValueError(
            f"a head needs hidden states or features (hidden={hidden}, features={features})"
        )


def item_inputs(
    states: nn.Module | None,
    h: torch.Tensor | None,
    features: nn.Module | None,
    f: torch.Tensor | None,
) -> torch.Tensor:
    """The sum of the projected hidden state and the projected features (whichever exist)."""
    parts = []
    for module, x, what in ((states, h, "hidden states"), (features, f, "features")):
        if module is not None:
            if x is None:
                raise ValueError(f"this head reads {what}, but none were given")
            parts.append(module(x))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]
