import pytest
import torch

from spdrank.heads import HEADS, HeadConfig, build_head

MATRIX_HEADS = sorted(k for k, cls in HEADS.items() if cls.matrix)


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_shape_and_padding_independence(kind):
    torch.manual_seed(0)
    head = build_head(24, HeadConfig(kind=kind, positions=12, width=16, heads=2)).eval()
    a = torch.randn(1, 5, 24)
    alone = head(a, torch.ones(1, 5, dtype=torch.bool))
    assert alone.shape == (1, 5, 12)
    # The same slate padded to 9 items next to a longer slate in one batch.
    batch = torch.randn(2, 9, 24) * 100  # loud garbage in the padding
    batch[0, :5] = a[0]
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :] = True
    padded = head(batch, mask)
    torch.testing.assert_close(padded[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    assert (padded[0, 5:] == 0).all()


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_items_are_permutation_equivariant(kind):
    torch.manual_seed(1)
    head = build_head(8, HeadConfig(kind=kind, positions=6, width=16, heads=2)).eval()
    h = torch.randn(1, 6, 8)
    mask = torch.ones(1, 6, dtype=torch.bool)
    perm = torch.randperm(6)
    torch.testing.assert_close(head(h[:, perm], mask), head(h, mask)[:, perm], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", MATRIX_HEADS)
def test_scores_depend_on_position(kind):
    head = build_head(8, HeadConfig(kind=kind, positions=6, width=16, heads=2)).eval()
    m = head(torch.randn(1, 6, 8), torch.ones(1, 6, dtype=torch.bool))[0]
    assert not torch.allclose(m[:, 0], m[:, 1])


def test_unknown_head():
    with pytest.raises(ValueError, match="unknown head 'mlp'"):
        build_head(8, HeadConfig(kind="mlp"))


def test_scalar_head_gives_one_score_per_item_independent_of_padding():
    head = build_head(8, HeadConfig(kind="scalar", width=16)).eval()
    h = torch.randn(1, 3, 8)
    alone = head(h, torch.ones(1, 3, dtype=torch.bool))
    assert alone.shape == (1, 3) and not head.matrix
    padded = torch.cat([h, torch.randn(1, 2, 8)], 1)
    mask = torch.tensor([[True, True, True, False, False]])
    torch.testing.assert_close(head(padded, mask)[0, :3], alone[0])
