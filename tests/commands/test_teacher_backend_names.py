"""``spdrank teacher`` names a backend as its labels record it without building it, so a
rerun with nothing left to label can check the file's labels against the backend asked for."""

from __future__ import annotations

import pytest

from spdrank.commands.cli import build_parser
from spdrank.commands.teacher import recorded_backend

BASE = ["teacher", "--slates", "s.jsonl", "--out", "l.jsonl", "--backend"]


@pytest.mark.parametrize(("argv", "name"), [
    (["hf", "--layers", "2", "--constrained"], "hf:bundled,layers=2+constrained"),
    (["likelihood", "--model", "m"], "likelihood:m"),
    (["openai", "--model-name", "fake-ranker"], "openai:fake-ranker"),
    (["openai", "--model-name", "m", "--constrained", "--guided", "vllm"], "openai:m+guided-vllm"),
    (["openai", "--model-name", "m", "--constrained"], "openai:m+guided-llama"),
    (["ranker:cooccurrence"], "ranker:cooccurrence"),
    (["ranker:bm25"], "ranker:slate_bm25"),  # a deprecated name labels as what it stands for
    (["file:r.jsonl"], "file:r.jsonl"),
    (["openai"], None),  # the servers name their model
    (["ranker:fusion:best:popularity+cooccurrence", "--choose-on", "v.jsonl"], None),
])
def test_the_name_a_backend_records_is_known_before_it_is_built(argv, name):
    assert recorded_backend(build_parser().parse_args(BASE + argv)) == name
