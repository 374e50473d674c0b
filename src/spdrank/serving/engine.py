"""The model behind the server: rank a batch of slates and say what was cut.

Runs only in the batcher's worker thread, so the model and its tokenizer are never used by
two threads at once (fast tokenizers raise "Already borrowed" when they are).

How a batch shares prefills is the batch policy's (``policy.py``). A slate over the model's K,
admitted only when the server ranks by sliding windows, is ranked alone, one prefill a window,
by the windowed ranker ``rank`` and ``eval`` use (:class:`spdrank.rankers.windows.WindowedRanker`);
its remaining windows are dropped once its client has left.

A slate comes as the engine's check admitted it (:class:`Admitted`), with the features the
check normalised on the request's thread: its prompts take them as they are, so a served
slate's features are normalised once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate
from spdrank.rankers.windows import WindowedRanker, Windows
from spdrank.serving.batcher import Abandoned
from spdrank.serving.policy import (
    DEFAULT_BATCH_POLICY,
    DEFAULT_MAX_PADDING,
    check_max_padding,
    plan_prefills,
    resolve_policy,
)

if TYPE_CHECKING:
    import numpy as np

    from spdrank.backbone.prompt import EncodedPrompt
    from spdrank.model.ranker import SPDRanker


@dataclass(eq=False)
class Admitted:
    """A slate the engine's check let in (:meth:`Engine.check`), with the candidates'
    normalised features it computed (None: the model reads none, or the slate was not
    checked here and its prompt normalises them)."""

    slate: Slate
    features: np.ndarray | None = None


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
    def encode(cls, model: SPDRanker, admitted: Admitted) -> _Prompt:
        start = time.perf_counter()
        encoded = model.encode(admitted.slate, admitted.features)
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
        #: The windowed ranking of slates over K (None: such slates are refused).
        self.windowed: WindowedRanker | None = None
        self.max_windowed = 0

    def use_windows(self, window: int, stride: int, max_documents: int) -> None:
        """Rank slates of up to ``max_documents`` candidates, those over K by sliding windows
        of ``window`` (0: none, slates over K are refused)."""
        if not window:
            self.windowed, self.max_windowed = None, 0
            return
        self.windowed = WindowedRanker(self.model, Windows(window, stride))
        self.max_windowed = max_documents

    @property
    def windows(self) -> Windows | None:
        """The window scheme for slates over K (None: such slates are refused)."""
        return self.windowed.windows if self.windowed is not None else None

    def use_policy(self, policy: str, max_padding: float = DEFAULT_MAX_PADDING) -> None:
        """Set the batch policy (``auto`` is resolved here, for this model's device)."""
        check_max_padding(max_padding)
        self.policy = resolve_policy(policy, self.device, bool(self.model.config.features_only))
        self.max_padding = float(max_padding)

    @property
    def max_documents(self) -> int:
        """The most candidates a slate may have: the model's K, or with windows the bound
        set for them."""
        return max(int(self.model.config.head.positions), self.max_windowed)

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

    def check(self, slate: Slate) -> Admitted:
        """Raise :class:`SlateError` for a slate the model cannot rank (the checks ``spdrank
        rank`` makes of each line): over K, a feature missing or beyond what it represents;
        else the slate admitted, with the features the check normalised.

        Called on the event loop, so such a request is refused (422) before it is queued
        rather than failing its batch.
        """
        return Admitted(slate, self.model.check(slate, most=self.max_documents))

    def rank(self, slates: list[Admitted]) -> list[Ranked]:
        """Rank ``slates`` under the batch policy; the results in the slates' order."""
        out: list[Ranked | None] = [None] * len(slates)
        for indices, results in self.rank_parts(slates):
            for i, result in zip(indices, results):
                out[i] = result
        assert all(r is not None for r in out), "a slate was left unranked"
        return out  # type: ignore[return-value]

    def rank_parts(
        self, slates: list[Admitted], wanted: Callable[[int], bool] = lambda i: True
    ) -> Iterator[tuple[list[int], list[Ranked | Abandoned]]]:
        """Rank ``slates`` one prefill at a time: yields each prefill's slates (indices into
        ``slates``) and their results, as soon as that prefill is done. A slate ranked by
        windows whose request is no longer ``wanted`` (its client left) stops before its next
        window, with :class:`Abandoned` for its result.

        The prompts are encoded first, once: their token counts decide the groups, their
        truncation flags and counts are reported, and ``rank_batch`` takes them as they are.
        So a prefill's ``tokenize`` stage is done in two places, each timed where it runs:
        its slates' encoding here, and their collation in the model.
        """
        model = self.model
        k = int(model.config.head.positions)
        whole = [i for i, admitted in enumerate(slates) if len(admitted.slate) <= k]
        for i in (i for i in range(len(slates)) if len(slates[i].slate) > k):
            result: Ranked | Abandoned
            try:
                result = self._windowed(slates[i], lambda i=i: wanted(i))
            except Abandoned as gone:
                result = gone
            yield [i], [result]
        prompts = [_Prompt.encode(model, slates[i]) for i in whole]
        lengths = [len(p.encoded.input_ids) for p in prompts]
        for group in plan_prefills(lengths, self.policy, self.max_padding):
            part = [prompts[g] for g in group]
            rankings = model.rank_batch(
                [slates[whole[g]].slate for g in group], encoded=[p.encoded for p in part]
            )
            encode_ms = sum(p.encode_ms for p in part)
            yield [whole[g] for g in group], [
                _ranked(r, p.encoded, encode_ms) for r, p in zip(rankings, part)
            ]

    def _windowed(self, admitted: Admitted, wanted: Callable[[], bool] = lambda: True) -> Ranked:
        """A slate over K, ranked by sliding windows: one prefill a window (each reading its
        candidates' rows of the admitted features), each window's truncations and tokens
        counted; :class:`Abandoned` before a window once the slate is no longer ``wanted``."""
        windowed = self.windowed
        assert windowed is not None, "a slate over K was admitted without windows"

        def unless_gone(part: Slate) -> None:
            if not wanted():
                raise Abandoned(f"the client left; windows of {len(part)} candidates dropped")

        slate = admitted.slate
        ranking = windowed.rank(slate, unless_gone, admitted.features)
        prompts = windowed.prompts
        return Ranked(ranking, [prompts.truncated[d] for d in slate.docids],
                      prompts.query_truncated, prompts.tokens)


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
