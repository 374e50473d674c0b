"""Baselines: determinism, validity, no leakage of eval targets, co-occurrence logic."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Candidate, Query, Slate, SlateError, read_slates, write_slates
from spdrank.eval.metrics import is_valid_permutation
from spdrank.rankers.baselines import (
    BASELINES,
    CooccurrenceRanker,
    FeatureRanker,
    PopularityRanker,
    RandomRanker,
    baseline_names,
    make_baseline,
)
from tests.helpers import item_slate as mk


def once(slates: list[Slate]):
    """A one-shot iterator: fitting must work in a single pass over a stream."""
    yield from slates


# -- random -----------------------------------------------------------------------------------


def test_random_is_valid_and_deterministic(slates):
    for s in slates:
        a, b = RandomRanker(seed=3).rank(s), RandomRanker(seed=3).rank(s)
        assert a.docids == b.docids
        assert is_valid_permutation(a.docids, s.docids)
        assert a.decode_passes == 0
    big = mk("u", [], [f"d{i}" for i in range(50)])
    outs = {tuple(RandomRanker(seed=k).rank(big).docids) for k in range(5)}
    assert len(outs) == 5  # the seed matters
    other = mk("v", [], big.docids)
    assert RandomRanker().rank(big).docids != RandomRanker().rank(other).docids  # so does qid
    assert big.docids == [f"d{i}" for i in range(50)]  # the slate is not shuffled in place


def test_random_does_not_depend_on_python_hash_seed():
    code = (
        "from spdrank.rankers.baselines import RandomRanker\n"
        "from spdrank.core.slates import Candidate, Query, Slate\n"
        "s = Slate(Query('u1', 't'), [Candidate(f'd{i}', {'title': 'x'}) for i in range(20)])\n"
        "print(' '.join(RandomRanker(seed=7).rank(s).docids))\n"
    )
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(proc.stdout)
    assert len(outs) == 1


# -- popularity -------------------------------------------------------------------------------


def test_popularity_counts_history_and_clicks_of_training_slates_only():
    train = [
        mk("t1", ["p", "q"], ["p", "x"], clicked=["p"]),  # p: 2 (history + click), q: 1
        mk("t2", ["p"], ["q", "r"], clicked=["q"]),  # p: 3, q: 2
    ]
    pop = PopularityRanker()
    pop.fit(once(train))
    assert pop.counts == {"p": 3, "q": 2}
    # e is the clicked target of every eval slate but never seen in training: no credit
    evals = [mk(f"e{i}", ["q"], ["e", "z", "q", "p"], clicked=["e"]) for i in range(5)]
    for s in evals:
        out = pop.rank(s)
        assert out.docids == ["p", "q", "e", "z"]  # unseen e, z keep their original order
        assert out.scores == [3.0, 2.0, 0.0, 0.0]
    assert pop.counts == {"p": 3, "q": 2}  # ranking never updates the counts


def test_popularity_fits_from_a_file_stream(tmp_path):
    path = tmp_path / "train.jsonl"
    train = [mk("t1", ["a", "b"], ["b", "c"], ["c"]), mk("t2", ["c"], ["c", "d"], ["d"])]
    write_slates(path, train)
    pop = PopularityRanker()
    pop.fit(read_slates(path))
    assert pop.counts == {"a": 1, "b": 1, "c": 2, "d": 1}


def test_rank_before_fit_is_an_error():
    s = mk("u", ["a"], ["a", "b"])
    with pytest.raises(RuntimeError, match="fit"):
        PopularityRanker().rank(s)
    with pytest.raises(RuntimeError, match="fit"):
        CooccurrenceRanker().rank(s)


# -- co-occurrence ----------------------------------------------------------------------------


def test_cooccurrence_ranks_the_cooccurring_item_first():
    train = [
        mk("t1", ["x"], ["a", "n"], clicked=["a"]),
        mk("t2", ["x"], ["a", "n"], clicked=["a"]),
        mk("t3", ["p", "y"], ["b", "n"], clicked=["b"]),
        mk("t4", ["p"], ["p", "n"], clicked=["p"]),
        mk("t5", ["p", "y"], ["y", "n"], clicked=["y"]),
    ]
    co = CooccurrenceRanker()
    co.fit(once(train))
    out = co.rank(mk("e", ["x"], ["p", "b", "a", "z"], clicked=["a"]))
    # a co-occurs with x; the rest tie at 0 and fall back to popularity (p: 4, b: 1, z: 0)
    assert out.docids == ["a", "p", "b", "z"]
    assert out.scores[0] > 0 and out.scores[1:] == [0.0, 0.0, 0.0]


def test_cooccurrence_weights_recent_history_more():
    train = [mk("t1", ["x"], ["a"], ["a"]), mk("t2", ["y"], ["b"], ["b"])]
    co = CooccurrenceRanker(recent=2, decay=0.5)
    co.fit(once(train))
    assert co.rank(mk("e", ["y", "x"], ["b", "a"])).docids == ["a", "b"]  # x is most recent
    assert co.rank(mk("e", ["x", "y"], ["a", "b"])).docids == ["b", "a"]
    only_last = CooccurrenceRanker(recent=1)
    only_last.fit(once(train))
    assert only_last.rank(mk("e", ["x", "y"], ["a", "b"])).scores == [1.0, 0.0]


def test_cooccurrence_window_and_direction():
    train = [mk("t", ["a", "b", "c"], ["d"], ["d"])]  # sequence a b c d
    co = CooccurrenceRanker(window=1, backward=0.25)
    co.fit(once(train))
    assert co.co is not None
    assert co.co["a"] == {"b": 1.0}  # c and d are beyond the window
    assert co.co["b"] == {"c": 1.0, "a": 0.25}  # forward 1, backward 0.25
    wide = CooccurrenceRanker(window=3, backward=0.0)
    wide.fit(once(train))
    assert wide.co is not None and wide.co["a"] == {"b": 1.0, "c": 1.0, "d": 1.0}
    assert "d" not in wide.co  # no backward pairs


def test_cooccurrence_never_counts_eval_slates():
    co = CooccurrenceRanker()
    co.fit(once([mk("t", ["x"], ["a"], ["a"])]))
    before = {k: dict(v) for k, v in co.co.items()}
    co.rank(mk("e", ["x"], ["a", "e"], clicked=["e"]))
    assert co.co == before


# -- a feature the slates carry ----------------------------------------------------------------


def with_feature(
    qid: str, values: dict[str, float | None], name: str = "title_similarity"
) -> Slate:
    """A slate whose candidates carry ``name`` (None: the candidate lacks it), in dict order."""
    return Slate(
        query=Query(qid=qid, text="-"),
        candidates=[
            Candidate(
                docid=d,
                doc={"title": f"item {d}"},
                features=None if v is None else {name: v, "other": -v},
            )
            for d, v in values.items()
        ],
    )


def test_feature_ranker_orders_by_the_feature_and_reports_it_as_scores():
    s = with_feature("u", {"a": 0.1, "b": 0.7, "c": 0.3})
    out = FeatureRanker("title_similarity").rank(s)
    assert out.docids == ["b", "c", "a"] and out.scores == [0.7, 0.3, 0.1]
    assert FeatureRanker("other").rank(s).docids == ["a", "c", "b"]  # any feature by name
    assert out.decode_passes == 0


def test_feature_ranker_breaks_ties_by_candidate_order():
    s = with_feature("u", {"z": 0.0, "b": 0.4, "y": 0.0, "a": 0.0, "c": 0.4, "x": -0.0})
    out = FeatureRanker("title_similarity").rank(s)
    assert out.docids == ["b", "c", "z", "y", "a", "x"]  # not by docid, not reversed
    assert out.scores == [0.4, 0.4, 0.0, 0.0, 0.0, 0.0]
    assert FeatureRanker("title_similarity").rank(s).docids == out.docids


def test_feature_ranker_reads_the_candidate_score_field():
    cands = [Candidate(d, {"title": d}, score=v) for d, v in (("a", 1.0), ("b", 2.0))]
    s = Slate(Query("u", "-"), cands)
    assert make_baseline("feature:score").rank(s).docids == ["b", "a"]


def test_feature_ranker_missing_feature_names_slate_candidate_and_feature():
    s = with_feature("user-7", {"a": 0.2, "b": None, "c": 0.1})
    with pytest.raises(SlateError) as info:
        make_baseline("title_similarity").rank(s)
    message = str(info.value)
    assert "slate 'user-7'" in message and "docid 'b'" in message
    assert "no feature 'title_similarity'" in message
    with pytest.raises(SlateError, match=r"docid 'a'\) has no feature 'bm25'.*it has other, title"):
        make_baseline("feature:bm25").rank(with_feature("u", {"a": 0.2}))


def test_feature_ranker_needs_no_training_and_is_named_by_its_feature():
    ranker = make_baseline("feature:title_similarity")
    assert isinstance(ranker, FeatureRanker)
    assert ranker.name == "feature:title_similarity" and ranker.feature == "title_similarity"
    assert not ranker.needs_train and ranker.ranks_by_scores
    alias = make_baseline("title_similarity")
    assert alias.name == "title_similarity" and alias.feature == "title_similarity"
    assert "title_similarity" in baseline_names() and "title_similarity" not in BASELINES
    with pytest.raises(ValueError, match="names no feature"):
        make_baseline("feature:")
    with pytest.raises(ValueError, match="feature:NAME"):
        make_baseline("title-similarity")


# -- all baselines ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_returns_a_permutation(name, slates):
    ranker = make_baseline(name)
    assert ranker.name == name
    ranker.fit(once(slates))  # conftest slates have no history: rankers must cope
    for s in slates:
        out = ranker.rank(s)
        assert type(out) is Ranking and is_valid_permutation(out.docids, s.docids)
        assert out.scores is None or len(out.scores) == len(out.docids)
        assert out.decode_passes == 0


def test_make_baseline():
    assert make_baseline("random", seed=4).seed == 4
    assert make_baseline("cooccurrence", window=2).window == 2
    with pytest.raises(ValueError, match="unknown baseline 'nope'"):
        make_baseline("nope")
    with pytest.raises(ValueError):
        CooccurrenceRanker(window=0)
