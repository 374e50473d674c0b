"""What the tests share, as plain functions: slate factories, tiny-model builders, servers on
loopback (uvicorn, and a fake OpenAI-compatible API), the benchmark scripts' dry runs and the
environment of a fresh interpreter. Fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.settings import BackboneConfig, LoraSettings
from spdrank.core.ranking import Ranking
from spdrank.core.slates import Candidate, Query, Slate
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.spd.history_settings import HistorySettings
from spdrank.model.config import SPDConfig
from spdrank.serving.engine import Engine

if TYPE_CHECKING:
    from typing import Self

    import uvicorn

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

WORDS = ["shampoo", "conditioner", "serum", "lipstick", "mascara", "cream", "lotion", "gel", "polish", "brush", "oil", "mask", "cleanser", "toner", "balm", "spray", "powder", "foundation", "blush", "eyeliner", "perfume", "soap", "scrub"]


# -- slates ------------------------------------------------------------------------------------


def make_slate(
    rng: random.Random, n: int, qid: str = "q", teacher: bool = True, *,
    catalogue: int = 0, history: int = 0,
) -> Slate:
    """``n`` candidates titled with 1 to 6 of WORDS, one click and (``teacher``) a teacher
    ranking, all random. With ``catalogue``, the docids are drawn from ``i0 .. i{catalogue-1}``
    (so slates share items, and can be filled up from each other's) and the query carries a
    ``history`` of that many of them."""
    cands = [
        Candidate(docid=f"d{i}", doc={"title": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))})
        for i in range(n)
    ]
    docids = [c.docid for c in cands]
    ranking = docids[:]
    rng.shuffle(ranking)
    query = Query(qid=qid, text="1. " + " ".join(rng.choices(WORDS, k=5)))
    if catalogue:
        items = [f"i{k}" for k in range(catalogue)]
        rename = dict(zip(docids, rng.sample(items, n)))
        cands = [Candidate(docid=rename[c.docid], doc=c.doc) for c in cands]
        ranking = [rename[d] for d in ranking]
        if history:
            query = Query(qid=qid, text=query.text, history=rng.sample(items, history))
    return Slate(
        query=query, candidates=cands, clicked=[ranking[0]], teacher=ranking if teacher else None
    )


def item_slate(
    qid: str, history: list[str], cands: list[str], clicked: list[str] | None = None,
    teacher: list[str] | None = None, sep: str = " ",
) -> Slate:
    """A slate over named items: candidate ``d`` is titled ``item d``, and the query's text is
    its history joined by ``sep`` (``-`` when empty)."""
    return Slate(
        query=Query(qid=qid, text=sep.join(history) or "-", history=history),
        candidates=[Candidate(docid=d, doc={"title": f"item {d}"}) for d in cands],
        clicked=clicked,
        teacher=teacher,
    )


def make_slates(n: int, seed: int = 0, prefix: str = "u") -> list[Slate]:
    """``n`` item slates from a catalogue of 30: a history of 4, 3 to 8 candidates, the first
    clicked, no teacher."""
    rng = random.Random(seed)
    items = [f"i{k}" for k in range(30)]
    out = []
    for u in range(n):
        history = rng.sample(items, 4)
        cands = rng.sample(items, rng.randint(3, 8))
        out.append(item_slate(f"{prefix}{u}", history, cands, clicked=[cands[0]], sep=" / "))
    return out


def signal_slates(n: int, seed: int, teacher: bool = True) -> list[Slate]:
    """Slates whose clicked item is the one with the top 'signal' feature, which no text says."""
    rng = random.Random(seed)
    slates = [make_slate(rng, 6, qid=f"s{seed}-{i}", teacher=teacher) for i in range(n)]
    for slate in slates:
        for c in slate.candidates:
            c.features = {"signal": rng.gauss(0, 1)}
        slate.clicked = [max(slate.candidates, key=lambda c: c.features["signal"]).docid]
    return slates


#: Three slates over four items: a teacher on the first two, every candidate clicked in the third.
EVAL = [
    item_slate("e1", ["a"], ["a", "b", "c", "d"], clicked=["c"], teacher=["c", "a", "b", "d"]),
    item_slate("e2", ["b"], ["a", "b", "c", "d"], clicked=["a"], teacher=["a", "b", "c", "d"]),
    item_slate("e3", ["c"], ["a", "b", "c", "d"], clicked=["a", "b", "c", "d"]),
]


def records(path: Path) -> list[dict]:
    """The JSON lines of ``path``."""
    return [json.loads(line) for line in path.read_text().splitlines()]


class Fixed:
    """A ranker returning whatever ``fn(slate)`` gives, counting calls."""

    def __init__(self, name, fn, passes=0):
        self.name, self.fn, self.passes, self.calls = name, fn, passes, 0

    def fit(self, train):
        pass

    def rank(self, slate):
        self.calls += 1
        return Ranking(docids=self.fn(slate), decode_passes=self.passes, timings={"x": 1.0})


# -- tiny models -------------------------------------------------------------------------------


def save_tiny_llama(path: Path, tokenizer) -> Path:
    """A 2-layer, 32-wide Llama with ``tokenizer`` (seeded), saved as a local HF model directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_qwen3(folder: Path, vocab_size: int = 49152) -> Path:
    """A 2-layer, 64-wide Qwen3 config.json (SmolLM2's tokenizer has 49,152 tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": vocab_size, "max_position_embeddings": 4096,
        "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "hidden_act": "silu",
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def tiny_config(
    backbone: str, kind: str = "attn", frozen: bool = False, positions: int = 16, *,
    lora: LoraSettings | None = None, item_tokens: int = 8, query_tokens: int | None = None,
    **head,
) -> SPDConfig:
    """A small SPD model on ``backbone``: LoRA ``lora`` (r 4, alpha 8 unless given) unless
    ``frozen``, a ``kind`` head 16 wide with 2 attention heads (``head`` overrides any of
    HeadConfig's fields, or the history head's ``match`` and ``match_width``), ``item_tokens``
    tokens an item and, when given, ``query_tokens``."""
    history = {name: head.pop(name) for name in ("match", "match_width") if name in head}
    if history:
        head["history"] = HistorySettings(**history)
    prompt = {"max_item_tokens": item_tokens}
    if query_tokens is not None:
        prompt["max_query_tokens"] = query_tokens
    return SPDConfig(
        backbone=BackboneConfig(
            name_or_path=backbone, lora=None if frozen else lora or LoraSettings(r=4, alpha=8)
        ),
        head=HeadConfig(kind=kind, positions=positions, **({"width": 16, "heads": 2} | head)),
        prompt=PromptSettings(**prompt),
    )


def save_features_only_model(
    path: Path, positions: int, std: tuple[float, float] = (0.5, 0.25)
) -> Path:
    """A features-only model (no backbone) reading 'pop' and the candidates' score (means 1.0
    and 0.5, deviations ``std``), saved to ``path``: it loads in milliseconds, so input-handling
    tests can run the real CLI and server around it."""
    from spdrank.core.features import FeatureNormalizer
    from spdrank.model.parts import NoBackbone, NoTokenizer
    from spdrank.model.ranker import SPDRanker

    config = SPDConfig(
        backbone=BackboneConfig(lora=None),
        head=HeadConfig(kind="attn", positions=positions, width=16, heads=2),
        features=FeatureNormalizer(("pop", "score"), (1.0, 0.5), std),
        features_only=True,
    )
    SPDRanker(config, NoBackbone(), NoTokenizer()).save_pretrained(path)
    return path


def train_config(tmp_path: Path, backbone: str, out: str = "run", **kw):
    """Training settings for ``tmp_path/train.jsonl`` on a tiny backbone, written to
    ``tmp_path/OUT``; ``kw`` overrides any of them."""
    from spdrank.training.train import TrainConfig

    base = {
        "slates": str(tmp_path / "train.jsonl"),
        "out": str(tmp_path / out),
        "target": "teacher",
        "backbone": backbone,
        "lora_r": 8,
        "lora_alpha": 16,
        "positions": 16,
        "head_width": 32,
        "max_item_tokens": 8,
        "batch_size": 4,
        "warmup_steps": 2,
        "eval_every": 0,
        "save_every": 0,
        "progress": False,
    }
    return TrainConfig(**(base | kw))



# -- servers on loopback -----------------------------------------------------------------------


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def uvicorn_on_loopback(app, **options) -> Iterator[tuple[int, uvicorn.Server]]:
    """``app`` on a real uvicorn server (``options`` for its Config) on a free loopback port, in
    a daemon thread; yields the port and the server once it has started, and stops it after."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield port, server
    finally:
        server.should_exit = True
        thread.join(10)


class HeldEngine(Engine):
    """The tiny model, holding every batch until ``release`` is set, so requests pile up
    behind it however fast or slow they arrive; ``entered`` counts the slates that reached it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.entered = 0

    def rank_parts(self, slates, wanted=lambda i: True):
        self.entered += len(slates)
        assert self.release.wait(20), "the test never released the batch"
        return super().rank_parts(slates, wanted)


class LoopbackHTTPServer:
    """A stdlib ThreadingHTTPServer answering with ``handler`` on a free loopback port, served
    from a daemon thread inside a ``with`` block; ``url`` is its OpenAI-style base (``/v1``)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        # serve_forever checks for shutdown every poll_interval (0.5 s by default), which
        # every test's exit would otherwise wait out.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RawTCPServer:
    """A fake server on loopback that speaks raw TCP, one thread a connection: for answers no
    HTTP server library gives (a byte at a time, never, or without end). A subclass writes
    :meth:`respond`, given the connection and the request's head and first body bytes."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.01)  # how often the accept loop sees ``stop``
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            self.respond(conn, head, body)

    def respond(self, conn: socket.socket, head: bytes, body: bytes) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the test's output stays its own) and answers JSON."""

    def log_message(self, *args) -> None:
        pass

    def send_json(self, code: int, body: dict | bytes, headers: dict[str, str] | None = None) -> None:
        """``body`` with status ``code``: a dict as JSON, bytes as they are (a broken answer);
        ``headers`` after the content type, which they may replace."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def reversed_completion(request: dict, completion_id: str = "c", usage: bool = False) -> dict:
    """The chat completion that answers the ranking prompt in ``request`` with its candidates
    reversed (``[n] > ... > [1]``), so a test knows the ranking to expect; with ``usage``, 100
    prompt tokens and 5 completion tokens a candidate."""
    n = int(re.search(r"Candidates \((\d+)\)", request["messages"][-1]["content"]).group(1))
    completion = {
        "id": completion_id, "object": "chat.completion", "created": 0, "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": " > ".join(f"[{i}]" for i in range(n, 0, -1))}}],
    }
    if usage:
        completion["usage"] = {
            "prompt_tokens": 100, "completion_tokens": 5 * n, "total_tokens": 100 + 5 * n}
    return completion

# -- processes and benchmark scripts -----------------------------------------------------------


def subprocess_env() -> dict[str, str]:
    """The environment for a fresh interpreter that imports this checkout's spdrank."""
    import spdrank

    src = str(Path(spdrank.__file__).parents[1])
    return os.environ | {"PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def load_benchmark(name: str, monkeypatch):
    """benchmarks/NAME.py as a module (the folder is no package), registered in sys.modules
    for the test's duration: dataclasses look their module up there. The folder is on the
    path meanwhile, as it is for a script run from it, so its sibling imports resolve."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def dry_run_commands(script: str) -> list[list[str]]:
    """The ``spdrank`` commands that ``bash benchmarks/SCRIPT --dry-run`` prints, each as its
    argv."""
    env = {**os.environ, "BIN": "/nonexistent/bin"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / script), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    return [shlex.split(line) for line in done.stdout.splitlines()
            if line.startswith("/nonexistent/bin/spdrank ")]


def walking_log(folder: Path, users: int, length: int = 6, items: int = 30) -> tuple[Path, Path]:
    """An interaction log (``seq.txt``) of users who walk i, i+1, ... through ``items`` items
    (no item twice), each from a seeded start, and the items' titles (``titles.tsv``)."""
    rng = random.Random(0)
    lines = []
    for u in range(users):
        start = rng.randrange(items)
        lines.append(" ".join([f"u{u}", *(f"i{(start + k) % items}" for k in range(length))]))
    seqs, titles = folder / "seq.txt", folder / "titles.tsv"
    seqs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    titles.write_text("item_id\ttitle\n" + "".join(f"i{i}\tItem {i}\n" for i in range(items)),
                      encoding="utf-8")
    return seqs, titles
