"""A journal: JSON records appended one by one, each flushed and fsynced, keyed by one field.

Work that costs an LLM call a record (a synthetic query a passage, a teacher's label a slate)
must survive ``kill -9`` and power loss, and a rerun must skip what is done. Records are only
ever appended, each as one ``write`` of a complete line followed by ``flush`` + ``fsync``; a
crash can therefore damage only the LAST line. On opening, a last line without its newline or
that is not valid JSON is a torn write: it is cut away (its work redone), never parsed as data.
Damage anywhere else is not ours to guess about and is an error naming ``file:line``, as is a
key that appears twice. An exclusive ``flock`` stops two runs from appending to one journal.

The teacher's label file (:mod:`spdrank.teacher.labels`) keeps the same promises with checks
of its own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from spdrank.core.validation import SlateError

log = logging.getLogger(__name__)

try:  # POSIX; elsewhere there is simply no guard against two writers
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

#: A record's own check: raises :class:`SlateError` (or ValueError) for a record not to use.
Check = Callable[[dict[str, Any]], None]


@dataclass
class Entry:
    record: dict[str, Any]
    #: ``file:line`` the record came from (for error messages).
    where: str


def read_journal(
    path: str | os.PathLike[str], key: str, check: Check | None = None, repair: bool = False
) -> dict[str, Entry]:
    """Key -> entry of a journal whose records are JSON objects with a string ``key`` field.

    A torn last line is cut off with ``repair`` (the file is truncated before it), else
    skipped; a bad line with good lines after it, a repeated key, or a record ``check``
    refuses is a :class:`SlateError` naming ``file:line``.
    """
    path = Path(path)
    entries: dict[str, Entry] = {}
    torn: tuple[int, int, str] | None = None  # (line number, byte offset, why)
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            where = f"{path}:{lineno}"
            if torn is not None:  # a bad line with good lines after it: not a torn tail
                raise SlateError(f"corrupt record ({torn[2]})", f"{path}:{torn[0]}")
            if not raw.endswith(b"\n"):
                torn = (lineno, start, "no trailing newline")
                continue
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                torn = (lineno, start, f"invalid JSON: {exc}")
                continue
            if not isinstance(data, dict) or not isinstance(data.get(key), str):
                raise SlateError(f"a record must be a JSON object with a string {key!r}", where)
            if check is not None:
                try:
                    check(data)
                except (SlateError, ValueError) as exc:
                    raise SlateError(str(exc), where) from None
            if data[key] in entries:
                raise SlateError(f"{key} {data[key]!r} appears twice (first at "
                                 f"{entries[data[key]].where})", where)
            entries[data[key]] = Entry(data, where)
    if torn is not None:
        lineno, start, why = torn
        if repair:
            log.warning("%s:%d: torn last line (%s) cut away; its work is redone", path, lineno,
                        why)
            os.truncate(path, start)
        else:
            log.warning("%s:%d: torn last line (%s) ignored", path, lineno, why)
    return entries


class Journal:
    """An open journal: the entries so far (``entries``), and ``append`` for new ones."""

    def __init__(self, path: str | os.PathLike[str], key: str, check: Check | None = None) -> None:
        self.path = Path(path)
        self.key = key
        if self.path.suffix == ".gz":
            raise ValueError(f"{self.path}: a journal is appended to; it cannot be gzip")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fh: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if fcntl is not None:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._fh.close()
                raise ValueError(f"{self.path} is being written by another run") from None
        if created:  # make the new file's directory entry durable too
            fsync_dir(self.path.parent)
        try:
            self.entries = read_journal(self.path, key, check, repair=True)
            with open(self.path, "rb") as fh:
                self._lines = sum(1 for _ in fh)
        except BaseException:
            self._fh.close()
            raise

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably: one line, flushed and fsynced before returning."""
        name = record[self.key]
        if name in self.entries:
            raise SlateError(f"{self.key} {name!r} is already in the journal", str(self.path))
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._lines += 1
        self.entries[name] = Entry(record, f"{self.path}:{self._lines}")

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> Journal:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a file just created in it) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
