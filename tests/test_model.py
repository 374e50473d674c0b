import json
import random

import numpy as np
import pytest
import torch

from spdrank.backbone import BackboneConfig, LoraSettings
from spdrank.heads import HeadConfig
from spdrank.metrics import is_valid_permutation
from spdrank.model import SPDConfig, SPDRanker
from spdrank.prompt import PromptSettings
from tests.conftest import make_slate


def tiny_config(path, kind="attn", frozen=False, positions=16):
    return SPDConfig(
        backbone=BackboneConfig(
            name_or_path=path, lora=None if frozen else LoraSettings(r=4, alpha=8)
        ),
        head=HeadConfig(kind=kind, positions=positions, width=16, heads=2),
        prompt=PromptSettings(max_item_tokens=8),
    )


@pytest.mark.parametrize("kind", ["attn", "linear", "slot"])
@pytest.mark.parametrize("frozen", [False, True])
def test_save_load_round_trip(tmp_path, tiny_backbone, slates, kind, frozen):
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone, kind, frozen))
    # Make the adapter non-trivial (peft initialises B = 0), so the round trip is meaningful.
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = model.score_matrix(slates[0])
    model.save_pretrained(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl", ".pth"))], files
    assert ("adapter_model.safetensors" in files) == (not frozen)
    loaded = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.score_matrix(slates[0]), before, rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["head"]["kind"] == kind


def test_rank_returns_valid_permutation_with_timings(tiny_backbone, slates):
    model = SPDRanker.build(tiny_config(tiny_backbone))
    for slate in slates:
        r = model.rank(slate)
        assert is_valid_permutation(r.docids, slate.docids)
        assert r.decode_passes == 1
        assert set(r.timings) == {"tokenize", "prefill", "head", "assign"}
        assert all(a > b for a, b in zip(r.scores, r.scores[1:]))
    r = model.rank("my history", ["red gel", "blue soap", "green mask"])
    assert sorted(r.docids) == ["0", "1", "2"]


def test_rank_batch_matches_rank_one_by_one(tiny_backbone, slates):
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone))
    alone = [model.score_matrix(s) for s in slates]
    together = [r.docids for r in model.rank_batch(slates)]
    assert together == [model.rank(s).docids for s in slates]
    batch = model.collate([model.encode(s) for s in slates])
    with torch.inference_mode():
        scores = model.eval()(batch)
    for i, s in enumerate(slates):
        np.testing.assert_allclose(scores[i, : len(s)].numpy(), alone[i], rtol=1e-4, atol=1e-4)


def test_too_many_candidates_is_a_clear_error(tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone, positions=4))
    with pytest.raises(ValueError, match="has 6 candidates; this model ranks at most 4"):
        model.rank(make_slate(random.Random(0), 6))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an spdrank checkpoint"):
        SPDRanker.from_pretrained(tmp_path)
