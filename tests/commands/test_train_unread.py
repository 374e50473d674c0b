"""``spdrank train``'s flags a run never reads, said in one line as LoRA's under --frozen are;
a learning rate of 0 for every part that trains refused."""

from __future__ import annotations

import logging

import pytest

from spdrank.training.config import TrainConfig

FEATURES_ONLY = {"features_only": True, "features": "pop"}


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]


@pytest.mark.parametrize("settings,message", [
    ({**FEATURES_ONLY, "lr": 1e-3},
     ("--lr 0.001 has no effect here: --frozen and --features-only train no LoRA (--head-lr is "
     "the head's rate)")),
    ({"frozen": True, "lr": 1e-3}, "--lr 0.001 has no effect here"),
    ({"eval_every": 50},
     ("--eval-every 50 has no effect here: it evaluates on --eval-slates or --holdout, and "
     "neither is given")),
    ({**FEATURES_ONLY, "backbone": "gemma3-270m"},
     "--backbone gemma3-270m has no effect here: --features-only reads no backbone"),
    ({**FEATURES_ONLY, "layers": 2}, "--layers 2 has no effect here"),
    ({**FEATURES_ONLY, "readout": "last"}, "--readout last has no effect here"),
    ({**FEATURES_ONLY, "dtype": "bfloat16"}, "--dtype bfloat16 has no effect here"),
])
def test_a_flag_the_run_never_reads_is_said_in_one_line(caplog, settings, message):
    with caplog.at_level(logging.WARNING):
        TrainConfig(slates="s.jsonl", out="run", **settings).check()
    (line,) = said(caplog)
    assert line.startswith(message), line


@pytest.mark.parametrize("settings", [
    FEATURES_ONLY, {"lr": 1e-3}, {"eval_slates": "v.jsonl", "eval_every": 50},
    {"holdout": 10.0, "eval_every": 50}, {"backbone": "gemma3-270m", "layers": 2,
                                         "readout": "mean", "dtype": "bfloat16"},
    {"head": "history"}, {**FEATURES_ONLY, "head": "history"},
])
def test_flags_the_run_reads_or_leaves_at_their_defaults_are_not_named(caplog, settings):
    with caplog.at_level(logging.WARNING):
        TrainConfig(slates="s.jsonl", out="run", **settings).check()
    assert said(caplog) == []


@pytest.mark.parametrize("settings,message", [
    ({**FEATURES_ONLY, "head_lr": 0.0}, "--head-lr 0 (the head is all that trains"),
    ({"frozen": True, "head_lr": 0.0}, "--head-lr 0 (the head is all that trains"),
    ({"head_lr": 0.0, "lr": 0.0}, "--head-lr 0 and --lr 0: no weight would change"),
])
def test_a_zero_rate_for_every_part_that_trains_is_refused(settings, message):
    with pytest.raises(ValueError, match="no weight would change") as info:
        TrainConfig(slates="s.jsonl", out="run", **settings).check()
    assert message in str(info.value)


def test_a_zero_rate_beside_a_part_that_trains_passes():
    TrainConfig(slates="s.jsonl", out="run", head_lr=0.0).check()  # LoRA still trains
    TrainConfig(slates="s.jsonl", out="run", lr=0.0).check()


def test_settings_built_in_python_are_held_to_what_their_flags_parse():
    """A flag's parser refuses a wrong kind of number and a non-finite one; a TrainConfig
    built in Python is held to the same by check(), before anything trains or is saved."""
    for settings, said in (({"head_lr": float("nan")}, "--head-lr must be a finite number"),
                           ({"batch_size": "4"}, "--batch-size must be an integer, got '4'"),
                           ({"batch_size": 2.0}, "--batch-size must be an integer, got 2.0"),
                           ({"max_item_tokens": 0}, "--max-item-tokens must be at least 1"),
                           ({"head_layers": 0}, "--head-layers must be at least 1")):
        with pytest.raises(ValueError, match=said):
            TrainConfig(slates="s.jsonl", out="run", **settings).check()
