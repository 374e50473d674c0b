"""The interaction log a build reads: one user a line, items in time order.

:func:`read_sequences` takes ``user item item ...`` lines or a RecBole ``.inter`` file
(recognised by its ``name:type`` header line, :mod:`spdrank.datasets.recbole`) into one
:class:`InteractionLog`, so what comes after (splits, negatives, features) never depends on
the file's format. Empty lines and users with fewer than 2 items are skipped and counted (a
leave-one-out slate needs a target and at least one item before it); a user on two lines, or
a ``name:type`` header field anywhere but an atomic file's first line, is an error naming
``file:line``. A first line of column names (``user_id item_ids``, as a pandas export writes)
is skipped with a warning naming it (:func:`is_column_header`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from spdrank.core.slates import SlateError
from spdrank.datasets import recbole
from spdrank.datasets.lines import first_line, numbered_lines, user_lines

logger = logging.getLogger(__name__)

#: Column names a sequences file's header line gives its user field and its item fields
#: (lower case). Read as data, such a header is a user named ``user_id`` with one item
#: ``item_ids``, an item every negative sampler can then draw.
USER_COLUMNS = frozenset({"user", "user_id", "userid", "uid", "session", "session_id"})
ITEM_COLUMNS = frozenset({
    "item", "items", "item_id", "item_ids", "itemid", "iid", "item_id_list", "sequence",
    "history",
})


@dataclass
class InteractionLog:
    """Parsed sequences: the users that make a slate, and the statistics of the whole log."""

    source: str
    #: ``(user, items)`` of every user with at least 2 items, in input order.
    users: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Interactions per item over every user line (short users included).
    item_counts: dict[str, int] = field(default_factory=dict)
    lines: int = 0
    empty_lines: int = 0
    #: Users skipped for having fewer than 2 items.
    short_users: int = 0

    @property
    def interactions(self) -> int:
        return sum(self.item_counts.values())


def parse_sequences(lines: Iterable[tuple[int, str]], source: str) -> InteractionLog:
    """Parse numbered ``user item item ...`` lines (``source`` names them in errors)."""
    out = InteractionLog(source=source)
    return _collect(out, _sequence_rows(lines, source, out))


def is_column_header(fields: list[str]) -> bool:
    """Whether a line's ``fields`` name columns rather than give a user and items: a user
    column name then one or more item column names (:data:`USER_COLUMNS`,
    :data:`ITEM_COLUMNS`, any case).

    Only a file's first line is asked, and only these names match, so that a line of ids is
    always read as data: nothing is guessed from what the line holds otherwise.
    """
    return (
        len(fields) >= 2
        and fields[0].lower() in USER_COLUMNS
        and all(f.lower() in ITEM_COLUMNS for f in fields[1:])
    )


def _without_header(
    lines: Iterable[tuple[int, str]], source: str, out: InteractionLog
) -> Iterator[tuple[int, str]]:
    """``lines`` less a first non-blank line of column names (:func:`is_column_header`),
    which is counted as read and named in a warning.

    Dropped before the users are read, so its user field is never taken for a user (a later
    user ``user`` is no duplicate of it).
    """
    lines = iter(lines)
    for lineno, text in lines:
        fields = text.split()
        if fields and is_column_header(fields):
            out.lines += 1
            logger.warning(
                "%s:%d: skipped %r: its fields are column names (a header line), not a user "
                "and its items", source, lineno, text.strip(),
            )
        else:
            yield lineno, text
        if fields:
            break
    yield from lines


def _sequence_rows(
    lines: Iterable[tuple[int, str]], source: str, out: InteractionLog
) -> Iterator[tuple[str, list[str]]]:
    """``(user, items)`` per non-blank line; ``out`` counts the lines and the blank ones.

    A line that cannot be a user is an error naming it: a user seen before, or a RecBole
    header field (``user_id:token``), which means an atomic file whose header is not its first
    line (a header first is read as one: :func:`read_sequences`).
    """
    for fields, _, where in user_lines(_without_header(lines, source, out), source, out):
        header = next((f for f in fields if recbole.is_header_field(f)), None)
        if header is not None:
            raise SlateError(
                f"{header!r} is a RecBole header field (name:type), not a user or an item: "
                "an atomic file's header must be its first line",
                where,
            )
        yield fields[0], fields[1:]


def _collect(out: InteractionLog, rows: Iterable[tuple[str, list[str]]]) -> InteractionLog:
    """Count every row's items into ``out``; keep the users with 2+ items, count the rest."""
    counts: dict[str, int] = {}
    for user, items in rows:
        for item in items:
            counts[item] = counts.get(item, 0) + 1
        if len(items) < 2:
            out.short_users += 1
            continue
        out.users.append((user, items))
    out.item_counts = counts
    return out


def read_sequences(path: str | os.PathLike[str]) -> InteractionLog:
    """Read a log: ``user item item ...`` lines in time order, or a RecBole ``.inter`` file
    (recognised by its ``name:type`` header, :mod:`spdrank.datasets.recbole`)."""
    path = Path(path)
    first, lines = first_line(numbered_lines(path))
    if first is None or recbole.header_names(first) is None:
        return parse_sequences(lines, str(path))
    atomic = recbole.read_inter(lines, str(path))
    out = InteractionLog(source=str(path), lines=atomic.lines, empty_lines=atomic.empty_lines)
    return _collect(out, atomic.users)
