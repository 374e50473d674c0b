"""The attention heads rank alike under ``torch.inference_mode`` and with autograd.

In eval mode without autograd torch runs its encoder layers on a fused path (the
nn.TransformerEncoderLayer "fast path"); ranking goes through it, training never does. These
tests hold the scores a ranking reads to the ones training computes, with and without padding,
features and history, and a model whose backbone runs in bfloat16 to the float32 head it was
trained with.
"""

import pytest
import torch

from spdrank.backbone.settings import LoraSettings
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.spd.heads import SelfAttentionHead
from spdrank.methods.spd.history import HistoryAttentionHead
from spdrank.methods.spd.history_settings import HistorySettings
from tests.helpers import tiny_config


def _head(hidden: int = 24, features: int = 0, layers: int = 2) -> SelfAttentionHead:
    """An attention head with perturbed weights (layer norms away from their identity start,
    biases nonzero), so no layer is trivially the identity."""
    torch.manual_seed(0)
    cfg = HeadConfig(kind="attn", positions=12, width=16, heads=2, layers=layers)
    head = SelfAttentionHead(hidden, cfg, features)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return head.eval()


def _batch(n: int = 9, hidden: int = 24, features: int = 0):
    torch.manual_seed(1)
    h = torch.randn(2, n, hidden)
    f = torch.randn(2, n, features) if features else None
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 5:] = False
    return h, mask, f


@pytest.mark.parametrize("features", [0, 3])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("padded", [True, False])
def test_attention_head_under_inference_mode_equals_its_autograd_forward(
    features, layers, padded
):
    head = _head(features=features, layers=layers)
    h, mask, f = _batch(features=features)
    if not padded:
        mask[:] = True
    reference = head(h, mask, f)
    assert reference.requires_grad
    with torch.inference_mode():
        ranked = head(h, mask, f)
    torch.testing.assert_close(ranked, reference.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(ranked[..., 0].argsort(dim=1), reference.detach()[..., 0].argsort(dim=1))


def test_attention_head_under_inference_mode_is_independent_of_padding():
    head = _head()
    h, mask, _ = _batch()
    with torch.inference_mode():
        alone = head(h[:1, :5], torch.ones(1, 5, dtype=torch.bool))
        noisy = h.clone()
        noisy[0, 5:] = 100 * torch.randn(4, 24)
        padded = head(noisy, mask)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


def test_training_mode_applies_dropout_even_without_autograd():
    head = _head()
    h, mask, _ = _batch()
    head.train()
    with torch.no_grad():
        torch.manual_seed(2)
        a = head(h, mask)
        torch.manual_seed(3)
        b = head(h, mask)
    assert not torch.equal(a, b)


# -- the history head ------------------------------------------------------------------------


def _history_head(match: str | None, features: int = 0) -> HistoryAttentionHead:
    """A history head reading pooled states (``match`` None) or units matched by ``match``,
    with perturbed weights so no part of it (the zero-initialised match-to-position map, the
    null slot) is trivially zero."""
    torch.manual_seed(0)
    cfg = HeadConfig(kind="history", positions=12, width=16, heads=2, layers=2,
                     history=HistorySettings(match=match or "maxsim", match_width=8))
    head = HistoryAttentionHead(24, cfg, features, units=match is not None).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head


def _history_batch(units: bool, features: int = 0, width: int = 7):
    """Two slates of 6 candidates (the first has 4) and 3 history items (the second has 1),
    with unit counts below ``width`` so trailing slots are padding in every item."""
    torch.manual_seed(1)
    shape = (width, 24) if units else (24,)
    h, history = torch.randn(2, 6, *shape), torch.randn(2, 3, *shape)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    history_mask = torch.tensor([[True, True, True], [True, False, False]])
    item_units = torch.tensor([[3, 5, 1, 4, 2, 2], [4, 4, 4, 4, 4, 4]]) if units else None
    history_units = torch.tensor([[2, 5, 3], [1, 0, 0]]) if units else None
    f = torch.randn(2, 6, features) if features else None
    return h, mask, f, history, history_mask, item_units, history_units


@pytest.mark.parametrize("match", [None, "maxsim", "tfidf"])
@pytest.mark.parametrize("features", [0, 2])
def test_history_head_under_inference_mode_equals_its_autograd_forward(match, features):
    head = _history_head(match, features)
    args = _history_batch(match is not None, features)
    reference = head(*args)
    assert reference.requires_grad
    with torch.inference_mode():
        ranked = head(*args)
    torch.testing.assert_close(ranked, reference.detach(), rtol=1e-5, atol=1e-5)


def test_history_head_ignores_unit_slots_no_item_uses():
    """Unit slots beyond every item's count are padding: scores do not depend on how many
    there are, or on what they hold."""
    head = _history_head("tfidf", features=2)
    narrow = _history_batch(True, 2, width=5)
    wide = list(narrow)
    for i in (0, 3):  # the candidates' and the history's states: 4 more slots of noise
        noise = 100 * torch.randn(*narrow[i].shape[:2], 4, 24)
        wide[i] = torch.cat([narrow[i], noise], dim=2)
    with torch.inference_mode():
        torch.testing.assert_close(head(*wide), head(*narrow), rtol=1e-5, atol=1e-5)


def test_history_head_under_inference_mode_without_any_history():
    """Slates without history carry one padded history item with no units."""
    head = _history_head("tfidf")
    h, mask, f, history, _, units, _ = _history_batch(True)
    none = torch.zeros(2, 1, dtype=torch.bool)
    args = (h, mask, f, history[:, :1], none, units, torch.zeros(2, 1, dtype=torch.long))
    reference = head(*args).detach()
    with torch.inference_mode():
        ranked = head(*args)
    assert torch.isfinite(ranked).all()
    torch.testing.assert_close(ranked, reference, rtol=1e-5, atol=1e-5)


# -- a bfloat16 backbone ---------------------------------------------------------------------


def test_a_bfloat16_backbone_keeps_its_float32_head(tmp_path, tiny_backbone, slates):
    """A checkpoint loaded in bfloat16 runs its backbone in it; the head it was trained with
    stays float32, reading the backbone's states as float32, and ranks valid permutations."""
    from spdrank.eval.metrics import is_valid_permutation
    from spdrank.model.ranker import SPDRanker

    torch.manual_seed(0)
    config = tiny_config(tiny_backbone, lora=LoraSettings())
    SPDRanker.build(config).save_pretrained(tmp_path / "ckpt")
    exact = SPDRanker.from_pretrained(tmp_path / "ckpt", device="cpu", dtype="float32")
    low = SPDRanker.from_pretrained(tmp_path / "ckpt", device="cpu", dtype="bfloat16")
    assert next(low.backbone.parameters()).dtype == torch.bfloat16
    assert {p.dtype for p in low.head.parameters()} == {torch.float32}
    for slate in slates:
        a, b = exact.score_matrix(slate), low.score_matrix(slate)
        assert b.dtype == a.dtype
        assert abs(b - a).max() < 0.1 * abs(a).max()
        assert is_valid_permutation(low.rank(slate).docids, slate.docids)


def test_rank_takes_a_dtype_and_refuses_an_unknown_one(tmp_path, tiny_backbone, train_file, capsys):
    from spdrank.commands.cli import main
    from spdrank.model.ranker import SPDRanker

    config = tiny_config(tiny_backbone, lora=LoraSettings())
    SPDRanker.build(config).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "ranked.jsonl"
    base = ["rank", "--model", str(tmp_path / "ckpt"), "--input", str(train_file),
            "--output", str(out), "--device", "cpu"]
    assert main([*base, "--dtype", "bfloat16"]) == 0
    assert len(out.read_text().splitlines()) == 8
    with pytest.raises(SystemExit):
        main([*base, "--dtype", "float64"])
    assert "invalid choice: 'float64'" in capsys.readouterr().err
