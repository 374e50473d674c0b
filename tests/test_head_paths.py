"""The attention head's two paths cannot drift: forward is infer in eval mode without
autograd, the module path (reference) everywhere else, and the two agree on any weights."""

from __future__ import annotations

import pytest
import torch

from spdrank.methods.heads import HeadConfig, SelfAttentionHead


def _head(features: int = 0, layers: int = 2, dropout: float = 0.1) -> SelfAttentionHead:
    torch.manual_seed(0)
    cfg = HeadConfig(kind="attn", positions=12, width=16, heads=2, layers=layers, dropout=dropout)
    head = SelfAttentionHead(24, cfg, features)
    with torch.no_grad():  # layer norms away from their identity start, biases nonzero
        for p in head.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return head.eval()


def _inputs(features: int = 0):
    torch.manual_seed(1)
    h = torch.randn(3, 7, 24)
    f = torch.randn(3, 7, features) if features else None
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 1:] = False
    return h, mask, f


@pytest.mark.parametrize("features", [0, 2])
@pytest.mark.parametrize("layers", [1, 3])
def test_infer_reproduces_the_reference_on_perturbed_weights(features, layers):
    head = _head(features, layers)
    h, mask, f = _inputs(features)
    with torch.no_grad():
        torch.testing.assert_close(head.infer(h, mask, f), head.reference(h, mask, f),
                                   rtol=1e-5, atol=1e-5)


def test_forward_in_eval_without_autograd_is_infer_exactly():
    head = _head(features=2)
    h, mask, f = _inputs(2)
    with torch.inference_mode():
        assert torch.equal(head(h, mask, f), head.infer(h, mask, f))
    with torch.no_grad():
        assert torch.equal(head(h, mask, f), head.infer(h, mask, f))


@pytest.mark.parametrize("training, grad", [(True, True), (True, False), (False, True)])
def test_every_other_forward_is_the_reference(training, grad, monkeypatch):
    head = _head(dropout=0.0)
    h, mask, _ = _inputs()
    head.train(training)

    def refuse(*_args, **_kwargs):
        raise AssertionError("the inference path ran")

    monkeypatch.setattr(head, "infer", refuse)
    with torch.set_grad_enabled(grad):
        out = head(h, mask)
        want = head.reference(h, mask)
    assert torch.equal(out, want)
    assert out.requires_grad == grad
