"""The model behind the server: rank a batch of slates and say what was cut.

Runs only in the batcher's worker thread, so the model and its tokenizer are never used by
two threads at once (fast tokenizers raise "Already borrowed" when they are).

How a batch shares prefills is the batch policy's (``policy.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spdrank.ranking import Ranking
from spdrank.serving.policy import (
    DEFAULT_BATCH_POLICY,
    DEFAULT_MAX_PADDING,
    plan_prefills,
    resolve_policy,
)
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
    """Wraps an :class:`SPDRanker` for serving: its name, its K, and batched ranking under a
    batch policy (see spdrank.serving.policy)."""

    def __init__(
        self,
        model: SPDRanker,
        name: str,
        policy: str = DEFAULT_BATCH_POLICY,
        max_padding: float = DEFAULT_MAX_PADDING,
    ) -> None:
        self.model = model
        self.name = name
        self.use_policy(policy, max_padding)

    def use_policy(self, policy: str, max_padding: float = DEFAULT_MAX_PADDING) -> None:
        """Set the batch policy (``auto`` is resolved here, for this model's device)."""
        if max_padding < 0:
            raise ValueError("max_padding must be >= 0")
        self.policy = resolve_policy(policy, self.device, bool(self.model.config.features_only))
        self.max_padding = float(max_padding)

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
        """Rank ``slates`` under the batch policy; the results in the slates' order."""
        out: list[Ranked | None] = [None] * len(slates)
        for indices, results in self.rank_parts(slates):
            for i, result in zip(indices, results):
                out[i] = result
        assert all(r is not None for r in out), "a slate was left unranked"
        return out  # type: ignore[return-value]

    def rank_parts(self, slates: list[Slate]) -> Iterator[tuple[list[int], list[Ranked]]]:
        """Rank ``slates`` one prefill at a time: yields each prefill's slates (indices into
        ``slates``) and their results, as soon as that prefill is done.

        The prompts are encoded first, once (their token counts decide the groups; their
        truncation flags and counts are reported; ``rank_batch`` takes them as they are).
        A result's ``tokenize`` timing is the encoding of its prefill's slates plus collation.
        """
        model = self.model
        encoded = []
        encode_ms = []
        for slate in slates:
            start = time.perf_counter()
            encoded.append(model.encode(slate))
            encode_ms.append((time.perf_counter() - start) * 1e3)
        lengths = [len(e.input_ids) for e in encoded]
        for group in plan_prefills(lengths, self.policy, self.max_padding):
            part = [encoded[i] for i in group]
            rankings = model.rank_batch([slates[i] for i in group], encoded=part)
            tokenize_ms = sum(encode_ms[i] for i in group)
            results = []
            for ranking, e in zip(rankings, part):
                ranking.timings["tokenize"] = ranking.timings.get("tokenize", 0.0) + tokenize_ms
                results.append(
                    Ranked(ranking, list(e.truncated), bool(e.query_truncated), len(e.input_ids))
                )
            yield group, results
