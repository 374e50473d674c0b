"""Cached readout states: equal to the live prefill, resumable, never reused when stale."""

from __future__ import annotations

import pytest
import torch

from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.settings import BackboneConfig, LoraSettings
from spdrank.core.slates import load_slates, write_slates
from spdrank.methods.head_config import HeadConfig
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache, shard_name
from tests.helpers import tiny_config


def build(backbone: str, lora: bool = False, item_tokens: int = 8) -> SPDRanker:
    torch.manual_seed(0)
    config = tiny_config(backbone, frozen=not lora, lora=LoraSettings(r=4), item_tokens=item_tokens,
                         width=32, heads=4, dropout=0.0)
    return SPDRanker.build(config).eval()


@pytest.fixture
def frozen(tiny_backbone) -> SPDRanker:
    return build(tiny_backbone)


def cache_of(model, path, directory, **kw):
    kw = {"storage": "float32", "batch_size": 3, "shard_size": 3, "progress": False} | kw
    return open_state_cache(directory, model, path, len(load_slates(path)), **kw)


def live_states(model: SPDRanker, slate) -> torch.Tensor:
    with torch.inference_mode():
        return model.read(model.collate([model.encode(slate)])).items[0]


def snapshot(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_cached_states_and_scores_are_the_live_ones(tmp_path, frozen, train_file):
    cache = cache_of(frozen, train_file, tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "key.json", shard_name(0), shard_name(1), shard_name(2),  # 8 slates, 3 a shard
    ]
    slates = load_slates(train_file)
    for i, slate in enumerate(slates):
        assert torch.allclose(cache.slate_states(i), live_states(frozen, slate), atol=1e-5)
    # A padded batch of cached states scores each slate as the live path does alone.
    with torch.inference_mode():
        scores = frozen(cache.batch([5, 0, 2], [slates[5], slates[0], slates[2]], frozen))
    for row, i in enumerate([5, 0, 2]):
        live = frozen.score_matrix(slates[i])
        assert torch.allclose(scores[row, : len(slates[i])], torch.from_numpy(live), atol=1e-5)


def test_float16_states_score_like_float32_ones(tmp_path, frozen, train_file):
    exact = cache_of(frozen, train_file, tmp_path / "fp32")
    half = cache_of(frozen, train_file, tmp_path / "fp16", storage="float16")
    assert sum(p.stat().st_size for p in (tmp_path / "fp16").glob("shard-*")) < 0.6 * sum(
        p.stat().st_size for p in (tmp_path / "fp32").glob("shard-*")
    )
    slates = load_slates(train_file)
    indices = list(range(len(slates)))
    with torch.inference_mode():
        a = frozen(exact.batch(indices, slates, frozen))
        b = frozen(half.batch(indices, slates, frozen))
    assert 0 < (a - b).abs().max() < 2e-3 * a.abs().max()


def test_an_interrupted_build_resumes_with_the_missing_shards_only(
    tmp_path, frozen, train_file, monkeypatch
):
    prefills = []
    real = frozen.read

    def counted(batch, fail_at=None):
        prefills.append(len(batch.sizes))
        if len(prefills) == fail_at:
            raise KeyboardInterrupt
        return real(batch)

    monkeypatch.setattr(frozen, "read", lambda batch: counted(batch, fail_at=3))
    with pytest.raises(KeyboardInterrupt):
        cache_of(frozen, train_file, tmp_path / "c")
    # The third shard failed: the first two are whole, and nothing half-written is left.
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "key.json", shard_name(0), shard_name(1),
    ]
    prefills.clear()
    monkeypatch.setattr(frozen, "read", counted)
    cache_of(frozen, train_file, tmp_path / "c")
    assert prefills == [2]  # slates 6 and 7, the last shard
    cache_of(frozen, train_file, tmp_path / "c")
    assert prefills == [2]  # complete: nothing is computed again
    cache_of(frozen, train_file, tmp_path / "straight")
    assert snapshot(tmp_path / "c") == snapshot(tmp_path / "straight")
    (tmp_path / "c" / shard_name(1)).write_bytes(b"")  # e.g. lost by the disk, not by a kill
    with pytest.raises(ValueError, match=r"shard-00001.safetensors is not a readable shard"):
        cache_of(frozen, train_file, tmp_path / "c").slate_states(4)


def test_a_cache_made_with_other_settings_is_refused_naming_them(
    tmp_path, tiny_backbone, frozen, train_file, slates
):
    cache_of(frozen, train_file, tmp_path / "c")
    before = snapshot(tmp_path / "c")

    def refused(model, path=train_file, **kw):
        with pytest.raises(ValueError, match="holds states cached with other settings") as info:
            cache_of(model, path, tmp_path / "c", **kw)
        return str(info.value)

    message = refused(build(tiny_backbone, item_tokens=4))
    assert "prompt.max_item_tokens (cached 8, now 4)" in message and "first_prompt" in message
    assert "storage (cached \"float32\", now \"float16\")" in refused(frozen, storage="float16")
    slates[3].candidates[0].doc["title"] = "a different title"
    write_slates(tmp_path / "edited.jsonl", slates)
    assert "slates.texts" in refused(frozen, tmp_path / "edited.jsonl")
    with torch.no_grad():
        next(frozen.backbone.parameters())[0, 0] += 1.0
    message = refused(frozen)
    assert "backbone_weights" in message and "prompt" not in message
    assert snapshot(tmp_path / "c") == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no key.json: not a state cache"):
        cache_of(frozen, train_file, tmp_path / "other")


def test_a_copied_slate_file_is_the_same_data(tmp_path, frozen, train_file):
    cache_of(frozen, train_file, tmp_path / "c")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(train_file.read_bytes())
    assert len(cache_of(frozen, copy, tmp_path / "c")) == 8


def test_states_that_change_in_training_cannot_be_cached(tmp_path, tiny_backbone, train_file):
    # The refusal spdrank train --cache-states gives, whichever way the cache is opened.
    with pytest.raises(ValueError, match="--cache-states needs --frozen, or LoRA on the top layers only"):
        cache_of(build(tiny_backbone, lora=True), train_file, tmp_path / "c")
    with pytest.raises(ValueError, match="unknown --cache-dtype 'int8'"):
        cache_of(build(tiny_backbone), train_file, tmp_path / "c", storage="int8")
    assert not (tmp_path / "c").exists()


def test_the_same_texts_labelled_otherwise_read_the_same_cache(tmp_path, frozen, train_file, slates):
    cache_of(frozen, train_file, tmp_path / "c")
    before = snapshot(tmp_path / "c")
    for slate in slates:
        slate.teacher = list(reversed(slate.docids))
        slate.candidates[0].features = {"new": 1.0}
    write_slates(tmp_path / "labelled.jsonl", slates)
    assert len(cache_of(frozen, tmp_path / "labelled.jsonl", tmp_path / "c")) == 8
    assert snapshot(tmp_path / "c") == before


def test_a_shorter_run_reads_a_prefix_of_a_larger_cache(
    tmp_path, frozen, train_file, monkeypatch
):
    cache_of(frozen, train_file, tmp_path / "c")  # 8 slates in shards of 3
    calls = []
    monkeypatch.setattr(frozen, "read", lambda batch: calls.append(batch) or None)
    kw = {"storage": "float32", "batch_size": 3, "shard_size": 3, "progress": False}
    prefix = open_state_cache(tmp_path / "c", frozen, train_file, 6, **kw)
    assert len(prefix) == 6 and not calls
    assert torch.equal(prefix.slate_states(5), cache_of(frozen, train_file, tmp_path / "c").slate_states(5))
    inside = open_state_cache(tmp_path / "c", frozen, train_file, 4, **kw)  # mid-shard
    assert len(inside) == 4 and not calls
    with pytest.raises(IndexError):
        inside.slate_states(4)
    slates = load_slates(train_file)
    slates[2].query.text = "another history"
    write_slates(tmp_path / "edited.jsonl", slates)
    with pytest.raises(ValueError, match="slates.texts"):
        open_state_cache(tmp_path / "c", frozen, tmp_path / "edited.jsonl", 4, **kw)


@pytest.mark.parametrize("readout", ["mean", "tokens", "words"])
def test_history_states_are_cached_with_the_candidates(tmp_path, tiny_backbone, train_file, readout):
    torch.manual_seed(0)
    config = SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="history", positions=16, width=32, dropout=0.0),
        prompt=PromptSettings(max_item_tokens=8, readout=readout, history_items=True),
    )
    model = SPDRanker.build(config).eval()
    cache = cache_of(model, train_file, tmp_path / "c")
    slates = load_slates(train_file)
    for i in (0, 7):
        live = model.collate([model.encode(slates[i])])
        with torch.inference_mode():
            inputs = model.read(live)
        if readout != "mean":
            lines = [line for line in slates[i].query.text.splitlines() if line.strip()]
            units = {"states": len(slates[i]), "history": len(lines)}
            for name, states, lengths in (("states", inputs.items, inputs.item_tokens),
                                          ("history", inputs.history, inputs.history_tokens)):
                cached, counts = cache.slate_tokens(i, name)
                assert len(counts) == units[name] > 0 and counts.min() > 0  # every unit compared
                assert torch.equal(counts, lengths[0, : len(counts)])
                for j, k in enumerate(counts.tolist()):
                    assert torch.allclose(cached[j, :k], states[0, j, :k], atol=1e-5)
                    assert not cached[j, k:].any()
        else:
            assert torch.allclose(cache.slate_states(i), inputs.items[0], atol=1e-5)
            assert torch.allclose(cache.slate_states(i, "history"), inputs.history[0], atol=1e-5)
    batch = cache.batch([0, 7], [slates[0], slates[7]], model)
    with torch.inference_mode():
        cached = model(batch)
        for row, i in enumerate((0, 7)):
            alone = model(model.collate([model.encode(slates[i])]))[0]
            n = len(slates[i])
            assert torch.allclose(cached[row, :n], alone[:n], atol=1e-4)


def test_building_a_cache_counts_the_cuts_of_the_prompts_it_reads_only(tmp_path, frozen,
                                                                        train_file):
    # The key digests the file's first prompt and the shards encode every slate: the model's
    # cut counts hold the slates read, once each, not the prompt encoded for the key.
    cache_of(frozen, train_file, tmp_path / "c")
    assert frozen.cuts.queries == len(load_slates(train_file))
    first = load_slates(train_file)[0]
    frozen.encode(first, counted=False)
    assert frozen.cuts.queries == len(load_slates(train_file))
