"""A head's settings, the record every head kind is built from and a checkpoint saves as its
``head`` field: here, apart from the layers (:mod:`spdrank.methods.heads`), so that reading a
checkpoint's config imports no torch.

What one head kind alone reads is that head's own record: the history head's match
(:class:`~spdrank.methods.spd.history_settings.HistorySettings`), held here as one field and
written flat into ``head``, where checkpoints have always held its fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from spdrank.backbone.settings import ConfigError
from spdrank.core.defaults import TRAIN_HEAD, UNNAMED_ANCHOR
from spdrank.methods.anchor_spec import parse_anchor
from spdrank.methods.spd.history_settings import HistorySettings

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
    #: (:func:`~spdrank.methods.base.head_kinds`), and that method builds it. Unnamed, the
    #: head ``spdrank train`` fits (:data:`~spdrank.core.defaults.TRAIN_HEAD`).
    kind: str = TRAIN_HEAD
    #: Number of rank positions; must be >= the largest slate.
    positions: int = 64
    #: Width of the head's own layers, projected down from the backbone's D.
    width: int = 256
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    #: The history head's own settings (its match), saved flat in ``head`` in this field's
    #: place whatever the kind.
    history: HistorySettings = field(default_factory=HistorySettings)
    #: What the scores start from (:mod:`spdrank.methods.anchor_spec`): "none", "order" (the
    #: order the candidates are given in, the first stage's), or "feature:NAME" (the order of
    #: a feature the model reads, or of a blend of them), which the head then corrects.
    anchor: str = UNNAMED_ANCHOR

    def __post_init__(self) -> None:
        try:
            parse_anchor(self.anchor)
        except ValueError as err:
            raise ValueError(f"head.anchor: {err}") from None
        self.check_sizes()

    def check_sizes(self) -> None:
        """Refuse a size that is no integer in its bound, or heads that would hold more than
        :data:`MAX_HEAD_PARAMETERS` weights, naming the field (``head.positions``)."""
        for name, low, high in (
            ("positions", 1, MAX_POSITIONS), ("width", 1, MAX_WIDTH), ("layers", 0, MAX_LAYERS),
            ("heads", 1, MAX_HEADS),
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
        weights = self.layers * 12 * self.width**2 + (
            3 * self.positions + 2 * self.history.match_width + 4) * self.width
        if weights > MAX_HEAD_PARAMETERS:
            raise ValueError(
                f"head sizes (width {self.width}, layers {self.layers}, positions "
                f"{self.positions}) ask for about {weights:,} weights, more than the "
                f"{MAX_HEAD_PARAMETERS:,} a head may hold"
            )

    def to_dict(self) -> dict[str, Any]:
        """The record config.json holds: every field, the history head's flat in its place."""
        record: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "history":
                record |= self.history.to_dict()
            else:
                record[f.name] = getattr(self, f.name)
        return record

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        data = dict(data)
        return cls(history=HistorySettings.take(data), **data)
