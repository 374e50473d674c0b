"""Feature names and normalisation: fitted on training slates, applied unchanged, errors named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spdrank.core.features import FeatureNormalizer, parse_feature_names, raw_features
from spdrank.core.slates import Candidate, Query, Slate, SlateError


def mk(qid: str, values: list[dict[str, float]], scores: list[float] | None = None) -> Slate:
    scores = scores or [0.0] * len(values)
    return Slate(
        Query(qid, "history"),
        [
            Candidate(f"d{i}", {"title": f"item {i}"}, score=s, features=v)
            for i, (v, s) in enumerate(zip(values, scores))
        ],
    )


def test_parse_feature_names():
    assert parse_feature_names("score, popularity") == ("score", "popularity")
    with pytest.raises(ValueError, match="comma-separated and non-empty"):
        parse_feature_names("score,,popularity")
    with pytest.raises(ValueError, match="names score more than once"):
        parse_feature_names("score,pop,score")


def test_fit_is_the_mean_and_std_over_every_training_candidate_in_one_pass():
    slates = [
        mk("a", [{"pop": 1.0}, {"pop": 3.0}], scores=[10.0, 20.0]),
        mk("b", [{"pop": 5.0}, {"pop": 7.0}, {"pop": 9.0}], scores=[30.0, 40.0, 50.0]),
    ]
    fitted = FeatureNormalizer.fit(["pop", "score"], iter(slates))  # a one-shot stream
    assert fitted.names == ("pop", "score")
    np.testing.assert_allclose(fitted.mean, [5.0, 30.0])
    np.testing.assert_allclose(fitted.std, [np.std([1, 3, 5, 7, 9]), np.std([10, 20, 30, 40, 50])])
    z = fitted(slates[1])
    assert z.dtype == np.float32 and z.shape == (3, 2)
    np.testing.assert_allclose(z[:, 0], (np.array([5, 7, 9]) - 5) / np.std([1, 3, 5, 7, 9]), rtol=1e-6)


def test_fit_is_stable_for_large_values():
    slates = [mk(str(i), [{"x": 1e9 + i}, {"x": 1e9 - i}]) for i in range(1, 200)]
    fitted = FeatureNormalizer.fit(["x"], slates)
    values = np.concatenate([[1e9 + i, 1e9 - i] for i in range(1, 200)])
    np.testing.assert_allclose(fitted.std, [values.std()], rtol=1e-9)


def test_a_constant_feature_is_refused():
    slates = [mk("a", [{"pop": 1.0}, {"pop": 2.0}]), mk("b", [{"pop": 3.0}])]
    with pytest.raises(ValueError, match=r"feature\(s\) score take one value on every training"):
        FeatureNormalizer.fit(["pop", "score"], slates)  # every score is the default 0


def test_a_missing_feature_names_the_slate_candidate_and_feature():
    slate = mk("user-7", [{"pop": 1.0}, {"other": 2.0}])
    with pytest.raises(SlateError) as info:
        raw_features(slate, ["pop"])
    message = str(info.value)
    assert "slate 'user-7': candidates[1] (docid 'd1') has no feature 'pop'" in message
    assert "which this model reads (features: pop); it has other" in message


def test_a_non_finite_score_is_refused():
    slate = mk("q", [{}, {}], scores=[1.0, float("nan")])
    with pytest.raises(SlateError, match=r"candidates\[1\] \(docid 'd1'\) has a non-finite 'score'"):
        raw_features(slate, ["score"])


def test_round_trip_through_json():
    fitted = FeatureNormalizer(("score", "pop"), (0.1, 2.0), (1.0 / 3.0, 4.5))
    assert FeatureNormalizer.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted
    with pytest.raises(ValueError, match="one mean and one std per feature"):
        FeatureNormalizer(("a", "b"), (0.0,), (1.0,))
    with pytest.raises(ValueError, match="must be positive"):
        FeatureNormalizer(("a",), (0.0,), (0.0,))


def test_features_beyond_every_training_value_are_counted():
    """Over n training values none lies more than sqrt(n - 1) standard deviations from their
    mean: a value past it (raw counts sent to a model trained on their log) was never seen."""
    from spdrank.core.features import FeatureDrift

    train = [mk("t0", [{"pop": 0.0}, {"pop": 1.0}]), mk("t1", [{"pop": 2.0}, {"pop": 3.0}])]
    norm = FeatureNormalizer.fit(["pop"], train)
    assert norm.count == 4 and norm.training_bound == pytest.approx(3 ** 0.5)
    assert FeatureNormalizer.from_dict(norm.to_dict()) == norm
    assert FeatureNormalizer.from_dict({**norm.to_dict(), "count": 0}).training_bound is None
    drift = FeatureDrift()
    for qid, value in (("near", 3.0), ("far", 40.0)):
        slate = mk(qid, [{"pop": value}])
        drift.add(norm, norm(slate), slate, f"f.jsonl:{qid}")
    assert drift.summary().startswith(
        "features beyond every training value on 1 of 2 slates (e.g. pop = 40 at f.jsonl:far, "
        "34 standard deviations from its training mean, where no training value lies beyond 2)")


def test_a_feature_too_spread_to_square_is_named():
    slates = [mk("a", [{"pop": 1e300}, {"pop": -1e300}]), mk("b", [{"pop": 0.0}, {"pop": 1.0}])]
    with pytest.raises(SlateError, match=r"slate 'a': feature 'pop' spreads past what float64 "
                       r"holds squared \(values up to 1e\+300\)"):
        FeatureNormalizer.fit(["pop"], slates)
