"""The ``openai`` backend against a real OpenAI-compatible HTTP server on loopback.

The server is the Python stdlib's http.server in a thread (tests.helpers' loopback server): ``/v1/models`` and
``/v1/chat/completions``, answering a deterministic ranking (the candidates reversed) with
usage. Variants fail the first requests with 500 (retries), hang (timeouts), or answer after
a delay while counting the requests in flight at once (concurrency limits).
"""

import json
import socket
import threading
import time
from collections import Counter

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import load_slates, write_slates
from tests.helpers import JSONHandler, LoopbackHTTPServer, make_slates, records, reversed_completion


class FakeServer(LoopbackHTTPServer):
    def __init__(self, fail_first: int = 0, hang: bool = False, status: int = 500,
                 model: str = "fake-ranker", delay: float = 0.0, bad: str | None = None) -> None:
        self.fail_first, self.hang, self.status = fail_first, hang, status
        self.bad = bad  # "json" / "no_choices": fail with a 200 that is not a completion
        self.model, self.delay = model, delay
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        fake = self

        class Handler(JSONHandler):
            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self.send_json(200, {"object": "list", "data": [
                        {"id": fake.model, "object": "model", "created": 0, "owned_by": "test"}]})
                else:
                    self.send_json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                with fake.lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                self.counted = True
                try:
                    self._answer()
                finally:
                    self._done()

            def _done(self):
                if getattr(self, "counted", False):
                    self.counted = False
                    with fake.lock:
                        fake.in_flight -= 1

            def send_json(self, *args, **kwargs):
                # Out of flight before the reply goes out: once the client has the reply it
                # frees its slot and may send the next request, which a decrement after the
                # write could still find counted (3 in flight under a limit of 2, under load).
                self._done()
                super().send_json(*args, **kwargs)

            def _answer(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    count = len(fake.requests)
                time.sleep(fake.delay)
                if fake.hang:
                    fake.release.wait(10)
                    return
                if count <= fake.fail_first and fake.bad == "json":
                    self.send_json(200, b'{"id": "c", "choices": [')
                    return
                if count <= fake.fail_first and fake.bad == "no_choices":
                    self.send_json(200, {"id": "c", "object": "chat.completion", "created": 0,
                                         "model": body["model"]})
                    return
                if count <= fake.fail_first:
                    self.send_json(fake.status, {"error": {"message": "try again", "type": "server_error"}})
                    return
                self.send_json(200, reversed_completion(body, f"c{count}", usage=True))

        super().__init__(Handler)

    def __exit__(self, *exc) -> None:
        self.release.set()  # hanging handlers return rather than wait out their 10 s
        super().__exit__(*exc)


def closed_port_urls(n: int = 1) -> list[str]:
    """URLs of ports nobody listens on (connection refused)."""
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:  # all bound at once, so the ports differ
        sock.bind(("127.0.0.1", 0))
    urls = [f"http://127.0.0.1:{sock.getsockname()[1]}/v1" for sock in socks]
    for sock in socks:
        sock.close()
    return urls


def run_on(slates_file, urls, *extra, out="labels.jsonl"):
    out = slates_file.parent / out
    base_urls = [arg for url in urls for arg in ("--base-url", url)]
    code = main(["teacher", "--slates", str(slates_file), "--out", str(out), "--backend", "openai",
                 *base_urls, "--api-key", "secret", "--no-progress", "--retry-backoff", "0.01", *extra])
    return code, out


def run_openai(slates_file, server, *extra):
    return run_on(slates_file, [server.url], *extra)


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


@pytest.mark.parametrize(
    ("guided", "field"),
    [(None, "grammar"), ("llama", "grammar"), ("vllm", "structured_outputs"),
     ("vllm-legacy", "guided_regex")],
)
def test_constrained_sends_the_servers_grammar_field(slates_file, guided, field):
    from spdrank.teacher.grammar import guided_body

    extra = ["--guided", guided] if guided else []
    with FakeServer() as server:
        code, out = run_openai(slates_file, server, "--concurrency", "1", "--constrained", *extra,
                               "--extra-body", '{"top_k": 1}')
    assert code == 0
    slates = {s.query.qid: s for s in load_slates(slates_file)}
    kind = guided or "llama"
    for rec in records(out):
        assert rec["status"] == "ok" and rec["backend"] == f"openai:fake-ranker+guided-{kind}"
    # One request per slate, in file order (one at a time): each constrained for its own size.
    assert len(server.requests) == len(slates)
    for body, slate in zip(server.requests, slates.values()):
        assert {k: body[k] for k in guided_body(kind, len(slate))} == guided_body(kind, len(slate))
        assert field in body and body["top_k"] == 1


def test_retries_after_server_errors(slates_file):
    with FakeServer(fail_first=2) as server:
        code, out = run_openai(slates_file, server, "--concurrency", "1", "--retries", "2",
                               "--model-name", "fake-ranker", "--extra-body", '{"top_k": 1}')
    assert code == 0
    recs = records(out)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    assert recs[0]["attempts"] == 3 and all(r["attempts"] == 1 for r in recs[1:])
    assert len(server.requests) == 6 + 2 and server.requests[0]["top_k"] == 1


@pytest.mark.parametrize("bad", ["json", "no_choices"])
def test_a_200_that_is_not_a_completion_is_retried(slates_file, bad):
    with FakeServer(fail_first=2, bad=bad) as server:
        code, out = run_openai(slates_file, server, "--concurrency", "1", "--retries", "2",
                               "--model-name", "fake-ranker")
    assert code == 0
    recs = records(out)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    assert recs[0]["attempts"] == 3 and len(server.requests) == 6 + 2


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
    code, _ = run_on(slates_file, closed_port_urls())
    assert code == 2 and "is the server up?" in capsys.readouterr().err


# -- many servers ---------------------------------------------------------------------------


def test_slates_spread_over_servers_with_concurrency_per_server(slates_file, tmp_path, capsys):
    write_slates(slates_file, make_slates(12, seed=4))
    with FakeServer(model="model-a", delay=0.3) as a, FakeServer(model="model-b", delay=0.3) as b:
        listing = tmp_path / "servers.txt"
        listing.write_text(f"# two fakes\n{a.url}\n\n  {b.url}/   # a trailing slash is fine\n")
        code, out = run_on(slates_file, [], "--base-urls-file", str(listing), "--concurrency", "2",
                           "--json", str(tmp_path / "summary.json"))
    assert code == 0
    recs = records(out)
    assert sorted(r["qid"] for r in recs) == sorted(s.query.qid for s in load_slates(slates_file))
    assert all(r["status"] == "ok" for r in recs)
    per_server = Counter(r["server"] for r in recs)
    assert per_server == {a.url: len(a.requests), b.url: len(b.requests)}
    assert min(per_server.values()) >= 3  # spread, not piled on one server
    assert a.max_in_flight == b.max_in_flight == 2  # the limit holds per server, and is used
    for rec in recs:  # each server's own model names the record
        assert rec["backend"] == {a.url: "openai:model-a", b.url: "openai:model-b"}[rec["server"]]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["servers"] == per_server and summary["backend"] == "openai:model-a,model-b"
    printed = capsys.readouterr().out
    assert all(f"{url}{n:>14}" in printed for url, n in per_server.items())


@pytest.mark.parametrize("dead", ["refused", "refused at start", "500"])
def test_a_dead_server_loses_no_slates(slates_file, caplog, dead):
    with FakeServer(delay=0.2) as live, FakeServer(fail_first=10**6) as broken:
        dead_url = broken.url if dead == "500" else closed_port_urls()[0]
        named = [] if dead == "refused at start" else ["--model-name", "fake-ranker"]
        # The dead server is listed first: it is the first asked, unless known dead at start.
        code, out = run_on(slates_file, [dead_url, live.url], "--concurrency", "2", "--retries", "1",
                           *named)
    assert code == 0
    recs = records(out)
    assert len(recs) == 6 and {r["server"] for r in recs} == {live.url}
    assert all(r["status"] == "ok" for r in recs) and len(live.requests) == 6
    assert live.max_in_flight == 2  # every thread wants the live server: the limit holds
    assert f"{dead_url} failed (" in caplog.text and "out of rotation" in caplog.text
    # Out of rotation after one failure: only slates sent before that (2 slots x 2 attempts) hit it.
    assert (1 <= len(broken.requests) <= 4) if dead == "500" else not broken.requests


def test_all_servers_down_leaves_every_slate_for_a_rerun(slates_file, capsys):
    dead = closed_port_urls(2)
    code, out = run_on(slates_file, dead, "--model-name", "m", "--retries", "1", "--max-failures", "0")
    assert code == 1 and out.read_text() == ""
    printed = capsys.readouterr().out
    assert "0 labelled now, 6 failed" in printed and "6 selected slates have no label yet" in printed
    first_failure = printed.split("first failure: ", 1)[1].splitlines()[0]
    assert all(f"{url}: APIConnectionError" in first_failure for url in dead)

    code, _ = run_on(slates_file, dead)  # no --model-name: nobody to ask, said at once
    err = capsys.readouterr().err
    assert code == 2 and "is the server up?" in err and all(url in err for url in dead)

    with FakeServer() as a, FakeServer() as b:  # servers back: the rerun labels everything
        code, out = run_on(slates_file, [a.url, b.url])
    assert code == 0 and len(records(out)) == 6


def test_shards_over_many_servers_merge(slates_file):
    with FakeServer() as a, FakeServer() as b:
        assert run_on(slates_file, [a.url, b.url], "--shard", "0/2", out="s0.jsonl")[0] == 0
        assert run_on(slates_file, [b.url], "--shard", "1/2", out="s1.jsonl")[0] == 0
    folder = slates_file.parent
    assert main(["teacher", "merge", "--labels", str(folder / "s0.jsonl"), str(folder / "s1.jsonl"),
                 "--slates", str(slates_file), "--out", str(folder / "merged.jsonl")]) == 0
    merged = records(folder / "merged.jsonl")
    assert [r["qid"] for r in merged] == [s.query.qid for s in load_slates(slates_file)]
    assert {r["server"] for r in merged[0::2]} == {a.url, b.url}  # shard 0: both servers
    assert {r["server"] for r in merged[1::2]} == {b.url}
