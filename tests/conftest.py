"""Shared fixtures: a tiny random Llama built from a config (fast), and slates; the plain
functions they use are in helpers.py.

The tiny backbone uses the bundled SmolLM2 tokenizer, so prompts are tokenized exactly as
in production; only the transformer is shrunk. Tests marked ``slow`` load the real bundled
SmolLM2 weights (first 1-2 layers) so the production path is always exercised.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

# One answer to "does this CPU multiply bfloat16 natively" on every machine, in this process
# and the interpreters it starts: a checkpoint saved with dtype auto loads in float32, as the
# tests' tolerances assume. The tests of the detection set their own answer.
os.environ["SPDRANK_CPU_BF16"] = "0"

from spdrank.core.slates import Slate, write_slates
from tests.helpers import make_slate, save_tiny_llama


@pytest.fixture(scope="session")
def bundled_path() -> Path:
    from spdrank.backbone.locate import bundled_backbone_path

    return bundled_backbone_path()


@pytest.fixture(scope="session")
def tokenizer(bundled_path):
    from spdrank.backbone.load import load_tokenizer

    return load_tokenizer(str(bundled_path))


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory, tokenizer) -> str:
    """A 2-layer, 32-wide Llama with SmolLM2's tokenizer, saved as a local HF model directory."""
    return str(save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer))


@pytest.fixture
def slates() -> list[Slate]:
    rng = random.Random(0)
    return [make_slate(rng, rng.randint(3, 10), qid=f"u{i}") for i in range(8)]


@pytest.fixture
def train_file(tmp_path, slates) -> Path:
    """The eight ``slates`` as ``tmp_path/train.jsonl``, where the training tests look for them."""
    write_slates(tmp_path / "train.jsonl", slates)
    return tmp_path / "train.jsonl"


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: a tiny model's matmuls are too small to share out, and on
    a busy machine two threads make every call wait for a free core (tenfold slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
