"""Fusion of rankers (``fusion:...``): the spec, reciprocal-rank and normalised-score fusion by
hand, ties, errors, and the ranker as ``eval``'s row and the teacher's backend."""

from __future__ import annotations

import math

import pytest

from spdrank.commands.cli import main
from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError, load_slates, write_slates
from spdrank.rankers.baselines import make_baseline
from spdrank.rankers.fusion import FusionSpec, normalised, parse_fusion, rrf_terms
from tests.helpers import make_slates, records


def slate(f1: list[float], f2: list[float], qid: str = "q1", order: list[int] | None = None) -> Slate:
    """A search slate of candidates d1..dn carrying features f1 and f2 (listed in ``order``)."""
    cands = [{"docid": f"d{i + 1}", "doc": {"text": f"passage {i + 1}"},
              "features": {"f1": a, "f2": b}} for i, (a, b) in enumerate(zip(f1, f2))]
    if order is not None:
        cands = [cands[i] for i in order]
    return Slate.from_dict({"query": {"qid": qid, "text": "a query"}, "candidates": cands})


def fused(spec: str, s: Slate) -> dict[str, float]:
    ranking = make_baseline(spec).rank(s)
    assert ranking.scores is not None
    return dict(zip(ranking.docids, ranking.scores))


# -- the spec ---------------------------------------------------------------------------------


def test_spec_method_k_and_weights():
    assert parse_fusion("fusion:dense+retriever") == FusionSpec(
        "rrf", (("dense", 1.0), ("retriever", 1.0)), 60.0)
    assert parse_fusion("fusion:rrf=20:dense+0.5*feature:score") == FusionSpec(
        "rrf", (("dense", 1.0), ("feature:score", 0.5)), 20.0)
    assert parse_fusion("fusion:zscore:dense+bm25+retriever").method == "zscore"
    assert parse_fusion("fusion:minmax:2*dense+bm25").components[0] == ("dense", 2.0)
    # a component's own colons are its own: feature:NAME and run:PATH
    assert parse_fusion("fusion:feature:a+run:x/y.trec").components == (
        ("feature:a", 1.0), ("run:x/y.trec", 1.0))


@pytest.mark.parametrize("spec, why", [
    ("fusion:dense", "two or more components"),
    ("fusion:rrf:dense+", "none empty"),
    ("fusion:zscore=3:dense+bm25", "only rrf takes a parameter"),
    ("fusion:rrf=x:dense+bm25", "k must be a number"),
    ("fusion:rrf=-1:dense+bm25", ">= 0"),
    ("fusion:rrf:dense+dense", "named twice: weight it instead"),
    ("fusion:rrf:0*dense+bm25", "finite number > 0"),
    ("fusion:rrf:heavy*dense+bm25", "a weight is a number"),
    ("fusion:rrf:fusion:a+b", "do not nest"),
])
def test_bad_specs_say_what_is_wrong(spec, why):
    with pytest.raises(ValueError, match=why) as err:
        parse_fusion(spec)
    assert spec in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_component_is_named_before_anything_is_built(tmp_path):
    with pytest.raises(ValueError, match="component 'dence': unknown baseline 'dence'"):
        make_baseline("fusion:rrf:dence+retriever")
    with pytest.raises(ValueError, match="no such TREC run file"):
        make_baseline(f"fusion:retriever+run:{tmp_path / 'missing.trec'}")


# -- reciprocal-rank fusion -------------------------------------------------------------------


def test_rrf_equals_hand_computed_values():
    s = slate([4, 3, 2, 1], [1, 4, 3, 2])
    # f1 ranks d1 d2 d3 d4, f2 ranks d2 d3 d4 d1
    expected = {"d1": 1 / 61 + 1 / 64, "d2": 1 / 62 + 1 / 61, "d3": 1 / 63 + 1 / 62,
                "d4": 1 / 64 + 1 / 63}
    ranking = make_baseline("fusion:rrf:feature:f1+feature:f2").rank(s)
    assert ranking.docids == ["d2", "d1", "d3", "d4"]
    assert dict(zip(ranking.docids, ranking.scores)) == pytest.approx(expected, abs=1e-15)
    # k and weights: 2 / (1 + r1) + 1 / (1 + r2)
    weighted = fused("fusion:rrf=1:2*feature:f1+feature:f2", s)
    assert weighted == pytest.approx({"d1": 2 / 2 + 1 / 5, "d2": 2 / 3 + 1 / 2,
                                      "d3": 2 / 4 + 1 / 3, "d4": 2 / 5 + 1 / 4})
    assert make_baseline("fusion:dense+retriever").spec.method == "rrf"  # the default method


def test_tied_scores_share_their_ranks_terms_whatever_the_listing():
    # f1: d4 first, d1 and d2 tied second, d3 last; f2 ties everything
    s = slate([1, 1, 0, 5], [0, 0, 0, 0])
    k = 60
    terms = [1 / (k + r) for r in range(1, 5)]
    shared = (terms[1] + terms[2]) / 2
    every = sum(terms) / 4
    out = fused("fusion:feature:f1+feature:f2", s)
    assert out == pytest.approx({"d4": terms[0] + every, "d1": shared + every,
                                 "d2": shared + every, "d3": terms[3] + every})
    assert out["d1"] == out["d2"]  # a tie, not an order the listing handed out
    ranking = make_baseline("fusion:feature:f1+feature:f2").rank(s)
    assert ranking.docids == ["d4", "d1", "d2", "d3"]  # equal fused scores: candidate order
    # listed the other way round: the same scores; the tie follows the listing, deterministically
    reversed_slate = slate([1, 1, 0, 5], [0, 0, 0, 0], order=[3, 2, 1, 0])
    assert fused("fusion:feature:f1+feature:f2", reversed_slate) == pytest.approx(out)
    again = make_baseline("fusion:feature:f1+feature:f2").rank(reversed_slate)
    assert again.docids == ["d4", "d2", "d1", "d3"]


def test_rrf_terms_of_a_ranker_without_scores_are_its_positions():
    ranking = Ranking(docids=["b", "a", "c"])
    assert rrf_terms(ranking, 0, ties=True) == {"b": 1.0, "a": 0.5, "c": 1 / 3}
    tied = Ranking(docids=["b", "a", "c"], scores=[2.0, 2.0, 1.0])
    assert rrf_terms(tied, 0, ties=False) == {"b": 1.0, "a": 0.5, "c": 1 / 3}
    assert rrf_terms(tied, 0, ties=True) == {"b": 0.75, "a": 0.75, "c": 1 / 3}


# -- normalised-score fusion ------------------------------------------------------------------


def test_zscore_and_minmax_equal_hand_computed_values():
    s = slate([1, 2, 3], [10, 0, 20])
    z = math.sqrt(1.5)  # (3 - 2) / sqrt(2/3)
    assert fused("fusion:zscore:feature:f1+feature:f2", s) == pytest.approx(
        {"d1": -z + 0, "d2": 0 - z, "d3": z + z})
    assert fused("fusion:minmax:feature:f1+0.5*feature:f2", s) == pytest.approx(
        {"d1": 0 + 0.25, "d2": 0.5 + 0, "d3": 1 + 0.5})
    # d1 and d2 tie under zscore: candidate order, and their scores are equal
    ranking = make_baseline("fusion:zscore:feature:f1+feature:f2").rank(s)
    assert ranking.docids == ["d3", "d1", "d2"] and ranking.scores[1] == ranking.scores[2]
    assert normalised([3.0, 3.0], "zscore") == [0.0, 0.0]  # no order: adds nothing
    assert normalised([3.0, 3.0], "minmax") == [0.0, 0.0]


def test_score_fusion_of_a_ranker_without_scores_says_to_use_rrf():
    with pytest.raises(SlateError, match="random gives no scores to normalise.*rrf"):
        make_baseline("fusion:zscore:random+feature:f1").rank(slate([1, 2], [3, 4]))


def test_a_component_ranking_by_a_missing_feature_names_it_and_the_candidate():
    with pytest.raises(SlateError, match=r"'q1'.*docid 'd1'.*has no feature 'nope'.*feature:nope"):
        make_baseline("fusion:rrf:feature:f1+feature:nope").rank(slate([1, 2], [3, 4]))


def test_a_run_is_a_component(tmp_path):
    run = tmp_path / "teacher.trec"
    run.write_text("q1 Q0 d3 1 9.0 t\nq1 Q0 d1 2 8.0 t\nq1 Q0 d2 3 7.0 t\n")
    out = fused(f"fusion:feature:f1+run:{run}", slate([1, 2, 3], [0, 0, 0]))
    assert out == pytest.approx({"d3": 2 / 61, "d2": 1 / 62 + 1 / 63, "d1": 1 / 63 + 1 / 62})


def test_components_that_learn_are_fitted_from_one_stream():
    train = make_slates(20, seed=1, prefix="t")
    ranker = make_baseline("fusion:popularity+cooccurrence")
    assert ranker.needs_train and ranker.needs_history
    ranker.fit(iter(train))  # one pass: both components see every slate
    pop, co = ranker.components
    assert pop.counts and sum(pop.counts.values()) > 0 and co.co
    s = make_slates(1, seed=2)[0]
    assert sorted(ranker.rank(s).docids) == sorted(s.docids)


# -- the commands -----------------------------------------------------------------------------


def test_the_teacher_labels_slates_through_a_fusion(tmp_path):
    slates = [slate([1, 1, 0, 5], [3, 2, 1, 0], qid="q1"), slate([2, 1, 4, 3], [0, 1, 0, 1], qid="q2")]
    write_slates(tmp_path / "slates.jsonl", slates)
    spec = "fusion:rrf:feature:f1+feature:f2"
    assert main(["teacher", "--slates", str(tmp_path / "slates.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", f"ranker:{spec}",
                 "--no-progress"]) == 0
    recs = records(tmp_path / "labels.jsonl")
    for s, rec, out in zip(slates, recs, load_slates(tmp_path / "labels.slates.jsonl")):
        expected = make_baseline(spec).rank(s)
        assert rec["backend"] == f"ranker:{spec}" and rec["status"] == "ok"
        assert rec["ranking"] == out.teacher == expected.docids
        assert rec["scores"] == pytest.approx(expected.scores)  # fused scores: ties stay ties


def test_eval_ranks_with_a_fusion_and_refuses_a_bad_spec_in_one_line(tmp_path, capsys):
    write_slates(tmp_path / "slates.jsonl", [slate([1, 2, 3], [3, 1, 2])])
    base = ["eval", "--slates", str(tmp_path / "slates.jsonl"), "--no-progress"]
    assert main([*base, "--ranker", "fusion:zscore:feature:f1+feature:f2"]) == 0
    assert "fusion:zscore:feature:f1+feature:f2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*base, "--ranker", "fusion:zscore:feature:f1"])
    assert exit_.value.code == 2
    assert "two or more components" in capsys.readouterr().err
