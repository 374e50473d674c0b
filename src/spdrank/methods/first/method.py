"""FIRST (Reddy et al. 2024): the LM's first-token logits over the candidates' letters.

Each candidate is labelled by one letter token and the prompt's answer opens with "[", so the
logit of a candidate's letter at the last position is its score: the backbone's own LM head
does the ranking (:class:`~spdrank.methods.first.head.FirstHead` only picks the letters' logits, plus a
linear map of the features when the model reads any). So the backbone is loaded with its LM
head, its states are never what the head reads (nothing to cache), K is at most the number of
letters, and with the backbone frozen and no features there is nothing to train. Scores are
trained and sorted as the scalar peer's are.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from spdrank.backbone.prompt import LETTERS, PromptSettings
from spdrank.methods.scalar.method import ScalarMethod

if TYPE_CHECKING:
    from torch import nn

    from spdrank.methods.base import ModelSettings


def first_prompt(settings: PromptSettings) -> PromptSettings:
    """FIRST's prompt: one-token letter labels, and the answer opened with "[" ."""
    return dataclasses.replace(settings, labels="letters", answer_prefix="[")


def letter_token_ids(tokenizer: Any, positions: int) -> list[int]:
    """The token id of each of the first ``positions`` letters; each must be one token."""
    if positions > len(LETTERS):
        raise ValueError(
            f"FIRST labels candidates with single letters: at most {len(LETTERS)} positions, "
            f"got {positions}"
        )
    ids = []
    for letter in LETTERS[:positions]:
        tokens = tokenizer(letter, add_special_tokens=False)["input_ids"]
        if len(tokens) != 1:
            raise ValueError(
                f"FIRST needs one token per label; {letter!r} is {len(tokens)} tokens here"
            )
        ids.append(tokens[0])
    return ids


class FirstMethod(ScalarMethod):
    name = "first"
    title = "FIRST"
    kinds = ("first",)
    help = "first (a single-pass peer, FIRST: first-token logits over candidate letters, ListNet)"
    reads = "logits"
    cache_refusal = (
        "--cache-states stores readout hidden states, but --head first reads the LM's logits "
        "(and only LoRA trains it): drop --cache-states"
    )
    max_positions = len(LETTERS)
    #: The letters' logits are the LM's own, with no output layer of the head's to zero.
    anchorable = False

    def prompt(self, settings: PromptSettings) -> PromptSettings:
        return first_prompt(settings)

    def check(self, config: ModelSettings) -> None:
        if config.features_only:
            raise ValueError(
                "FIRST scores candidates by the backbone's letter logits, so it cannot run "
                "on features alone: choose another --head for --features-only"
            )
        if config.prompt.labels != "letters" or config.prompt.answer_prefix != "[":
            raise ValueError(
                "FIRST needs letter labels and the '[' answer prefix: use first_prompt()"
            )

    def build_head(
        self, config: ModelSettings, backbone: nn.Module, tokenizer: Any, features: int
    ) -> nn.Module:
        from spdrank.methods.first.head import FirstHead

        return FirstHead(letter_token_ids(tokenizer, config.head.positions), features)

    def frozen_refusal(self, config: ModelSettings) -> str | None:
        return None if config.features is not None else "FIRST's only weights are the backbone's"
