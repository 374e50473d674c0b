import torch

from spdrank.methods.scalar.loss import listnet_loss, top_one_distribution


def test_top_one_distribution_favours_the_target_top_and_ignores_padding():
    target = torch.zeros(1, 4, 4)
    target[0, :3, :3] = torch.eye(3)[[2, 0, 1]]  # item 1 first, item 2 second, item 0 third
    q = top_one_distribution(target, torch.tensor([3]))
    assert q[0, 3] == 0 and torch.isclose(q.sum(), torch.tensor(1.0))
    assert q[0, 1] > q[0, 2] > q[0, 0]


def test_loss_prefers_scores_in_target_order_and_has_finite_gradients():
    target = torch.eye(3)[[2, 0, 1]].unsqueeze(0)
    sizes = torch.tensor([3])
    good = torch.tensor([[0.0, 5.0, 2.5]], requires_grad=True)
    bad = torch.tensor([[5.0, 0.0, 2.5]])
    loss = listnet_loss(good, target, sizes)
    assert loss < listnet_loss(bad, target, sizes)
    loss.backward()
    assert torch.isfinite(good.grad).all()
