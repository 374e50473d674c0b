"""The server against clients that are slow, gone, unauthenticated or offline: the header,
body and keep-alive deadlines on a real uvicorn server on loopback (raw sockets sending half
a request), disconnected requests leaving the queue, the optional API key, and /docs served
without a CDN."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from spdrank.commands.cli import build_parser, main
from spdrank.serving import ServeSettings, create_app
from spdrank.serving.auth import ENV_VAR, MAX_KEY_BYTES, load_api_key
from spdrank.serving.deadlines import HeaderDeadlineProtocol, uvicorn_options
from tests.helpers import HeldEngine, uvicorn_on_loopback

#: What a deadline may overrun by on a loaded 2-core machine before the test calls it missed.
SLACK_S = 2.0
RERANK = {"query": "1. rose shampoo", "documents": ["hair oil", "nail polish", "body lotion"]}


def serving(app) -> contextlib.AbstractContextManager[tuple[int, uvicorn.Server]]:
    """``app`` on a real uvicorn server on loopback, under its settings' deadlines (as
    ``spdrank serve`` runs it); yields the port and the server."""
    return uvicorn_on_loopback(app, **uvicorn_options(app.state.settings))


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took;
    fails if it is still open after ``within`` seconds."""
    start = time.monotonic()
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {within} s; it sent {data!r}")
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, read without waiting for the connection to close."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def error_in(response: bytes, status: int) -> dict:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), response
    assert b"connection: close" in head.lower(), head
    error = json.loads(body)["error"]
    assert error["code"] == status
    return error


def trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    """Send ``data`` one byte every ``every`` seconds until ``stop`` or the server closes."""
    for byte in data:
        if stop.wait(every):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


@contextlib.contextmanager
def trickling(sock: socket.socket, data: bytes, every: float) -> Iterator[None]:
    """``data`` trickled into ``sock`` (see :func:`trickle`) from a thread for the ``with``
    block, which is stopped and joined at its end however the block ends."""
    stop = threading.Event()
    sender = threading.Thread(target=trickle, args=(sock, data, every, stop))
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join()


HEAD = b"POST /v1/rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


# -- header, body and keep-alive deadlines ------------------------------------------------------


@pytest.fixture(scope="module")
def deadline_server(served):
    settings = ServeSettings(header_timeout=0.5, body_timeout=0.5, keep_alive_timeout=5)
    app = create_app(served[0], settings, name="tiny-spd")
    with serving(app) as (port, _):
        yield port


def test_half_sent_headers_get_408_and_the_connection_is_closed(deadline_server):
    port = deadline_server
    with connect(port) as sock:
        sock.sendall(HEAD)  # no blank line: the headers never end
        response, took = read_until_closed(sock, 0.5 + SLACK_S)
    assert 0.4 <= took, took
    error = error_in(response, 408)
    assert error["type"] == "header_timeout" and "0.5 s" in error["message"]


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_deadline(deadline_server):
    """The deadline is for the whole head, not between bytes: a slowloris client that keeps
    sending is closed all the same."""
    port = deadline_server
    with connect(port) as sock, trickling(sock, HEAD * 10, 0.05):
        response, _ = read_until_closed(sock, 0.5 + SLACK_S)
    assert error_in(response, 408)["type"] == "header_timeout"


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(deadline_server):
    port = deadline_server
    with connect(port) as sock:
        response, took = read_until_closed(sock, 0.5 + SLACK_S)
    assert response == b"" and took >= 0.4


def test_a_half_sent_body_gets_408_within_the_body_deadline(deadline_server):
    port = deadline_server
    with connect(port) as sock:
        sock.sendall(HEAD + b"Content-Length: 500\r\n\r\n" + b'{"query": ')  # 10 of 500 bytes
        response, took = read_until_closed(sock, 0.5 + SLACK_S)
    assert took >= 0.4, took
    error = error_in(response, 408)
    assert error["type"] == "body_timeout" and "0.5 s" in error["message"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'spdrank_errors_total{route="/v1/rerank",type="body_timeout"}' in metrics


def test_a_chunked_body_that_keeps_trickling_is_cut_at_the_body_deadline(deadline_server):
    port = deadline_server
    with connect(port) as sock:
        sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        with trickling(sock, b"1\r\nx\r\n" * 200, 0.02):
            response, _ = read_until_closed(sock, 0.5 + SLACK_S)
    assert error_in(response, 408)["type"] == "body_timeout"


def test_the_next_request_on_a_kept_alive_connection_has_the_header_deadline(deadline_server):
    """After a response the keep-alive timer runs (5 s here); a later request's first byte
    stops it, and from then on that request's headers have the header deadline (0.5 s)."""
    port = deadline_server
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        response, took = read_until_closed(sock, 0.5 + SLACK_S)
    assert error_in(response, 408)["type"] == "header_timeout" and took < 0.5 + SLACK_S


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(served):
    settings = ServeSettings(keep_alive_timeout=0.5)
    app = create_app(served[0], settings, name="tiny-spd")
    with serving(app) as (port, _), connect(port) as sock:
        for _ in range(2):  # kept open between requests sent in time
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        rest, took = read_until_closed(sock, 0.5 + SLACK_S)
    assert rest == b"" and took >= 0.4, took


def test_the_deadlines_are_flags_and_reach_uvicorn(served, monkeypatch):
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    args = build_parser().parse_args([
        "serve", "--model", str(served[1]), "--device", "cpu", "--header-timeout", "3",
        "--body-timeout", "7", "--keep-alive-timeout", "2",
    ])
    assert args.func(args) == 0
    assert issubclass(seen["http"], HeaderDeadlineProtocol) and seen["http"].header_timeout == 3
    assert seen["timeout_keep_alive"] == 2
    settings = seen["app"].state.settings
    assert (settings.header_timeout, settings.body_timeout) == (3, 7)
    bad = build_parser().parse_args(["serve", "--model", str(served[1]), "--body-timeout", "0"])
    with pytest.raises(ValueError, match="--body-timeout must be at least 0.1, got 0"):
        bad.func(bad)


# -- a client gone before its turn ----------------------------------------------------------


@pytest.mark.parametrize("leave", ["close", "half-close"])
def test_a_request_whose_client_left_is_dropped_from_the_queue_unrun(served, leave):
    """One request holds the model; a second, queued behind it, loses its client (closed, or
    half-closed: nobody can read an answer either way). It leaves the queue at once and never
    reaches the model."""
    app = create_app(HeldEngine(served[0], "tiny-spd"), name="tiny-spd")
    engine, batcher = app.state.engine, app.state.batcher
    with serving(app) as (port, _):
        first: list[httpx.Response] = []
        held = threading.Thread(
            target=lambda: first.append(
                httpx.post(f"http://127.0.0.1:{port}/v1/rerank", json=RERANK, timeout=30)
            )
        )
        held.start()
        wait_for(lambda: engine.entered == 1)
        body = json.dumps(RERANK).encode()
        sock = connect(port)
        sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: batcher.pending == 1)
        if leave == "close":
            sock.close()
        else:
            sock.shutdown(socket.SHUT_WR)
        wait_for(lambda: batcher.metrics.abandoned.value() == 1)
        assert batcher.pending == 0  # its place in the queue is free again
        engine.release.set()
        held.join(30)
        sock.close()
        assert first[0].status_code == 200
        r = httpx.post(f"http://127.0.0.1:{port}/v1/rerank", json=RERANK, timeout=30)
        assert r.status_code == 200
        assert engine.entered == 2  # the first and the last: never the abandoned one
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert "spdrank_abandoned_total 1" in metrics
        assert 'spdrank_requests_total{route="/v1/rerank",status="499"} 1' in metrics


def wait_for(condition, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


# -- responsiveness while slow clients hold connections ----------------------------------------


def p99_latency(port: int, n: int) -> float:
    """The 99th percentile of ``n`` sequential rerank requests' latency (one keep-alive client)."""
    seconds = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        client.get("/healthz")  # the connection is opened outside the timing
        for _ in range(n):
            start = time.perf_counter()
            r = client.post("/v1/rerank", json=RERANK)
            seconds.append(time.perf_counter() - start)
            assert r.status_code == 200, r.text
    return statistics.quantiles(seconds, n=100)[98]


@pytest.mark.slow
def test_well_behaved_clients_keep_their_latency_while_50_slow_clients_hold_connections(served):
    """25 clients dribble a request head and 25 a body, one byte every 0.2 s, all held under
    the deadlines (30 s); meanwhile a well-behaved client's p99 stays within 2x the idle
    server's (measured before and after, the larger taken). The machine is shared, so one
    phase can be slowed by other work: up to three rounds are run, and one within the bound
    passes. Slow clients that slowed the server would fail every round."""
    settings = ServeSettings(header_timeout=30, body_timeout=30)
    app = create_app(served[0], settings, name="tiny-spd")
    rounds = []
    with serving(app) as (port, server):
        for _ in range(3):
            idle_before = p99_latency(port, 100)
            loaded = p99_under_slow_clients(port, server, 100)
            idle = max(idle_before, p99_latency(port, 100))
            rounds.append((loaded, idle))
            if loaded <= 2 * idle:
                return
    pytest.fail(f"p99 with 50 slow clients over the idle p99 (seconds), each round: {rounds}")


def p99_under_slow_clients(port: int, server: uvicorn.Server, n: int) -> float:
    """:func:`p99_latency` while 50 slow clients hold connections (all still held at its end)."""
    stop = threading.Event()
    socks, senders = [], []
    for i in range(50):
        sock = connect(port)
        if i % 2:
            sock.sendall(HEAD + b"Content-Length: 500\r\n\r\n")
            rest = b'{"query": "' + b"x" * 400
        else:
            rest = HEAD * 20
        socks.append(sock)
        senders.append(threading.Thread(target=trickle, args=(sock, rest, 0.2, stop)))
    for sender in senders:
        sender.start()
    try:
        wait_for(lambda: len(server.server_state.connections) >= 50)
        loaded = p99_latency(port, n)
        assert len(server.server_state.connections) >= 50  # all still held
    finally:
        stop.set()
        for sender in senders:
            sender.join()
        for sock in socks:
            sock.close()
    wait_for(lambda: len(server.server_state.connections) == 0)
    return loaded


# -- the API key ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(served):
    with TestClient(create_app(served[0], name="tiny-spd", api_key="s3cret-Key")) as c:
        yield c


def test_without_the_key_a_route_answers_401_in_the_error_shape(keyed):
    for headers, says in (
        ({}, "needs an API key"),
        ({"Authorization": "Bearer wrong"}, "not valid"),
        ({"Authorization": "Bearer s3cret-Key-and-more"}, "not valid"),
        ({"Authorization": "Basic s3cret-Key"}, "not valid"),
    ):
        for method, path in (("POST", "/v1/rerank"), ("POST", "/v1/rank"),
                             ("GET", "/v1/models"), ("GET", "/wp-admin")):
            body = RERANK if method == "POST" else None
            r = keyed.request(method, path, headers=headers, json=body)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            error = r.json()["error"]
            assert error["type"] == "unauthorized" and error["code"] == 401
            assert says in error["message"]
    assert 'spdrank_errors_total{route="/v1/rerank",type="unauthorized"}' in keyed.get(
        "/metrics"
    ).text


def test_with_the_key_routes_answer_and_health_metrics_and_docs_stay_open(keyed):
    good = {"Authorization": "Bearer s3cret-Key"}
    assert keyed.post("/v1/rerank", headers=good, json=RERANK).status_code == 200
    assert keyed.post("/v1/rerank", headers={"authorization": "bearer s3cret-Key"},
                      json=RERANK).status_code == 200  # the scheme's case does not matter
    assert keyed.get("/v1/models", headers=good).json()["data"][0]["id"] == "tiny-spd"
    for path in ("/healthz", "/metrics", "/docs", "/redoc", "/openapi.json"):
        assert keyed.get(path).status_code == 200, path
    schema = keyed.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["paths"]["/v1/rerank"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/healthz"]["get"]


def test_the_key_comes_from_a_file_or_the_environment(tmp_path):
    path = tmp_path / "key"
    path.write_text("s3cret-Key\n")  # as `echo` writes it
    assert load_api_key(str(path), environ={}) == "s3cret-Key"
    assert load_api_key(None, environ={ENV_VAR: "s3cret-Key"}) == "s3cret-Key"
    assert load_api_key(None, environ={}) is None
    with pytest.raises(ValueError, match="both in SPDRANK_API_KEY and by --api-key-file"):
        load_api_key(str(path), environ={ENV_VAR: "other"})
    with pytest.raises(ValueError, match="SPDRANK_API_KEY is empty"):
        load_api_key(None, environ={ENV_VAR: " "})
    path.write_text("two words\n")
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        load_api_key(str(path), environ={})
    path.write_bytes(b"k" * (MAX_KEY_BYTES + 1))
    with pytest.raises(ValueError, match=f"more than {MAX_KEY_BYTES} bytes"):
        load_api_key(str(path), environ={})
    with pytest.raises(ValueError, match="No such file"):
        load_api_key(str(tmp_path / "missing"), environ={})


def test_serve_refuses_an_empty_key_file_in_one_line_and_takes_a_good_one(
    served, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(ENV_VAR, raising=False)
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["serve", "--model", str(served[1]), "--api-key-file", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err == f"spdrank serve: error: --api-key-file {empty} is empty: write the API key " \
                  "into it, or leave it unset\n"
    assert not seen  # refused before the model was loaded or the port opened
    with pytest.raises(SystemExit):  # never on the command line, nor read as --api-key-file
        build_parser().parse_args(["serve", "--model", str(served[1]), "--api-key", "s3cret"])
    err = capsys.readouterr().err
    assert "never taken on the command line" in err and "s3cret" not in err

    key = tmp_path / "key"
    key.write_text("s3cret-Key\n")
    assert main(["serve", "--model", str(served[1]), "--device", "cpu",
                 "--api-key-file", str(key)]) == 0
    with TestClient(seen["app"]) as c:
        assert c.post("/v1/rerank", json=RERANK).status_code == 401
        r = c.post("/v1/rerank", json=RERANK, headers={"Authorization": "Bearer s3cret-Key"})
        assert r.status_code == 200


# -- /docs without a CDN --------------------------------------------------------------------


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_name_no_other_host_and_their_assets_are_served(served, page):
    with TestClient(create_app(served[0], name="tiny-spd")) as c:
        html = c.get(page)
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        assert re.findall(r"https?://", html.text) == [], html.text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
        assert any(a.endswith(".js") for a in assets), html.text
        if page == "/docs":
            assert any(a.endswith(".css") for a in assets), html.text
        for asset in assets:
            assert asset.startswith("/"), asset
            r = c.get(asset)
            assert r.status_code == 200 and r.content, asset
