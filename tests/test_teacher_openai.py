"""The ``openai`` backend against a real OpenAI-compatible HTTP server on loopback.

The server is the Python stdlib's http.server in a thread: ``/v1/models`` and
``/v1/chat/completions``, answering a deterministic ranking (the candidates reversed) with
usage. Variants fail the first requests with 500 (retries) or hang (timeouts).
"""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spdrank.cli import main
from spdrank.slates import load_slates, write_slates
from tests.test_teacher_run import make_slates, records


class FakeServer:
    def __init__(self, fail_first: int = 0, hang: bool = False, status: int = 500) -> None:
        self.fail_first, self.hang, self.status = fail_first, hang, status
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": "fake-ranker", "object": "model", "created": 0, "owned_by": "test"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    count = len(fake.requests)
                if fake.hang:
                    fake.release.wait(10)
                    return
                if count <= fake.fail_first:
                    self._send(fake.status, {"error": {"message": "try again", "type": "server_error"}})
                    return
                n = int(re.search(r"Candidates \((\d+)\)", body["messages"][-1]["content"]).group(1))
                text = " > ".join(f"[{i}]" for i in range(n, 0, -1))
                self._send(200, {
                    "id": f"c{count}", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 5 * n, "total_tokens": 100 + 5 * n},
                })

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def slates_file(tmp_path, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    write_slates(tmp_path / "slates.jsonl", make_slates(6, seed=3))
    return tmp_path / "slates.jsonl"


def run_openai(slates_file, server, *extra):
    out = slates_file.parent / "labels.jsonl"
    code = main(["teacher", "--slates", str(slates_file), "--out", str(out), "--backend", "openai",
                 "--base-url", server.url, "--api-key", "secret", "--no-progress",
                 "--retry-backoff", "0.01", *extra])
    return code, out


def test_openai_backend_labels_every_slate(slates_file):
    with FakeServer() as server:
        code, out = run_openai(slates_file, server, "--concurrency", "3", "--mode", "reasoning")
    assert code == 0
    slates = {s.query.qid: s for s in load_slates(slates_file)}
    recs = records(out)
    assert sorted(r["qid"] for r in recs) == sorted(slates)
    for rec in recs:
        slate = slates[rec["qid"]]
        assert rec["status"] == "ok" and rec["ranking"] == slate.docids[::-1]
        assert rec["decode_passes"] == 5 * len(slate) and rec["attempts"] == 1
        assert rec["backend"] == "openai:fake-ranker" and rec["mode"] == "reasoning"
    first = server.requests[0]
    assert first["model"] == "fake-ranker" and first["temperature"] == 0
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert "last line" in first["messages"][1]["content"]
    assert first["max_tokens"] >= 6 * 3
    labelled = load_slates(out.with_name("labels.slates.jsonl"))
    assert [s.teacher for s in labelled] == [s.docids[::-1] for s in slates.values()]


def test_retries_after_server_errors(slates_file):
    with FakeServer(fail_first=2) as server:
        code, out = run_openai(slates_file, server, "--concurrency", "1", "--retries", "2",
                               "--model-name", "fake-ranker", "--extra-body", '{"top_k": 1}')
    assert code == 0
    recs = records(out)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    assert recs[0]["attempts"] == 3 and all(r["attempts"] == 1 for r in recs[1:])
    assert len(server.requests) == 6 + 2 and server.requests[0]["top_k"] == 1


def test_client_errors_are_not_retried(slates_file):
    with FakeServer(fail_first=100, status=400) as server:
        code, out = run_openai(slates_file, server, "--concurrency", "1", "--retries", "3",
                               "--model-name", "m", "--max-failures", "2")
    assert code == 1 and out.read_text() == ""
    assert len(server.requests) == 2  # one attempt each, then the run stopped


def test_timeout_fails_slates_which_a_rerun_retries(slates_file, capsys):
    with FakeServer(hang=True) as server:
        t0 = time.monotonic()
        code, out = run_openai(slates_file, server, "--concurrency", "2", "--timeout", "0.3",
                               "--retries", "1", "--model-name", "m", "--max-failures", "2")
        elapsed = time.monotonic() - t0
    assert code == 1 and out.read_text() == ""  # nothing recorded: failures are retried
    assert elapsed < 5
    printed = capsys.readouterr().out
    assert "2 failed (stopped early)" in printed
    with FakeServer() as server:
        code, out = run_openai(slates_file, server, "--model-name", "m")
    assert code == 0 and len(records(out)) == 6


def test_unreachable_server_is_a_clear_error(slates_file, capsys):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["teacher", "--slates", str(slates_file), "--out", str(slates_file.parent / "l.jsonl"),
                 "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--no-progress"])
    assert code == 2 and "is the server up?" in capsys.readouterr().err
