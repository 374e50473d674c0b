"""Item titles: read from a file, cleaned, and shown in a slate.

A slate shows every item by its title: the history as the query text, each candidate as its
``doc``. Titles come from a TSV ``item_id<TAB>title`` with a header line, or a RecBole
``.item`` file (:func:`read_titles`); a line without the header's fields, an empty item id or
a repeated item id is an error naming ``file:line``. A TSV whose first row names an item of
the log has no header line: that row is read as a title, with a warning. Titles are
HTML-unescaped and their whitespace collapsed (:func:`clean_title`), so the text a model reads
does not depend on how the source escaped or wrapped it.

Untitled items: an item whose title is empty, or that has no row in the titles (an *unknown*
item), is shown as ``Item <item_id>`` (:data:`UNTITLED`), so every candidate still has a text;
:meth:`Titles.untitled` lists both kinds for the manifest to count.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from spdrank.core.slates import SlateError
from spdrank.datasets import recbole
from spdrank.datasets.lines import first_line, numbered_lines

logger = logging.getLogger(__name__)

#: How an item without a usable title is rendered.
UNTITLED = "Item {item_id}"


def clean_title(raw: str) -> str:
    """HTML-unescape a title and collapse its whitespace (``""`` for a blank title)."""
    return " ".join(html.unescape(raw).split())


def read_titles(
    path: str | os.PathLike[str], known_items: Collection[str] | None = None
) -> dict[str, str]:
    """Read a TSV ``item_id<TAB>title`` with a header line, or a RecBole ``.item`` file (its
    ``item_id`` and title columns); titles cleaned, may be ``""``.

    ``known_items`` (the log's) tell a TSV without its header line: a first row whose item id
    is one of them is read as a title, with a warning, instead of dropped as a header.
    """
    path = Path(path)
    first, lines = first_line(numbered_lines(path))
    if first is None:
        raise SlateError(f"{path} is empty: expected a header line and item_id<TAB>title rows")
    if recbole.header_names(first) is not None:
        rows = recbole.read_item_titles(lines, str(path))
    else:
        rows = _title_rows(lines, path, known_items)
    titles: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    for lineno, item, title in rows:
        where = f"{path}:{lineno}"
        if item in titles:
            raise SlateError(
                f"item {item!r} has a second title (first at line {first_seen[item]})", where
            )
        first_seen[item] = lineno
        titles[item] = clean_title(title)
    return titles


def _title_rows(
    lines: Iterable[tuple[int, str]], path: Path, known_items: Collection[str] | None = None
) -> Iterator[tuple[int, str, str]]:
    """``(line, item, raw title)`` per row of a titles TSV, its header line skipped: the first
    row, unless its item id is one of ``known_items`` (then the file has no header)."""
    header = False
    for lineno, line in lines:
        where = f"{path}:{lineno}"
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise SlateError(
                f"expected 2 tab-separated fields (item_id<TAB>title), got {len(fields)}"
                + (" in the header line" if not header else ""),
                where,
            )
        if not header:
            header = True
            if known_items is None or fields[0].strip() not in known_items:
                continue
            logger.warning(
                "%s has no header line: its first row names item %r of the log, so it is read "
                "as that item's title (add an 'item_id<TAB>title' header line to silence this)",
                where, fields[0].strip(),
            )
        item = fields[0].strip()
        if not item:
            raise SlateError("empty item id", where)
        yield lineno, item, fields[1]


class Titles:
    """Titles by item id, with the untitled policy."""

    def __init__(self, titles: Mapping[str, str]) -> None:
        self.titles = titles

    def __call__(self, item: str) -> str:
        title = self.titles.get(item)
        return title if title else UNTITLED.format(item_id=item)

    def untitled(self, items: Iterable[str]) -> tuple[list[str], list[str]]:
        """The sorted untitled items among ``items``, and the unknown ones among those."""
        untitled = sorted(i for i in set(items) if not self.titles.get(i))
        unknown = [i for i in untitled if i not in self.titles]
        return untitled, unknown


def render_history(titles: Sequence[str]) -> str:
    """The query text: ``"<k>. <title>"`` one line per item, oldest first, from 1."""
    return "\n".join(f"{k}. {title}" for k, title in enumerate(titles, start=1))
