"""RecBole atomic files: an ``.inter`` log and an ``.item`` table, in the builder's terms.

RecBole keeps a dataset as tab-separated "atomic files" whose first line names every column
as ``name:type`` (``user_id:token``, ``timestamp:float``, ``title:token_seq``). The sequences
builder reads them beside its own forms, recognising such a file by that header:

- ``.inter``: one interaction a line (``user_id``, ``item_id``, optionally ``timestamp``),
  grouped into one sequence per user in the order of their first line, ordered by
  ``timestamp`` when the file has one (equal times keep the file's order), else by line.
  RecBole's sequential form (``item_id_list:token_seq`` holding the history, space-separated,
  and ``item_id`` the next item) is read too; a user on several such lines (one line per
  prefix) keeps the longest sequence. Other columns (ratings, labels) are ignored.
- ``.item``: ``item_id`` and the title column: ``title``, else the one column whose name ends
  in ``title`` (``movie_title``).

Read as a plain ``user item item ...`` file, such a header would become a user named
``user_id:token``; so outside a header a ``name:type`` field is an error naming ``file:line``
(:func:`is_header_field`), and so is a row with the wrong number of fields, an empty id or a
timestamp that is no number.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from spdrank.core.slates import SlateError
from spdrank.core.validation import check_id

log = logging.getLogger(__name__)

#: The column types of RecBole's atomic files.
ATOMIC_TYPES: tuple[str, ...] = ("token", "token_seq", "float", "float_seq")

_FIELD = re.compile(r"([^\s:]+):(" + "|".join(ATOMIC_TYPES) + r")")

USER = "user_id"
ITEM = "item_id"
ITEM_LIST = "item_id_list"
TIME = "timestamp"
TITLE = "title"


def is_header_field(token: str) -> bool:
    """Whether ``token`` is a RecBole header field (``name:type``), never a user or an item."""
    return _FIELD.fullmatch(token.strip()) is not None


def header_names(line: str) -> list[str] | None:
    """The column names of a RecBole atomic header line; None when ``line`` is not one."""
    cells = _cells(line)
    if not cells or not all(is_header_field(c) for c in cells):
        return None
    return [c.strip().split(":", 1)[0] for c in cells]


def _cells(line: str) -> list[str]:
    return line.rstrip("\r\n").split("\t")


@dataclass
class AtomicLog:
    """An ``.inter`` file's sequences, one per user in the order of their first line."""

    users: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Lines read, the header included, and the blank ones among them.
    lines: int = 0
    empty_lines: int = 0
    #: Rows that repeat an earlier row's user, item and timestamp, dropped.
    repeated_rows: int = 0


@dataclass
class _Columns:
    """Where an ``.inter`` file keeps what a sequence needs."""

    width: int
    user: int
    item: int
    items: int | None
    time: int | None


def _column(names: list[str], name: str, where: str, what: str) -> int:
    if name not in names:
        raise SlateError(
            f"this RecBole header has no {name} column ({what}); it names {', '.join(names)}",
            where,
        )
    if names.count(name) > 1:
        raise SlateError(f"this RecBole header names {name} twice", where)
    return names.index(name)


def _inter_columns(names: list[str], where: str) -> _Columns:
    return _Columns(
        width=len(names),
        user=_column(names, USER, where, "the user of each interaction"),
        item=_column(names, ITEM, where, "the item of each interaction"),
        items=names.index(ITEM_LIST) if ITEM_LIST in names else None,
        time=names.index(TIME) if TIME in names else None,
    )


def _row(line: str, width: int, header: str, where: str) -> list[str]:
    """A data row's cells, refused when it cannot be one (a header, a wrong field count)."""
    cells = _cells(line)
    if ":" in line and header_names(line) is not None:
        raise SlateError("a second RecBole header line: only the first line is one", where)
    if len(cells) != width:
        raise SlateError(
            f"expected {width} tab-separated fields ({header}), got {len(cells)}", where
        )
    return cells


def _timestamp(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SlateError(f"timestamp {text!r} is not a number", where, field=TIME) from None
    if not math.isfinite(value):
        raise SlateError(f"timestamp {text!r} is not a finite number", where, field=TIME)
    return value


def _id(text: str, name: str, where: str) -> str:
    value = text.strip()
    if not value:
        raise SlateError(f"empty {name}", where, field=name)
    if is_header_field(value):
        raise SlateError(f"{name} {value!r} is a RecBole header field, not an id", where, field=name)
    check_id(value, name, where, field=name)
    return value


def read_inter(lines: Iterable[tuple[int, str]], source: str) -> AtomicLog:
    """Sequences from the numbered lines of an ``.inter`` file (its first non-blank one the header)."""
    out = AtomicLog()
    events: dict[str, list[tuple[float, int, list[str]]]] = {}
    columns: _Columns | None = None
    header = ""
    seen: set[tuple[str, str, float]] = set()
    for lineno, line in lines:
        out.lines += 1
        where = f"{source}:{lineno}"
        if not line.strip():
            out.empty_lines += 1
            continue
        if columns is None:
            names = header_names(line)
            if names is None:
                raise SlateError("expected a RecBole header line (name:type fields)", where)
            columns, header = _inter_columns(names, where), line.strip().replace("\t", ", ")
            continue
        cells = _row(line, columns.width, header, where)
        user = _id(cells[columns.user], USER, where)
        items = [_id(cells[columns.item], ITEM, where)]
        if columns.items is not None:
            items = [_id(i, ITEM_LIST, where) for i in cells[columns.items].split()] + items
        time = _timestamp(cells[columns.time], where) if columns.time is not None else 0.0
        if columns.time is not None and columns.items is None:
            if (user, items[0], time) in seen:
                out.repeated_rows += 1
                continue
            seen.add((user, items[0], time))
        events.setdefault(user, []).append((time, lineno, items))
    for user, rows in events.items():
        out.users.append((user, _sequence(rows, columns)))
    if out.repeated_rows:
        log.warning("%s: %s rows repeat an earlier row's user, item and timestamp, and were "
                    "dropped (kept, a user's target could be the item just before it)", source,
                    f"{out.repeated_rows:,}")
    return out


def _sequence(rows: list[tuple[float, int, list[str]]], columns: _Columns | None) -> list[str]:
    """A user's items: the interactions in time order, or the longest sequential-form line."""
    if columns is not None and columns.items is not None:
        return max(rows, key=lambda row: (len(row[2]), row[1]))[2]
    ordered = sorted(rows, key=lambda row: (row[0], row[1]))
    return [item for _, _, items in ordered for item in items]


def _title_column(names: list[str], where: str) -> int:
    if TITLE in names:
        return _column(names, TITLE, where, "the title of each item")
    titled = [i for i, name in enumerate(names) if name.endswith(TITLE)]
    if len(titled) != 1:
        found = f"{len(titled)} columns ending in 'title'" if titled else "none"
        raise SlateError(
            f"this RecBole header needs one title column (title, or one named *_title); "
            f"it names {', '.join(names)} ({found})",
            where,
        )
    return titled[0]


def read_item_titles(
    lines: Iterable[tuple[int, str]], source: str
) -> Iterator[tuple[int, str, str]]:
    """``(line, item, raw title)`` per row of an ``.item`` file (its first non-blank line the
    header); ids are checked here, repeats and cleaning are the caller's."""
    width = item = title = -1
    header = ""
    for lineno, line in lines:
        where = f"{source}:{lineno}"
        if not line.strip():
            continue
        if width < 0:
            names = header_names(line)
            if names is None:
                raise SlateError("expected a RecBole header line (name:type fields)", where)
            width, header = len(names), line.strip().replace("\t", ", ")
            item = _column(names, ITEM, where, "the item each title belongs to")
            title = _title_column(names, where)
            continue
        cells = _row(line, width, header, where)
        yield lineno, _id(cells[item], ITEM, where), cells[title]
