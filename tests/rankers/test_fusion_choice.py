"""A fusion chosen on validation slates (``fusion:best:...``): the candidates, the choice where
one component is best and where a blend is, ties decided for the simpler, the chosen spec
reproducing what was chosen, the refusals, a label file as a component, and the ranker as
``eval``'s row and the teacher's backend."""

from __future__ import annotations

import json
import random

import pytest

from spdrank.commands.cli import main
from spdrank.commands.named_rankers import make_ranker
from spdrank.core.slates import Slate, load_slates, write_slates
from spdrank.eval.judged import ndcg_at_k
from spdrank.rankers.baselines import make_baseline
from spdrank.rankers.fusion import parse_fusion
from spdrank.rankers.fusion_choice import (
    ChosenFusion,
    candidates,
    format_choice,
    parse_choice,
)
from tests.helpers import records


def slate(qid: str, features: dict[str, list[float]], grades: list[int] | None = None,
          clicked: list[int] | None = None) -> Slate:
    """A search slate of candidates d0..dn-1 carrying ``features`` (name: one value a
    candidate), judged by ``grades`` or clicked at ``clicked`` (indices)."""
    n = len(next(iter(features.values())))
    cands = [{"docid": f"d{i}", "doc": {"text": f"passage {i}"},
              "features": {name: values[i] for name, values in features.items()}}
             for i in range(n)]
    data = {"query": {"qid": qid, "text": "a query"}, "candidates": cands}
    if grades is not None:
        data["relevance"] = {f"d{i}": g for i, g in enumerate(grades) if g}
    if clicked is not None:
        data["clicked"] = [f"d{i}" for i in clicked]
    return Slate.from_dict(data)


def one_best(count: int = 12, seed: int = 0) -> list[Slate]:
    """f1 orders every slate by its grades; f2 is noise."""
    rng = random.Random(seed)
    out = []
    for q in range(count):
        grades = [rng.choice([0, 0, 1, 2, 3]) for _ in range(12)]
        f1 = [g + rng.random() * 0.5 for g in grades]
        f2 = [rng.random() for _ in grades]
        out.append(slate(f"q{q}", {"f1": f1, "f2": f2}, grades))
    return out


def blend_best(count: int = 30, seed: int = 0) -> list[Slate]:
    """The grade follows a + b: f1 reads a alone, f2 b alone, so neither orders a slate as
    their sum does."""
    rng = random.Random(seed)
    out = []
    for q in range(count):
        a = [rng.random() for _ in range(15)]
        b = [rng.random() for _ in range(15)]
        grades = [min(3, int((x + y) * 2)) for x, y in zip(a, b)]
        out.append(slate(f"q{q}", {"f1": a, "f2": b}, grades))
    return out


def chosen(spec: str, slates: list[Slate]) -> ChosenFusion:
    ranker = make_baseline(spec)
    assert isinstance(ranker, ChosenFusion)
    ranker.choose(slates, "valid.jsonl")
    return ranker


def mean_ndcg(ranker, slates: list[Slate]) -> float:
    values = [ndcg_at_k(ranker.rank(s).docids, s.relevance, 10) for s in slates]
    return sum(values) / len(values)


# -- the spec and the candidates ----------------------------------------------------------------


def test_the_spec_names_two_to_four_unweighted_components():
    assert parse_choice("fusion:best:feature:dense+retriever") == ("feature:dense", "retriever")
    for spec, why in [("fusion:best:dense", "two or more components"),
                      ("fusion:best:0.5*dense+retriever", "chooses the weights"),
                      ("fusion:best:a+b+c+d+e", "at most 4 components")]:
        with pytest.raises(ValueError, match=why):
            parse_choice(spec)
    with pytest.raises(ValueError, match="no fixed fusion"):
        parse_fusion("fusion:best:feature:a+feature:b")


def test_candidates_are_bounded_and_each_spec_reads_as_its_weights():
    for n, count in [(2, 38), (3, 55), (4, 144)]:
        tried = candidates([f"feature:f{i}" for i in range(n)])
        assert len(tried) == count
        assert len({c.spec for c in tried}) == count
    tried = candidates(["a", "b"])
    assert [c.spec for c in tried[:2]] == ["a", "b"]  # each alone
    assert "fusion:rrf:a+b" in {c.spec for c in tried}  # equal weights, unwritten
    assert "fusion:zscore:0.7*a+0.3*b" in {c.spec for c in tried}
    assert "fusion:rrf=10:0.2*a+0.8*b" in {c.spec for c in tried}
    # a component without scores enters only the rank fusions
    assert all(c.method in (None, "rrf") for c in candidates(["a", "b"], scoreless={0}))


# -- choosing -----------------------------------------------------------------------------------


def test_a_clearly_best_component_is_chosen_alone():
    valid = one_best()
    ranker = chosen("fusion:best:feature:f1+feature:f2", valid)
    choice = ranker.choice
    assert choice.spec == "feature:f1" and choice.metric == "nDCG@10" and choice.slates == 12
    assert choice.score == pytest.approx(1.0)
    assert choice.score == mean_ndcg(make_baseline("feature:f1"), valid)
    scores = [c.score for c in choice.candidates]
    assert scores == sorted(scores, reverse=True) and len(scores) == 38
    text = format_choice(choice)
    assert text.splitlines()[0].startswith(
        "fusion:best:feature:f1+feature:f2: chose feature:f1, nDCG@10 1.0000 over 12 slates")
    assert "feature:f2  (alone)" in text and "more, from" in text


def test_a_blend_strictly_best_is_chosen_and_its_spec_reproduces_it():
    valid = blend_best()
    ranker = chosen("fusion:best:feature:f1+feature:f2", valid)
    choice = ranker.choice
    assert choice.spec.startswith("fusion:")
    alone = {c.spec: c.score for c in choice.candidates if c.alone}
    assert choice.score > max(alone.values()) + 0.05
    plain = make_baseline(choice.spec)  # the printed spec, as a user would reuse it
    assert mean_ndcg(plain, valid) == choice.score
    for s in valid + blend_best(5, seed=9):  # the same ranking and scores, on any slate
        assert ranker.rank(s).docids == plain.rank(s).docids
        assert ranker.rank(s).scores == plain.rank(s).scores


def test_every_candidate_scores_as_its_own_spec_ranks():
    valid = blend_best(8, seed=3)
    choice = chosen("fusion:best:feature:f1+feature:f2", valid).choice
    for c in choice.candidates[::5]:
        assert mean_ndcg(make_baseline(c.spec), valid) == pytest.approx(c.score, abs=1e-12)


def test_ties_go_to_a_component_alone_then_to_equal_weights():
    same = [slate(s.query.qid, {"f1": [s.candidates[i].features["f1"] for i in range(12)],
                                "f2": [s.candidates[i].features["f1"] for i in range(12)]},
                  [s.relevance.get(f"d{i}", 0) for i in range(12)]) for s in one_best(4)]
    assert chosen("fusion:best:feature:f1+feature:f2", same).choice.spec == "feature:f1"
    # each alone puts one irrelevant passage second; any near-equal blend puts both relevant
    # ones on top, so equal weights tie with unequal ones and are preferred
    valid = [slate("q1", {"f1": [1, 0, 0.9, 0], "f2": [0, 1, 0, 0.9]}, [1, 1, 0, 0])]
    choice = chosen("fusion:best:feature:f1+feature:f2", valid).choice
    assert choice.spec == "fusion:rrf:feature:f1+feature:f2"
    assert any(c.score == choice.score and "*" in c.spec for c in choice.candidates)


def test_clicks_judge_when_no_slate_is_graded():
    rng = random.Random(1)
    valid = []
    for q in range(10):
        f2 = [rng.random() for _ in range(8)]
        best = max(range(8), key=f2.__getitem__)
        valid.append(slate(f"q{q}", {"f1": [rng.random() for _ in range(8)], "f2": f2},
                           clicked=[best]))
    choice = chosen("fusion:best:feature:f1+feature:f2", valid).choice
    assert choice.spec == "feature:f2" and choice.metric == "NDCG@10 (clicks)"


def test_without_judgements_or_clicks_the_choice_is_refused():
    valid = [slate("q1", {"f1": [1, 2], "f2": [2, 1]})]
    ranker = make_baseline("fusion:best:feature:f1+feature:f2")
    with pytest.raises(ValueError, match="nothing to choose by") as err:
        ranker.choose(valid, "valid.jsonl")
    assert "valid.jsonl" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RuntimeError, match="choose it on validation slates"):
        ranker.rank(valid[0])


# -- a teacher's label file as a component ------------------------------------------------------


def label_file(tmp_path, slates: list[Slate], order, name: str):
    """A label file as an LLM teacher leaves it: rankings without scores."""
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(
        json.dumps({"qid": s.query.qid, "ranking": order(s)}) + "\n" for s in slates))
    write_slates(tmp_path / "all.jsonl", slates)
    out = tmp_path / f"{name}.labels.jsonl"
    assert main(["teacher", "--slates", str(tmp_path / "all.jsonl"), "--out", str(out),
                 "--backend", f"file:{path}", "--no-progress"]) == 0
    return out


def by_grade(s: Slate) -> list[str]:
    return sorted(s.docids, key=lambda d: -s.relevance.get(d, 0))


def test_a_label_file_is_chosen_where_it_adds_and_left_out_where_not(tmp_path):
    valid = blend_best(12, seed=4)
    good = label_file(tmp_path, valid, by_grade, "good")
    ranker = make_ranker(f"fusion:best:labels:{good}+feature:f1", choose_on=tmp_path / "v")
    ranker.choose(valid, "valid.jsonl")
    assert ranker.choice.spec == f"labels:{good}"  # it orders by the grades: nothing beats it
    assert all(c.spec.startswith(("fusion:rrf", "labels:", "feature:"))
               for c in ranker.choice.candidates)  # no scores: fused by rank alone
    bad = label_file(tmp_path, valid, lambda s: by_grade(s)[::-1], "bad")
    ranker = make_ranker(f"fusion:best:labels:{bad}+feature:f1+feature:f2",
                         choose_on=tmp_path / "v")
    ranker.choose(valid, "valid.jsonl")
    assert "labels:" not in ranker.choice.spec


def test_a_missing_label_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="no such label file"):
        make_ranker(f"fusion:best:labels:{tmp_path / 'none.jsonl'}+feature:f1",
                    choose_on=tmp_path / "v")
    with pytest.raises(ValueError, match="no such label file"):
        make_ranker(f"fusion:labels:{tmp_path / 'none.jsonl'}+feature:f1")


def test_a_plain_fusion_takes_a_label_file_with_its_scores(tmp_path):
    valid = one_best(3)
    write_slates(tmp_path / "v.jsonl", valid)
    labels = tmp_path / "f1.labels.jsonl"
    assert main(["teacher", "--slates", str(tmp_path / "v.jsonl"), "--out", str(labels),
                 "--backend", "ranker:feature:f1", "--no-progress"]) == 0
    via_labels = make_ranker(f"fusion:zscore:labels:{labels}+0.5*feature:f2")
    direct = make_baseline("fusion:zscore:feature:f1+0.5*feature:f2")
    for s in valid:
        assert via_labels.rank(s).docids == direct.rank(s).docids
        assert via_labels.rank(s).scores == pytest.approx(direct.rank(s).scores)


# -- the commands -------------------------------------------------------------------------------


def test_the_teacher_labels_with_the_chosen_fusion_and_records_the_choice(tmp_path, capsys):
    valid = blend_best(20, seed=5)
    write_slates(tmp_path / "valid.jsonl", valid)
    train = blend_best(6, seed=6)
    for s in train:
        s.query.qid = "t" + s.query.qid
        s.relevance = None
    write_slates(tmp_path / "train.jsonl", train)
    spec = "fusion:best:feature:f1+feature:f2"
    assert main(["teacher", "--slates", str(tmp_path / "train.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", f"ranker:{spec}", "--choose-on",
                 str(tmp_path / "valid.jsonl"), "--json", str(tmp_path / "summary.json"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    picked = summary["chosen"]["spec"]
    assert f"{spec}: chose {picked}, nDCG@10" in out
    assert summary["backend"] == f"ranker:{picked}" and summary["chosen"]["from"] == spec
    assert len(summary["chosen"]["candidates"]) == 38
    plain = make_baseline(picked)
    for s, rec, labelled in zip(train, records(tmp_path / "labels.jsonl"),
                                load_slates(tmp_path / "labels.slates.jsonl")):
        assert rec["backend"] == f"ranker:{picked}"
        assert rec["chosen"] == {"from": spec, "spec": picked, "metric": "nDCG@10",
                                 "score": summary["chosen"]["score"], "slates": 20,
                                 "on": str(tmp_path / "valid.jsonl")}
        assert rec["ranking"] == labelled.teacher == plain.rank(s).docids
        assert rec["scores"] == pytest.approx(plain.rank(s).scores)


def test_the_teacher_refuses_a_choice_without_slates_and_slates_without_a_choice(tmp_path,
                                                                                  capsys):
    write_slates(tmp_path / "s.jsonl", one_best(2))
    base = ["teacher", "--slates", str(tmp_path / "s.jsonl"), "--out",
            str(tmp_path / "l.jsonl"), "--no-progress"]
    assert main([*base, "--backend", "ranker:fusion:best:feature:f1+feature:f2"]) == 2
    assert "add --choose-on FILE" in capsys.readouterr().err
    assert main([*base, "--backend", "ranker:feature:f1", "--choose-on",
                 str(tmp_path / "s.jsonl")]) == 2
    assert "--choose-on" in capsys.readouterr().err
    assert main([*base, "--backend", "ranker:fusion:best:feature:f1+feature:f2",
                 "--choose-on", str(tmp_path / "none.jsonl")]) == 2
    assert "no such slate file" in capsys.readouterr().err
    assert not (tmp_path / "l.jsonl").exists()


def test_eval_chooses_on_its_flag_and_refuses_it_unused(tmp_path, capsys):
    write_slates(tmp_path / "valid.jsonl", one_best(6, seed=1))
    write_slates(tmp_path / "test.jsonl", one_best(4, seed=2))
    base = ["eval", "--slates", str(tmp_path / "test.jsonl"), "--no-progress"]
    spec = "fusion:best:feature:f1+feature:f2"
    assert main([*base, "--ranker", spec, "--choose-on", str(tmp_path / "valid.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"{spec}: chose feature:f1" in out
    assert main([*base, "--ranker", spec]) == 2
    assert "add --choose-on FILE" in capsys.readouterr().err
    assert main([*base, "--ranker", "feature:f1", "--choose-on",
                 str(tmp_path / "valid.jsonl")]) == 2
    assert "none is named" in capsys.readouterr().err


def test_eval_says_a_choice_made_on_the_slates_it_scores_flatters_its_row(tmp_path, caplog):
    write_slates(tmp_path / "test.jsonl", one_best(4, seed=2))
    test = str(tmp_path / "test.jsonl")
    spec = "fusion:best:feature:f1+feature:f2"
    with caplog.at_level("WARNING"):
        assert main(["eval", "--slates", test, "--ranker", spec, "--choose-on", test,
                     "--no-progress"]) == 0
    assert any(f"{spec} chooses its fusion on --choose-on {test}, the slates it is scored on"
               in r.getMessage() for r in caplog.records)
