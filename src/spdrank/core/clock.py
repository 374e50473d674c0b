"""Milliseconds a ranking call spends in each of its stages (:data:`spdrank.core.ranking.STAGES`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


class StageClock:
    """Milliseconds spent in each named stage of a ranking call, timed around the work itself.

    A stage timed twice (the head, then copying its scores to the host) adds up. On a GPU a
    stage's timer stops after its queued work has run (``sync``), so each stage is charged
    its own.
    """

    def __init__(self, stages: Sequence[str] = ()) -> None:
        #: Each stage's milliseconds; the ``stages`` given start at 0, so a call that skips
        #: one (no prefill for cached states) still reports it.
        self.ms: dict[str, float] = dict.fromkeys(stages, 0.0)

    @contextmanager
    def stage(self, name: str, sync: Callable[[], None] | None = None) -> Iterator[None]:
        """Time the body as stage ``name``; ``sync`` waits for the device's queued work
        before the timer stops."""
        start = time.perf_counter()
        yield
        if sync is not None:
            sync()
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3


def timed(
    clock: StageClock | None, name: str, sync: Callable[[], None] | None = None
) -> contextlib.AbstractContextManager[None]:
    """``clock``'s timer for stage ``name``, or nothing to time without a clock (training)."""
    return contextlib.nullcontext() if clock is None else clock.stage(name, sync)
