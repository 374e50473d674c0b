"""Every number a flag takes is checked where it is parsed: a float option refuses ``nan``,
``inf`` and ``1e999`` and a value out of its range as a usage error naming the flag, not a
traceback or a failure far from it (``train --holdout inf`` in the holdout split, ``eval
--bootstrap`` after every slate was ranked)."""

from __future__ import annotations

import argparse
import re

import pytest

from spdrank.commands.cli import build_parser, main


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings:
            yield " ".join(path), action


def _takes_floats(action: argparse.Action) -> bool:
    if action.type is None or action.type in (str, int):
        return False
    if action.type is float:
        return True
    try:
        return isinstance(action.type("0.5"), float)
    except (argparse.ArgumentTypeError, ValueError):
        return isinstance(_try(action.type, "5"), float)


def _try(parse, text):
    try:
        return parse(text)
    except (argparse.ArgumentTypeError, ValueError):
        return None


FLOAT_OPTIONS = [(cmd, action) for cmd, action in _options(build_parser())
                 if _takes_floats(action)]


def test_the_audit_finds_the_float_options():
    found = {(cmd, action.option_strings[0]) for cmd, action in FLOAT_OPTIONS}
    assert {("train", "--holdout"), ("train", "--lr"), ("data queries", "--timeout"),
            ("teacher", "--timeout"), ("serve", "--max-wait-ms")} <= found


@pytest.mark.parametrize(("cmd", "action"), FLOAT_OPTIONS,
                         ids=[f"{c}{a.option_strings[0]}" for c, a in FLOAT_OPTIONS])
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999"])
def test_every_float_option_refuses_a_number_that_is_not_finite(cmd, action, text):
    if action.type is float:  # serve's knobs: checked by settings_from_args, tested there
        assert cmd == "serve", f"{cmd} {action.option_strings[0]} is parsed by float()"
        return
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        action.type(text)


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "--holdout", "inf"], "argument --holdout: must be a finite number"),
    (["train", "--holdout", "1e999"], "argument --holdout: must be a finite number"),
    (["train", "--holdout", "nan"], "argument --holdout: must be a finite number"),
    (["train", "--holdout", "2.5"], "argument --holdout: is a number of queries or a share"),
    (["train", "--holdout", "0"], "argument --holdout: is a number of queries or a share"),
    (["train", "--lr", "nan"], "argument --lr: must be a finite number"),
    (["train", "--head-dropout", "1"], "argument --head-dropout: must be below 1"),
    (["train", "--tau", "0"], "argument --tau: must be above 0"),
    (["eval", "--bootstrap", "100000000000"], "argument --bootstrap: must be at most 1,000,000"),
    (["bench", "--bootstrap", "100000000000"], "argument --bootstrap: must be at most"),
    (["data", "queries", "--timeout", "nan"], "argument --timeout: must be a finite number"),
    (["data", "queries", "--timeout", "0"], "argument --timeout: must be above 0"),
    (["teacher", "--timeout", "inf"], "argument --timeout: must be a finite number"),
    (["teacher", "--retry-backoff", "-1"], "argument --retry-backoff: must be at least 0"),
    (["teacher", "--retries", "-1"], "argument --retries: must be at least 0"),
    (["teacher", "--max-failures", "-1"], "argument --max-failures: must be at least 0"),
    (["eval", "--warmup", "-1"], "argument --warmup: must be at least 0"),
    (["bench", "--warmup", "-1"], "argument --warmup: must be at least 0"),
    (["serve", "--model", "m", "--served-model-name", ""],
     "argument --served-model-name: a model name is empty"),
    (["serve", "--model", "m", "--served-model-name", "a\u202eb"],
     "argument --served-model-name: a model name holds a control or format character"),
])
def test_a_bad_number_is_a_usage_error_naming_its_flag(argv, said, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err, err
    assert "Traceback" not in err


def test_the_holdout_split_refuses_what_the_flag_refuses():
    from spdrank.training.holdout import held_out_count

    for value in (float("inf"), float("nan"), 2.5, 0.0):
        with pytest.raises(ValueError, match="--holdout is a number of queries"):
            held_out_count(value, 10)
    assert held_out_count(3.0, 10) == 3 and held_out_count(0.2, 10) == 2


def test_the_bootstrap_refuses_more_resamples_than_its_bound():
    import numpy as np

    from spdrank.eval.paired import MAX_RESAMPLES, bootstrap_interval

    with pytest.raises(ValueError, match="resamples must be between 1 and"):
        bootstrap_interval(np.ones(4), MAX_RESAMPLES + 1)


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--header-timeout", "1e300", "--header-timeout must be at most 86400, got 1e+300"),
    ("--max-wait-ms", "1e9", "--max-wait-ms must be at most 60,000"),
    ("--keep-alive-timeout", "nan", "--keep-alive-timeout must be a finite number"),
])
def test_serve_knobs_are_held_to_their_range(flag, value, said):
    from spdrank.commands.serve import settings_from_args

    args = build_parser().parse_args(["serve", "--model", "m", flag, value])
    with pytest.raises(ValueError, match=re.escape(said)):
        settings_from_args(args)
