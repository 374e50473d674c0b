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
* admission is bounded: past ``max_queue`` waiting items :meth:`MicroBatcher.submit` raises
  :class:`QueueFullError` at once (the server answers 503 + Retry-After) instead of letting
  latency grow without limit.

A batch that raises is retried one item at a time, so one bad slate (or an out-of-memory on a
large batch) fails only the requests that fail alone; the collector itself never dies.
This module does not import torch: it batches any callable ``list[T] -> list[R]``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from spdrank.serving.metrics import ServerMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class QueueFullError(Exception):
    """The admission queue is full; ``retry_after`` is a whole-second estimate of the drain."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the server is busy (queue full); retry after {retry_after} s")
        self.retry_after = retry_after


class BatcherClosedError(Exception):
    """The server is shutting down and takes no new work."""


class InferenceError(Exception):
    """Inference raised for this item (alone, after its batch failed); wraps the cause."""


@dataclass
class Done(Generic[R]):
    """One item's result and how it was served."""

    value: R
    batch_size: int
    queue_ms: float
    inference_ms: float


@dataclass
class _Job(Generic[T, R]):
    item: T
    future: asyncio.Future[Done[R]]
    admitted: float  # time.perf_counter()


class MicroBatcher(Generic[T, R]):
    """Groups submitted items into batches for ``run``, executed in a single worker thread."""

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        max_queue: int = 64,
        metrics: ServerMetrics | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self._run = run
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
        self._set_pending(self._pending + 1)
        self._queue.put_nowait(_Job(item, future, time.perf_counter()))
        return await future

    def _set_pending(self, value: int) -> None:
        self._pending = value
        self.metrics.queue_depth.set(value)

    async def _gather(self) -> list[_Job[T, R]]:
        """The next batch: the oldest job plus whatever joins before the size or time limit."""
        assert self._queue is not None
        batch = [await self._queue.get()]
        deadline = batch[0].admitted + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        self._set_pending(self._pending - len(batch))
        return batch

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            live = [job for job in batch if not job.future.done()]  # skip cancelled clients
            if not live:
                continue
            started = time.perf_counter()
            try:
                outcomes, seconds = await loop.run_in_executor(
                    self._executor, self._run_isolated, [job.item for job in live]
                )
            except asyncio.CancelledError:
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(BatcherClosedError("the server is shutting down"))
                raise
            except Exception as exc:  # the executor itself failed: never kill the collector
                log.exception("batch dispatch failed")
                outcomes, seconds = [InferenceError(str(exc))] * len(live), 0.0
            self._batch_s = seconds if self._batch_s == 0 else 0.8 * self._batch_s + 0.2 * seconds
            self.metrics.batch_size.observe(len(live))
            self.metrics.inference.observe(seconds)
            for job, outcome in zip(live, outcomes):
                queue_s = started - job.admitted
                self.metrics.queue_wait.observe(queue_s)
                if job.future.done():
                    continue
                if isinstance(outcome, BaseException):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(Done(outcome, len(live), queue_s * 1e3, seconds * 1e3))

    def _run_isolated(self, items: list[T]) -> tuple[list[R | InferenceError], float]:
        """Run a batch in the worker thread; if it raises, run its items one by one."""
        start = time.perf_counter()
        try:
            results = list(self._run(items))
            if len(results) != len(items):
                raise RuntimeError(f"run returned {len(results)} results for {len(items)} items")
            return list(results), time.perf_counter() - start
        except Exception as exc:
            log.exception("inference failed on a batch of %d", len(items))
            if len(items) == 1:
                return [_wrap(exc)], time.perf_counter() - start
        outcomes: list[R | InferenceError] = []
        for item in items:
            try:
                outcomes.append(self._run([item])[0])
            except Exception as exc:
                log.exception("inference failed on a single item")
                outcomes.append(_wrap(exc))
        return outcomes, time.perf_counter() - start


def _wrap(exc: Exception) -> InferenceError:
    error = InferenceError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
