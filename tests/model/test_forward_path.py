"""One forward path: training, batch scoring and one-slate scoring reach the head the same way,
and a batch of cached states is padded exactly as a collated one."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from spdrank.backbone.batching import CachedStates, SlateStates, collate, pad_rows, states_batch
from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.settings import BackboneConfig
from spdrank.core.ranking import STAGES
from spdrank.methods.head_config import HeadConfig
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_backbone) -> SPDRanker:
    torch.manual_seed(0)
    config = SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="attn", positions=16, width=32, dropout=0.0),
        prompt=PromptSettings(max_item_tokens=8),
    )
    return SPDRanker.build(config).eval()


def test_every_caller_scores_through_head_scores(model, slates, monkeypatch):
    calls = []
    real = model.head_scores

    def spy(batch, clock=None):
        calls.append(clock is not None)
        return real(batch, clock)

    monkeypatch.setattr(model, "head_scores", spy)
    model.score_matrix(slates[0])
    model.score_batch(slates[:2])
    model.rank_batch(slates[:2])
    with torch.inference_mode():
        model(model.collate([model.encode(slates[0])]))
    assert calls == [True, True, True, False]


def test_the_callers_give_the_same_scores_bit_for_bit(model, slates):
    batch_scores, _ = model.score_batch(slates)
    with torch.inference_mode():
        forward = model(model.collate([model.encode(s) for s in slates])).numpy()
    np.testing.assert_array_equal(batch_scores, forward)
    for slate in slates[:3]:
        one, _ = model.score_batch([slate])
        np.testing.assert_array_equal(model.score_matrix(slate), one[0, : len(slate)])


def test_training_keeps_a_frozen_prefill_out_of_autograd(model, slates):
    model.train()
    try:
        scores = model(model.collate([model.encode(s) for s in slates[:2]]))
    finally:
        model.eval()
    assert scores.requires_grad
    scores.sum().backward()
    assert all(p.grad is None for p in model.backbone.parameters())
    assert any(p.grad is not None for p in model.head.parameters())
    model.zero_grad(set_to_none=True)


def test_each_stage_is_timed_around_its_own_work(model, slates, monkeypatch):
    import spdrank.backbone.readout as readout_module

    forward, pool, score = readout_module.prompt_hidden, readout_module.read_items, model.score

    def slow_forward(*args):
        time.sleep(0.05)
        return forward(*args)

    def slow_pool(*args):
        time.sleep(0.1)
        return pool(*args)

    def slow_score(inputs, batch):
        time.sleep(0.2)
        return score(inputs, batch)

    monkeypatch.setattr(readout_module, "prompt_hidden", slow_forward)
    monkeypatch.setattr(readout_module, "read_items", slow_pool)
    monkeypatch.setattr(model, "score", slow_score)
    ranking = model.rank_batch(slates[:2])[0]
    timings = ranking.timings
    assert set(timings) == set(STAGES)
    assert 50 <= timings["prefill"] < 100 <= timings["readout"] < 200 <= timings["head"]
    assert timings["tokenize"] < 50


def test_cached_states_have_no_prefill_to_time(model, slates):
    live = model.collate([model.encode(s) for s in slates[:2]])
    with torch.inference_mode():
        items = model.read(live).items
    states = dataclasses.replace(live, prompt=None, cached=CachedStates(items))
    scores, timings = model.score_batch(slates[:2], batch=states)
    assert set(timings) == set(STAGES[:-1])
    assert timings["prefill"] == 0.0 and timings["readout"] > 0.0
    assert scores.shape[:2] == (2, max(len(s) for s in slates[:2]))


def test_cached_states_are_padded_as_a_collated_batch_is(model, slates):
    chosen = [slates[1], slates[0], slates[4]]  # sizes differ, so rows are padded
    encoded = [model.encode(s) for s in chosen]
    live = collate(encoded, model.tokenizer.pad_token_id)
    with torch.inference_mode():
        items = model.read(live).items
    per_slate = [items[b, : len(s)].clone() for b, s in enumerate(chosen)]
    cached = states_batch(SlateStates(per_slate), [None] * len(chosen))
    assert torch.equal(cached.item_mask, live.item_mask)
    assert torch.equal(cached.sizes, live.sizes)
    assert cached.prompt is None and live.cached is None
    assert torch.equal(cached.cached.items, items.masked_fill(~live.item_mask[..., None], 0.0))
    with torch.inference_mode():
        np.testing.assert_array_equal(model(cached).numpy(), model(live).numpy())


def test_pad_rows_pads_lists_arrays_and_tensors_alike():
    want = torch.tensor([[1, 2, 0], [3, 0, 0]])
    assert torch.equal(pad_rows([[1, 2], [3]], 3), want)
    assert torch.equal(pad_rows([np.array([1, 2]), np.array([3])], 3), want)
    assert torch.equal(pad_rows([torch.tensor([1, 2]), torch.tensor([3])], 3), want)
    assert torch.equal(pad_rows([[1], []], 2, fill=7), torch.tensor([[1, 7], [7, 7]]))
    states = pad_rows([torch.ones(2, 4)], 3, (4,), dtype=np.float32)
    assert states.dtype == torch.float32 and states.shape == (1, 3, 4)
    assert states[0, :2].eq(1).all() and not states[0, 2:].any()
