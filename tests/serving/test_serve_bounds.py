"""What the server bounds: a body that does not say it is JSON is 415 (a web page's "simple"
request cannot make it work), a windowed request whose client left drops its remaining
windows, and ``spdrank serve``'s arguments are checked before the model loads."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from spdrank.commands.cli import main
from spdrank.core.slates import Candidate, Query, Slate
from spdrank.model.ranker import SPDRanker
from spdrank.serving import ServeSettings, create_app
from spdrank.serving.batcher import Abandoned
from spdrank.serving.deadlines import uvicorn_options
from spdrank.serving.engine import Engine
from tests.helpers import uvicorn_on_loopback

RERANK = {"query": "1. rose shampoo", "documents": ["hair oil", "nail polish", "body lotion"]}
SLATE = {"query": {"qid": "q", "text": "rose"},
         "candidates": [{"docid": "a", "doc": {"text": "hair oil"}},
                        {"docid": "b", "doc": {"text": "lotion"}}]}


# -- JSON bodies say so ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(served):
    with TestClient(create_app(served[0], name="tiny-spd")) as c:
        yield c


@pytest.mark.parametrize("path", ["/v1/rerank", "/v1/rank"])
@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
])
def test_a_body_not_sent_as_json_is_415(client, path, content_type):
    body = json.dumps(RERANK if path == "/v1/rerank" else SLATE).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["type"] == "unsupported_media_type" and "application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_with_parameters_or_any_case_is_taken(client, content_type):
    r = client.post("/v1/rerank", content=json.dumps(RERANK).encode(),
                    headers={"content-type": content_type})
    assert r.status_code == 200, r.text


# -- a windowed request whose client left -------------------------------------------------------


def _long_slate(n: int) -> Slate:
    return Slate(Query("q", "rose"), [Candidate(f"d{i}", {"text": f"document {i}"})
                                      for i in range(n)])


def test_the_engine_stops_a_slates_windows_once_it_is_not_wanted(served):
    model: SPDRanker = served[0]
    engine = Engine(model, "tiny-spd")
    engine.use_windows(8, 4, 64)
    ran: list[int] = []
    original = model.rank_batch

    def counted(slates, **kw):
        ran.append(len(slates[0]))
        return original(slates, **kw)

    model.rank_batch = counted  # the instance attribute shadows the method
    try:
        parts = list(engine.rank_parts([engine.check(_long_slate(40))], wanted=lambda i: not ran))
        assert len(ran) == 1  # the first window ran; none after it
        [(indices, [result])] = parts
        assert indices == [0] and isinstance(result, Abandoned)
        ran.clear()
        [(_, [whole])] = list(engine.rank_parts([engine.check(_long_slate(40))]))
        assert len(ran) == len(engine.windows.spans(40)) and len(whole.ranking.docids) == 40
    finally:
        del model.rank_batch


def test_a_client_that_leaves_drops_its_remaining_windows(served):
    model: SPDRanker = served[0]
    ran: list[float] = []
    original = model.rank_batch

    def slow(slates, **kw):
        ran.append(time.monotonic())
        time.sleep(0.3)
        return original(slates, **kw)

    settings = ServeSettings(window=8, window_stride=4, max_documents=64)
    app = create_app(model, name="tiny-spd", settings=settings)
    windows = len(app.state.engine.windows.spans(40))
    body = json.dumps({"query": "q", "documents": [f"document {i}" for i in range(40)]}).encode()
    model.rank_batch = slow
    try:
        with uvicorn_on_loopback(app, **uvicorn_options(settings)) as (port, _):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 20
            while not ran:
                assert time.monotonic() < deadline, "the request never reached the model"
                time.sleep(0.01)
            sock.close()
            # The worker runs one batch at a time: once the next request is answered, the
            # windowed one has stopped.
            r = httpx.post(f"http://127.0.0.1:{port}/v1/rerank", json=RERANK, timeout=30)
            assert r.status_code == 200
    finally:
        del model.rank_batch
    assert windows >= 8 and len(ran) - 1 <= 2, (len(ran), windows)


def test_a_batcher_item_is_unwanted_once_its_submitter_leaves():
    import asyncio

    from spdrank.serving.batcher import MicroBatcher

    seen: list[bool] = []
    started, release = threading.Event(), threading.Event()

    def parts(items, wanted):
        started.set()
        assert release.wait(10)
        seen.append(wanted(0))
        yield [0], [Abandoned("gone")]

    async def main_():
        b = MicroBatcher(lambda xs: xs, max_batch_size=1, max_wait_ms=0, parts=parts)
        await b.start()
        task = asyncio.ensure_future(b.submit("x"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.sleep(0.2)
        await b.stop()

    asyncio.run(main_())
    assert seen == [False]


# -- spdrank serve's arguments, before the model loads -----------------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(SPDRanker, "from_pretrained", refuse)


@pytest.mark.parametrize(("extra", "words"), [
    (["--port", "70000"], "--port must be between 1 and 65535, got 70000"),
    (["--port", "-1"], "--port must be between 1 and 65535"),
    (["--host", "no such host.invalid"], "--host 'no such host.invalid' names no address"),
    (["--max-documents", "50"], "--max-documents applies with --window only"),
    (["--window-stride", "2"], "--window-stride applies with --window only"),
    (["--window", "9"], "--window 9 is over the model's K (8)"),
    (["--max-wait-ms", "nan"], "--max-wait-ms must be a finite number"),
    (["--body-timeout", "inf"], "--body-timeout must be a finite number"),
])
def test_serve_refuses_bad_arguments_in_one_line_before_loading(served, no_loading, capsys,
                                                                 extra, words):
    assert main(["serve", "--model", str(served[1]), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert words in err, err
