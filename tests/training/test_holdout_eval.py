"""--holdout evaluates every slate it holds out unless --eval-limit cuts them: a held-out
slate left unevaluated is neither trained on nor measured."""

from __future__ import annotations

from spdrank.core.slates import load_slates, write_slates
from spdrank.training.config import EVAL_LIMIT, TrainConfig
from spdrank.training.train import Trainer
from tests.helpers import make_slates, train_config


def featured(n: int):
    slates = make_slates(n)
    for slate in slates:
        for k, candidate in enumerate(slate.candidates):
            candidate.features = {"pop": float(k % 3)}
    return slates


def trainer(tmp_path, out: str, **kw) -> Trainer:
    write_slates(tmp_path / "train.jsonl", featured(40))
    return Trainer(train_config(tmp_path, "unused", out=out, target="clicks",
                                features_only=True, features="pop", max_steps=1, **kw))


def test_every_held_out_slate_is_evaluated_unless_eval_limit_cuts_them(tmp_path):
    run = trainer(tmp_path, "all", holdout=0.5)
    held = load_slates(tmp_path / "all" / "holdout" / "validation.jsonl")
    assert len(held) == 20
    assert [s.query.qid for s in run.eval_slates] == [s.query.qid for s in held]
    assert len(trainer(tmp_path, "cut", holdout=0.5, eval_limit=7).eval_slates) == 7


def test_eval_slates_given_are_cut_to_their_default():
    assert TrainConfig(slates="s", out="o", eval_slates="v").eval_cut == EVAL_LIMIT
    assert TrainConfig(slates="s", out="o", eval_slates="v", eval_limit=3).eval_cut == 3
    assert TrainConfig(slates="s", out="o", holdout=0.2).eval_cut is None
