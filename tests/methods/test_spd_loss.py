import numpy as np
import pytest
import torch

from spdrank.core.slates import Candidate, Query, Slate
from spdrank.methods.spd.loss import log_sinkhorn, permutation_cross_entropy
from spdrank.training.targets import clicks_first, target_matrix


def test_real_block_is_doubly_stochastic_and_padding_isolated():
    torch.manual_seed(0)
    scores = torch.randn(2, 6, 8)
    sizes = torch.tensor([4, 6])
    s = log_sinkhorn(scores, sizes, tau=0.5, iters=200).exp()
    assert s.shape == (2, 6, 6)
    torch.testing.assert_close(s[0, :4, :4].sum(1), torch.ones(4), atol=1e-4, rtol=0)
    torch.testing.assert_close(s[0, :4, :4].sum(0), torch.ones(4), atol=1e-4, rtol=0)
    assert s[0, :4, 4:].sum() == 0 and s[0, 4:, :4].sum() == 0
    torch.testing.assert_close(s[1].sum(0), torch.ones(6), atol=1e-4, rtol=0)
    # The short slate's block equals the same slate normalised alone.
    alone = log_sinkhorn(scores[:1, :4], torch.tensor([4]), tau=0.5, iters=200).exp()
    torch.testing.assert_close(s[0, :4, :4], alone[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("tau", [1.0, 0.2, 0.1, 0.05])
def test_gradients_are_finite_at_low_temperature(tau):
    torch.manual_seed(0)
    scores = (torch.randn(3, 10, 12) * 20).requires_grad_()
    sizes = torch.tensor([10, 7, 3])
    target = torch.zeros(3, 10, 10)
    for b, n in enumerate(sizes.tolist()):
        target[b, :n, :n] = torch.eye(n)[torch.randperm(n)]
    loss = permutation_cross_entropy(log_sinkhorn(scores, sizes, tau=tau, iters=30), target, sizes)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(scores.grad).all()
    assert scores.grad.abs().sum() > 0


def test_loss_is_lower_for_the_target_permutation():
    perm = torch.tensor([2, 0, 3, 1])
    target = torch.eye(4)[perm].unsqueeze(0)
    good = target * 5.0
    bad = torch.eye(4).unsqueeze(0) * 5.0
    sizes = torch.tensor([4])
    ce = lambda m: permutation_cross_entropy(log_sinkhorn(m, sizes), target, sizes)
    assert ce(good) < ce(bad)


def test_too_few_positions_and_bad_temperature_raise():
    with pytest.raises(ValueError, match="at least 5 positions"):
        log_sinkhorn(torch.zeros(1, 5, 4), torch.tensor([5]))
    with pytest.raises(ValueError, match="temperature"):
        log_sinkhorn(torch.zeros(1, 2, 2), torch.tensor([2]), tau=0)


def _slate(teacher=None, clicked=None):
    return Slate(
        Query("q", "t"),
        [Candidate(d, {"title": d}) for d in ["a", "b", "c", "d"]],
        clicked=clicked,
        teacher=teacher,
    )


def test_targets():
    s = _slate(teacher=["c", "a", "d", "b"], clicked=["d"])
    t = target_matrix(s, "teacher")
    assert t.argmax(1).tolist() == [1, 3, 0, 2]  # a at rank 2, b at 4, c at 1, d at 3
    assert clicks_first(["c", "a", "d", "b"], ["d", "b"]) == ["d", "b", "c", "a"]
    tc = target_matrix(s, "teacher+clicks")
    assert tc.argmax(1).tolist() == [2, 3, 1, 0]
    two = target_matrix(_slate(clicked=["a", "c"]), "clicks")
    np.testing.assert_allclose(two[0], [0.5, 0.5, 0, 0])
    np.testing.assert_allclose(two[1], [0, 0, 0.5, 0.5])
    np.testing.assert_allclose(two.sum(0), 1)
    with pytest.raises(ValueError, match="no 'teacher' ranking"):
        target_matrix(_slate(clicked=["a"]), "teacher")
    with pytest.raises(ValueError, match="no 'clicked'"):
        target_matrix(_slate(teacher=["a", "b", "c", "d"]), "clicks")


def test_teacher_ties_share_their_block_of_positions():
    s = _slate(teacher=["c", "a", "d", "b"], clicked=["d"])
    s.teacher_scores = [0.9, 0.0, 0.0, 0.0]  # a, d and b tie behind c
    t = target_matrix(s, "teacher")
    np.testing.assert_allclose(t[2], [1, 0, 0, 0])  # c alone first
    for row in (0, 1, 3):  # a, b, d: a third of positions 2-4 each
        np.testing.assert_allclose(t[row], [0, 1 / 3, 1 / 3, 1 / 3])
    tc = target_matrix(s, "teacher+clicks")  # d clicked: first; c, then the tie a, b
    np.testing.assert_allclose(tc[3], [1, 0, 0, 0])
    np.testing.assert_allclose(tc[2], [0, 1, 0, 0])
    np.testing.assert_allclose(tc[0], [0, 0, 0.5, 0.5])
    np.testing.assert_allclose(tc[1], [0, 0, 0.5, 0.5])
    s.teacher_scores = [4.0, 3.0, 2.0, 1.0]  # no tie: the permutation itself
    np.testing.assert_allclose(target_matrix(s, "teacher"), target_matrix(
        _slate(teacher=["c", "a", "d", "b"]), "teacher"))


def test_dcg_position_weights_make_an_error_at_the_top_cost_more():
    """Two predictions, each wrong on one swapped pair: at the top (positions 0, 1) or at the
    bottom (2, 3). Uniform weights charge both alike; DCG weights charge the top swap more."""
    sizes = torch.tensor([4])
    target = torch.eye(4).unsqueeze(0)
    top_swapped = torch.eye(4)[[1, 0, 2, 3]].unsqueeze(0) * 4.0
    bottom_swapped = torch.eye(4)[[0, 1, 3, 2]].unsqueeze(0) * 4.0

    def ce(m, weights):
        return permutation_cross_entropy(log_sinkhorn(m, sizes), target, sizes, position_weights=weights)

    assert torch.isclose(ce(top_swapped, "uniform"), ce(bottom_swapped, "uniform"))
    assert ce(top_swapped, "dcg") > ce(bottom_swapped, "dcg")


def test_dcg_weights_of_a_uniform_row_keep_the_loss_a_weighted_mean():
    """A perfectly matching, sharp prediction costs ~0 under either weighting, and padding
    (a smaller slate in the batch) leaves a slate's loss unchanged."""
    perm = torch.tensor([2, 0, 3, 1])
    target = torch.zeros(2, 4, 4)
    target[0] = torch.eye(4)[perm]
    target[1, :3, :3] = torch.eye(3)
    scores = target * 30.0
    sizes = torch.tensor([4, 3])
    per_slate = permutation_cross_entropy(
        log_sinkhorn(scores, sizes), target, sizes, reduction="none", position_weights="dcg"
    )
    assert per_slate.shape == (2,) and (per_slate < 1e-3).all()
    blurred = scores / 10.0
    in_batch = permutation_cross_entropy(
        log_sinkhorn(blurred, sizes), target, sizes, reduction="none", position_weights="dcg"
    )
    alone = permutation_cross_entropy(
        log_sinkhorn(blurred[1:, :3, :3], sizes[1:]), target[1:, :3, :3], sizes[1:],
        position_weights="dcg",
    )
    assert torch.isclose(in_batch[1], alone)
    with pytest.raises(ValueError, match="position weights"):
        permutation_cross_entropy(log_sinkhorn(scores, sizes), target, sizes, position_weights="top")
