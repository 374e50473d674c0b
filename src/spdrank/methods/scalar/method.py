"""The scalar peer: one score per candidate from SPD's one prefill, ranked by sorting.

The classic score-and-sort reranker on SPD's backbone and prompt (all candidates in one
sequence, unlike :mod:`spdrank.methods.pointwise`, which reads each in its own): its head (:class:`~spdrank.methods.scalar.head.ScalarHead`)
maps each candidate's state to one score, training fits those scores with ListNet against the
same item-position targets SPD learns from (:mod:`spdrank.methods.scalar.loss`), and ranking sorts them.
There are no positions, so there is no decoder to choose, and a ranking reports the scores
themselves. :mod:`spdrank.methods.first` scores, trains and ranks the same way from other scores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spdrank.methods.base import RankingMethod, state_size
from spdrank.methods.sorting import rank_by_sorting, sort_scores

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from spdrank.methods.base import BatchDecoder, ModelSettings


class ScalarMethod(RankingMethod):
    name = "scalar"
    title = "scalar"
    kinds = ("scalar",)
    help = "scalar (a single-pass peer: one score per item + argsort, ListNet)"
    matrix = False

    def build_head(
        self, config: ModelSettings, backbone: nn.Module, tokenizer: Any, features: int
    ) -> nn.Module:
        from spdrank.methods.scalar.head import ScalarHead

        return ScalarHead(state_size(config, backbone), config.head, features)

    def loss(
        self, scores: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, settings: Any
    ) -> torch.Tensor:
        from spdrank.methods.scalar.loss import listnet_loss

        return listnet_loss(scores, target, sizes, reduction="none")

    def order(self, scores: np.ndarray, decoder: str) -> np.ndarray:
        return sort_scores(scores)

    def ranked_scores(self, scores: np.ndarray, order: np.ndarray) -> list[float]:
        return scores[order].astype(float).tolist()

    def decoding(self, decoder: str) -> BatchDecoder:
        """:func:`rank_by_sorting`, whatever the decoder: there are no positions to assign.
        The name must still be one of SPD's decoders, so a misspelt one is refused here as it
        is for an SPD model rather than ignored."""
        from spdrank.methods.spd.decode import get_decoder

        get_decoder(decoder)
        return rank_by_sorting
