"""What every method's heads share: their settings and the layers they are built from.

A head maps per-candidate hidden states [B, N, D] to scores: an item-position matrix M
[B, N, K] for SPD's heads (:mod:`spdrank.methods.spd.heads`, :mod:`spdrank.methods.spd.history`),
one score per item [B, N] for the peers' (:mod:`spdrank.methods.scalar.head`,
:mod:`spdrank.methods.first.head`). The method that serves a head kind builds it
(:meth:`spdrank.methods.base.RankingMethod.build_head`); :class:`HeadConfig` is the one setting
record of every kind, saved as a checkpoint's ``head`` field.

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

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from spdrank.backbone.settings import ConfigError
from spdrank.core.defaults import ANCHORS, UNNAMED_ANCHOR, UNNAMED_HEAD, UNNAMED_MATCH

#: How the history head compares a candidate's units with a history item's (``HeadConfig.match``).
MATCHES = ("maxsim", "tfidf")

#: The bounds of a head's sizes. A checkpoint's config.json is read from a file, so each size
#: is checked before a layer is built from it: positions far past any slate, widths and depths
#: far past any head trained here, and at most ``MAX_HEAD_PARAMETERS`` weights in all (1 GiB
#: in float32), so no setting asks for an allocation without bound.
MAX_POSITIONS = 8192
MAX_WIDTH = 8192
MAX_LAYERS = 64
MAX_HEADS = 256
MAX_HEAD_PARAMETERS = 1 << 28


@dataclass
class HeadConfig:
    #: The head kind (``--head``): one a registered method serves
    #: (:func:`~spdrank.methods.base.head_kinds`), and that method builds it.
    kind: str = UNNAMED_HEAD
    #: Number of rank positions; must be >= the largest slate.
    positions: int = 64
    #: Width of the head's own layers (attn/slot), projected down from the backbone's D.
    width: int = 256
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    #: How the history head matches units, when the prompt's readout keeps several states per
    #: item (its tokens or its words: :data:`~spdrank.backbone.prompt.UNIT_READOUTS`): "maxsim" (late interaction: each candidate
    #: unit's best cosine with the item's units, averaged with learned weights) or "tfidf"
    #: (every pair of units through a sharp kernel, weighted on both sides: the shape of a
    #: TF-IDF cosine, whose matches also go straight to the position scores). Unnamed:
    #: :data:`~spdrank.core.defaults.UNNAMED_MATCH`; ``spdrank train`` asks for
    #: :data:`~spdrank.core.defaults.UNIT_MATCH`.
    match: str = UNNAMED_MATCH
    #: Width of the space where the "tfidf" match compares units: every pair of units meets
    #: there, so it is kept narrower than the head's own layers.
    match_width: int = 64
    #: What the scores start from (:mod:`spdrank.methods.anchor`): "none", or "order", the
    #: order the candidates are given in (the first stage's), which the head then corrects.
    anchor: str = UNNAMED_ANCHOR

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise ValueError(f"unknown match {self.match!r}: use one of {list(MATCHES)}")
        if self.anchor not in ANCHORS:
            raise ValueError(f"unknown head.anchor {self.anchor!r}: use one of {list(ANCHORS)}")
        self.check_sizes()

    def check_sizes(self) -> None:
        """Refuse a size that is no integer in its bound, or heads that would hold more than
        :data:`MAX_HEAD_PARAMETERS` weights, naming the field (``head.positions``)."""
        for name, low, high in (
            ("positions", 1, MAX_POSITIONS), ("width", 1, MAX_WIDTH), ("layers", 0, MAX_LAYERS),
            ("heads", 1, MAX_HEADS), ("match_width", 1, MAX_WIDTH),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"head.{name} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"head.{name} must be between {low} and {high}, got {value}")
        if self.width % self.heads:
            raise ValueError(f"head.width ({self.width}) must be a multiple of head.heads "
                             f"({self.heads}): each attention head takes an equal share")
        if not isinstance(self.kind, str):
            raise ConfigError(f"head.kind must be a name, got {self.kind!r}")
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout < 1:
            raise ValueError(f"head.dropout must be a number in [0, 1), got {dropout!r}")
        # A pre-norm layer holds about 12 width^2 weights; the position and match maps a few
        # width-sized rows each.
        weights = self.layers * 12 * self.width**2 + (3 * self.positions + 2 * self.match_width
                                                        + 4) * self.width
        if weights > MAX_HEAD_PARAMETERS:
            raise ValueError(
                f"head sizes (width {self.width}, layers {self.layers}, positions "
                f"{self.positions}) ask for about {weights:,} weights, more than the "
                f"{MAX_HEAD_PARAMETERS:,} a head may hold"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        return cls(**data)


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


def renamed_from(renames: dict[str, str]) -> Callable[..., None]:
    """A load hook that moves ``renames``' keys (these layers' earlier names) to their current
    names, so checkpoints saved under the earlier names still load."""

    def hook(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            rest = key[len(prefix) :]
            for old, new in renames.items():
                if rest.startswith(old):
                    state_dict[prefix + new + rest[len(old) :]] = state_dict.pop(key)
                    break

    return hook


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
