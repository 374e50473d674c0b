"""The history head's own settings: how it compares a candidate's units with a history item's.

Here, apart from the head (:mod:`.history`, which imports torch), so that reading a
checkpoint's config imports no torch. A :class:`~spdrank.methods.head_config.HeadConfig` holds
one, and config.json holds its fields flat in ``head`` for every head kind: spdrank has always
written them there, and ``spdrank train`` saves its ``--match`` whatever the head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from spdrank.backbone.settings import bounded_int
from spdrank.core.defaults import UNIT_MATCH

#: How the history head may compare a candidate's units with a history item's (``--match``).
MATCHES = ("maxsim", "tfidf")

#: The widest space the "tfidf" match may compare units in (a checkpoint's value is read from
#: a file, so it is bounded before a layer is built from it).
MAX_MATCH_WIDTH = 8192


@dataclass
class HistorySettings:
    #: How the history head matches units, when the prompt's readout keeps several states per
    #: item (its tokens or its words: :data:`~spdrank.backbone.prompt.UNIT_READOUTS`):
    #: "maxsim" (late interaction: each candidate unit's best cosine with the item's units,
    #: averaged with learned weights) or "tfidf" (every pair of units through a sharp kernel,
    #: weighted on both sides: the shape of a TF-IDF cosine, whose matches also go straight to
    #: the position scores). Unnamed, ``spdrank train``'s:
    #: :data:`~spdrank.core.defaults.UNIT_MATCH`.
    match: str = UNIT_MATCH
    #: Width of the space where the "tfidf" match compares units: every pair of units meets
    #: there, so it is kept narrower than the head's own layers.
    match_width: int = 64

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise ValueError(f"unknown match {self.match!r}: use one of {list(MATCHES)}")
        bounded_int(self.match_width, "head.match_width", 1, MAX_MATCH_WIDTH)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def take(cls, record: dict[str, Any]) -> HistorySettings:
        """These settings from a head's record, their fields popped from it (those it lacks at
        their defaults: a checkpoint's config gets its missing fields filled before, by
        :meth:`spdrank.model.config.SPDConfig.from_dict`)."""
        return cls(**{f.name: record.pop(f.name) for f in fields(cls) if f.name in record})
