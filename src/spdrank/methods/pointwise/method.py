"""The pointwise peer: each candidate in its own sequence with the user context, N prefills.

The reranker a team would otherwise deploy on the same backbone (monoT5, RankLLaMA, a
cross-encoder): its head reads ``candidates``, so the model reads a slate as one sequence a
candidate (:func:`~spdrank.backbone.prompt.encode_candidates`: the model's own prompt, holding
that candidate alone), batched into one padded pass
(:func:`~spdrank.backbone.batching.collate_candidates`,
:func:`~spdrank.backbone.readout.read_candidates`), and each candidate's score is one linear
map of its sequence's last state (:mod:`.head`). It trains on the same targets with the scalar peer's
ListNet and ranks by sorting, as the scalar peer does: the two differ only in how the
backbone reads the candidates, N sequences with the context each against one prompt with
all of them, so a comparison between them, and with SPD, measures that and nothing else.

A frozen backbone's state for a candidate is still a pure function of the slate's texts, so
``--cache-states`` caches them as it caches SPD's: the cache reads through the model's
candidates reader (:class:`spdrank.backbone.readout.CandidateReader`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spdrank.backbone.prompt import UNIT_READOUTS
from spdrank.methods.scalar.method import ScalarMethod

if TYPE_CHECKING:
    from torch import nn

    from spdrank.methods.base import ModelSettings


class PointwiseMethod(ScalarMethod):
    name = "pointwise"
    title = "pointwise"
    kinds = ("pointwise",)
    help = (
        "pointwise (the cross-encoder peer: each candidate in its own sequence with the user "
        "context, batched; one linear score from its last state; ListNet)"
    )
    reads = "candidates"

    def check(self, config: ModelSettings) -> None:
        if config.features_only:
            raise ValueError(
                "the pointwise method reads each candidate's text with the user context, so "
                "it cannot run on features alone: choose --head scalar for --features-only"
            )
        if config.prompt.readout in UNIT_READOUTS:
            raise ValueError(
                f"the pointwise head scores one state a candidate: use --readout last or mean, "
                f"not {config.prompt.readout}"
            )

    def build_head(
        self, config: ModelSettings, backbone: nn.Module, tokenizer: Any, features: int
    ) -> nn.Module:
        from spdrank.backbone.load import hidden_size
        from spdrank.methods.pointwise.head import PointwiseHead

        return PointwiseHead(hidden_size(backbone), features)
