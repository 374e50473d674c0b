"""The ``openai`` teacher backend against a REAL OpenAI-compatible server: llama.cpp's,
serving the bundled SmolLM2 GGUF on loopback.

llama.cpp's server comes from ``llama-cpp-python[server]``, which builds from source (about
8 minutes on 2 cores; pip caches the wheel, so later installs take seconds). ``make test``
installs it. Generation on a CPU is slow, so the slates are small and the answers
capped: a 135M model's rankings are mostly repaired, and the test checks exactly what the
pipeline promises for any teacher: every slate gets a status, the raw text, a valid repaired
permutation and its decode passes. A second server shows one run spreading its slates over two.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from spdrank.backbone.gguf import bundled_gguf
from spdrank.commands.cli import main
from spdrank.core.slates import Slate, load_slates, write_slates
from spdrank.eval.metrics import is_valid_permutation
from spdrank.teacher.parse import parse_response
from tests.helpers import free_port, make_slates, records

pytest.importorskip("llama_cpp.server", reason="make test installs llama-cpp-python[server]")

pytestmark = pytest.mark.slow  # launches llama.cpp servers on the real bundled model

#: The answers' cap: a CPU generates slowly.
MAX_NEW_TOKENS = 48


def assert_record_matches_its_answer(rec: dict, slate) -> None:
    """The record's status, issues and ranking are what its raw answer warrants: the
    status and issues ``parse_response`` finds, and its repair as a valid permutation."""
    parsed = parse_response(rec["raw"], len(slate), rec["mode"])
    assert (rec["status"], rec["issues"], rec["parsed"]) == (parsed.status, parsed.issues, parsed.ids)
    assert rec["ranking"] == [slate.docids[i] for i in parsed.permutation]
    assert is_valid_permutation(rec["ranking"], slate.docids)


def labelled_records(out: Path, slates: list[Slate]) -> dict[str, dict]:
    """The label file's records by qid: one per slate, each with a raw answer within
    :data:`MAX_NEW_TOKENS` decode passes that its status, issues and ranking match, from the
    llama.cpp server's model."""
    recs = {r["qid"]: r for r in records(out)}
    assert sorted(recs) == sorted(s.query.qid for s in slates)
    for slate in slates:
        rec = recs[slate.query.qid]
        assert rec["raw"] and 0 < rec["decode_passes"] <= MAX_NEW_TOKENS
        assert_record_matches_its_answer(rec, slate)
        assert rec["backend"] == "openai:smollm2"
    return recs


class LlamaServer:
    """llama.cpp's server on loopback; its access log (stdout) tells what it answered."""

    def __init__(self, log: Path, n_threads: int) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf()),
                 "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                 "--n_threads", str(n_threads), "--model_alias", "smollm2"],
                stdout=out, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    assert json.load(r)["data"][0]["id"] == "smollm2"
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    pytest.fail("llama.cpp's server did not start")
                time.sleep(0.5)

    def completions(self) -> int:
        """Chat completions it has answered (200) so far."""
        return self.log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llama") / "access.log", n_threads=2)
    yield server
    server.stop()


@pytest.mark.parametrize("mode", ["direct", "reasoning"])
def test_labels_slates_through_llamacpp_server(tmp_path, llama_server, mode):
    slates = make_slates(3, seed=7)
    write_slates(tmp_path / "train.jsonl", slates)
    out = tmp_path / "labels.jsonl"
    code = main([
        "teacher", "--slates", str(tmp_path / "train.jsonl"), "--out", str(out),
        "--backend", "openai", "--base-url", llama_server.url, "--mode", mode,
        "--max-new-tokens", str(MAX_NEW_TOKENS), "--concurrency", "1", "--timeout", "120",
        "--no-progress",
    ])
    assert code == 0
    recs = labelled_records(out, slates)
    assert all(rec["mode"] == mode for rec in recs.values())
    labelled = load_slates(out.with_name("labels.slates.jsonl"))
    assert [s.teacher for s in labelled] == [recs[s.query.qid]["ranking"] for s in labelled]


def test_two_servers_share_the_slates(tmp_path, llama_server):
    """One process, two servers, one request at a time each: both answer, every slate labelled."""
    second = LlamaServer(tmp_path / "second.log", n_threads=1)
    try:
        before = llama_server.completions()
        slates = make_slates(4, seed=8)
        write_slates(tmp_path / "train.jsonl", slates)
        out = tmp_path / "labels.jsonl"
        code = main([
            "teacher", "--slates", str(tmp_path / "train.jsonl"), "--out", str(out),
            "--backend", "openai", "--base-url", llama_server.url, "--base-url", second.url,
            "--max-new-tokens", str(MAX_NEW_TOKENS), "--concurrency", "1", "--timeout", "300",
        "--no-progress",
        ])
        answered = {llama_server.url: llama_server.completions() - before, second.url: second.completions()}
    finally:
        second.stop()
    assert code == 0
    recs = labelled_records(out, slates)
    # Both served, by their own access logs, at least the slates the records say they did (more
    # only if a request timed out on a loaded machine and was retried).
    labelled = Counter(r["server"] for r in recs.values())
    assert set(labelled) == set(answered)
    assert all(answered[url] >= labelled[url] >= 1 for url in answered)
