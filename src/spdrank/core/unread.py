"""Flags a run would not read, said in one line or refused: the one table every command's
check of them goes through.

A flag given and silently ignored leaves its user believing it took effect (``--seed 3`` on
an evaluation with no random ranker, ``--timeout 30`` on a teacher that asks no server). So a
command lists, for each flag that only some runs read, whether this run reads it and what
would make it count; :func:`check_unread` compares each flag with its default and refuses the
first one given for nothing, or says it in one line where the command allows the flag to ride
along (a recipe run with a switch on or off). A flag at its default is never named, so giving
a default changes nothing either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple


class Unread(NamedTuple):
    """One row of a command's table: the setting ``name`` (its flag is ``--name`` with
    dashes), whether this run ``read``\\ s it, ``why`` it would not, whether a flag given for
    nothing is ``refused`` (else said in one line), and whether its value may be ``shown`` in
    the message (an API key is not)."""

    name: str
    read: bool
    why: str
    refused: bool = True
    shown: bool = True


def _given(flag: str, value: Any, shown: bool) -> str:
    if value is True or not shown:
        return flag
    if isinstance(value, (list, tuple)):
        return f"{flag} {' '.join(map(str, value))}"
    return f"{flag} {value}"


def check_unread(settings: Any, defaults: Any, rows: Iterable[Unread],
                 log: logging.Logger) -> None:
    """Refuse (a ``ValueError``), or say on ``log``, each setting of ``rows`` that ``settings``
    gives away from its value in ``defaults`` and this run does not read, with why."""
    for row in rows:
        value = getattr(settings, row.name)
        if row.read or value == getattr(defaults, row.name):
            continue
        given = _given("--" + row.name.replace("_", "-"), value, row.shown)
        if row.refused:
            raise ValueError(f"{given} has no effect here: {row.why}; drop it")
        log.warning("%s has no effect here: %s", given, row.why)
