"""SPD: each candidate's state -> a row of N x K item-position scores -> an assignment.

The head (:mod:`.heads`: linear, attn; :mod:`.history`: history) scores every item at every
rank position. Training runs the matrix through log-Sinkhorn into a soft permutation and takes its
cross-entropy against the target permutation, rows weighted as ``--position-weights`` says;
ranking decodes each matrix with the checkpoint's decoder (Hungarian, greedy, expected rank,
...), so every answer is a valid permutation. The entries of M are not comparable across
positions; a ranking reports each item's relevance under the Sinkhorn-normalised matrix
(one minus its expected position over n), which can be compared across items.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spdrank.core.defaults import UNIT_MATCH
from spdrank.core.flags import setting
from spdrank.methods.base import MethodSettings, RankingMethod, state_size
from spdrank.methods.spd import POSITION_WEIGHTS

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from spdrank.core.unread import Unread
    from spdrank.methods.base import BatchDecoder, ModelSettings
    from spdrank.methods.head_config import HeadConfig


@dataclass(kw_only=True)
class SPDSettings(MethodSettings):
    """SPD's own training settings, each a ``spdrank train`` flag: what its loss reads
    (``--tau``, ``--sinkhorn-iters``, ``--position-weights``) and how its history head matches
    units (``--match``, saved in the checkpoint's head record)."""

    #: The Sinkhorn's temperature: the matrix is divided by it before normalising.
    tau: float = setting(1.0, help="Sinkhorn temperature", bounds={"above": 0.0})
    #: The Sinkhorn's row and column normalisations.
    sinkhorn_iters: int = setting(20, help="Sinkhorn iterations", bounds={"low": 1})
    #: How the cross-entropy weighs the rank positions (:mod:`spdrank.methods.spd.loss`).
    position_weights: str = setting(
        "uniform",
        help="how the Sinkhorn cross-entropy weighs each target position: uniform (the paper: "
        "every row alike) or dcg (a row by 1/log2(2+j) of its target position j, so the top "
        "counts as the metrics count it; ours). Scalar and FIRST peers use ListNet, "
        "DCG-weighted either way",
        choices=POSITION_WEIGHTS,
    )
    #: See :class:`spdrank.methods.spd.history_settings.HistorySettings`.
    match: str = setting(
        UNIT_MATCH,
        help="with --readout tokens or words, how --head history compares a candidate with a "
        "history item: maxsim (each candidate unit's best cosine with the item's, averaged "
        "with learned weights) or tfidf (a soft TF-IDF cosine: every pair of units, weighted "
        "on both sides, through a sharp learned kernel)",
    )


class SPDMethod(RankingMethod):
    name = "spd"
    title = "SPD"
    kinds = ("attn", "linear", "history")
    help = (
        "SPD heads: attn (2-layer self-attention), linear (probe), history (attention that "
        "also reads the history items' states: candidates matched with and attending to what "
        "the user chose before; reads the user context one item a line)"
    )
    matrix = True
    history_kinds = ("history",)
    settings = SPDSettings

    def model_name(self, kind: str) -> str:
        return f"spd-{kind}"

    def head_settings(self, settings: Any) -> dict[str, Any]:
        from spdrank.methods.spd.history_settings import HistorySettings

        return {"history": HistorySettings(match=SPDSettings.of(settings).match)}

    def unread(self, settings: Any) -> list[Unread]:
        from spdrank.backbone.prompt import UNIT_READOUTS
        from spdrank.core.unread import Unread

        units = settings.head in self.history_kinds and settings.readout in UNIT_READOUTS
        return [Unread("match", units,
                       "it applies to --head history with --readout tokens or words")]

    def build_head(
        self, config: ModelSettings, backbone: nn.Module, tokenizer: Any, features: int
    ) -> nn.Module:
        from spdrank.backbone.prompt import UNIT_READOUTS

        units = config.prompt.readout in UNIT_READOUTS
        return self.head(config.head, state_size(config, backbone), features, units)

    def head(
        self, cfg: HeadConfig, hidden: int, features: int = 0, units: bool = False
    ) -> nn.Module:
        """A fresh SPD head of ``cfg.kind`` over D = ``hidden`` states (0: the features
        alone) and ``features`` features; ``units``: each item comes as several states (its
        tokens or its words), which the history head matches unit by unit."""
        from spdrank.methods.spd.heads import LinearProbe, SelfAttentionHead
        from spdrank.methods.spd.history import HistoryAttentionHead

        classes: dict[str, type[nn.Module]] = {
            "attn": SelfAttentionHead, "linear": LinearProbe, "history": HistoryAttentionHead,
        }
        if cfg.kind not in classes:
            raise ValueError(f"{cfg.kind!r} is no SPD head: choose one of {list(self.kinds)}")
        if cfg.kind == "history":
            return HistoryAttentionHead(hidden, cfg, features, units)
        return classes[cfg.kind](hidden, cfg, features)

    def loss(
        self, scores: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, settings: Any
    ) -> torch.Tensor:
        from spdrank.methods.spd.loss import log_sinkhorn, permutation_cross_entropy

        spd = SPDSettings.of(settings)
        log_s = log_sinkhorn(
            scores, sizes, tau=spd.tau, iters=spd.sinkhorn_iters, width=target.size(1)
        )
        return permutation_cross_entropy(
            log_s, target, sizes, reduction="none", position_weights=spd.position_weights
        )

    def order(self, scores: np.ndarray, decoder: str) -> np.ndarray:
        from spdrank.methods.spd.decode import decode

        return decode(scores, decoder)

    def orders(self, scores: np.ndarray, sizes: Sequence[int], decoder: str) -> list[np.ndarray]:
        from spdrank.methods.spd.decode import decode_batch

        return decode_batch(scores, sizes, decoder)

    def ranked_scores(self, scores: np.ndarray, order: np.ndarray) -> list[float]:
        """Each ranked item's relevance under the Sinkhorn-normalised matrix, never rising
        down the list (:func:`~spdrank.methods.spd.decode.ranked_relevance`)."""
        from spdrank.methods.spd.decode import ranked_relevance

        return ranked_relevance(scores, order)

    def decoding(self, decoder: str) -> BatchDecoder:
        """:func:`~spdrank.methods.spd.decode.rank_batch` with the named decoder, which must
        be one of :data:`~spdrank.methods.spd.decode.DECODERS`."""
        from spdrank.methods.spd.decode import get_decoder, rank_batch

        get_decoder(decoder)
        return functools.partial(rank_batch, name=decoder)
