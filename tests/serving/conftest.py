"""The tiny SPD model the serving tests rank with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spdrank.model.ranker import SPDRanker
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def served(tiny_backbone, tmp_path_factory) -> tuple[SPDRanker, Path]:
    """A tiny SPD model (8 positions, 8 tokens per item), built once and saved for the CLI test."""
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone, positions=8, query_tokens=64))
    path = tmp_path_factory.mktemp("served") / "tiny-spd"
    model.save_pretrained(path)
    return model, path
