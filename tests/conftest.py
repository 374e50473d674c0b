"""Shared fixtures: a tiny random Llama built from a config (fast), and slate factories.

The tiny backbone uses the bundled SmolLM2 tokenizer, so prompts are tokenized exactly as
in production; only the transformer is shrunk. Tests marked ``slow`` load the real bundled
SmolLM2 weights (first 1-2 layers) so the production path is always exercised.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from spdrank.slates import Candidate, Query, Slate, write_slates

WORDS = ["shampoo", "conditioner", "serum", "lipstick", "mascara", "cream", "lotion", "gel", "polish", "brush", "oil", "mask", "cleanser", "toner", "balm", "spray", "powder", "foundation", "blush", "eyeliner", "perfume", "soap", "scrub"]


@pytest.fixture(scope="session")
def bundled_path() -> Path:
    from spdrank.backbone import bundled_backbone_path

    return bundled_backbone_path()


@pytest.fixture(scope="session")
def tokenizer(bundled_path):
    from spdrank.backbone import load_tokenizer

    return load_tokenizer(str(bundled_path))


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory, tokenizer) -> str:
    """A 2-layer, 32-wide Llama with SmolLM2's tokenizer, saved as a local HF model directory."""
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
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def make_slate(rng: random.Random, n: int, qid: str = "q", teacher: bool = True) -> Slate:
    cands = [
        Candidate(docid=f"d{i}", doc={"title": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))})
        for i in range(n)
    ]
    docids = [c.docid for c in cands]
    ranking = docids[:]
    rng.shuffle(ranking)
    return Slate(
        query=Query(qid=qid, text="1. " + " ".join(rng.choices(WORDS, k=5))),
        candidates=cands,
        clicked=[ranking[0]],
        teacher=ranking if teacher else None,
    )


@pytest.fixture
def slates() -> list[Slate]:
    rng = random.Random(0)
    return [make_slate(rng, rng.randint(3, 10), qid=f"u{i}") for i in range(8)]


@pytest.fixture
def train_file(tmp_path, slates) -> Path:
    """The eight ``slates`` as ``tmp_path/train.jsonl``, where the training tests look for them."""
    write_slates(tmp_path / "train.jsonl", slates)
    return tmp_path / "train.jsonl"


def save_features_only_model(path: Path, positions: int) -> Path:
    """A features-only model (no backbone) reading 'pop' and the candidates' score, saved to
    ``path``: it loads in milliseconds, so input-handling tests can run the real CLI and
    server around it."""
    from spdrank.backbone import BackboneConfig
    from spdrank.features import FeatureNormalizer
    from spdrank.heads import HeadConfig
    from spdrank.model import NoBackbone, NoTokenizer, SPDConfig, SPDRanker

    config = SPDConfig(
        backbone=BackboneConfig(lora=None),
        head=HeadConfig(kind="attn", positions=positions, width=16, heads=2),
        features=FeatureNormalizer(("pop", "score"), (1.0, 0.5), (0.5, 0.25)),
        features_only=True,
    )
    SPDRanker(config, NoBackbone(), NoTokenizer()).save_pretrained(path)
    return path


def subprocess_env() -> dict[str, str]:
    """The environment for a fresh interpreter that imports this checkout's spdrank."""
    import spdrank

    src = str(Path(spdrank.__file__).parents[1])
    return os.environ | {"PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: a tiny model's matmuls are too small to share out, and on
    a busy machine two threads make every call wait for a free core (tenfold slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
