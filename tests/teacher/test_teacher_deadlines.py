"""The ``openai`` teacher against servers that are slow, silent, busy or refuse the run.

Two fakes on loopback: :class:`RawServer` speaks raw TCP (reads each request, then answers a
byte at a time, or never), for the total deadline of an attempt; :class:`StatusServer` is
http.server (tests.helpers' loopback server) answering a scripted status (with headers) to
the first requests and a ranking after, noting when each request came, for ``Retry-After`` and
the refusals that stop a run.
"""

import email.utils
import json
import re
import socket
import time

import pytest

from spdrank.commands.cli import main
from spdrank.teacher import openai_api
from tests.helpers import (
    JSONHandler,
    LoopbackHTTPServer,
    RawTCPServer,
    records,
    reversed_completion,
)

COMPLETION = json.dumps({
    "id": "c", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "[1] > [2]"}}],
}).encode()
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))


class RawServer(RawTCPServer):
    """Reads each request whole, then sends ``answer`` one byte every ``interval`` seconds
    (``answer=None``: sends nothing), for at most ``hold`` seconds before it hangs up."""

    def __init__(self, answer: bytes | None, interval: float = 1.0, hold: float = 8.0) -> None:
        super().__init__()
        self.answer, self.interval, self.hold = answer, interval, hold
        self.requests = 0
        #: ``time.monotonic()`` when each request had been read whole.
        self.times: list[float] = []

    def respond(self, conn: socket.socket, head: bytes, body: bytes) -> None:
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        while length and len(body) < int(length.group(1)):
            body += conn.recv(65536)
        self.requests += 1
        self.times.append(time.monotonic())
        end = time.monotonic() + self.hold
        for byte in (self.answer or b""):
            if self.stop.wait(self.interval) or time.monotonic() > end:
                return
            conn.sendall(bytes([byte]))
        self.stop.wait(max(0.0, end - time.monotonic()))


class StatusServer(LoopbackHTTPServer):
    """Answers the first requests with ``script`` ((status, headers) each, in order), then a
    ranking; ``times`` holds when each chat request arrived (``time.monotonic()``)."""

    def __init__(self, script: list[tuple[int, dict[str, str]]], models_status: int = 200) -> None:
        self.script, self.models_status = list(script), models_status
        self.times: list[float] = []
        fake = self

        class Handler(JSONHandler):
            def do_GET(self):
                if fake.models_status != 200:
                    self.send_json(fake.models_status, {"error": {"message": "no"}})
                    return
                self.send_json(200, {"object": "list", "data": [
                    {"id": "m", "object": "model", "created": 0, "owned_by": "test"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.times.append(time.monotonic())
                if len(fake.times) <= len(fake.script):
                    status, headers = fake.script[len(fake.times) - 1]
                    # A callable value is computed as the answer is sent (an HTTP date).
                    headers = {k: v() if callable(v) else v for k, v in headers.items()}
                    self.send_json(status, {"error": {"message": "not now"}}, headers)
                    return
                self.send_json(200, reversed_completion(body))

        super().__init__(Handler)


def teacher(slates_file, url, *extra):
    out = slates_file.parent / "labels.jsonl"
    code = main(["teacher", "--slates", str(slates_file), "--out", str(out), "--backend", "openai",
                 "--base-url", url, "--api-key", "secret", "--no-progress", "--retry-backoff", "0.01",
                 "--concurrency", "1", *extra])
    return code, out


def after_last_request(server: "RawServer", fn, *args):
    """``fn(*args)``, and the seconds from the server's last request to its end."""
    result = fn(*args)
    return result, time.monotonic() - server.times[-1]


# -- the total deadline of an attempt -------------------------------------------------------


def test_a_trickling_answer_ends_at_the_total_deadline(slates_file):
    # A byte a second keeps every socket read under any per-read timeout: only a deadline
    # on the whole attempt ends it.
    with RawServer(ANSWER, interval=1.0) as server:
        (code, out), elapsed = after_last_request(
            server, teacher, slates_file, server.url, "--timeout", "2", "--retries", "0",
            "--limit", "1", "--model-name", "m")
    assert code == 1 and out.read_text() == ""  # failed, left for a rerun
    assert server.requests == 1
    assert elapsed < 3.0  # the timeout, and a second


def test_a_trickling_model_list_ends_at_the_total_deadline(slates_file, capsys):
    with RawServer(ANSWER, interval=0.5) as server:
        (code, _), elapsed = after_last_request(server, teacher, slates_file, server.url,
                                                "--timeout", "1.5")
    assert code == 2 and "cannot list the models" in capsys.readouterr().err
    assert elapsed < 2.5


def test_a_server_that_never_answers_is_bounded_per_attempt(slates_file):
    with RawServer(None) as server:
        (code, out), elapsed = after_last_request(
            server, teacher, slates_file, server.url, "--timeout", "1", "--retries", "1",
            "--limit", "1", "--model-name", "m")
    assert code == 1 and out.read_text() == ""
    assert server.requests == 2  # each attempt ended by its deadline, then retried
    assert 0.9 < server.times[1] - server.times[0] < 2.0
    assert elapsed < 2.0


def test_a_deadline_spent_on_the_model_list_leaves_none_for_the_answer():
    """One attempt is one deadline: what the model list took is not given back."""
    import httpcore2

    with openai_api.deadline(0.2):
        assert openai_api._left(10.0, httpcore2.ReadTimeout) <= 0.2
        time.sleep(0.25)
        with pytest.raises(httpcore2.ReadTimeout):
            openai_api._left(10.0, httpcore2.ReadTimeout)
    assert openai_api._left(10.0, httpcore2.ReadTimeout) == 10.0  # no deadline outside


# -- Retry-After ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "date"])
def test_retry_after_is_waited_for(slates_file, status, form):
    # A date has whole seconds: two from when it is sent wait between one and two.
    value = "1" if form == "seconds" else (
        lambda: email.utils.formatdate(time.time() + 2, usegmt=True))
    with StatusServer([(status, {"Retry-After": value})]) as server:
        code, out = teacher(slates_file, server.url, "--model-name", "m", "--retries", "2")
    assert code == 0
    # One retry, by one layer (the openai client's are off, or attempts would read 1):
    assert [r["attempts"] for r in records(out)] == [2, 1, 1, 1, 1, 1]
    assert len(server.times) == 7
    gap = server.times[1] - server.times[0]
    assert 0.95 < gap < 2.5  # not the 0.01 s back-off


def test_retry_after_is_capped(slates_file, monkeypatch):
    monkeypatch.setattr(openai_api, "MAX_RETRY_AFTER_S", 0.3)
    with StatusServer([(429, {"Retry-After": "3600"})]) as server:
        code, out = teacher(slates_file, server.url, "--model-name", "m", "--retries", "1")
    assert code == 0 and len(records(out)) == 6
    assert 0.29 < server.times[1] - server.times[0] < 1.5


def test_a_shorter_retry_after_keeps_the_back_off(slates_file):
    with StatusServer([(503, {"Retry-After": "0"})]) as server:
        code, _ = teacher(slates_file, server.url, "--model-name", "m", "--retries", "1",
                          "--retry-backoff", "0.6")
    assert code == 0
    assert server.times[1] - server.times[0] > 0.29  # the jittered back-off, at least half


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({"Retry-After": "3"}, 3.0), ({"retry-after": " 1.5 "}, 1.5), ({"Retry-After": "-2"}, None),
     ({"Retry-After": "soon"}, None), ({"Retry-After": "nan"}, None), ({}, None),
     ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
     ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0)],
)
def test_retry_after_values(headers, expected):
    assert openai_api.retry_after_s(headers) == expected


def test_retry_after_as_a_date_in_the_future():
    ahead = openai_api.retry_after_s({"Retry-After": email.utils.formatdate(time.time() + 30, usegmt=True)})
    assert 28 < ahead <= 30


# -- refusals stop the run ------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_stops_the_run_at_once(slates_file, capsys, status):
    with StatusServer([(status, {})] * 10) as server:
        code, out = teacher(slates_file, server.url, "--model-name", "m")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(server.times) == 1  # not one request per slate up to --max-failures
    assert err.count("\n") == 0 and server.url in err and "refused the API key" in err
    assert "is the server up" not in err and out.read_text() == ""


def test_a_refused_key_on_the_model_list_says_so(slates_file, capsys):
    with StatusServer([], models_status=401) as server:
        code, _ = teacher(slates_file, server.url)
    err = capsys.readouterr().err.strip()
    assert code == 2 and not server.times
    assert err.count("\n") == 0 and server.url in err and "refused the API key" in err
    assert "is the server up" not in err


def test_an_unknown_model_stops_the_run_naming_it(slates_file, capsys):
    with StatusServer([(404, {})] * 10) as server:
        code, _ = teacher(slates_file, server.url, "--model-name", "no-such-model")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(server.times) == 1
    assert err.count("\n") == 0 and server.url in err and "'no-such-model'" in err
