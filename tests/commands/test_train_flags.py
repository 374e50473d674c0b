"""``spdrank train``'s flags are generated from :class:`TrainConfig`: each field's help and
choices are written once, on the field, and the parsed flags rebuild the settings exactly."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from spdrank.commands.cli import build_parser
from spdrank.commands.train import config_argv, config_from_args
from spdrank.core.defaults import HISTORY_READOUT, OTHER_READOUT
from spdrank.core.flags import flag_choices, flag_help, is_flag
from spdrank.methods.base import methods
from spdrank.training.config import TrainConfig

FIELDS = dataclasses.fields(TrainConfig)


def train_parser() -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["train"]


def flag_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in train_parser()._actions}


def test_every_field_is_declared_with_its_help_choices_and_flag():
    for f in FIELDS:
        assert set(f.metadata) >= {"help", "choices", "flag"}, f"{f.name} is not a setting()"
        assert isinstance(flag_help(f), str), f.name


def test_no_two_fields_share_a_help():
    helps = [flag_help(f) for f in FIELDS if flag_help(f)]
    assert len(helps) == len(set(helps))


def test_each_flag_says_its_fields_help_and_takes_its_fields_choices():
    actions = flag_actions()
    method_helps = "; ".join(method.help for method in methods())
    for f in FIELDS:
        if not is_flag(f):
            assert f.name not in actions and f"no_{f.name}" not in actions
            continue
        action = actions.get(f.name) or actions[f"no_{f.name}"]
        if f.name == "head":
            assert action.help == f"{method_helps} {flag_help(f)}"
            continue
        assert action.help.startswith(flag_help(f)), f.name
        if flag_choices(f) is not None:
            assert action.choices == flag_choices(f), f.name
        if f.default not in (None, True, False, dataclasses.MISSING):
            assert action.help.endswith(f"(default: {f.default})"), f.name


def test_the_flags_a_config_gives_parse_back_to_it():
    cfg = TrainConfig(
        slates="s.jsonl", out="-o", head="linear", frozen=True, lr=3e-5, limit=7,
        cache_states="c", cache_dtype="float32", position_weights="dcg", progress=False,
    )
    argv = config_argv(cfg)
    assert "--no-progress" in argv and "--out=-o" in argv and "--position-weights=dcg" in argv
    assert config_from_args(train_parser().parse_args(argv)) == cfg
    assert config_from_args(train_parser().parse_args(["--slates", "s", "--out", "o"])).progress


@pytest.mark.parametrize(("head", "readout", "history_items"), [
    ("history", HISTORY_READOUT, True),
    ("attn", OTHER_READOUT, False),
    ("scalar", OTHER_READOUT, False),
])
def test_the_readout_and_prompt_follow_whether_the_methods_head_reads_the_history(
    head, readout, history_items
):
    cfg = TrainConfig(slates="s.jsonl", out="o", head=head)
    assert cfg.readout == readout
    assert cfg.model_config().prompt.history_items is history_items


def test_a_record_with_a_head_no_method_serves_still_loads():
    assert TrainConfig(slates="s.jsonl", out="o", head="retired").readout == OTHER_READOUT


def test_a_method_s_settings_are_train_flags_and_fill_its_record():
    from spdrank.methods.spd.method import SPDSettings

    cfg = config_from_args(train_parser().parse_args(
        ["--slates", "s", "--out", "o", "--tau", "0.25", "--match", "maxsim"]))
    assert SPDSettings.of(cfg) == SPDSettings(tau=0.25, match="maxsim")
    assert cfg.model_config().head.history.match == "maxsim"
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--slates", "s", "--out", "o", "--tau", "0"])


def test_a_method_s_settings_that_another_record_names_are_refused():
    import dataclasses

    from spdrank.core.flags import setting
    from spdrank.methods.base import MethodSettings, register, unregister
    from spdrank.methods.scalar.method import ScalarMethod
    from spdrank.training.config import method_records

    @dataclasses.dataclass(kw_only=True)
    class Clash(MethodSettings):
        lr: float = setting(0.1, help="a learning rate of its own")

    class Clashing(ScalarMethod):
        name, kinds, settings = "clash", ("clash",), Clash

    method = register(Clashing())
    try:
        with pytest.raises(ValueError, match="settings field 'lr' of Clash is already training's"):
            method_records()
    finally:
        unregister(method)
    assert method_records()  # the built-in records again


#: Counts a run reads as steps or slates, each given one below its least value: a negative
#: warm-up or a run of -3 steps once trained as if it were meant.
BELOW_THEIR_LEAST = [
    ("limit", 0), ("max_steps", 0), ("batch_size", 0), ("warmup_steps", -1),
    ("eval_every", -1), ("eval_limit", 0), ("save_every", -1), ("cache_batch_size", 0),
    ("stop_after", 0), ("sinkhorn_iters", 0),
]


@pytest.mark.parametrize(("name", "value"), BELOW_THEIR_LEAST)
def test_a_count_below_its_least_is_refused_by_its_flag_and_by_the_settings(name, value, capsys):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["train", "--slates", "s.jsonl", "--out", "r", flag, str(value)])
    assert exited.value.code == 2
    assert f"argument {flag}: must be at least {value + 1}, got {value}" in capsys.readouterr().err
    # Settings built in Python are held to the same range when a run checks them.
    with pytest.raises(ValueError, match=f"^{flag} must be at least {value + 1}, got {value}$"):
        TrainConfig(slates="s.jsonl", out="r", **{name: value}).check()
    given = {"eval_slates": "e.jsonl"} if name == "eval_limit" else {}  # what it would cut
    TrainConfig(slates="s.jsonl", out="r", **given, **{name: value + 1}).check()
