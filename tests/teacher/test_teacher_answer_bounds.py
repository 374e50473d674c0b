"""The ``openai`` teacher reads a bounded answer: a server that streams a 200 body without end
is cut once the attempt has read :data:`~spdrank.core.defaults.MAX_ANSWER_BYTES`, long before
``--timeout``, with a line that says why; a compressed answer, whose size unpacked nothing
bounds, is refused."""

from __future__ import annotations

import socket
import time

import pytest

from spdrank.commands.cli import main
from spdrank.core.defaults import MAX_ANSWER_BYTES
from spdrank.teacher import openai_api
from tests.helpers import RawTCPServer


class EndlessServer(RawTCPServer):
    """Answers every request with a 200 and ``headers``, then ``body`` over and over, as fast
    as the client reads, until the client hangs up; counts the bytes it sent."""

    def __init__(self, headers: bytes, body: bytes) -> None:
        super().__init__()
        self.head, self.body = headers, body
        self.sent = 0

    def respond(self, conn: socket.socket, head: bytes, body: bytes) -> None:
        try:
            conn.sendall(self.head)
            while not self.stop.is_set():
                conn.sendall(self.body)
                self.sent += len(self.body)
        except OSError:  # the client hung up
            return


ENDLESS = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
CHUNK = b"10000\r\n" + b" " * 0x10000 + b"\r\n"


def _teacher(slates_file, url: str, capsys) -> tuple[int, str, float]:
    out = slates_file.parent / "labels.jsonl"
    t0 = time.monotonic()
    code = main(["teacher", "--slates", str(slates_file), "--out", str(out), "--backend",
                 "openai", "--base-url", url, "--api-key", "k", "--model-name", "m",
                 "--no-progress", "--retries", "0", "--concurrency", "1", "--limit", "1",
                 "--timeout", "60"])
    return code, capsys.readouterr().out, time.monotonic() - t0


def test_an_endless_answer_is_cut_at_the_byte_bound(slates_file, capsys):
    with EndlessServer(ENDLESS, CHUNK) as server:
        code, printed, seconds = _teacher(slates_file, server.url, capsys)
    assert code == 1  # the slate failed, left for a rerun
    assert f"AnswerTooLarge: the answer passed {MAX_ANSWER_BYTES:,} bytes" in printed
    assert seconds < 20  # far from the 60 s --timeout
    # What was sent beyond the bound is at most what the sockets buffered.
    assert server.sent < MAX_ANSWER_BYTES + 16 * 2**20


def test_a_compressed_answer_is_refused(slates_file, capsys):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n")
    with EndlessServer(head, CHUNK) as server:
        code, printed, _ = _teacher(slates_file, server.url, capsys)
    assert code == 1 and "compressed (gzip)" in printed


def test_the_budget_counts_every_read_of_an_attempt():
    with openai_api.deadline(10.0, max_bytes=10):
        budget = openai_api._BUDGET.get()
        budget.spend(10)
        with pytest.raises(openai_api.AnswerTooLarge, match="passed 10 bytes"):
            budget.spend(1)
    assert openai_api._BUDGET.get() is None  # no bound outside an attempt
