"""Settings fields that carry their command-line flag: its help, the values it may take and, for
a number, its range, kept with the field so that each is written once.

``spdrank train`` generates one flag per field of its settings record
(:class:`spdrank.training.config.TrainConfig`): training's own fields and those of each
registered ranking method's settings record (:attr:`spdrank.methods.base.RankingMethod.settings`),
each declared with :func:`setting`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, Field, field
from typing import Any


def setting(
    default: Any = MISSING, *, help: str, choices: Sequence[str] | None = None,
    bounds: dict[str, float] | None = None,
) -> Any:
    """A settings field with its flag's ``help``, the values the flag may take (``choices``)
    and, for a number, its range (``bounds``, as :func:`spdrank.commands.argtypes.float_in`
    takes it: ``low``, ``above``, ``below``; an integer's is its ``low``), which the flag and
    :func:`bound_problem` hold a value to.

    The command adds ``(default: ...)`` to a help itself, for a default other than None (a
    None default means "decided later", and its help says how). A flag's name is the field's
    (``--max-steps``); a bool that defaults to True is the flag ``--no-NAME``, and its help is
    that flag's. An empty help: the flag's name and its default say what it does.
    """
    return field(default=default, metadata=flag_metadata(help, choices, bounds=bounds))


def flag_metadata(
    help: str, choices: Sequence[str] | None = None, flag: bool = True,
    bounds: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A field's ``metadata``: its flag's help, choices and bounds, and whether it has a flag."""
    return {"help": help, "choices": None if choices is None else list(choices), "flag": flag,
            "bounds": dict(bounds or {})}


def flag_help(f: Field[Any]) -> str:
    """The help of the flag of settings field ``f``."""
    return f.metadata["help"]


def flag_choices(f: Field[Any]) -> list[str] | None:
    """The values the flag of settings field ``f`` may take; None: any."""
    return f.metadata["choices"]


def flag_bounds(f: Field[Any]) -> dict[str, float]:
    """The range of the number flag of settings field ``f``; empty: any finite number."""
    return f.metadata.get("bounds", {})


def bound_problem(f: Field[Any], value: Any) -> str | None:
    """Why ``value`` lies outside the range settings field ``f`` declares, naming its flag;
    None when it is inside (or is None: decided later). What the flag refuses, for settings
    built in Python rather than parsed: a number of the wrong kind (``batch_size="4"``,
    ``batch_size=2.0``) or not finite (``head_lr=nan``) too, which the flag's parser refuses."""
    flag = f"--{f.name.replace('_', '-')}"
    default = f.default
    if value is None or isinstance(value, bool) or isinstance(default, bool):
        return None
    if isinstance(default, int) and not isinstance(value, int):
        return f"{flag} must be an integer, got {value!r}"
    if isinstance(default, float) and not isinstance(value, int | float):
        return f"{flag} must be a number, got {value!r}"
    if not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{flag} must be a finite number, got {value}"
    problem = range_problem(value, **flag_bounds(f))
    return None if problem is None else f"{flag} {problem}"


def range_problem(
    value: float, *, low: float | None = None, high: float | None = None,
    above: float | None = None, below: float | None = None,
) -> str | None:
    """Why ``value`` lies outside a range (at least ``low``, at most ``high``, strictly above
    ``above``, strictly below ``below``, each when given), as ``must be at least 1, got 0``;
    None when it is inside. The one wording of a refused number, for a flag parsed and for a
    setting built in Python."""
    for bound, outside, words in (
        (low, lambda b: value < b, "at least"), (above, lambda b: value <= b, "above"),
        (high, lambda b: value > b, "at most"), (below, lambda b: value >= b, "below"),
    ):
        if bound is not None and outside(bound):
            return f"must be {words} {_shown(bound)}, got {_shown(value)}"
    return None


def _shown(number: float) -> str:
    """A number as a message shows it: an integer with thousands separators, a float short."""
    return f"{number:,}" if isinstance(number, int) else f"{number:g}"


def is_flag(f: Field[Any]) -> bool:
    """Whether settings field ``f`` has a flag."""
    return f.metadata.get("flag", False)
