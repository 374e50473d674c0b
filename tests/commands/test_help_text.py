"""``spdrank --help`` and every sub-command's help read as plain text, and ``spdrank train``'s
fifty-odd flags come in TrainConfig's own sections."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re

from spdrank.commands.cli import build_parser
from spdrank.commands.train import SECTIONS
from spdrank.core.flags import is_flag
from spdrank.methods.spd.method import SPDSettings
from spdrank.training.config import TrainConfig, TrainingSettings

REST = re.compile(r"``|:[a-z]+:`")


def parsers(parser: argparse.ArgumentParser, path: str = "spdrank"):
    """``parser`` and every sub-command's, with the command line that reaches each."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_no_help_or_description_holds_rest_markup():
    texts = []
    for path, parser in parsers(build_parser()):
        texts.append((path, parser.description or ""))
        texts += [(f"{path} {action.option_strings or action.dest}", action.help or "")
                  for action in parser._actions]
    assert len({path for path, _ in texts}) > 50  # every command's flags were read
    assert [(where, text) for where, text in texts if REST.search(text)] == []


def test_no_description_joins_an_example_s_lines():
    """A backslash ending a line of a docstring that is not raw joins the next line to it:
    an example command continued with ``\\`` must show its backslash and its line break."""
    joined = re.compile(r"\S {5,}\S")  # a line's end, the next line's indent, run together
    found = [(path, line) for path, parser in parsers(build_parser())
             for line in (parser.description or "").splitlines() if joined.search(line)]
    assert found == []


def test_train_help_groups_are_trainconfig_s_sections_in_its_order():
    (train,) = [p for path, p in parsers(build_parser()) if path == "spdrank train"]
    groups = {g.title: [a.dest for a in g._group_actions] for g in train._action_groups}
    titles = [title for title, _ in SECTIONS]
    assert [t for t in groups if t in titles] == titles
    grouped = [dest for title in titles for dest in groups[title]]
    flags = [f.name for f in dataclasses.fields(TrainingSettings) if is_flag(f)]
    # every setting in one section, in TrainConfig's order, the non-settings with the runtime
    assert [d for d in grouped if d in flags or d.removeprefix("no_") in flags] == [
        ("no_" + f if getattr(TrainConfig, f, None) is True else f) for f in flags
    ]
    assert groups["runtime"][-2:] == ["trust_remote_code", "num_processes"]
    for title, first in SECTIONS:
        assert groups[title][0].removeprefix("no_") == first
    # each registered method's own settings in a group of their own, after training's
    spd = [title for title in groups if title.startswith("SPD settings")]
    assert spd == ["SPD settings (--head attn, linear, history)"]
    assert groups[spd[0]] == [f.name for f in dataclasses.fields(SPDSettings)]
    assert list(groups).index(spd[0]) > list(groups).index("runtime")


def test_the_sections_are_the_ones_trainconfig_s_source_names():
    source = inspect.getsource(TrainingSettings)
    written = [re.sub(r"\s*\(.*\)$", "", m) for m in re.findall(r"# -- (.+?) -{3,}", source)]
    assert written == [title for title, _ in SECTIONS]
