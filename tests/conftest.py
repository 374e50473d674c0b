"""Shared fixtures: a tiny random Llama built from a config (fast), and slates; the plain
functions they use are in helpers.py.

The tiny backbone uses the bundled SmolLM2 tokenizer, so prompts are tokenized exactly as
in production; only the transformer is shrunk. Tests marked ``slow`` load the real bundled
SmolLM2 weights (first 1-2 layers) so the production path is always exercised.
"""

from __future__ import annotations

import copy
import hashlib
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

#: Files of a model folder that hold weights, not the tokenizer.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@pytest.fixture(scope="session", autouse=True)
def tokenizers_read_once():
    """Each distinct tokenizer read from disk once a test process: reading SmolLM2's takes
    about 0.4 s, and the tests save hundreds of tiny backbones that each carry a copy of it,
    which made reading tokenizers a third of the fast suite's time.

    A folder's tokenizer is keyed by the content of every file in it but the weights (so a test
    that edits a template or damages a file reads it afresh), and each caller gets its own
    shallow copy named after its own folder, as a fresh read would be. spdrank's own checks
    around the read (``load_tokenizer``'s trust rules and error messages) run as ever."""
    from transformers import AutoTokenizer

    read = AutoTokenizer.from_pretrained.__func__
    cache: dict[str, object] = {}

    def from_pretrained(cls, name_or_path, *args, **kwargs):
        folder = Path(name_or_path)
        if not folder.is_dir():
            return read(cls, name_or_path, *args, **kwargs)
        digest = hashlib.sha256(repr((args, sorted(kwargs.items()))).encode())
        for file in sorted(folder.iterdir()):
            if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES):
                digest.update(file.name.encode() + b"\0" + file.read_bytes())
        key = digest.hexdigest()
        if key not in cache:
            cache[key] = read(cls, name_or_path, *args, **kwargs)
        tokenizer = copy.copy(cache[key])
        tokenizer.name_or_path = str(name_or_path)
        return tokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoTokenizer, "from_pretrained", classmethod(from_pretrained))
        yield


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
