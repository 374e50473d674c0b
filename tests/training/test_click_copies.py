"""A teacher that saw the clicks is said: its labels teach the clicks, not its ranking."""

from __future__ import annotations

import logging

from spdrank.core.slates import write_slates
from spdrank.training.targets import CLICK_COPY_SLATES, teacher_copies_clicks
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
