"""LoRA on the top layers only: the frozen layers below run once into a cache, and training
from it gives the weights, and the scores, of training through the whole backbone."""

from __future__ import annotations

import functools

import pytest
import torch

from spdrank.backbone.settings import LoraSettings
from spdrank.backbone.split import check_split, lower_hidden, prompt_hidden, upper_hidden
from spdrank.core.slates import load_slates
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache
from spdrank.training.train import train
from tests.helpers import tiny_config, tiny_qwen3, train_config


def build(backbone: str, top_layers: int | None, modules: str | list[str] = "all-linear"
          ) -> SPDRanker:
    torch.manual_seed(0)
    lora = LoraSettings(r=4, alpha=8, top_layers=top_layers, target_modules=modules)
    return SPDRanker.build(tiny_config(backbone, lora=lora, dropout=0.0)).eval()


def prompt_of(model: SPDRanker, slates):
    return model.collate([model.encode(s) for s in slates]).prompt


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("layer", [0, 1])
def test_the_two_halves_make_the_whole_prefill(tmp_path, tiny_backbone, slates, family, layer):
    backbone = tiny_backbone if family == "llama" else f"config:{tiny_qwen3(tmp_path / 'q')}"
    model = build(backbone, top_layers=None)
    prompt = prompt_of(model, slates[:3])  # padded: prompts of different lengths
    ids, mask = prompt.input_ids, prompt.attention_mask
    with torch.inference_mode():
        whole = prompt_hidden(model.backbone, prompt)
        split = upper_hidden(model.backbone, lower_hidden(model.backbone, ids, mask, layer),
                             mask, layer)
    real = mask.bool()
    assert torch.allclose(whole[real], split[real], atol=1e-5)
    check_split(model.backbone, ids, mask, layer)
    assert len(model.backbone.get_base_model().layers) == 2  # the model is whole again


@pytest.mark.parametrize("modules", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_adapts_only_the_top_layers(tiny_backbone, modules):
    backbone = build(tiny_backbone, top_layers=1, modules=modules).backbone
    adapted = {tuple(name.split(".layers.")[1].split(".")[:3:2])
               for name, _ in backbone.named_parameters() if "lora_A" in name}
    every = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert adapted == {("1", m) for m in (every if modules == "all-linear" else modules)}
    with pytest.raises(ValueError, match="LoRA on the top 3 layers needs at least as many"):
        build(tiny_backbone, top_layers=3)


def test_a_split_that_is_not_the_whole_prefill_is_refused(tiny_backbone, slates, monkeypatch):
    model = build(tiny_backbone, top_layers=1)
    prompt = prompt_of(model, slates[:1])
    real = upper_hidden
    monkeypatch.setattr("spdrank.backbone.split.upper_hidden",
                        lambda *a: real(*a) * 1.01)  # a family whose forward rescales its input
    with pytest.raises(ValueError, match="cannot be split at layer 1"):
        check_split(model.backbone, prompt.input_ids, prompt.attention_mask, 1)


def test_cached_lower_states_score_and_learn_as_the_live_prefill(tmp_path, tiny_backbone,
                                                                 train_file):
    model = build(tiny_backbone, top_layers=1)
    cache = open_state_cache(tmp_path / "c", model, train_file, 8, storage="float32",
                             batch_size=3, shard_size=3, progress=False)
    assert cache.key["split_layer"] == 1
    slates = load_slates(train_file)
    picked = [5, 0, 2]
    batch = cache.batch(picked, [slates[i] for i in picked], model)
    live = model.collate([model.encode(slates[i]) for i in picked])
    for scored in (batch, live):
        model.zero_grad()
        scores = model(scored)
        scores.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        if scored is batch:
            cached_scores, cached_grads = scores.detach(), grads
    assert torch.allclose(cached_scores, scores.detach(), atol=1e-5)
    assert cached_grads.keys() == grads.keys()
    assert any("lora_" in name for name in grads)
    assert all(torch.allclose(cached_grads[n], grads[n], atol=1e-5) for n in grads)


def test_a_readout_cache_is_not_read_as_a_split_one(tmp_path, tiny_backbone, train_file):
    torch.manual_seed(0)
    frozen = SPDRanker.build(tiny_config(tiny_backbone, frozen=True)).eval()
    open_state_cache(tmp_path / "c", frozen, train_file, 8, progress=False)
    with pytest.raises(ValueError, match="split_layer"):
        open_state_cache(tmp_path / "c", build(tiny_backbone, top_layers=1), train_file, 8,
                         progress=False)


def weights(run) -> dict[str, torch.Tensor]:
    model = SPDRanker.from_pretrained(run)
    return {name: p.detach().clone() for name, p in model.named_parameters()
            if p.requires_grad}


def test_training_from_split_states_gives_the_weights_of_live_training(
    tmp_path, tiny_backbone, train_file
):
    run = functools.partial(train_config, tmp_path, tiny_backbone, lora_layers=1, max_steps=4,
                            head_dropout=0.0)
    train(run(out="live"))
    summary = train(run(out="cached", cache_states=str(tmp_path / "states"),
                        cache_dtype="float32"))
    assert summary["finished"]
    live, cached = weights(tmp_path / "live"), weights(tmp_path / "cached")
    assert live.keys() == cached.keys() and any("lora_" in k for k in live)
    # A bias the loss cannot see (an attention key's, which softmax ignores; one that shifts a
    # whole column of scores, which the Sinkhorn loss ignores) has a gradient that is rounding
    # noise, and Adam scales noise to a full step: the two runs may move it differently.
    unseen = [k for k in live if k.endswith(("in_proj_bias", "out.bias", "norm.bias"))]
    assert all(torch.allclose(live[k], cached[k], atol=1e-5) for k in live if k not in unseen)


def test_lora_layers_without_lora_is_said(tmp_path, tiny_backbone, caplog):
    # As every LoRA setting of a recipe run with --frozen: one line, not a refusal.
    train_config(tmp_path, tiny_backbone, lora_layers=1, frozen=True).check()
    assert "--lora-layers 1 has no effect here: --frozen and --features-only train no LoRA" \
        in caplog.text
