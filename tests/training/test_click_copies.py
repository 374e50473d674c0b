"""An order that saw the clicks is said: a teacher's labels that teach the clicks, not its
ranking; candidates listed with the clicked item first."""

from __future__ import annotations

import logging

from spdrank.core.slates import write_slates
from spdrank.training.targets import CLICK_COPY_SLATES, ranks_clicks_first
from spdrank.training.train import train
from tests.helpers import make_slates, train_config


def labelled(n: int, copied: int, clicks: int = 1):
    """``n`` slates whose teacher reverses the candidates, the first ``copied`` of them with
    the clicked item (the first candidate, and the next ``clicks - 1``) moved to the top."""
    slates = make_slates(n)
    for i, slate in enumerate(slates):
        slate.clicked = slate.docids[:clicks]
        order = slate.docids[::-1]
        slate.teacher = ([*slate.clicked, *(d for d in order if d not in slate.clicked)]
                         if i < copied else order)
    return slates


def teacher_copies_clicks(slates):
    return ranks_clicks_first(slates, lambda slate: slate.teacher)


def test_a_teacher_that_ranks_the_click_first_nearly_always_is_found():
    n = CLICK_COPY_SLATES
    assert teacher_copies_clicks(labelled(n, n)) == (n, n)
    assert teacher_copies_clicks(labelled(60, 54)) == (54, 60)
    assert teacher_copies_clicks(labelled(60, 53)) is None  # below nine in ten
    assert teacher_copies_clicks(labelled(n - 1, n - 1)) is None  # too few to say
    assert teacher_copies_clicks(labelled(n, n, clicks=2)) is None  # one click only
    unclicked = labelled(n, n)
    for slate in unclicked:
        slate.clicked = None
    assert teacher_copies_clicks(unclicked) is None


def test_training_on_such_labels_says_so(tmp_path, tiny_backbone, caplog):
    write_slates(tmp_path / "train.jsonl", labelled(60, 60))
    for target, says in (("teacher", True), ("clicks", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
            train(train_config(tmp_path, tiny_backbone, out=target, target=target, max_steps=1))
        said = [r.getMessage() for r in caplog.records if "saw these slates' clicks" in
                r.getMessage()]
        message = (f"the teacher ranks the clicked item first in 60 of the 60 slates of the "
                   f"first 1000 of {tmp_path / 'train.jsonl'} that have one click: a teacher "
                   "that saw these slates' clicks (one fitted on them, or labels copied from "
                   "them) teaches the clicks, not its own ranking; label them with a teacher "
                   "that did not")
        # accelerate's logger may put the process's rank before the message
        assert [line.endswith(message) for line in said] == ([True] if says else [])


def test_candidates_listed_click_first_are_said(tmp_path, caplog):
    """make_slates lists the clicked item first: said whatever the target; the same slates
    shuffled are not."""
    import random

    from spdrank.training.train import Trainer

    listed = make_slates(60)
    shuffled = make_slates(60)
    rng = random.Random(0)
    for slate in shuffled:
        rng.shuffle(slate.candidates)
    assert ranks_clicks_first(listed, lambda slate: slate.docids) == (60, 60)
    assert ranks_clicks_first(shuffled, lambda slate: slate.docids) is None
    for name, slates, says in (("listed", listed, True), ("shuffled", shuffled, False)):
        for slate in slates:
            for i, candidate in enumerate(slate.candidates):
                candidate.features = {"pop": float(i % 3)}
        path = tmp_path / f"{name}.jsonl"
        write_slates(path, slates)
        caplog.clear()
        cfg = train_config(tmp_path, "unused", slates=str(path), out=name, target="clicks",
                           features_only=True, features="pop", max_steps=1)
        with caplog.at_level(logging.WARNING, logger="spdrank.training.train"):
            Trainer(cfg)
        said = [r.getMessage() for r in caplog.records if "first candidate listed" in
                r.getMessage()]
        assert len(said) == says, said
        if says:
            assert said[0].endswith(
                f"the clicked item is the first candidate listed in 60 of the 60 slates of the "
                f"first 1000 of {path} that have one click: a student can read the candidates' "
                "order (their numbers in an LLM student's prompt, the given order it may start "
                "from), and so learn where the click is listed, which no first stage tells it "
                "when it serves; list each slate's candidates in its first stage's order, or "
                "shuffled")
