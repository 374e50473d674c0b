"""The model behind the server: rank a batch of slates and say what was cut.

Runs only in the batcher's worker thread, so the model and its tokenizer are never used by
two threads at once (fast tokenizers raise "Already borrowed" when they are).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spdrank.ranking import Ranking
from spdrank.slates import Slate
from spdrank.validation import check_fits_model

if TYPE_CHECKING:
    from spdrank.model import SPDRanker


@dataclass
class Ranked:
    """A slate's ranking plus what the prompt did to it."""

    ranking: Ranking
    #: Per candidate, in slate order: its text was cut to the model's per-item token budget.
    truncated: list[bool]
    query_truncated: bool
    prompt_tokens: int


class Engine:
    """Wraps an :class:`SPDRanker` for serving: its name, its K, and batched ranking."""

    def __init__(self, model: SPDRanker, name: str) -> None:
        self.model = model
        self.name = name

    @property
    def max_documents(self) -> int:
        """The model's K: it ranks slates of up to this many candidates."""
        return int(self.model.config.head.positions)

    @property
    def text_field(self) -> str:
        """The ``doc`` field the model reads a candidate's text from."""
        return self.model.config.text_fields[0]

    @property
    def device(self) -> str:
        return str(self.model.device)

    @property
    def features(self) -> tuple[str, ...]:
        """The upstream features the model reads from each candidate (none: ``()``)."""
        return self.model.features.names if self.model.features is not None else ()

    def check(self, slate: Slate) -> None:
        """Raise :class:`SlateError` for a slate the model cannot rank (the checks ``spdrank
        rank`` makes of each line): over K, a feature missing or beyond what it represents.

        Called on the event loop, so such a request is refused (422) before it is queued
        rather than failing its batch.
        """
        check_fits_model(slate, self.max_documents, self.model.features)

    def rank(self, slates: list[Slate]) -> list[Ranked]:
        """One padded prefill over ``slates`` (via ``rank_batch``), plus truncation reports.

        The prompts are encoded here, once, so their truncation flags and token counts can be
        reported; ``rank_batch`` takes them as they are.
        """
        model = self.model
        start = time.perf_counter()
        encoded = [model.encode(slate) for slate in slates]
        encode_ms = (time.perf_counter() - start) * 1e3
        rankings = model.rank_batch(slates, encoded=encoded)
        out = []
        for ranking, e in zip(rankings, encoded):
            ranking.timings["tokenize"] = ranking.timings.get("tokenize", 0.0) + encode_ms
            out.append(
                Ranked(ranking, list(e.truncated), bool(e.query_truncated), len(e.input_ids))
            )
        return out
