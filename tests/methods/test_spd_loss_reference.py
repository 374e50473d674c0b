"""The decoder's numpy Sinkhorn is the training relaxation's: log_sinkhorn is the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spdrank.methods.spd.decode import decode, expected_positions
from spdrank.methods.spd.loss import log_sinkhorn


def reference_positions(m: np.ndarray, tau: float, iters: int = 20) -> np.ndarray:
    """Expected positions from torch's log-domain Sinkhorn, in float64."""
    n = m.shape[0]
    log_s = log_sinkhorn(torch.from_numpy(m)[None], torch.tensor([n]), tau=tau, iters=iters)
    return (log_s.exp()[0] @ torch.arange(n, dtype=torch.float64)).numpy()


@pytest.mark.parametrize("tau", [1.0, 0.3, 0.05, 0.01])  # the last two: the log-domain branch
@pytest.mark.parametrize("n", [2, 9, 50])
def test_expected_positions_agree_with_log_sinkhorn(n, tau):
    rng = np.random.default_rng(n)
    for _ in range(5):
        m = rng.normal(scale=rng.choice([0.1, 1.0, 5.0]), size=(n, 64))
        got = expected_positions(m[None, :, :n], tau)[0]
        np.testing.assert_allclose(got, reference_positions(m, tau), rtol=0, atol=1e-6)


def test_a_padded_training_batch_normalises_each_slate_as_the_decoder_does():
    rng = np.random.default_rng(0)
    sizes = [7, 3, 12]
    m = rng.normal(size=(len(sizes), 12, 16))
    log_s = log_sinkhorn(torch.from_numpy(m), torch.tensor(sizes))
    for b, n in enumerate(sizes):
        expected = (log_s[b, :n, :n].exp() @ torch.arange(n, dtype=torch.float64)).numpy()
        got = expected_positions(m[None, b, :n, :n])[0]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_expected_rank_orders_items_by_the_reference_positions():
    rng = np.random.default_rng(1)
    for _ in range(20):
        m = rng.normal(size=(30, 40))
        want = np.argsort(reference_positions(m, 1.0), kind="stable")
        assert decode(m, "expected_rank").tolist() == want.tolist()
