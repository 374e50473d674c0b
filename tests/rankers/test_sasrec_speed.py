"""SASRec at inference: many slates go through one forward, and a forward runs on the
threads its size pays for, the caller's count restored after. On shared cores a small
forward spread over threads waits on whichever worker another process descheduled, so the
eval ranker took hundreds of milliseconds for a forward one thread does in one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spdrank.rankers.sasrec import (
    POSITIONS_PER_THREAD,
    SASRec,
    SASRecRanker,
    forward_threads,
    threads_for,
)
from spdrank.rankers.sasrec_config import SASRecConfig
from tests.helpers import make_slates

#: An unfitted model: what is checked here is how it runs, not what it learned.
TINY = SASRecConfig(dim=16, max_len=8, epochs=1, batch_size=16)


@pytest.fixture
def ranker() -> SASRecRanker:
    ranker = SASRecRanker(TINY, cache=None)
    ranker.model = SASRec([f"i{k}" for k in range(30)], TINY)
    return ranker


@pytest.fixture
def two_threads():
    """torch set to 2 intra-op threads, as on the 2-core machines eval runs on, then back."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _forwards(model: SASRec) -> list[tuple[int, int]]:
    """Every forward of ``model``'s network, as (histories, intra-op threads it ran on)."""
    seen: list[tuple[int, int]] = []

    def hook(module, args) -> None:
        seen.append((args[0].shape[0], torch.get_num_threads()))

    model.model.register_forward_pre_hook(hook)
    return seen


def test_a_batch_of_slates_is_scored_in_one_forward(ranker):
    slates = make_slates(40, seed=3)
    seen = _forwards(ranker.model)
    rankings = ranker.rank_batch(slates)
    assert [n for n, _ in seen] == [40]
    # ... and each ranking is the one the slate gets alone.
    for slate, ranking in zip(slates, rankings):
        alone = ranker.rank(slate)
        assert ranking.docids == alone.docids
        assert np.allclose(ranking.scores, alone.scores, atol=1e-6)
    assert ranker.scores_batch(slates[:2]) == [ranker.scores(s) for s in slates[:2]]


def test_one_slate_runs_on_one_thread_and_the_count_is_restored(ranker, two_threads):
    seen = _forwards(ranker.model)
    ranker.rank(make_slates(1)[0])
    assert seen == [(1, 1)]
    assert torch.get_num_threads() == 2


def test_a_forward_big_enough_keeps_the_threads_it_pays_for(ranker, two_threads):
    seen = _forwards(ranker.model)
    histories = [[f"i{(u + k) % 30}" for k in range(TINY.max_len)] for u in range(512)]
    ranker.model.encode(histories)
    assert seen == [(512, 2)]  # 4,096 positions: two threads' worth
    assert torch.get_num_threads() == 2


def test_thread_count_follows_the_size_of_the_work(two_threads):
    assert forward_threads(10, available=8) == 1
    assert forward_threads(POSITIONS_PER_THREAD - 1, available=8) == 1
    assert forward_threads(3 * POSITIONS_PER_THREAD, available=8) == 3
    assert forward_threads(10**7, available=2) == 2
    with pytest.raises(RuntimeError), threads_for(1):
        raise RuntimeError("the count comes back even when the forward fails")
    assert torch.get_num_threads() == 2


def test_histories_sorted_for_the_batch_keep_their_own_states(ranker):
    """``encode`` sorts the histories by length to pad little; each row is still its own."""
    model = ranker.model
    histories = [["i1", "i2", "i3", "i4", "i5"], [], ["i7"], ["i9", "i8"], ["unknown"]]
    together = model.encode(histories)
    for row, history in zip(together, histories):
        assert np.allclose(row, model.encode([history])[0], atol=1e-6)
    assert np.allclose(together[1], together[4])  # nothing known reads as an empty history
