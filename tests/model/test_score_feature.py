"""A model reading the feature ``score`` refuses a candidate whose score was not given, as it
refuses a candidate lacking any other feature it reads: a slate file may leave scores out
(rank_llm's format allows it), and the 0.0 read in their place is no value anyone sent.
Rankers that order by the first stage's score (``retriever``) still read it as 0, the listed
order, and a model reading no score ranks such slates as it always did."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spdrank.backbone.settings import BackboneConfig
from spdrank.commands.cli import main
from spdrank.core.features import FeatureNormalizer
from spdrank.core.slates import Slate, SlateError, write_slates
from spdrank.methods.head_config import HeadConfig
from spdrank.model.config import SPDConfig
from spdrank.model.parts import NoBackbone, NoTokenizer
from spdrank.model.ranker import SPDRanker
from spdrank.rankers.baselines import make_baseline
from spdrank.training.train import train
from tests.helpers import save_features_only_model, signal_slates
from tests.helpers import train_config as config

K = 8  # the models' positions
MISSING = ("candidates[0] (docid 'a') has no feature 'score' (its 'score' is left out or "
           "null), which this model reads")


def save_model(path: Path, names: tuple[str, ...]) -> Path:
    """A features-only model (no backbone: it loads in milliseconds) reading ``names``, each
    z-scored with mean 0.5 and deviation 0.25."""
    config = SPDConfig(
        backbone=BackboneConfig(lora=None),
        head=HeadConfig(kind="attn", positions=K, width=16, heads=2),
        features=FeatureNormalizer(names, (0.5,) * len(names), (0.25,) * len(names)),
        features_only=True,
    )
    SPDRanker(config, NoBackbone(), NoTokenizer()).save_pretrained(path)
    return path


def slate(scores: list[float | None] | None) -> dict:
    """Three candidates carrying 'pop'; ``scores`` None leaves every score out, and a None
    among them sends that one as null."""
    out = {"query": {"qid": "u1", "text": "rose shampoo"}, "candidates": [
        {"docid": d, "doc": {"title": f"item {d}"}, "features": {"pop": float(i)}}
        for i, d in enumerate("abc")]}
    for cand, score in zip(out["candidates"], scores or ()):
        cand["score"] = score
    return out


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data) + "\n")
    return path


@pytest.mark.parametrize("scores", [None, [None, 0.2, 0.9]], ids=["left-out", "null"])
def test_a_slate_file_without_scores_is_refused_by_rank_and_eval_naming_score(
    tmp_path, capsys, scores
):
    model = save_model(tmp_path / "m", ("score",))
    slates = write(tmp_path / "slates.jsonl", slate(scores))
    out = tmp_path / "ranked.jsonl"
    assert main(["rank", "--model", str(model), "--input", str(slates), "--output", str(out),
                 "--device", "cpu"]) == 2
    assert f"{slates}:1: slate 'u1': {MISSING}" in capsys.readouterr().err
    assert not out.exists()
    assert main(["eval", "--slates", str(slates), "--model", str(model), "--no-progress"]) == 2
    assert f"{slates}:1: slate 'u1': {MISSING}" in capsys.readouterr().err
    # The first stage's order reads a score left out as 0: the candidates as listed.
    assert main(["eval", "--slates", str(slates), "--ranker", "retriever", "--no-progress"]) == 0
    retriever = make_baseline("retriever").rank(Slate.from_dict(slate(scores)))
    assert retriever.docids == (["a", "b", "c"] if scores is None else ["c", "b", "a"])
    # Given, every score is read, a score of 0 too, and the model ranks by them.
    given = slate([0.0, 0.9, 0.2])
    write(slates, given)
    assert main(["rank", "--model", str(model), "--input", str(slates), "--output", str(out),
                 "--device", "cpu"]) == 0
    loaded = SPDRanker.from_pretrained(model)
    read = Slate.from_dict(given)
    np.testing.assert_allclose(loaded.check(read)[:, 0], (np.array([0.0, 0.9, 0.2]) - 0.5) / 0.25,
                               rtol=1e-6)
    ranked = json.loads(out.read_text())
    assert [c["docid"] for c in ranked["candidates"]] == loaded.rank(read).docids


def test_rank_on_plain_texts_is_refused_by_a_model_reading_score(tmp_path):
    model = SPDRanker.from_pretrained(save_model(tmp_path / "m", ("score",)))
    with pytest.raises(SlateError) as info:
        model.rank("rose shampoo", ["argan oil", "lotion"])
    assert ("candidates[0] (docid '0') has no feature 'score' (its 'score' is left out or "
            "null), which this model reads (features: score)") in str(info.value)
    given = [{"docid": "a", "doc": {"text": "argan oil"}, "score": 0.1},
             {"docid": "b", "doc": {"text": "lotion"}, "score": 0.9}]
    assert sorted(model.rank("rose shampoo", given).docids) == ["a", "b"]


def test_only_a_model_reading_score_refuses_a_slate_without_scores(tmp_path):
    """The same file: refused by a model reading 'pop' and 'score', ranked by one reading
    'pop' alone, exactly as it ranks the slate with every score 0 (what both once read)."""
    unscored = write(tmp_path / "unscored.jsonl", slate(None))
    zeros = write(tmp_path / "zeros.jsonl", slate([0.0, 0.0, 0.0]))
    both = save_features_only_model(tmp_path / "both", K)
    pop = save_model(tmp_path / "pop", ("pop",))
    with pytest.raises(SlateError, match=r"has no feature 'score'.*\(features: pop, score\)"):
        SPDRanker.from_pretrained(both).rank(Slate.from_dict(json.loads(unscored.read_text())))
    rankings = []
    for path in (unscored, zeros):
        out = path.with_suffix(".ranked.jsonl")
        assert main(["rank", "--model", str(pop), "--input", str(path), "--output", str(out),
                     "--device", "cpu"]) == 0
        ranked = json.loads(out.read_text())
        rankings.append([(c["docid"], c["score"]) for c in ranked["candidates"]])
    assert rankings[0] == rankings[1]


def test_training_on_slates_without_scores_is_refused_for_a_model_reading_score(tmp_path):
    """The normalisation is fitted on the training slates: without their scores it would be
    fitted on zeros, so the run is refused as a missing feature is, before it writes anything."""
    slates = signal_slates(6, seed=0)
    for s in slates:
        for cand in s.candidates:
            cand.scored = False
    write_slates(tmp_path / "train.jsonl", slates)
    cfg = config(tmp_path, "unused", target="clicks", features="signal,score",
                 features_only=True, max_steps=1)
    with pytest.raises(SlateError, match=r"candidates\[0\] \(docid 'd0'\) has no feature "
                       r"'score' \(its 'score' is left out or null\), which this model reads"):
        train(cfg)
    assert not (tmp_path / "run").exists()
