"""Anchors on the features a student reads: an untrained student ranks exactly as the feature
(or the blend) it starts from, ``--anchor best`` starts from the input that ranks the eval
slates best, and a student that cannot beat its best input is saved as that input."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from spdrank.backbone.settings import BackboneConfig
from spdrank.core.features import FeatureNormalizer
from spdrank.core.slates import Candidate, Query, Slate, load_slates, write_slates
from spdrank.methods.anchor_spec import parse_anchor
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.spd.decode import DECODERS
from spdrank.model.config import SPDConfig
from spdrank.model.parts import NoBackbone, NoTokenizer
from spdrank.model.ranker import SPDRanker
from spdrank.rankers.baselines import FeatureRanker
from spdrank.training.blend import best_blend, blend_rankings
from spdrank.training.train import TrainConfig, train


def slate(rng: random.Random, qid: str, n: int) -> Slate:
    """Candidates listed at random, graded by a hidden relevance that 'good' tells with
    little noise and 'weak' with much; 'tied' takes few values, so its ties matter."""
    grades = [rng.choice((0, 0, 1, 2, 3)) for _ in range(n)]
    cands = [Candidate(docid=f"{qid}-d{i}", doc={"text": f"passage {i}"},
                       features={"good": g + rng.gauss(0, 0.3), "weak": g + rng.gauss(0, 3),
                                 "tied": float(rng.randint(0, 2))})
             for i, g in enumerate(grades)]
    return Slate(query=Query(qid=qid, text="a query"), candidates=cands,
                 relevance={c.docid: g for c, g in zip(cands, grades) if g})


def model(kind: str, anchor: str, names=("good", "weak", "tied"),
          normalizer: FeatureNormalizer | None = None) -> SPDRanker:
    config = SPDConfig(
        backbone=BackboneConfig(lora=None),
        head=HeadConfig(kind=kind, positions=24, width=16, heads=2, anchor=anchor),
        features=normalizer or FeatureNormalizer(tuple(names), (0.5,) * len(names),
                                                 (2.0,) * len(names)),
        features_only=True,
    )
    return SPDRanker(config, NoBackbone(), NoTokenizer()).eval()


@pytest.mark.parametrize("kind", ["attn", "linear", "scalar"])
@pytest.mark.parametrize("feature", ["good", "tied"])
def test_an_untrained_student_ranks_as_the_feature_it_starts_from(kind, feature):
    rng = random.Random(f"{kind}{feature}")
    slates = [slate(rng, f"q{i}", rng.randint(2, 24)) for i in range(6)]
    torch.manual_seed(0)
    student = model(kind, f"feature:{feature}")
    expected = [FeatureRanker(feature).rank(s).docids for s in slates]
    decoders = sorted(DECODERS) if student.method.matrix else [student.config.decoder]
    for decoder in decoders:
        got = [r.docids for r in student.rank_batch(slates, decoder=decoder)]
        assert got == expected, (kind, decoder)


def test_a_blend_ranks_by_the_weighted_sum_of_z_scores():
    rng = random.Random(7)
    slates = [slate(rng, f"q{i}", 16) for i in range(4)]
    student = model("attn", "feature:0.8*good+0.2*weak")
    for s, ranking in zip(slates, student.rank_batch(slates)):
        z = {c.docid: 0.8 * (c.features["good"] - 0.5) / 2 + 0.2 * (c.features["weak"] - 0.5) / 2
             for c in s.candidates}
        assert ranking.docids == sorted(s.docids, key=lambda d: -z[d])


def test_a_feature_anchor_round_trips_and_refuses_what_the_model_does_not_read(tmp_path):
    student = model("attn", "feature:0.7*good+0.3*tied")
    student.save_pretrained(tmp_path / "m")
    assert SPDRanker.from_pretrained(tmp_path / "m").config.head.anchor == \
        "feature:0.7*good+0.3*tied"
    with pytest.raises(ValueError, match="does not read"):
        model("attn", "feature:dense")
    for bad in ("feature:", "feature:-1*good", "feature:x*good", "feature:good+good", "dense"):
        with pytest.raises(ValueError, match="anchor"):
            parse_anchor(bad)
    with pytest.raises(ValueError, match=r"the weight of 'good' is 1e39; only the weights' "
                       "ratios order the sum"):
        parse_anchor("feature:1e39*good")


def run(tmp_path, name: str, **settings) -> dict:
    rng = random.Random(11)
    write_slates(tmp_path / "train.jsonl", [slate(rng, f"t{i}", 20) for i in range(32)])
    write_slates(tmp_path / "valid.jsonl", [slate(rng, f"v{i}", 20) for i in range(12)])
    common = {"slates": str(tmp_path / "train.jsonl"), "features": "weak,good",
              "features_only": True, "head": "attn", "positions": 20, "head_width": 16,
              "batch_size": 8, "eval_every": 0, "save_every": 0, "progress": False,
              "target": "relevance", "select": "best",
              "eval_slates": str(tmp_path / "valid.jsonl")}
    return train(TrainConfig(out=str(tmp_path / name), **(common | settings)))


def test_anchor_best_starts_from_the_input_that_ranks_the_eval_slates_best(tmp_path):
    """'good' is the best input; 'weak' is the same grades under more noise, so a little of
    it beside 'good' ranks the eval slates better still, and the student starts from that
    blend, led by 'good'."""
    summary = run(tmp_path, "best", max_steps=1, head_lr=1e-12)
    assert summary["config"]["anchor"] is None  # best is the default for a student reading features
    choice = summary["anchor"]
    assert choice["metric"] == "nDCG@10"
    assert choice["inputs"]["feature:good"] > choice["inputs"]["feature:weak"] > \
        choice["inputs"]["order"]
    assert choice["anchor"].startswith("feature:1*good+") and "*weak" in choice["anchor"]
    assert choice["blend"] > choice["inputs"]["feature:good"]
    saved = SPDRanker.from_pretrained(tmp_path / "best")
    assert saved.config.head.anchor == choice["anchor"]
    assert "not below feature:good" in " ".join(summary["input_lines"])
    # Unable to learn (learning rate 1e-12), it keeps its start, and says what that ranks as.
    assert summary["selected"]["step"] == 0
    assert summary["verdict"].endswith(
        f": its untrained start, which ranks exactly as its anchor {choice['anchor']}, since "
        "no epoch ranked them better")


def test_a_blend_may_lead_with_the_feature_the_given_order_ties_with(tmp_path):
    """Candidates listed by 'b' (a first stage's score), the better feature: the given order
    ranks exactly as 'b' and comes first among equals, and the blend still starts from 'b'
    and wins."""
    rng = random.Random(3)

    def listed(qid: str) -> Slate:
        found = halves(rng, qid)
        return Slate(query=found.query, relevance=found.relevance, candidates=sorted(
            found.candidates, key=lambda c: -c.features["b"]))

    write_slates(tmp_path / "train.jsonl", [listed(f"t{i}") for i in range(16)])
    write_slates(tmp_path / "valid.jsonl", [listed(f"v{i}") for i in range(24)])
    summary = train(TrainConfig(
        out=str(tmp_path / "run"), slates=str(tmp_path / "train.jsonl"), features="a,b",
        features_only=True, head="attn", positions=20, head_width=16, batch_size=8,
        eval_every=0, save_every=0, progress=False, target="relevance", select="best",
        eval_slates=str(tmp_path / "valid.jsonl"), max_steps=1, head_lr=1e-12))
    choice = summary["anchor"]
    assert choice["inputs"]["order"] == choice["inputs"]["feature:b"] > \
        choice["inputs"]["feature:a"]
    assert choice["anchor"].startswith("feature:1*b+") and choice["blend"] > \
        choice["inputs"]["order"]


def halves(rng: random.Random, qid: str) -> Slate:
    """Each of two features holds half of every candidate's grade."""
    grades = [rng.choice((0, 0, 1, 2, 3)) for _ in range(20)]
    cands = []
    for i, g in enumerate(grades):
        a = rng.uniform(0, g)
        cands.append(Candidate(docid=f"{qid}-d{i}", doc={"text": f"passage {i}"},
                               features={"a": a + rng.gauss(0, .2), "b": g - a}))
    return Slate(query=Query(qid=qid, text="a query"), candidates=cands,
                 relevance={c.docid: g for c, g in zip(cands, grades) if g})


def test_a_blend_is_chosen_only_where_it_ranks_better_than_one_feature(tmp_path):
    """Each of two features holds half of every grade: their blend ranks the slates better
    than either, and the search finds it; on one feature alone there is nothing to blend."""
    rng = random.Random(5)
    slates = [halves(rng, f"q{i}") for i in range(40)]
    normalizer = FeatureNormalizer.fit(("a", "b"), slates)
    single = best_blend(slates, FeatureNormalizer.fit(("a",), slates), "a", "nDCG@10")
    assert single[0].text() == "feature:a"
    blend, value = best_blend(slates, normalizer, "a", "nDCG@10")
    assert blend.names == ("a", "b") and blend.weights[0] == ("a", 1.0)
    alone = {name: best_blend(slates, FeatureNormalizer.fit((name,), slates), name, "nDCG@10")[1]
             for name in ("a", "b")}
    assert value > max(alone.values())
    student = model("attn", blend.text(), normalizer=normalizer)
    weights = np.array([weight for _, weight in blend.weights])
    expected = blend_rankings(slates, [normalizer(s) for s in slates], weights)
    assert [r.docids for r in student.rank_batch(slates)] == expected


def test_a_student_below_its_best_input_is_saved_as_that_input(tmp_path, capsys):
    """Anchored to the weaker feature and unable to learn (learning rate 0), the student ranks
    below 'good' on every evaluation: the run saves 'good' itself, and says so."""
    summary = run(tmp_path, "weak", anchor="weak", epochs=2, head_lr=1e-12)
    kept = summary["selected"]
    assert kept["input"] == "feature:good" and kept["student"] < kept["value"]
    assert summary["verdict"].startswith("kept feature:good itself")
    below = [line for line in summary["input_lines"] if "below feature:good" in line]
    assert below and below[0].startswith("the student ranks below feature:good on these 12")
    saved = SPDRanker.from_pretrained(tmp_path / "weak")
    slates = load_slates(tmp_path / "valid.jsonl")
    assert [r.docids for r in saved.rank_batch(slates)] == \
        [FeatureRanker("good").rank(s).docids for s in slates]
    assert not (tmp_path / "weak" / "best").exists()


def test_select_last_says_when_an_input_ranks_better_but_keeps_the_student(tmp_path):
    summary = run(tmp_path, "last", anchor="weak", epochs=1, head_lr=1e-12, select="last")
    assert "step" in summary["selected"] and "input" not in summary["selected"]
    assert summary["verdict"].endswith(
        f"; feature:good ranks them better ({summary['inputs'][-1]['first_stage']:.3f})")


def test_eval_puts_a_student_beside_each_ranker_it_reads(tmp_path, capsys):
    from spdrank.commands.cli import main

    run(tmp_path, "student", anchor="weak", epochs=1, head_lr=1e-12, select="last")
    rng = random.Random(12)
    write_slates(tmp_path / "test.jsonl", [slate(rng, f"e{i}", 20) for i in range(10)])
    assert main(["eval", "--slates", str(tmp_path / "test.jsonl"), "--model",
                 f"student={tmp_path / 'student'}", "--k", "10", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "\nfeature:weak " in printed and "\nfeature:good " in printed
    assert "student ranks not below feature:weak on these 10 slates: nDCG@10" in printed
    assert "student ranks below feature:good on these 10 slates: nDCG@10" in printed


def test_equal_scores_share_the_span_of_ranks_they_fill():
    """Candidates a feature does not tell apart are pulled to the span of ranks they fill
    together and not ordered within it, but for the tie-break that keeps them in the order
    given: the prior asserts no order the head cannot see."""
    from spdrank.methods.anchor import TIE_BREAK, Anchor

    anchor = Anchor(matrix=True, spec=parse_anchor("feature:f"), features=("f",))
    mask = torch.tensor([[True, True, True, True, False]])
    features = torch.tensor([[[0.0], [2.0], [0.0], [0.0], [0.0]]])
    ranks = anchor.ranks(mask, features)
    assert ranks.low[0].tolist() == [1, 0, 1, 1, 4] and ranks.high[0].tolist() == [3, 0, 3, 3, 4]
    assert ranks.stable[0].tolist() == [1, 0, 2, 3, 4]
    prior = anchor.prior(torch.tensor([4]), ranks, 4)[0] * 3  # in steps of rank
    assert prior[1].tolist() == pytest.approx([0, -1, -2, -3])  # alone: pulled to its rank
    assert prior[0].tolist() == pytest.approx([-1 - TIE_BREAK, 0, -TIE_BREAK, -2 * TIE_BREAK])
    assert prior[3].tolist() == pytest.approx([-1 - 3 * TIE_BREAK, -2 * TIE_BREAK, -TIE_BREAK, 0])


@pytest.mark.slow  # builds the own-data example and trains on it
def test_a_click_trained_student_does_not_fall_below_the_feature_it_starts_from(
    tmp_path, monkeypatch
):
    """The own-data walkthrough's slates, a click-trained features-only student anchored to
    'transition' (0 for most candidates: many ties): clicks order nothing after the clicked
    item, and a prior that pinned every item to a rank the head cannot see (ties in the
    order given) drove such a student far below its anchor. It must not fall below it."""
    import importlib.util
    import sys

    from spdrank.commands.cli import main
    from spdrank.core.slates import load_slates
    from spdrank.training import train as training
    from spdrank.training.inputs import input_ranking
    from spdrank.training.train import mean_metrics
    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location(
        "own_data_example", ROOT / "benchmarks" / "own_data_example.py")
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    assert example.main(["--out", "own"]) == 0
    assert main(["data", "sequences", "--sequences", "own/log.inter", "--titles", "own/log.item",
                 "--candidate-file", "own/candidates.txt", "--candidates", "20",
                 "--eval-fraction", "0.2", "--features", "--no-progress", "--out", "slates"]) == 0
    assert main(["train", "--slates", "slates/train.jsonl", "--target", "clicks", "--features",
                 "score,popularity,cooccurrence,transition,title_similarity", "--features-only",
                 "--anchor", "transition", "--positions", "20", "--epochs", "4",
                 "--batch-size", "16", "--no-progress", "--out", "run"]) == 0
    student = SPDRanker.from_pretrained("run")
    assert float(student.head.anchor.log_strength) < 1.0  # started at CLICKS_STRENGTH
    assert training.CLICKS_STRENGTH < 5.0
    slates = load_slates("slates/eval.jsonl")
    learned = mean_metrics(slates, [r.docids for r in student.rank_batch(slates)])["NDCG@10"]
    anchor = mean_metrics(slates, [input_ranking(s, "feature:transition")
                                   for s in slates])["NDCG@10"]
    assert learned >= anchor, (learned, anchor)
