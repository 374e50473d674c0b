"""The training step's prefill route: a right-padded batch runs without its padding mask, and
LoRA adapters over a bfloat16 backbone run their products in bfloat16; the states, scores and
losses stay those of the masked route with float32 adapters, to the dtype's tolerance."""

from __future__ import annotations

import pytest
import torch

from spdrank.backbone.settings import LoraSettings
from spdrank.backbone.split import last_hidden, prompt_hidden
from spdrank.model.ranker import SPDRanker
from spdrank.training.config import TrainConfig
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2}


def lora_model(backbone: str, dtype: str) -> SPDRanker:
    """A tiny LoRA student whose adapters do something (B drawn, not zero)."""
    torch.manual_seed(0)
    config = tiny_config(backbone, positions=16, lora=LoraSettings(r=4, alpha=8), dropout=0.0)
    config.backbone.dtype = dtype
    model = SPDRanker.build(config).eval()
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model


def masked_route(model: SPDRanker, prompt) -> torch.Tensor:
    """The prefill as it ran before: the padding mask passed, peft's float32 adapters."""
    return last_hidden(model.backbone, prompt.input_ids, prompt.attention_mask)


def close(a: torch.Tensor, b: torch.Tensor, dtype: str) -> bool:
    a, b = a.float(), b.float()
    return float((a - b).abs().max()) <= TOLERANCE[dtype] * max(float(b.abs().max()), 1.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_states_scores_and_loss_match_the_masked_route(tiny_backbone, slates, dtype, monkeypatch):
    model = lora_model(tiny_backbone, dtype)
    batch = model.collate([model.encode(s) for s in slates])
    prompt = batch.prompt
    assert not prompt.attention_mask.all(), "the slates should differ in length"
    real = prompt.attention_mask.bool()
    with torch.no_grad():
        assert close(prompt_hidden(model.backbone, prompt)[real],
                     masked_route(model, prompt)[real], dtype)

    cfg = TrainConfig(slates="unused", out="unused")
    target = torch.eye(int(batch.sizes.max())).expand(len(slates), -1, -1).clone()

    def loss_and_scores() -> tuple[torch.Tensor, torch.Tensor]:
        scores = model(batch).float()
        return model.method.loss(scores, target, batch.sizes, cfg), scores

    new_loss, new_scores = loss_and_scores()
    from spdrank.backbone import readout

    monkeypatch.setattr(readout, "prompt_hidden",
                        lambda backbone, p: last_hidden(backbone, p.input_ids, p.attention_mask))
    old_loss, old_scores = loss_and_scores()
    assert close(new_scores, old_scores, dtype)
    assert close(new_loss, old_loss, dtype)


def test_bfloat16_adapters_multiply_in_bfloat16_and_learn_in_float32(tiny_backbone, slates):
    model = lora_model(tiny_backbone, "bfloat16")
    seen: list[torch.dtype] = []
    adapters = [m for n, m in model.backbone.named_modules() if n.endswith("lora_A.default")]
    handles = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
               for m in adapters]
    batch = model.collate([model.encode(s) for s in slates])
    prompt_hidden(model.backbone, batch.prompt).float().sum().backward()
    for handle in handles:
        handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    grads = [p.grad for n, p in model.backbone.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_a_float32_backbone_runs_unchanged(tiny_backbone, slates):
    """No autocast where the backbone computes in float32: the adapters' products too."""
    model = lora_model(tiny_backbone, "float32")
    seen: list[torch.dtype] = []
    adapter = next(m for n, m in model.backbone.named_modules() if n.endswith("lora_A.default"))
    adapter.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batch = model.collate([model.encode(s) for s in slates])
    with torch.no_grad():
        prompt_hidden(model.backbone, batch.prompt)
    assert seen and set(seen) == {torch.float32}
