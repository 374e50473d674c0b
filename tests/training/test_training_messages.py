"""What training says about itself, checked against what it did: the warm-up line's reason,
and the token-budget cuts of a run whose states come from a state cache."""

from __future__ import annotations

import logging

from spdrank.model.ranker import SPDRanker
from spdrank.training.train import train, warmup_note, warmup_steps
from tests.helpers import train_config


def test_the_warmup_line_gives_the_reason_that_holds():
    # 126 steps: 20 would end well before the run; it is cut to a tenth all the same.
    level, line = warmup_note(None, warmup_steps(None, 126), 126)
    assert level == logging.INFO
    assert line.startswith("warming up over 13 steps, 10% of this run's 126 (the default of 20 "
                           "steps is cut to 10% of a run, so that most of it trains at the full "
                           "learning rate)")
    assert "would not end" not in line
    # 16 steps: there the default would outlast the run, and the line says so.
    level, line = warmup_note(None, warmup_steps(None, 16), 16)
    assert "warming up over 2 steps" in line
    assert "(the default 20 would not end before the run does)" in line
    # A run of 200 or more warms up over the default and says nothing; an asked warm-up the
    # run never finishes is a warning.
    assert warmup_note(None, warmup_steps(None, 400), 400) is None
    level, line = warmup_note(30, 30, 16)
    assert level == logging.WARNING and line.startswith("--warmup-steps 30 is not below")


def test_a_run_reading_a_state_cache_reports_what_the_cache_cut(
    tmp_path, tiny_backbone, train_file, slates, caplog
):
    """The cut counts are those of the cached slates' prompts, once each, whether this run
    computed the states or an earlier one did: not the one prompt a run encodes to check the
    cache's key."""
    settings = {"frozen": True, "cache_states": str(tmp_path / "cache"), "max_item_tokens": 3,
                "max_steps": 1}
    with caplog.at_level(logging.INFO):
        built = train(train_config(tmp_path, tiny_backbone, out="built", **settings))
        reused = train(train_config(tmp_path, tiny_backbone, out="reused", **settings))
    model = SPDRanker.from_pretrained(tmp_path / "built")
    encoded = [model.encode(slate) for slate in slates]
    honest = {"candidates": sum(sum(e.truncated) for e in encoded),
              "of_candidates": sum(len(s) for s in slates),
              "queries": sum(bool(e.query_truncated) for e in encoded), "of_queries": len(slates),
              "max_item_tokens": 3}
    assert honest["candidates"] > 0
    assert built["cut"] == reused["cut"] == honest
    lines = [r.getMessage().removeprefix("[RANK 0] ") for r in caplog.records
             if "cut to the token budget" in r.getMessage()]
    assert len(lines) == 2 and lines[0] == lines[1]
    assert lines[0].startswith("in the 8 cached slates' prompts, cut to the token budget: "
                               f"{honest['candidates']} of {honest['of_candidates']} candidates "
                               "(at 3 tokens)")
