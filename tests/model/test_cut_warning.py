"""Texts cut to the token budget, told to Python callers: ``rank`` and ``rank_batch`` warn once
a call (a :class:`TruncationWarning` at the caller's line, naming the count and the budget),
as ``spdrank rank`` prints its summary line; spdrank's own callers, which report cuts their
own way (the server's ``truncated_documents``), are not warned."""

from __future__ import annotations

import warnings

import pytest
import torch

from spdrank.core.slates import Candidate, Query, Slate
from spdrank.model.ranker import SPDRanker, TruncationWarning
from tests.helpers import tiny_config

LONG = "extra virgin organic argan oil for dry hair and skin, cold pressed"


@pytest.fixture(scope="module")
def model(tiny_backbone) -> SPDRanker:
    """A tiny model reading 4 tokens of each candidate and 64 of the user context."""
    torch.manual_seed(0)
    return SPDRanker.build(tiny_config(tiny_backbone, positions=8, item_tokens=4,
                                      query_tokens=64, frozen=True))


def _slate(qid: str, titles: list[str], query: str = "1. rose shampoo") -> Slate:
    return Slate(Query(qid, query), [Candidate(f"d{i}", {"title": t}) for i, t in enumerate(titles)])


def _cut_warnings(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, TruncationWarning)]


def test_rank_warns_once_at_the_callers_line_naming_the_count_and_the_budget(model):
    (warned,) = _cut_warnings(lambda: model.rank("1. rose", [LONG, "gel", LONG, "soap"]))
    assert str(warned.message).startswith(
        "2 of 4 candidates were cut to the token budget (config.prompt.max_item_tokens = 4 "
        "tokens each)")
    assert warned.filename == __file__ and issubclass(warned.category, UserWarning)


def test_rank_batch_warns_once_for_the_whole_call_and_names_a_cut_query(model):
    slates = [_slate("a", [LONG, "gel"]), _slate("b", ["soap", LONG, LONG], "rose " * 200)]
    (warned,) = _cut_warnings(lambda: model.rank_batch(slates))
    said = str(warned.message)
    assert said.startswith("3 of 5 candidates were cut to the token budget")
    assert ("1 of 2 user contexts were cut to their last 64 tokens "
            "(config.prompt.max_query_tokens)") in said


def test_a_call_that_cuts_nothing_warns_nothing(model):
    assert _cut_warnings(lambda: model.rank("1. rose", ["gel", "soap"])) == []


def test_the_server_reports_cuts_in_its_reply_and_is_not_warned(model):
    """It encodes the prompts itself (their flags become ``truncated_documents``) and hands
    them to ``rank_batch``, so the cuts are its to report."""
    from spdrank.serving.engine import Engine

    engine = Engine(model, "tiny-spd")
    admitted = engine.check(_slate("a", ["gel", LONG, "soap"]))
    ranked = []
    assert _cut_warnings(lambda: ranked.extend(engine.rank([admitted]))) == []
    assert ranked[0].truncated == [False, True, False]


def test_spdrank_rank_prints_its_summary_line_and_is_not_warned(model, tmp_path, capsys):
    from spdrank.commands.cli import main
    from spdrank.core.slates import write_slates

    model.save_pretrained(tmp_path / "m")
    write_slates(tmp_path / "in.jsonl", [_slate("a", [LONG, "gel"])])
    args = ["rank", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl")]
    assert _cut_warnings(lambda: main(args)) == []
    assert "cut to the token budget: 1 of 2 candidates (at 4 tokens)" in capsys.readouterr().out
