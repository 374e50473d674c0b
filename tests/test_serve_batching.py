"""Micro-batching: the batcher alone (no model), then a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from spdrank.serving import ServeSettings, create_app
from spdrank.serving.batcher import InferenceError, MicroBatcher, QueueFullError
from spdrank.serving.engine import Engine
from tests.test_serve import served  # noqa: F401 - the tiny model fixture

# -- the batcher alone ------------------------------------------------------------------------


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_concurrent_submits_share_a_batch_and_keep_their_results():
    seen: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        seen.append(list(items))
        return [x * 10 for x in items]

    async def main():
        b = MicroBatcher(run, max_batch_size=4, max_wait_ms=200, max_queue=16)
        await b.start()
        try:
            done = await asyncio.gather(*(b.submit(i) for i in range(6)))
        finally:
            await b.stop()
        return done

    done = run_async(main())
    assert [d.value for d in done] == [0, 10, 20, 30, 40, 50]
    assert [len(s) for s in seen] == [4, 2]  # size-capped, then the rest after the wait
    assert [d.batch_size for d in done] == [4, 4, 4, 4, 2, 2]


def test_max_wait_bounds_the_wait_of_a_lone_request():
    async def main():
        b = MicroBatcher(lambda xs: xs, max_batch_size=8, max_wait_ms=30, max_queue=4)
        await b.start()
        t0 = time.perf_counter()
        done = await b.submit(1)
        await b.stop()
        return done, time.perf_counter() - t0

    done, seconds = run_async(main())
    assert done.batch_size == 1 and 0.025 <= seconds < 1.0


def test_full_queue_refuses_at_once_with_retry_after():
    release = threading.Event()

    def run(items):
        release.wait(5)
        return items

    async def main():
        b = MicroBatcher(run, max_batch_size=1, max_wait_ms=0, max_queue=2)
        await b.start()
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0.05)  # 0 is in the worker; the queue is empty again
        waiting = [asyncio.ensure_future(b.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as info:
            await b.submit(3)
        assert info.value.retry_after >= 1 and b.metrics.rejected.value() == 1
        release.set()
        values = [d.value for d in await asyncio.gather(first, *waiting)]
        await b.stop()
        return values

    assert run_async(main()) == [0, 1, 2]


def test_a_failing_batch_is_retried_item_by_item():
    def run(items):
        if "bad" in items:
            raise ValueError("cannot rank 'bad'")
        return [x.upper() for x in items]

    async def main():
        b = MicroBatcher(run, max_batch_size=3, max_wait_ms=100, max_queue=8)
        await b.start()
        out = await asyncio.gather(
            *(b.submit(x) for x in ("a", "bad", "c")), return_exceptions=True
        )
        after = await b.submit("d")
        await b.stop()
        return out, after

    (a, bad, c), after = run_async(main())
    assert a.value == "A" and c.value == "C" and after.value == "D"
    assert isinstance(bad, InferenceError) and "cannot rank 'bad'" in str(bad)


# -- a real server ----------------------------------------------------------------------------


class SlowEngine(Engine):
    """The tiny model, made slow enough (0.3 s a batch) that requests pile up behind it."""

    def rank(self, slates):
        time.sleep(0.3)
        return super().rank(slates)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


async def fire(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        body = {"query": "1. rose shampoo", "documents": ["hair oil", "nail polish", "body lotion"]}
        return await asyncio.gather(*(c.post("/v1/rerank", json=body) for _ in range(n)))


def test_real_server_batches_concurrent_requests_and_sheds_load(served):  # noqa: F811
    settings = ServeSettings(max_batch_size=4, max_wait_ms=150, max_queue=4)
    app = create_app(SlowEngine(served[0], "tiny-spd"), settings)
    with running(app) as url:
        # Four at once: they share prefills (at least one batch holds more than one slate).
        first = asyncio.run(fire(url, 4))
        assert [r.status_code for r in first] == [200] * 4
        assert max(r.json()["meta"]["batch_size"] for r in first) > 1
        metrics = httpx.get(f"{url}/metrics").text
        ones = int(_line(metrics, 'spdrank_batch_size_bucket{le="1"}'))
        total = int(_line(metrics, "spdrank_batch_size_count"))
        assert total < 4 and ones < total, metrics  # a batch > 1 is in the histogram

        # Twelve at once against 1 running batch + 4 waiting: the rest are refused, not queued.
        burst = asyncio.run(fire(url, 12))
        codes = sorted(r.status_code for r in burst)
        assert codes.count(200) >= 4 and 503 in codes, codes
        refused = next(r for r in burst if r.status_code == 503)
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "queue_full"
        assert httpx.get(f"{url}/healthz").status_code == 200  # still serving
        metrics = httpx.get(f"{url}/metrics").text
        assert float(_line(metrics, "spdrank_rejected_total")) == codes.count(503)


def _line(text: str, prefix: str) -> str:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return line.split()[-1]
    raise AssertionError(f"{prefix} not in metrics")
