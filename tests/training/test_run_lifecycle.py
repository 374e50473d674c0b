"""A run's lifecycle in its ``--out``: what is refused before the first step, and what a rerun
into a run's folder resumes or is refused."""

import json
import random

import pytest

from spdrank.core.slates import SlateError, load_slates, write_slates
from spdrank.training.holdout import hold_out
from spdrank.training.train import Trainer, train
from tests.helpers import make_slate, signal_slates
from tests.helpers import train_config as config


def settings(tmp_path, out="run", **kw):
    """A features-only run on ``tmp_path/train.jsonl``: trains in seconds, reads no LLM."""
    base = {"target": "clicks", "features": "signal", "features_only": True, "positions": 8,
            "head_width": 16, "max_steps": 4, "lora_r": 64, "lora_alpha": 64}
    return config(tmp_path, "unused", out=out, **(base | kw))


@pytest.fixture
def files(tmp_path):
    write_slates(tmp_path / "train.jsonl", signal_slates(16, seed=1, teacher=False))
    write_slates(tmp_path / "eval.jsonl", signal_slates(6, seed=2, teacher=False))
    return tmp_path / "train.jsonl", tmp_path / "eval.jsonl"


@pytest.fixture
def no_step(monkeypatch):
    """A step taken fails the test: what is checked here is refused before the first one."""
    def step(self):
        raise AssertionError("a training step ran before the refusal")

    monkeypatch.setattr(Trainer, "train_step", step)


def long_slate(qid: str) -> object:
    """A slate of 9 candidates, one more than the runs' K of 8."""
    rng = random.Random(3)
    slate = make_slate(rng, 9, qid=qid, teacher=False)
    for c in slate.candidates:
        c.features = {"signal": rng.gauss(0, 1)}
    return slate


# -- eval slates the model cannot rank ---------------------------------------------------------


@pytest.mark.parametrize("select", ["last", "best"])
def test_an_eval_slate_longer_than_k_is_refused_before_the_first_step(
    tmp_path, files, no_step, select
):
    _, eval_file = files
    write_slates(eval_file, [*load_slates(eval_file)[:2], long_slate("long")])
    with pytest.raises(SlateError, match=r"eval\.jsonl:3: slate 'long' has 9 candidates, more "
                       r"than the model's 8 rank positions \(--positions\)"):
        train(settings(tmp_path, eval_slates=str(eval_file), select=select))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("select", ["last", "best"])
def test_an_eval_slate_missing_a_feature_is_refused_before_the_first_step(
    tmp_path, files, no_step, select
):
    _, eval_file = files
    slates = load_slates(eval_file)
    slates[1].candidates[2].features = {"other": 1.0}
    write_slates(eval_file, slates)
    with pytest.raises(SlateError, match=r"eval\.jsonl:2: slate 's2-1': candidates\[2\] "
                       r"\(docid 'd2'\) has no feature 'signal'"):
        train(settings(tmp_path, eval_slates=str(eval_file), select=select))
    assert not (tmp_path / "run").exists()


def test_a_held_out_slate_longer_than_k_is_refused_before_the_first_step(tmp_path, files,
                                                                         no_step):
    train_file, _ = files
    _, probe = hold_out(train_file, 1, tmp_path / "probe", seed=0)
    held = load_slates(probe)[0].query.qid
    write_slates(train_file, [long_slate(held) if s.query.qid == held else s
                              for s in load_slates(train_file)])
    with pytest.raises(SlateError, match=rf"holdout/validation\.jsonl:1: slate '{held}' has 9 "
                       "candidates"):
        train(settings(tmp_path, holdout=1))
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_only_the_eval_limit_of_the_eval_slates_is_read(tmp_path, files):
    _, eval_file = files
    write_slates(eval_file, [*load_slates(eval_file), long_slate("past-the-limit")])
    summary = train(settings(tmp_path, eval_slates=str(eval_file), eval_limit=6))
    assert summary["finished"] and summary["eval_slates"] == 6
    assert json.loads((tmp_path / "run" / "train.json").read_text())["eval_slates"] == 6
