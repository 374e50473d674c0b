"""A state cache grows to a longer run of the same slates: a cache of the first 8 serves a run
on 43 by computing the 35 it lacks, its last short shard completed, and reads as a cache built
for all 43 at once."""

from __future__ import annotations

import pytest
import torch

from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.settings import BackboneConfig
from spdrank.core.slates import load_slates, write_slates
from spdrank.methods.head_config import HeadConfig
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache, shard_name
from tests.helpers import make_slates

KW = {"storage": "float32", "batch_size": 4, "shard_size": 5, "progress": False}


@pytest.fixture
def frozen(tiny_backbone) -> SPDRanker:
    """The history head on word states: every tensor a shard holds (states, history, their
    sizes and word counts) is appended when a shard grows."""
    torch.manual_seed(0)
    return SPDRanker.build(SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="history", positions=16, width=32, dropout=0.0),
        prompt=PromptSettings(max_item_tokens=8, readout="words", history_items=True),
    )).eval()


def counting(model: SPDRanker, monkeypatch) -> list[int]:
    """Record how many slates each prefill of ``model`` reads."""
    seen: list[int] = []
    read = model.read

    def counted(batch):
        seen.append(batch.prompt.input_ids.shape[0])
        return read(batch)

    monkeypatch.setattr(model, "read", counted)
    return seen


def test_a_cache_of_8_slates_grows_to_43_computing_only_the_new_ones(
    tmp_path, frozen, monkeypatch
):
    path = tmp_path / "train.jsonl"
    write_slates(path, make_slates(43))
    open_state_cache(tmp_path / "c", frozen, path, 8, **KW)  # shards of 5: one full, one of 3
    prefills = counting(frozen, monkeypatch)
    grown = open_state_cache(tmp_path / "c", frozen, path, 43, **KW)
    assert sum(prefills) == 35 and len(grown) == 43
    assert sorted(p.name for p in (tmp_path / "c").glob("shard-*")) == [
        shard_name(i) for i in range(9)
    ]
    monkeypatch.undo()
    whole = open_state_cache(tmp_path / "whole", frozen, path, 43, **KW)
    slates = load_slates(path)
    for i in (0, 7, 8, 9, 42):  # cached before, in the completed shard, and new
        for name in ("states", "history"):
            assert torch.allclose(grown.slate_tokens(i, name)[0], whole.slate_tokens(i, name)[0],
                                  atol=1e-5)
            assert torch.equal(grown.slate_tokens(i, name)[1], whole.slate_tokens(i, name)[1])
    with torch.inference_mode():
        assert torch.allclose(frozen(grown.batch([6, 7, 8], slates[6:9], frozen)),
                              frozen(whole.batch([6, 7, 8], slates[6:9], frozen)), atol=1e-4)
    # Grown, it still serves the shorter run without computing anything.
    prefills = counting(frozen, monkeypatch)
    assert len(open_state_cache(tmp_path / "c", frozen, path, 8, **KW)) == 8 and not prefills


def test_a_cache_of_other_slates_is_still_refused(tmp_path, frozen):
    path = tmp_path / "train.jsonl"
    write_slates(path, make_slates(12))
    open_state_cache(tmp_path / "c", frozen, path, 4, **KW)
    write_slates(tmp_path / "other.jsonl", make_slates(12, seed=5))
    with pytest.raises(ValueError, match="slates.texts"):
        open_state_cache(tmp_path / "c", frozen, tmp_path / "other.jsonl", 12, **KW)
