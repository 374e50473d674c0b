"""Micro-batching: the batcher alone (no model), the batch policy (how a batch shares
prefills) on the tiny model, then a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from spdrank.core.slates import Candidate, Query, Slate
from spdrank.serving import ServeSettings, create_app
from spdrank.serving.batcher import InferenceError, MicroBatcher, QueueFullError
from spdrank.serving.engine import Engine
from spdrank.serving.policy import padding_waste, plan_prefills, resolve_policy
from tests.helpers import HeldEngine, uvicorn_on_loopback

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


class FakeClock:
    """``time.perf_counter`` for one module, standing still until ``advance`` moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_max_wait_bounds_the_wait_of_a_lone_request(monkeypatch):
    """A lone request waits ``max_wait_ms`` for company, then runs alone rather than waiting
    for a full batch (which would never come: the timeout only ends a hang). The batcher's
    clock is a fake and its wait for company returns at once, having moved the clock on by
    the time it was given, so what is checked is the wait it asked for, not a scheduler's."""
    from spdrank.serving import batcher

    clock = FakeClock()
    waits: list[float] = []

    async def no_company(awaitable, timeout):
        awaitable.close()  # the queue's get(), never awaited: nobody else comes
        waits.append(timeout)
        clock.advance(timeout)
        raise asyncio.TimeoutError

    monkeypatch.setattr(batcher, "time", clock)
    monkeypatch.setattr(
        batcher, "asyncio", SimpleNamespace(**{**vars(asyncio), "wait_for": no_company})
    )

    async def main():
        b = MicroBatcher(lambda xs: xs, max_batch_size=8, max_wait_ms=30, max_queue=4)
        await b.start()
        done = await asyncio.wait_for(b.submit(1), timeout=60)
        await b.stop()
        return done

    done = run_async(main())
    assert waits == [pytest.approx(0.030)]  # one wait, of max_wait_ms from its admission
    assert done.value == 1 and done.batch_size == 1 and done.collected == 1
    assert done.queue_ms == pytest.approx(30.0)


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


def test_a_batch_run_in_parts_answers_each_part_as_it_finishes_with_its_size():
    """Each part's items are answered when that part is done (before the next part runs),
    with the part's size; ``collected`` is the whole batch's."""
    first_answered = threading.Event()
    parts_run: list[list[int]] = []

    def parts(items: list[int], wanted):
        parts_run.append([items[0], items[2]])
        yield [0, 2], [items[0] * 10, items[2] * 10]
        # The worker waits here until the event loop has answered the first part.
        assert first_answered.wait(10), "the first part was not answered before the second ran"
        parts_run.append([items[1], items[3]])
        yield [3, 1], [items[3] * 10, items[1] * 10]  # any order: results follow indices

    async def main():
        b = MicroBatcher(
            lambda xs: [x * 10 for x in xs],
            max_batch_size=4,
            max_wait_ms=500,
            max_queue=8,
            parts=parts,
        )
        await b.start()
        futures = [asyncio.ensure_future(b.submit(i)) for i in range(4)]
        await asyncio.wait([futures[0]])
        first_answered.set()
        done = await asyncio.gather(*futures)
        await b.stop()
        return done, b

    done, b = run_async(main())
    assert parts_run == [[0, 2], [1, 3]]
    assert [d.value for d in done] == [0, 10, 20, 30]
    assert [d.batch_size for d in done] == [2, 2, 2, 2] and {d.collected for d in done} == {4}
    # One observation per part (one prefill), not per collected batch.
    assert b.metrics.batch_size.count() == 2 and b.metrics.inference.count() == 2


def test_a_failing_part_keeps_the_answered_parts_and_retries_the_rest_alone():
    alone: list[list[str]] = []

    def run(items):
        alone.append(list(items))
        if "bad" in items:
            raise ValueError("cannot rank 'bad'")
        return [x.upper() for x in items]

    def parts(items, wanted):
        yield [0], [items[0].upper()]
        raise RuntimeError("out of memory (simulated) on the second part")

    async def main():
        b = MicroBatcher(run, max_batch_size=3, max_wait_ms=200, max_queue=8, parts=parts)
        await b.start()
        out = await asyncio.gather(
            *(b.submit(x) for x in ("a", "bad", "c")), return_exceptions=True
        )
        await b.stop()
        return out

    a, bad, c = run_async(main())
    assert a.value == "A" and a.batch_size == 1 and c.value == "C" and c.batch_size == 1
    assert isinstance(bad, InferenceError) and "cannot rank 'bad'" in str(bad)
    assert alone == [["bad"], ["c"]]  # the answered part is not run again


# -- the batch policy ------------------------------------------------------------------------

MIXED = [900, 120, 880, 130, 1000, 125, 910, 500]


@pytest.mark.parametrize("cap", [0.0, 0.05, 0.1, 0.5])
def test_bucketing_splits_a_mixed_length_batch_within_the_padding_cap(cap):
    assert padding_waste(MIXED) > 0.5  # one padded prefill would waste most of its work
    groups = plan_prefills(MIXED, "bucketed", cap)
    assert sorted(i for g in groups for i in g) == list(range(len(MIXED)))  # each once
    assert all(padding_waste([MIXED[i] for i in g]) <= cap + 1e-12 for g in groups), groups
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)  # oldest request first
    assert all(g == sorted(g) for g in groups)


def test_bucketing_groups_near_equal_lengths_and_the_other_policies():
    groups = plan_prefills(MIXED, "bucketed", 0.1)
    assert groups == [[0, 2, 4, 6], [1, 3, 5], [7]]
    assert plan_prefills([7, 7, 7], "bucketed", 0.0) == [[0, 1, 2]]  # no padding: one prefill
    assert plan_prefills(MIXED, "padded") == [list(range(8))]
    assert plan_prefills(MIXED, "single") == [[i] for i in range(8)]
    assert plan_prefills([], "bucketed") == []
    assert resolve_policy("auto", "cpu") == "single"
    assert resolve_policy("auto", "cuda:0") == "bucketed"
    assert resolve_policy("auto", "cpu", features_only=True) == "padded"
    assert resolve_policy("padded", "cpu") == "padded"
    with pytest.raises(ValueError, match="unknown batch policy 'fast'"):
        resolve_policy("fast", "cpu")


def mixed_slates() -> list[Slate]:
    """Slates whose prompts differ a lot in length: short and long histories and titles."""
    histories = [
        "",
        "1. rose shampoo",
        "\n".join(f"{i}. argan oil serum no {i}" for i in range(1, 9)),
    ]
    out = []
    for i in range(7):
        n = 2 + i % 5
        words = "vanilla body lotion extra" if i % 2 else "gel"
        cands = [Candidate(f"d{j}", {"text": f"{words} {j}"}) for j in range(n)]
        out.append(Slate(Query(f"u{i}", histories[i % 3]), cands))
    return out


def test_bucketed_engine_keeps_order_and_ranks_as_each_slate_alone(served):
    model = served[0]
    slates = mixed_slates()
    cap = 0.1
    engine = Engine(model, "tiny-spd", policy="bucketed", max_padding=cap)
    prefills: list[list[int]] = []
    real = model.rank_batch

    def recording(batch, decoder=None, encoded=None):
        prefills.append([len(e.input_ids) for e in encoded])
        return real(batch, decoder, encoded)

    model.rank_batch = recording  # the instance attribute shadows the method
    try:
        ranked = engine.rank([engine.check(s) for s in slates])
    finally:
        del model.rank_batch
    lengths = [n for p in prefills for n in p]
    assert padding_waste(lengths) > cap and len(prefills) > 1  # one prefill would exceed the cap
    assert all(padding_waste(p) <= cap for p in prefills), prefills
    assert len(ranked) == len(slates)
    for slate, r in zip(slates, ranked):  # request order, and the same as ranking it alone
        alone = model.rank(slate)
        assert sorted(r.ranking.docids) == sorted(c.docid for c in slate.candidates)
        assert r.ranking.docids == alone.docids
        assert r.ranking.scores == pytest.approx(alone.scores, abs=1e-5)
        assert r.prompt_tokens == len(model.encode(slate).input_ids)
    # The score matrices too, not only the decoded order: each prefill's vs each slate alone.
    parts = list(engine.rank_parts([engine.check(s) for s in slates]))
    for group, _ in parts:
        together, _ = model.score_batch([slates[i] for i in group])
        for row, i in enumerate(group):
            alone, _ = model.score_batch([slates[i]])
            n = len(slates[i])
            np.testing.assert_allclose(together[row, :n], alone[0, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["padded", "bucketed", "single"])
def test_every_policy_answers_in_request_order(served, policy):
    slates = mixed_slates()
    engine = Engine(served[0], "tiny-spd", policy=policy)
    parts = list(engine.rank_parts([engine.check(s) for s in slates]))
    sizes = {"padded": [len(slates)], "single": [1] * len(slates)}
    if policy in sizes:
        assert [len(g) for g, _ in parts] == sizes[policy]
    ranked = engine.rank([engine.check(s) for s in slates])
    assert [sorted(r.ranking.docids) for r in ranked] == [
        sorted(c.docid for c in s.candidates) for s in slates
    ]
    assert [r.ranking.docids for r in ranked] == [served[0].rank(s).docids for s in slates]


def test_the_policy_is_wired_through_settings(served):
    app = create_app(served[0], name="tiny-spd")  # defaults: auto, on a CPU
    assert app.state.settings.batch_policy == "auto"
    # one slate at a time, never waiting: the unbatched server's path, whatever the batch size
    assert app.state.engine.policy == "single" and app.state.batcher.max_wait_s == 0
    assert app.state.batcher.max_batch_size == 1 and app.state.settings.max_batch_size == 8
    settings = ServeSettings(batch_policy="bucketed", max_padding=0.25, max_wait_ms=7)
    app = create_app(Engine(served[0], "tiny-spd"), settings)
    assert (app.state.engine.policy, app.state.engine.max_padding) == ("bucketed", 0.25)
    assert app.state.batcher.max_wait_s == pytest.approx(0.007)
    assert app.state.batcher.max_batch_size == 8
    with pytest.raises(ValueError, match="unknown batch policy"):
        ServeSettings(batch_policy="fastest")
    with pytest.raises(ValueError, match="max_padding"):
        ServeSettings(max_padding=-0.1)


# -- a real server ----------------------------------------------------------------------------


@contextlib.contextmanager
def running(app) -> Iterator[str]:
    """``app`` on a real uvicorn server on loopback; yields its base URL."""
    with uvicorn_on_loopback(app) as (port, _):
        yield f"http://127.0.0.1:{port}"


async def fire(url: str, n: int, app=None) -> list[httpx.Response]:
    """``n`` requests at once. With ``app`` (on a HeldEngine, held), its engine is released
    only once every request is accounted for: in a batch, waiting in the queue or refused."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        body = {"query": "1. rose shampoo", "documents": ["hair oil", "nail polish", "body lotion"]}
        sent = asyncio.gather(*(c.post("/v1/rerank", json=body) for _ in range(n)))
        if app is not None:
            engine, batcher = app.state.engine, app.state.batcher
            start = (engine.entered, batcher.metrics.rejected.value())
            deadline = time.monotonic() + 20
            while (engine.entered - start[0] + batcher.pending
                   + batcher.metrics.rejected.value() - start[1]) < n:
                assert time.monotonic() < deadline, "the requests never all arrived"
                await asyncio.sleep(0.01)
            engine.release.set()
        responses = await sent
        if app is not None:
            app.state.engine.release.clear()
        return responses


def test_real_server_batches_concurrent_requests_and_sheds_load(served):
    settings = ServeSettings(max_batch_size=4, max_wait_ms=150, max_queue=4, batch_policy="padded")
    app = create_app(HeldEngine(served[0], "tiny-spd"), settings)
    with running(app) as url:
        # Four at once: they share prefills (at least one batch holds more than one slate).
        first = asyncio.run(fire(url, 4, app))
        assert [r.status_code for r in first] == [200] * 4
        assert max(r.json()["meta"]["batch_size"] for r in first) > 1
        metrics = httpx.get(f"{url}/metrics").text
        ones = int(_line(metrics, 'spdrank_batch_size_bucket{le="1"}'))
        total = int(_line(metrics, "spdrank_batch_size_count"))
        assert total < 4 and ones < total, metrics  # a batch > 1 is in the histogram

        # Twelve at once against 1 running batch + 4 waiting: the rest are refused, not queued.
        burst = asyncio.run(fire(url, 12, app))
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


def test_single_collects_one_slate_without_waiting_and_the_others_use_the_settings():
    from spdrank.serving.policy import collector_limits

    assert collector_limits("single", 8, 5.0) == (1, 0.0)
    for policy in ("padded", "bucketed"):
        assert collector_limits(policy, 8, 5.0) == (8, 5.0)


def test_tokenize_holds_the_encoding_timed_where_it_ran(served, monkeypatch):
    """The engine's clock is a fake that each encoding moves on by 20 ms."""
    from spdrank.serving import engine as engine_module

    model = served[0]
    engine = Engine(model, "tiny-spd", policy="padded")
    real = model.encode
    clock = FakeClock()
    monkeypatch.setattr(engine_module, "time", clock)

    def slow(slate, features=None):
        clock.advance(0.02)
        return real(slate, features)

    monkeypatch.setattr(model, "encode", slow)
    slates = mixed_slates()[:3]
    seen = []
    real_rank_batch = model.rank_batch

    def recording(batch, decoder=None, encoded=None):
        out = real_rank_batch(batch, decoder, encoded)
        seen.append(dict(out[0].timings))  # what the model measured itself
        return out

    monkeypatch.setattr(model, "rank_batch", recording)
    ranked = engine.rank([engine.check(s) for s in slates])
    model_tokenize = seen[0]["tokenize"]
    for r in ranked:  # one prefill: all three slates' encoding, plus the model's collation
        assert r.ranking.timings["tokenize"] == pytest.approx(model_tokenize + 3 * 20)
        assert list(r.ranking.timings) == list(seen[0])
