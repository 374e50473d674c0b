"""The model behind the server: rank a batch of slates and say what was cut.

Runs only in the batcher's worker thread, so the model and its tokenizer are never used by
two threads at once (fast tokenizers raise "Already borrowed" when they are).

How a batch shares prefills is the batch policy's (``policy.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spdrank.ranking import Ranking
from spdrank.serving.policy import (
    DEFAULT_BATCH_POLICY,
    DEFAULT_MAX_PADDING,
    check_max_padding,
    plan_prefills,
    resolve_policy,
)
from spdrank.slates import Slate
from spdrank.validation import check_fits_model

if TYPE_CHECKING:
    from spdrank.model import SPDRanker
    from spdrank.prompt import EncodedPrompt


@dataclass
class Ranked:
    """A slate's ranking plus what the prompt did to it."""

    ranking: Ranking
    #: Per candidate, in slate order: its text was cut to the model's per-item token budget.
    truncated: list[bool]
    query_truncated: bool
    prompt_tokens: int


@dataclass
class _Prompt:
    """A slate's encoded prompt and the milliseconds its encoding took, timed as it ran."""

    encoded: EncodedPrompt
    encode_ms: float

    @classmethod
    def encode(cls, model: SPDRanker, slate: Slate) -> _Prompt:
        start = time.perf_counter()
        encoded = model.encode(slate)
        return cls(encoded, (time.perf_counter() - start) * 1e3)


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
        check_max_padding(max_padding)
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

        The prompts are encoded first, once: their token counts decide the groups, their
        truncation flags and counts are reported, and ``rank_batch`` takes them as they are.
        So a prefill's ``tokenize`` stage is done in two places, each timed where it runs:
        its slates' encoding here, and their collation in the model.
        """
        model = self.model
        prompts = [_Prompt.encode(model, slate) for slate in slates]
        lengths = [len(p.encoded.input_ids) for p in prompts]
        for group in plan_prefills(lengths, self.policy, self.max_padding):
            part = [prompts[i] for i in group]
            rankings = model.rank_batch(
                [slates[i] for i in group], encoded=[p.encoded for p in part]
            )
            encode_ms = sum(p.encode_ms for p in part)
            yield group, [_ranked(r, p.encoded, encode_ms) for r, p in zip(rankings, part)]


def _ranked(ranking: Ranking, encoded: EncodedPrompt, encode_ms: float) -> Ranked:
    """A slate's result from a prefill whose prompts took ``encode_ms`` to encode: its
    ``tokenize`` stage is that encoding plus the collation the model timed."""
    tokenize_ms = ranking.timings.get("tokenize", 0.0) + encode_ms
    timings = {**ranking.timings, "tokenize": tokenize_ms}
    return Ranked(
        replace(ranking, timings=timings),
        list(encoded.truncated),
        bool(encoded.query_truncated),
        len(encoded.input_ids),
    )
