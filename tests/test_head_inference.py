"""The attention head's inference path computes what its training-time forward computes."""

import pytest
import torch

from spdrank.backbone.load import LoraSettings
from spdrank.methods.heads import HeadConfig, HistoryAttentionHead, SelfAttentionHead
from tests.helpers import tiny_config


def _head(hidden: int = 24, features: int = 0, layers: int = 2) -> SelfAttentionHead:
    torch.manual_seed(0)
    cfg = HeadConfig(kind="attn", positions=12, width=16, heads=2, layers=layers)
    return SelfAttentionHead(hidden, cfg, features).eval()


def _batch(n: int = 9, hidden: int = 24, features: int = 0):
    torch.manual_seed(1)
    h = torch.randn(2, n, hidden)
    f = torch.randn(2, n, features) if features else None
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 5:] = False
    return h, mask, f


@pytest.mark.parametrize("features", [0, 3])
@pytest.mark.parametrize("layers", [1, 2])
def test_inference_path_equals_the_reference_forward(features, layers):
    head = _head(features=features, layers=layers)
    h, mask, f = _batch(features=features)
    reference = head(h, mask, f)  # autograd on: the nn.TransformerEncoder path
    assert reference.requires_grad
    with torch.inference_mode():
        fast = head(h, mask, f)
    torch.testing.assert_close(fast, reference.detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(head(h, mask, f), reference.detach(), rtol=1e-5, atol=1e-5)


def test_inference_path_without_padding_equals_the_reference_forward():
    """A batch with no padded item takes no key mask at all."""
    head = _head()
    h, _, _ = _batch()
    mask = torch.ones(2, 9, dtype=torch.bool)
    reference = head(h, mask).detach()
    with torch.inference_mode():
        torch.testing.assert_close(head(h, mask), reference, rtol=1e-5, atol=1e-5)


def test_inference_path_is_independent_of_padding():
    head = _head()
    h, mask, _ = _batch()
    with torch.inference_mode():
        alone = head(h[:1, :5], torch.ones(1, 5, dtype=torch.bool))
        noisy = h.clone()
        noisy[0, 5:] = 100 * torch.randn(4, 24)
        padded = head(noisy, mask)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


def test_training_mode_still_takes_the_reference_path():
    head = _head()
    h, mask, _ = _batch()
    head.train()
    with torch.no_grad():
        torch.manual_seed(2)
        a = head(h, mask)
        torch.manual_seed(3)
        b = head(h, mask)
    assert not torch.equal(a, b)  # dropout: only the reference path applies it


def test_bfloat16_products_stay_close_and_rank_alike():
    head = _head()
    h, mask, _ = _batch(n=30)
    mask[:] = True
    with torch.inference_mode():
        exact = head(h, mask)
        head.compute_dtype = torch.bfloat16
        low = head(h, mask)
    assert low.dtype == torch.float32
    scale = exact.abs().max()
    assert (low - exact).abs().max() < 0.05 * scale
    assert torch.equal(low[..., 0].argmax(dim=1), exact[..., 0].argmax(dim=1))


def test_kept_weights_follow_a_parameter_change():
    """The weights cast for inference are rebuilt when a parameter changes in place (an
    optimizer step, a checkpoint loaded) or the compute dtype changes."""
    head = _head()
    h, mask, _ = _batch()
    with torch.inference_mode():
        before = head(h, mask)
    with torch.no_grad():
        head.encoder.layers[1].linear2.weight.mul_(2.0)
    reference = head(h, mask).detach()
    with torch.inference_mode():
        after = head(h, mask)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, reference, rtol=1e-5, atol=1e-5)
    head.load_state_dict(_head().state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(head(h, mask), before, rtol=1e-5, atol=1e-5)


def test_a_bfloat16_backbone_on_the_cpu_gives_the_head_bfloat16_products(tmp_path, tiny_backbone, slates):
    from spdrank.eval.metrics import is_valid_permutation
    from spdrank.model.ranker import SPDRanker

    torch.manual_seed(0)
    config = tiny_config(tiny_backbone, lora=LoraSettings())
    SPDRanker.build(config).save_pretrained(tmp_path / "ckpt")
    exact = SPDRanker.from_pretrained(tmp_path / "ckpt", device="cpu")
    assert exact.head.compute_dtype is None
    low = SPDRanker.from_pretrained(tmp_path / "ckpt", device="cpu", dtype="bfloat16")
    assert low.head.compute_dtype == torch.bfloat16
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


def test_kept_weights_follow_a_checkpoint_loaded_by_assignment_and_a_dtype_move():
    head = _head()
    h, mask, _ = _batch()
    with torch.inference_mode():
        head(h, mask)
    other = _head()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1)
    head.load_state_dict(other.state_dict(), assign=True)
    with torch.inference_mode():
        torch.testing.assert_close(head(h, mask), other(h, mask), rtol=1e-5, atol=1e-5)
        head.double()
        assert head(h.double(), mask).dtype == torch.float64


def test_bfloat16_products_with_and_without_the_packed_weights_agree(monkeypatch):
    """On a CPU with oneDNN the bfloat16 weights are packed for its kernels; without it (or if
    packing fails) the products fall back to F.linear: both give the same scores."""
    from spdrank.methods import head_inference

    head = _head()
    head.compute_dtype = torch.bfloat16
    h, mask, _ = _batch(n=30)
    with torch.inference_mode():
        packed = head(h, mask)
        monkeypatch.setattr(head_inference, "packed_weight", lambda weight: None)
        head._cast.reset()
        plain = head(h, mask)
    assert head._cast.weights(head, torch.bfloat16).input.product.packed is None
    torch.testing.assert_close(packed, plain, rtol=0.02, atol=0.02)


# -- the history head ------------------------------------------------------------------------


def _history_head(match: str | None, features: int = 0):
    """A history head reading pooled states (``match`` None) or units matched by ``match``,
    with perturbed weights so no part of it (the zero-initialised match-to-position map, the
    null slot) is trivially zero."""
    torch.manual_seed(0)
    cfg = HeadConfig(kind="history", positions=12, width=16, heads=2, layers=2,
                     tokens=match is not None, match=match or "maxsim", match_width=8)
    head = HistoryAttentionHead(24, cfg, features).eval()
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
def test_history_head_inference_equals_the_reference_forward(match, features):
    head = _history_head(match, features)
    args = _history_batch(match is not None, features)
    reference = head(*args)
    assert reference.requires_grad  # autograd on: the nn.TransformerDecoder path
    with torch.inference_mode():
        fast = head(*args)
    torch.testing.assert_close(fast, reference.detach(), rtol=1e-5, atol=1e-5)


def test_history_head_inference_reads_only_the_used_unit_slots():
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


def test_history_head_inference_without_any_history():
    """Slates without history carry one padded history item with no units."""
    head = _history_head("tfidf")
    h, mask, f, history, _, units, _ = _history_batch(True)
    none = torch.zeros(2, 1, dtype=torch.bool)
    args = (h, mask, f, history[:, :1], none, units, torch.zeros(2, 1, dtype=torch.long))
    reference = head(*args).detach()
    with torch.inference_mode():
        torch.testing.assert_close(head(*args), reference, rtol=1e-5, atol=1e-5)


def test_history_head_bfloat16_products_stay_close_and_rank_alike():
    head = _history_head("tfidf", features=2)
    args = _history_batch(True, 2)
    with torch.inference_mode():
        exact = head(*args)
        head.compute_dtype = torch.bfloat16
        low = head(*args)
    assert low.dtype == torch.float32
    assert (low - exact).abs().max() < 0.05 * exact.abs().max()
    real = args[1]
    for b in range(2):
        n = int(real[b].sum())
        assert torch.equal(low[b, :n, 0].argsort(), exact[b, :n, 0].argsort())
