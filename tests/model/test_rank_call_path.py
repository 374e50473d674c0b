"""One ranking call stays readable: ``SPDRanker.rank_batch`` enters few of spdrank's files and
hands work to its ranking method at most twice (the head, then the decoding), so what happens
to a slate can be read in a few files rather than followed through a dozen.

The files counted are the steps of the call: the model, the backbone's prompt, batch, prefill
and readout, the method's head and decoding. ``core/`` is left out of the count (it is listed
in the message): it is the vocabulary every layer speaks (a slate's length and texts, the stage
clock), read like the standard library rather than followed as a step."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

import spdrank
from spdrank.model.ranker import SPDRanker
from tests.helpers import make_slate, tiny_config

PACKAGE = Path(spdrank.__file__).resolve().parent
MODEL = PACKAGE / "model"
METHODS = PACKAGE / "methods"
CORE = PACKAGE / "core"

#: The most spdrank source files outside ``core/`` one ranking call may enter.
MOST_FILES = 8
#: The most times model code may hand work to the method's code in one ranking call.
MOST_ROUND_TRIPS = 2


def _package_file(frame: FrameType) -> Path | None:
    """The spdrank source file ``frame`` runs, or None for any other code."""
    path = Path(frame.f_code.co_filename)
    return path if path.is_relative_to(PACKAGE) else None


def _caller_file(frame: FrameType) -> Path | None:
    """The spdrank file of the nearest spdrank frame below ``frame``: the code that called it,
    through any library in between (torch's ``Module.__call__`` for a head)."""
    caller = frame.f_back
    while caller is not None:
        path = _package_file(caller)
        if path is not None:
            return path
        caller = caller.f_back
    return None


def trace(call: Callable[[], Any]) -> tuple[set[Path], list[str]]:
    """The spdrank files ``call`` enters, and each call from model code into methods code
    (the callee's ``file:function``)."""
    files: set[Path] = set()
    handoffs: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = _package_file(frame)
        if path is None:
            return
        files.add(path)
        caller = _caller_file(frame)
        if path.is_relative_to(METHODS) and caller is not None and caller.is_relative_to(MODEL):
            handoffs.append(f"{path.relative_to(PACKAGE)}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files, handoffs


@pytest.mark.parametrize("frozen", [False, True])
def test_rank_batch_enters_few_files_and_hands_work_to_the_method_twice(tiny_backbone, frozen):
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone, frozen=frozen))
    model.eval()
    rng = random.Random(0)
    slates = [make_slate(rng, n, qid=f"u{n}") for n in (4, 7, 5)]
    model.rank_batch(slates)  # first call: lazy imports and caches, not the call's path

    files, handoffs = trace(lambda: model.rank_batch(slates))

    steps = [p for p in files if not p.is_relative_to(CORE)]
    names = sorted(str(p.relative_to(PACKAGE)) for p in files)
    assert len(steps) <= MOST_FILES, (
        f"rank_batch entered {len(steps)} files outside core/ ({len(files)} in all): {names}"
    )
    assert len(handoffs) <= MOST_ROUND_TRIPS, (
        f"model code called methods code {len(handoffs)} times: {handoffs}"
    )
