import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from spdrank.decode import DECODERS, decode, register_decoder

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
ties = st.integers(-2, 2).map(float)


def matrices(elements):
    return st.integers(1, 12).flatmap(
        lambda n: st.integers(n, n + 4).flatmap(
            lambda k: arrays(np.float64, (n, k), elements=elements)
        )
    )


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=1000, deadline=None)
@given(m=matrices(finite))
def test_every_decoder_returns_a_permutation_for_any_finite_matrix(name, m):
    order = decode(m, name)
    assert sorted(order.tolist()) == list(range(m.shape[0]))


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=500, deadline=None)
@given(m=matrices(ties))
def test_every_decoder_returns_a_permutation_with_ties(name, m):
    order = decode(m, name)
    assert sorted(order.tolist()) == list(range(m.shape[0]))


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores_raise_a_clear_error(name, bad):
    m = np.zeros((4, 4))
    m[2, 1] = bad
    with pytest.raises(ValueError, match="non-finite value .* item 2, position 1"):
        decode(m, name)


def test_too_few_positions_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="need at least 5 positions"):
        decode(np.zeros((5, 4)))
    with pytest.raises(ValueError, match="2-D"):
        decode(np.zeros(5))
    with pytest.raises(ValueError, match="unknown decoder"):
        decode(np.zeros((2, 2)), "beam")


@settings(max_examples=200, deadline=None)
@given(m=arrays(np.float64, (5, 5), elements=st.floats(-10, 10)))
def test_hungarian_is_optimal_against_brute_force(m):
    order = decode(m, "hungarian")
    total = sum(m[item, pos] for pos, item in enumerate(order))
    best = max(sum(m[i, p[i]] for i in range(5)) for p in itertools.permutations(range(5)))
    assert total == pytest.approx(best)


def test_rank_one_matrix_hungarian_equals_sorting():
    # M[i, j] = s_i * w_j with w decreasing: the optimal assignment is "sort by s".
    rng = np.random.default_rng(0)
    s = rng.normal(size=20)
    w = np.sort(rng.normal(size=20))[::-1]
    m = np.outer(s, w)
    assert decode(m, "hungarian").tolist() == np.argsort(-s).tolist()
    assert decode(m, "argsort").tolist() == (
        np.argsort(-s).tolist() if w[0] > 0 else np.argsort(s).tolist()
    )


def test_decoders_agree_on_a_clear_unimodal_matrix():
    # Item i peaks at position pos[i] and falls off around it: every decoder must recover pos.
    pos = np.random.default_rng(2).permutation(8)
    m = -np.subtract.outer(pos, np.arange(8)).astype(float) ** 2
    for name in DECODERS:
        assert decode(m, name).tolist() == np.argsort(pos).tolist(), name


def test_solver_is_swappable():
    register_decoder("reverse", lambda m: np.arange(m.shape[0])[::-1])
    try:
        assert decode(np.zeros((3, 3)), "reverse").tolist() == [2, 1, 0]
    finally:
        DECODERS.pop("reverse")
