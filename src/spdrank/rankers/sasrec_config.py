"""SASRec's settings, importable without torch (the data builder and the CLI read them).

The shape is Kang & McAuley's (2018) for Amazon Beauty (2 blocks, 1 head, dropout 0.5,
sequences cut to the last 50 items, batch 128, Adam at 1e-3), with a 64-wide embedding, the
softmax loss RecBole trains it with by default, and an epoch count chosen so that one fit on
Beauty's users stays within minutes on one CPU thread (docs/sasrec.md gives the measured
time and what each choice is worth).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The name of the SASRec feature, retriever and ranker.
SASREC = "sasrec"
#: The manifest field where a build records the SASRec it fitted (``{"key": ...}``), which
#: ``spdrank eval --ranker sasrec`` on its training file loads.
SASREC_FIT = "sasrec_fit"
#: The training losses a fit may use (:attr:`SASRecConfig.loss`).
LOSSES = ("bce", "ce")
#: Beyond this many items, ``"ce"`` normalises over the next item and this many items drawn
#: uniformly for the batch rather than over the whole catalogue, whose logits for a batch of
#: 128 sequences of 50 positions would take gigabytes.
SAMPLED_NEGATIVES = 8192


@dataclass(frozen=True)
class SASRecConfig:
    """Model shape and training schedule; all of it is part of the fitted model's cache key."""

    #: How many of a sequence's most recent items the model reads (older ones are cut).
    max_len: int = 50
    dim: int = 64
    blocks: int = 2
    heads: int = 1
    dropout: float = 0.5
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0
    #: What a position is trained to predict its next item with. ``"ce"``: cross-entropy of a
    #: softmax over the whole catalogue (over the next item and :data:`SAMPLED_NEGATIVES`
    #: uniform ones shared by the batch, for a catalogue larger than that), as RecBole's
    #: SASRec trains by default and Klenitskiy & Vasilev (RecSys 2023) found much stronger
    #: than one negative: the SASRec a team runs. ``"bce"``: the paper's binary
    #: cross-entropy of the next item against one negative drawn uniformly from the items the
    #: user never touched.
    loss: str = "ce"

    def __post_init__(self) -> None:
        for name in ("max_len", "dim", "blocks", "heads", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SASRec {name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.heads:
            raise ValueError(
                f"SASRec dim {self.dim} must be a multiple of heads {self.heads}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"SASRec dropout must be within [0, 1), got {self.dropout}")
        if not self.lr > 0.0:
            raise ValueError(f"SASRec lr must be > 0, got {self.lr}")
        if self.loss not in LOSSES:
            raise ValueError(f"SASRec loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SASRecConfig:
        """Settings as :meth:`to_dict` wrote them; a fit saved before ``loss`` was a setting
        was trained with ``"bce"``."""
        return cls(**{"loss": "bce", **data})
