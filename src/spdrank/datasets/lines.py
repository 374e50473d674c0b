"""Numbered lines of the text inputs a build reads (logs, titles, candidate lists).

Every reader of a build's inputs goes through here, and through it the one input reader
(:func:`spdrank.core.inputs.input_lines`), so each of them reports a bad byte, an endless
line, a repeated user or a misplaced header the same way: a :class:`SlateError` naming
``file:line``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from spdrank.core.inputs import input_lines
from spdrank.core.slates import SlateError
from spdrank.core.validation import check_id


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a UTF-8 text file (a BOM is dropped), with errors naming file:line."""
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    for line in input_lines(path, "text file"):
        yield line.number, line.text


def first_line(
    lines: Iterator[tuple[int, str]],
) -> tuple[str | None, Iterator[tuple[int, str]]]:
    """The first non-blank line's text (None if there is none), and all the lines again.

    A reader looks at it to tell the file's format (a RecBole header, a TSV header) before
    reading the lines as that format.
    """
    held: list[tuple[int, str]] = []
    for numbered in lines:
        held.append(numbered)
        if numbered[1].strip():
            return numbered[1], itertools.chain(held, lines)
    return None, iter(held)


class LineCounts(Protocol):
    """What a reader counts of its file's lines."""

    lines: int
    empty_lines: int


def user_lines(
    lines: Iterable[tuple[int, str]], source: str, counts: LineCounts
) -> Iterator[tuple[list[str], int, str]]:
    """The fields of each non-blank ``user token token ...`` line, with its number and where
    it is (``source:line``); ``counts`` counts every line and the blank ones.

    A user's second line is a SlateError naming the first: a user's items, or list, must be
    on one line. So is a field that cannot be an id (a control or format character such as a
    zero-width space: :func:`spdrank.core.validation.id_problem`), which every reader of the
    slates written from it would refuse.
    """
    seen: dict[str, int] = {}
    for lineno, line in lines:
        counts.lines += 1
        fields = line.split()
        if not fields:
            counts.empty_lines += 1
            continue
        where = f"{source}:{lineno}"
        for i, token in enumerate(fields):
            check_id(token, "user" if i == 0 else f"field {i + 1}", where)
        user = fields[0]
        if user in seen:
            raise SlateError(
                f"duplicate user {user!r} (first seen at line {seen[user]}): "
                "each user must be on one line",
                where,
            )
        seen[user] = lineno
        yield fields, lineno, where
