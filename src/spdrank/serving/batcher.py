"""Dynamic micro-batching: concurrent requests share one padded prefill.

One prefill over B slates costs far less than B prefills on an accelerator, so requests that
arrive close together are grouped. The design is the usual one for a single model:

* request handlers (on the event loop) ``submit`` an item and await a future;
* one collector coroutine takes the oldest item, then keeps taking items until the batch holds
  ``max_batch_size`` or ``max_wait_ms`` has passed since that oldest item was admitted (items
  that queued up while the previous batch ran are taken at once: they have waited already);
* the batch runs in ONE worker thread. torch is not re-entrant friendly and one model on one
  device gains nothing from two concurrent forward passes, so inference is strictly serial
  while the event loop keeps accepting, validating and queueing requests;
* a batch may run in parts (``parts``: the engine's batch policy splits it into several
  prefills); each part's items are answered as soon as that part is done, with the part's
  own size and time, so every request's ``batch_size`` and ``inference_ms`` say what its
  answer actually cost;
* admission is bounded: past ``max_queue`` waiting items :meth:`MicroBatcher.submit` raises
  :class:`QueueFullError` at once (the server answers 503 + Retry-After) instead of letting
  latency grow without limit;
* a submit cancelled while its item waits (the server cancels it when the client
  disconnects) gives its place in the queue back at once, and the collector passes the item
  over instead of running it: nobody is left to read its answer. Once its item runs, ``parts``
  is told (its ``wanted`` callback), so work left for it (a long slate's remaining windows)
  can be dropped.

A batch (or part) that raises is retried one item at a time, so one bad slate (or an
out-of-memory on a large batch) fails only the requests that fail alone; the collector itself
never dies. This module does not import torch: it batches any callable ``list[T] -> list[R]``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from spdrank.serving.metrics import ServerMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: One part of a batch: which of the batch's items it ran (indices) and their results (an
#: item whose submitter left may have :class:`Abandoned` as its result).
Part = tuple[Sequence[int], Sequence[R]]
#: Whether the batch's item at an index is still awaited (its submitter has not left).
Wanted = Callable[[int], bool]


class QueueFullError(Exception):
    """The admission queue is full; ``retry_after`` is a whole-second estimate of the drain."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the server is busy (queue full); retry after {retry_after} s")
        self.retry_after = retry_after


class BatcherClosedError(Exception):
    """The server is shutting down and takes no new work."""


class InferenceError(Exception):
    """Inference raised for this item (alone, after its batch failed); wraps the cause."""


class Abandoned(Exception):
    """The result of an item whose work ``parts`` dropped part way: its submitter had left."""


@dataclass
class Done(Generic[R]):
    """One item's result and how it was served."""

    value: R
    #: Items that ran together with this one (its part of the batch: one prefill).
    batch_size: int
    #: From admission until its part started running.
    queue_ms: float
    #: Its part's run time (for the batch's first part, also the batch's preparation).
    inference_ms: float
    #: Items collected into the same batch (``batch_size`` or more when the batch ran in parts).
    collected: int = 0


@dataclass
class _Job(Generic[T, R]):
    item: T
    future: asyncio.Future[Done[R]]
    admitted: float  # time.perf_counter()
    taken: bool = False  # into a batch by the collector
    dropped: bool = False  # abandoned by its submitter before it was taken
    #: Set on the event loop when the submitter stops waiting, read by the worker thread.
    gone: threading.Event = field(default_factory=threading.Event)


class MicroBatcher(Generic[T, R]):
    """Groups submitted items into batches for ``run``, executed in a single worker thread.

    ``parts``, when given, runs a batch instead of ``run``: called with the items and a
    ``wanted`` callback (whether the item at an index is still awaited), it yields
    ``(indices, results)`` for each part of the batch as it finishes, and every item must
    appear in exactly one part. ``run`` stays the way to run items alone (retrying after a
    failure).
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        max_queue: int = 64,
        metrics: ServerMetrics | None = None,
        parts: Callable[[list[T], Wanted], Iterable[Part[R]]] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self._run = run
        self._parts = parts or (lambda items, wanted: [(range(len(items)), run(items))])
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1e3
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self._queue: asyncio.Queue[_Job[T, R]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0  # admitted, not yet taken into a batch
        self._batch_s = 0.0  # moving average of one batch's inference time, for Retry-After
        self._closed = False

    @property
    def pending(self) -> int:
        return self._pending

    async def start(self) -> None:
        """Start the collector; call from the event loop that will serve requests."""
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spdrank-infer")
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="spdrank-batcher")

    async def stop(self) -> None:
        """Refuse new work, fail what is still queued, and let the worker thread finish."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._queue is not None:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if not job.future.done():
                    job.future.set_exception(BatcherClosedError("the server is shutting down"))
        self._set_pending(0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def retry_after(self) -> int:
        """Seconds until the current queue has likely drained (at least 1)."""
        batches = math.ceil(max(self._pending, 1) / self.max_batch_size)
        return max(1, math.ceil(batches * self._batch_s))

    async def submit(self, item: T) -> Done[R]:
        """Queue ``item`` and wait for its result; raises QueueFullError when the queue is full."""
        if self._closed or self._queue is None:
            raise BatcherClosedError("the server is not accepting work")
        if self._pending >= self.max_queue:
            self.metrics.rejected.inc()
            raise QueueFullError(self.retry_after())
        future: asyncio.Future[Done[R]] = asyncio.get_running_loop().create_future()
        job = _Job(item, future, time.perf_counter())
        self._set_pending(self._pending + 1)
        self._queue.put_nowait(job)
        try:
            return await future
        except asyncio.CancelledError:
            job.gone.set()
            if not job.taken and not job.dropped:
                job.dropped = True
                self._set_pending(self._pending - 1)
                self.metrics.abandoned.inc()
            raise

    def _claim(self, job: _Job[T, R]) -> bool:
        """Take ``job`` into the batch being gathered, unless its submitter abandoned it."""
        if job.dropped:
            return False
        job.taken = True
        self._set_pending(self._pending - 1)
        return True

    def _set_pending(self, value: int) -> None:
        self._pending = value
        self.metrics.queue_depth.set(value)

    async def _gather(self) -> list[_Job[T, R]]:
        """The next batch: the oldest job plus whatever joins before the size or time limit."""
        assert self._queue is not None
        first = await self._queue.get()
        while not self._claim(first):
            first = await self._queue.get()
        batch = [first]
        deadline = first.admitted + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                job = self._queue.get_nowait()
            else:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if self._claim(job):
                batch.append(job)
        return batch

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            live = [job for job in batch if not job.future.done()]  # skip cancelled clients
            if len(live) < len(batch):
                self.metrics.abandoned.inc(len(batch) - len(live))
            if not live:
                continue
            try:
                seconds = await loop.run_in_executor(self._executor, self._work, live, loop)
            except asyncio.CancelledError:
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(BatcherClosedError("the server is shutting down"))
                raise
            except Exception as exc:  # the executor itself failed: never kill the collector
                log.exception("batch dispatch failed")
                self._resolve(
                    live,
                    [InferenceError(str(exc))] * len(live),
                    time.perf_counter(),
                    0.0,
                    len(live),
                )
                seconds = 0.0
            self._batch_s = seconds if self._batch_s == 0 else 0.8 * self._batch_s + 0.2 * seconds

    def _resolve(
        self,
        jobs: list[_Job[T, R]],
        outcomes: Sequence[R | BaseException],
        started: float,
        seconds: float,
        collected: int,
    ) -> None:
        """On the event loop: answer the jobs of one part that started at ``started``."""
        self.metrics.batch_size.observe(len(jobs))
        self.metrics.inference.observe(seconds)
        for job, outcome in zip(jobs, outcomes):
            queue_s = max(0.0, started - job.admitted)
            self.metrics.queue_wait.observe(queue_s)
            if job.future.done():
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(
                    Done(outcome, len(jobs), queue_s * 1e3, seconds * 1e3, collected)
                )

    def _work(self, jobs: list[_Job[T, R]], loop: asyncio.AbstractEventLoop) -> float:
        """Run a batch in the worker thread, answering each part's jobs as it finishes; if it
        raises, run the jobs not yet answered one by one. Returns the batch's seconds."""
        n = len(jobs)
        items = [job.item for job in jobs]

        def deliver(
            indices: Sequence[int], outcomes: Sequence[R | BaseException], t0: float
        ) -> None:
            seconds = time.perf_counter() - t0
            part = [jobs[i] for i in indices]
            try:
                loop.call_soon_threadsafe(self._resolve, part, list(outcomes), t0, seconds, n)
            except RuntimeError:  # the loop is closed: the server has stopped
                pass

        start = mark = time.perf_counter()
        answered = [False] * n
        try:
            for indices, results in self._parts(items, lambda i: not jobs[i].gone.is_set()):
                indices = list(indices)
                if not indices:
                    continue  # nothing answered: its time goes to the next part
                if len(results) != len(indices):
                    raise RuntimeError(
                        f"a part returned {len(results)} results for {len(indices)} items"
                    )
                if len(set(indices)) < len(indices) or any(
                    not 0 <= i < n or answered[i] for i in indices
                ):
                    raise RuntimeError(f"a part ran items {indices} twice or out of range")
                deliver(indices, results, mark)
                for i in indices:
                    answered[i] = True
                mark = time.perf_counter()
            if not all(answered):
                raise RuntimeError(f"the parts left {answered.count(False)} of {n} items unrun")
            return time.perf_counter() - start
        except Exception as exc:
            log.exception("inference failed on a batch of %d", n)
            failure = exc
        rest = [i for i in range(n) if not answered[i]]
        if n == 1 and rest:  # it already failed alone
            deliver(rest, [_wrap(failure)], mark)
            return time.perf_counter() - start
        for i in rest:
            t0 = time.perf_counter()
            try:
                outcome: R | BaseException = self._run([items[i]])[0]
            except Exception as exc:
                log.exception("inference failed on a single item")
                outcome = _wrap(exc)
            deliver([i], [outcome], t0)
        return time.perf_counter() - start


def _wrap(exc: Exception) -> InferenceError:
    error = InferenceError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
