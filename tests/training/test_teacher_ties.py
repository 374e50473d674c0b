"""A teacher whose rankings order no pair (every candidate scored alike) is refused, or said
when most of its rankings do: its targets are uniform and teach nothing."""

from __future__ import annotations

import logging

import pytest

from spdrank.core.slates import write_slates
from spdrank.training.targets import teacher_ties
from spdrank.training.train import Trainer
from tests.helpers import make_slates, train_config


def scored(n: int, tied: int):
    """``n`` slates with a teacher scoring each candidate, the first ``tied`` scoring all 0.0,
    every candidate reading a feature so a features-only student can train on them."""
    slates = make_slates(n)
    for i, slate in enumerate(slates):
        slate.teacher = list(slate.docids)
        slate.teacher_scores = [0.0 if i < tied else float(-k) for k in range(len(slate))]
        for k, candidate in enumerate(slate.candidates):
            candidate.features = {"pop": float(k % 3)}
    return slates


def trainer(tmp_path, slates, target: str = "teacher") -> None:
    path = tmp_path / "train.jsonl"
    write_slates(path, slates)
    Trainer(train_config(tmp_path, "unused", slates=str(path), out=target, target=target,
                         features_only=True, features="pop", max_steps=1))


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "the teacher scores every candidate equally" in r.getMessage()]


def test_teacher_ties_counts_rankings_that_order_no_pair():
    assert teacher_ties(scored(10, 4)) == (4, 10)
    unlabelled = make_slates(3)
    assert teacher_ties(unlabelled) == (0, 0)


def test_a_teacher_that_ties_every_candidate_of_every_slate_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--target teacher: the teacher scores every "
                       r"candidate equally in 20 of the 20 teacher-labelled slates of the "
                       r"first 1000 of .*train\.jsonl.*orders no pair"):
        trainer(tmp_path, scored(20, 20))


def test_most_slates_tied_is_said_and_a_few_are_not(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
        trainer(tmp_path, scored(20, 15))
    assert len(said(caplog)) == 1 and "15 of the 20" in said(caplog)[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
        trainer(tmp_path, scored(20, 5), target="teacher+clicks")
    assert said(caplog) == []


def test_clicks_beside_a_tied_teacher_still_train_and_it_is_said(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
        trainer(tmp_path, scored(20, 20), target="teacher+clicks")
    assert len(said(caplog)) == 1 and "only what the clicks or judgements say" in said(caplog)[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
        trainer(tmp_path, scored(20, 20), target="clicks")
    assert said(caplog) == []
