import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from spdrank.methods.spd.decode import DECODERS, decode, register_decoder

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
ties = st.integers(-2, 2).map(float)


def matrices(elements):
    return st.integers(1, 12).flatmap(
        lambda n: st.integers(n, n + 4).flatmap(
            lambda k: arrays(np.float64, (n, k), elements=elements)
        )
    )


@pytest.mark.slow  # a long search: thousands of matrices
@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=1000, deadline=None)
@given(m=matrices(finite))
def test_every_decoder_returns_a_permutation_for_any_finite_matrix(name, m):
    order = decode(m, name)
    assert sorted(order.tolist()) == list(range(m.shape[0]))


@pytest.mark.slow
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


def log_domain_expected_positions(m: np.ndarray, tau: float = 1.0, iters: int = 20) -> np.ndarray:
    """Each item's expected position under Sinkhorn in the log domain, the plain way: the
    reference that expected_rank's scaling-vector form must reproduce."""
    n = m.shape[0]
    log_s = np.clip((m[:, :n] - m[:, :n].max()) / tau, -1e300, 0.0)
    for _ in range(iters):
        for axis in (1, 0):
            top = log_s.max(axis=axis, keepdims=True)
            log_s = log_s - (top + np.log(np.exp(log_s - top).sum(axis=axis, keepdims=True)))
    return np.exp(log_s) @ np.arange(n, dtype=np.float64)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0, 60.0, 1e3, 1e6])
def test_expected_rank_matches_the_log_domain_sinkhorn(scale):
    # Spreads up to 1e6: the widest are normalised in the log domain, the rest by scaling.
    rng = np.random.default_rng(int(scale * 1000) % 2**32)
    for _ in range(40):
        n = int(rng.integers(1, 40))
        m = rng.normal(size=(n, n + int(rng.integers(0, 5)))) * scale
        want = log_domain_expected_positions(m)
        assert decode(m, "expected_rank").tolist() == np.argsort(want, kind="stable").tolist()


def test_expected_rank_scaling_form_gives_the_same_positions():
    from spdrank.methods.spd.decode import _expected_scaled

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 50, 150):
        m = rng.normal(size=(n, n)) * 5
        log_s = m - m.max()
        got = _expected_scaled(np.exp(log_s)[None], 20)[0]
        np.testing.assert_allclose(got, log_domain_expected_positions(m), rtol=1e-12, atol=1e-9)


def test_expected_rank_of_one_matrix_equals_its_row_in_a_stack():
    """One slate takes plain matrix-vector products, a stack batched ones: the same numbers."""
    from spdrank.methods.spd.decode import _expected_scaled

    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 50, 150):
        stack = np.exp(rng.normal(size=(3, n, n)) * 3)
        together = _expected_scaled(stack, 20)
        for b in range(3):
            alone = _expected_scaled(stack[b : b + 1], 20)[0]
            np.testing.assert_allclose(alone, together[b], rtol=1e-12, atol=1e-12)
            assert np.argsort(alone, kind="stable").tolist() == np.argsort(
                together[b], kind="stable"
            ).tolist()


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decode_batch_equals_decoding_each_slate(name):
    from spdrank.methods.spd.decode import decode_batch

    rng = np.random.default_rng(5)
    sizes = [3, 7, 3, 1, 7, 60, 7, 60]
    k = 64
    scores = np.zeros((len(sizes), max(sizes), k), dtype=np.float32)
    for b, n in enumerate(sizes):
        scores[b, :n] = rng.normal(size=(n, k)) * 4
    scores[2, :3] = np.round(scores[2, :3])  # ties
    orders = decode_batch(scores, sizes, name)
    for b, n in enumerate(sizes):
        assert orders[b].tolist() == decode(scores[b, :n], name).tolist()
    bad = scores.copy()
    bad[4, 2, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite value .* item 2, position 1"):
        decode_batch(bad, sizes, name)


def test_a_registered_decoder_replaces_the_batched_one():
    from spdrank.methods.spd.decode import DECODERS as registry
    from spdrank.methods.spd.decode import decode_batch

    saved = registry["argsort"]
    try:
        register_decoder("argsort", lambda m: np.arange(m.shape[0])[::-1].copy())
        orders = decode_batch(np.zeros((2, 4, 4)), [4, 3], "argsort")
        assert [o.tolist() for o in orders] == [[3, 2, 1, 0], [2, 1, 0]]
    finally:
        register_decoder("argsort", saved)
        from spdrank.methods.spd.decode import BATCH_DECODERS, argsort_batch

        BATCH_DECODERS["argsort"] = argsort_batch
