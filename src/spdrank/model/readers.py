"""How the model reads a slate from its backbone: one reader a way, chosen by the method's kind.

A ranking method says which way its head reads (:attr:`~spdrank.methods.base.RankingMethod.reads`)
and the model builds that reader over its own parts (backbone, prompt builder, pad token), so a
method never handles the model:

- ``prompt`` (:class:`PromptReader`): one prompt holding every candidate, one prefill, its
  states pooled at the readout positions as the prompt's ``readout`` says (SPD, scalar);
- ``candidates`` (:class:`CandidateReader`): one sequence a candidate with the user context,
  the sequences batched into one padded pass (the pointwise peer);
- ``logits`` (:class:`LogitsReader`): one prompt, the LM's next-token logits at its end (FIRST).

Each reader encodes a slate (``encode``), pads encoded slates into one batch (``collate``) and
reads a batch into what the head reads (``read``, timing the ``prefill`` and ``readout`` stages).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spdrank.backbone.batching import Batch, collate
from spdrank.backbone.readout import HeadInputs, read_items
from spdrank.core.clock import StageClock, timed

if TYPE_CHECKING:
    from torch import nn

    from spdrank.backbone.prompt import EncodedPrompt, PromptBuilder, PromptSettings
    from spdrank.backbone.words import WordSplitter
    from spdrank.core.slates import Slate


@dataclass
class PromptReader:
    """One prompt holding every candidate; the prefill's states pooled at the readout positions."""

    backbone: nn.Module
    prompts: PromptBuilder
    pad_id: int
    settings: PromptSettings
    text_fields: tuple[str, ...]
    #: Splits an item's tokens into words, for the ``words`` readout (else None).
    words: WordSplitter | None = None
    #: The head reads the history items' states too.
    history: bool = False
    #: Waits for queued GPU work, so a stage's timer stops after it.
    sync: Callable[[], None] | None = None

    def encode(self, slate: Slate) -> EncodedPrompt:
        """The backbone's input for ``slate``: one prompt with its user context and every
        candidate's text."""
        return self.prompts.encode(slate.query.text, slate.candidate_texts(self.text_fields))

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        """Encoded slates right-padded into one batch for one prefill."""
        return collate(encoded, self.pad_id)

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """One prefill of ``batch``, pooled as the prompt's ``readout`` says."""
        from spdrank.backbone.load import prompt_hidden

        with timed(clock, "prefill", self.sync):
            hidden = prompt_hidden(self.backbone, batch.prompt)
        with timed(clock, "readout", self.sync):
            return read_items(batch, hidden, self.settings, self.words, self.history)


class LogitsReader(PromptReader):
    """One prompt holding every candidate; the LM's next-token logits at its end."""

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """One prefill of ``batch``: the LM's next-token logits at each prompt's end [B, V]."""
        from spdrank.backbone.load import last_token_logits

        with timed(clock, "prefill", self.sync):
            prompt = batch.prompt
            logits = last_token_logits(self.backbone, prompt.input_ids, prompt.attention_mask)
        return HeadInputs(logits.float())


class CandidateReader(PromptReader):
    """One sequence a candidate with the user context, the sequences prefilled as one batch."""

    def encode(self, slate: Slate) -> EncodedPrompt:
        """One sequence a candidate: the user context, then that candidate alone."""
        from spdrank.methods.pointwise.prompt import encode_candidates

        texts = slate.candidate_texts(self.text_fields)
        return encode_candidates(self.prompts, slate.query.text, texts)

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        """Every candidate's sequence a row, right-padded into one batch."""
        from spdrank.methods.pointwise.batching import collate_candidates

        return collate_candidates(encoded, self.pad_id)  # type: ignore[arg-type]

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """The candidates' states from their own sequences' prefills, [B, N, D]."""
        from spdrank.methods.pointwise.read import read_candidates

        return read_candidates(self.backbone, batch, self.settings.readout, clock, self.sync)


#: The reader of each way a method's head reads (``RankingMethod.reads``).
READERS: dict[str, type[PromptReader]] = {
    "prompt": PromptReader,
    "candidates": CandidateReader,
    "logits": LogitsReader,
}


def reader_for(reads: str, **parts: Any) -> PromptReader:
    """The reader for a head that ``reads`` so, over the model's ``parts``."""
    try:
        return READERS[reads](**parts)
    except KeyError:
        raise ValueError(f"no reader reads {reads!r}: choose one of {list(READERS)}") from None
