"""A journal: JSON records appended one by one, each flushed and fsynced, keyed by one field.

Work that costs an LLM call a record (a synthetic query a passage, a teacher's label a slate)
must survive ``kill -9`` and power loss, and a rerun must skip what is done. Records are only
ever appended, each as one ``write`` of a complete line followed by ``flush`` + ``fsync``; a
crash can therefore damage only the LAST line. On opening, a last line without its newline or
that is not valid JSON is a torn write: it is cut away (its work redone), never parsed as data.
Damage anywhere else is not ours to guess about and is an error naming ``file:line``, as is a
key that appears twice. An exclusive ``flock`` stops two runs from appending to one journal.

The teacher's label file (:mod:`spdrank.teacher.labels`) is such a journal, keyed by ``qid``:
it brings its own record check and, as a :class:`Kind`, its own words, error class and entry
class, so its messages read as they always have.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from spdrank.core.files import WriteError, write_errors
from spdrank.core.inputs import Line, input_lines
from spdrank.core.validation import RepeatedKey, SlateError, unique_keys

if TYPE_CHECKING:  # Self is in typing from Python 3.11
    from typing_extensions import Self

log = logging.getLogger(__name__)

try:  # POSIX; elsewhere there is simply no guard against two writers
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

def open_locked(path: Path, mode: str, busy: str, **options: Any) -> IO[Any]:
    """``path`` opened to append (``mode``, created when missing) and held by an exclusive,
    non-blocking ``flock`` until it is closed, so that two runs never append to one file: a
    second is refused at once with ``busy`` (a ValueError), since waiting would only redo the
    first's work. The lock must hold the file the path names: one a finishing run unlinked
    after this one opened it is let go and the path opened again."""
    while True:
        fh = open(path, mode, **options)  # noqa: SIM115 - the caller closes it, lock and all
        if fcntl is None:  # pragma: no cover
            return fh
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise ValueError(busy) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fh.fileno()), current):
            return fh
        fh.close()


#: A record's own check: raises :class:`SlateError` (or ValueError) for a record not to use.
Check = Callable[[dict[str, Any]], None]


@dataclass
class Entry:
    record: dict[str, Any]
    #: ``file:line`` the record came from (for error messages).
    where: str


@dataclass(frozen=True)
class Kind:
    """What a journal's messages call its parts, the error it raises, the entries it holds
    and the logger it warns on; a module keeping a journal of its own (the label file) names
    its own. ``twice`` and ``again`` are formatted with ``key``, ``value`` and (``twice``)
    ``first``, the ``file:line`` of the record first seen."""

    error: type[SlateError] = SlateError
    entry: type[Entry] = Entry
    logger: logging.Logger = log
    #: The file, in "... is appended to; it cannot be gzip".
    file: str = "a journal"
    #: A record, in "... must be a JSON object with a string 'KEY'".
    record: str = "a record"
    #: A key read twice.
    twice: str = "{key} {value!r} appears twice (first at {first})"
    #: A key appended again.
    again: str = "{key} {value!r} is already in the journal"
    #: What becomes of a torn last line's record once it is cut away.
    redone: str = "its work is redone"


JOURNAL = Kind()


def read_journal(
    path: str | os.PathLike[str],
    key: str,
    check: Check | None = None,
    repair: bool = False,
    kind: Kind = JOURNAL,
) -> dict[str, Entry]:
    """Key -> entry of a journal whose records are JSON objects with a string ``key`` field.

    A torn last line is cut off with ``repair`` (the file is truncated before it), else
    skipped; a bad line with good lines after it, a repeated key, or a record ``check``
    refuses is a ``kind.error`` (a :class:`SlateError`) naming ``file:line``. Entries are
    ``kind.entry``.
    """
    path = Path(path)
    entries: dict[str, Entry] = {}
    torn: tuple[int, int, str] | None = None  # (line number, byte offset, why)
    tail = b""
    for lineno, start, raw in _journal_lines(path, kind, repair):
        where = f"{path}:{lineno}"
        if torn is not None:  # a bad line with good lines after it: not a torn tail
            raise kind.error(f"corrupt record ({torn[2]})", f"{path}:{torn[0]}")
        tail = raw
        if not raw.endswith(b"\n"):
            torn = (lineno, start, "no trailing newline")
            continue
        if not raw.strip():
            continue
        try:
            # Decoded here, strictly: json.loads given bytes decodes them with
            # "surrogatepass", so an encoded surrogate (b"\xed\xa0\x80") would be read.
            data = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
        except RepeatedKey as exc:
            raise kind.error(f"{exc}: each field of a record may appear once", where) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            torn = (lineno, start, f"invalid JSON: {exc}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get(key), str):
            raise kind.error(f"{kind.record} must be a JSON object with a string {key!r}",
                             where)
        if check is not None:
            try:
                check(data)
            except (SlateError, ValueError) as exc:
                raise kind.error(str(exc), where) from None
        value = data[key]
        if value in entries:
            raise kind.error(kind.twice.format(key=key, value=value,
                                               first=entries[value].where), where)
        entries[value] = kind.entry(data, where)
    if torn is not None:
        lineno, start, why = torn
        if not entries and not _begins_a_record(tail, key):
            raise kind.error(
                f"not written by this command: its last line ({why}) follows no record and "
                f"does not begin as {kind.record} does ({_record_start(key).decode()}...), so "
                "it is no write torn by a crash and is not cut away; nothing was written",
                f"{path}:{lineno}")
        if repair:
            kind.logger.warning("%s:%d: torn last line (%s) cut away; %s", path, lineno, why,
                                kind.redone)
            os.truncate(path, start)
        else:
            kind.logger.warning("%s:%d: torn last line (%s) ignored", path, lineno, why)
    return entries


def _record_start(key: str) -> bytes:
    """How every record :meth:`Journal.append` writes begins: its key first, compact JSON."""
    return b'{"' + json.dumps(key)[1:-1].encode() + b'":'


def _begins_a_record(raw: bytes, key: str) -> bool:
    """Whether ``raw``, a torn last line, is what a crash leaves of an append: the start of a
    record (or less of it), or only NUL bytes and whitespace. A file whose only line is
    anything else (a config, notes) was never this journal's, and cutting it would destroy it."""
    body = raw.lstrip(b"\xef\xbb\xbf").strip(b"\x00 \t\r\n\x0b\x0c")
    start = _record_start(key)
    return not body or body.startswith(start) or start.startswith(body)


def _journal_lines(path: Path, kind: Kind, repair: bool) -> Iterator[Line]:
    """The journal's lines through the one input reader, its errors as ``kind.error``.

    Read as bytes, undecoded: a torn last line may end inside a character, which is damage to
    cut away, not an error. A journal to repair is truncated, which only a regular file can be.
    """
    what = kind.file.removeprefix("the ").removeprefix("a ")
    try:
        yield from input_lines(path, what, regular_only=repair, utf8=False)
    except SlateError as exc:
        raise kind.error(exc.detail, exc.where) from None


class Journal:
    """An open journal: the entries so far (``entries``), and ``append`` for new ones."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        check: Check | None = None,
        kind: Kind = JOURNAL,
    ) -> None:
        self.path = Path(path)
        self.key = key
        self.kind = kind
        if self.path.suffix == ".gz":
            raise ValueError(f"{self.path}: {kind.file} is appended to; it cannot be gzip")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fh: IO[str] = open_locked(self.path, "a", f"{self.path} is being written by "
                                        "another run", encoding="utf-8")
        if created:  # make the new file's directory entry durable too
            fsync_dir(self.path.parent)
        try:
            self.entries = read_journal(self.path, key, check, repair=True, kind=kind)
            with open(self.path, "rb") as fh:
                self._lines = sum(1 for _ in fh)
        except BaseException:
            self._fh.close()
            raise

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably: one line, written and fsynced before returning.

        The line goes to the descriptor itself, not through a buffer: a write the file system
        refuses part-way (a full disk) is cut back off the file, so the journal ends at its
        last whole record, and raised as a :class:`~spdrank.core.files.WriteError` naming it.
        """
        name = record[self.key]
        record = {self.key: name, **record}  # first, so a torn record is known by its start
        if name in self.entries:
            raise self.kind.error(self.kind.again.format(key=self.key, value=name),
                                  str(self.path))
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        fd = self._fh.fileno()
        size = os.fstat(fd).st_size
        try:
            with write_errors(self.path, any_errno=True):
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
        except WriteError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        self._lines += 1
        self.entries[name] = self.kind.entry(record, f"{self.path}:{self._lines}")

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> Self:
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
