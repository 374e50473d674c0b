"""Every file a user brings, opened and read one way: as numbered lines, or as one document.

Slates, labels, TREC runs, qrels, topics, corpora, retrieve results, logs, titles and prompt
templates all arrive as files a user names, and any of them may be the wrong thing: a device
that never ends (``/dev/zero``), a directory, a 2 GB file without a newline, text in another
encoding. So every reader opens its file through :func:`input_lines` or
:func:`read_document`, which hold the same rules for all of them:

- **What may be read**: a regular file, or a pipe (``<(zcat corpus.gz)``, a FIFO), which is
  read once from start to end. A character or block device, a directory or a socket is
  refused at once. A reader that reads its file twice asks for a regular file alone.
- **How much**: a line holds at most :data:`~spdrank.core.defaults.MAX_LINE_BYTES` and a file
  at most :data:`~spdrank.core.defaults.MAX_INPUT_BYTES` (decompressed, for gzip); a line is
  read with a bounded ``readline``, so an endless line fails after reading its bound, never
  after filling memory.
- **Which text**: UTF-8, strictly; a byte that is not is an error naming the line and its byte
  offset in the file (never a U+FFFD that then matches nothing).
- **A byte order mark** at the start of a file is skipped, whatever the format: editors on
  Windows write one, and it is never part of the first record.

Every refusal is a :class:`~spdrank.core.validation.SlateError` naming ``file:line`` (or the
file, for what is wrong before any line), which the command line prints as one line.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

from spdrank.core.defaults import MAX_DOCUMENT_BYTES, MAX_INPUT_BYTES, MAX_LINE_BYTES
from spdrank.core.validation import SlateError

#: The UTF-8 byte order mark, skipped at the start of a file.
BOM = b"\xef\xbb\xbf"


class Line(NamedTuple):
    """One line of an input: its number (from 1, blank lines counted, as an editor counts),
    the byte offset where it starts (decompressed, for gzip) and its bytes, the newline
    included (a file's byte order mark is not)."""

    number: int
    offset: int
    raw: bytes

    @property
    def text(self) -> str:
        """The line as text (it was checked to be UTF-8 when read)."""
        return self.raw.decode("utf-8")


def gzipped(path: Path) -> bool:
    """Whether spdrank reads and writes ``path`` as gzip (by its ``.gz`` suffix)."""
    return path.suffix == ".gz"


def _kind(mode: int) -> str | None:
    """What a file that may not be read is (None for a regular file or a pipe)."""
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_kind(mode: int, path: Path, what: str, regular_only: bool) -> None:
    kind = _kind(mode)
    if kind is not None:
        allowed = "a regular file" if regular_only else "a regular file or a pipe"
        raise SlateError(f"{path} is {kind}: a {what} must be {allowed}")
    if regular_only and stat.S_ISFIFO(mode):
        raise SlateError(f"{path} is a pipe: a {what} is read more than once, so it must be "
                         "a regular file")


def check_rereadable(path: Path, what: str) -> None:
    """Refuse ``path`` for a reader that reads it more than once (a pipe would be empty the
    second time), before any of it is read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise SlateError(f"no such {what}: {path}") from None
    except OSError as exc:
        raise SlateError(f"cannot read the {what} {path} ({exc.strerror or exc})") from None
    _check_kind(mode, path, what, regular_only=True)


def _open_checked(path: Path, what: str, regular_only: bool) -> IO[bytes]:
    """``path`` opened for reading bytes once it is known to be a file spdrank may read.

    Its kind is checked before opening (opening a device or a socket may block or fail
    obscurely) and again on what was opened. A pipe is opened blocking, so a FIFO waits for
    its writer; anything else without blocking, and made blocking once it is known to be a
    regular file.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SlateError(f"no such {what}: {path}") from None
    except OSError as exc:
        raise SlateError(f"cannot read the {what} {path} ({exc.strerror or exc})") from None
    _check_kind(info.st_mode, path, what, regular_only)
    pipe = stat.S_ISFIFO(info.st_mode)
    try:
        fd = os.open(path, os.O_RDONLY | (0 if pipe else os.O_NONBLOCK))
    except OSError as exc:
        raise SlateError(f"cannot read the {what} {path} ({exc.strerror or exc})") from None
    try:
        _check_kind(os.fstat(fd).st_mode, path, what, regular_only)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


@contextmanager
def _decompressed(raw: IO[bytes], path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes as spdrank reads them: gunzipped when its name says gzip."""
    if not gzipped(path):
        with raw:
            yield raw
        return
    with raw, gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
        yield unzipped


def _utf8_error(raw: bytes, offset: int, where: str, line: bool = True) -> SlateError | None:
    """Why ``raw`` (a ``line``, or a whole file, starting at byte ``offset`` of its file) is
    not UTF-8 text, or None."""
    if raw.isascii():
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        in_line = f"byte {exc.start + 1} of the line, " if line else ""
        return SlateError(f"not UTF-8 text ({in_line}at byte offset {offset + exc.start} of "
                          f"the file: {exc.reason})", where)
    return None


def input_lines(
    path: str | os.PathLike[str],
    what: str = "file",
    *,
    regular_only: bool = False,
    utf8: bool = True,
    max_line: int | None = None,
    max_bytes: int | None = None,
) -> Iterator[Line]:
    """Every line of an input file (``.gz`` gunzipped), blank ones included, checked as read.

    ``what`` names the file in messages (``"qrels file"``). ``regular_only`` refuses a pipe,
    for a reader that reads its file twice or seeks in it. ``utf8=False`` leaves decoding to
    the caller: a journal's torn last line may end inside a character, which is damage to
    repair rather than an error. ``max_line`` and ``max_bytes`` default to the bounds of
    :mod:`spdrank.core.defaults`, read when called.
    """
    path = Path(path)
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    max_bytes = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    number, offset = 0, 0
    try:
        with _decompressed(_open_checked(path, what, regular_only), path) as fh:
            while True:
                raw = fh.readline(max_line + 1)
                if not raw:
                    return
                number += 1
                where = f"{path}:{number}"
                if len(raw) > max_line:
                    raise SlateError(f"a line longer than {max_line:,} bytes, the most a "
                                     f"{what} line may hold (is it the right file?)", where)
                if offset + len(raw) > max_bytes:
                    raise SlateError(f"the {what} is longer than {max_bytes:,} bytes, the most "
                                     "spdrank reads from one file", where)
                start = offset
                offset += len(raw)
                if number == 1 and raw.startswith(BOM):
                    raw, start = raw[len(BOM):], start + len(BOM)
                if utf8 and (error := _utf8_error(raw, start, where)) is not None:
                    raise error
                yield Line(number, start, raw)
    except (OSError, EOFError, zlib.error) as exc:
        # A .gz file that is not gzip, or was cut short; or a file the OS cannot read.
        kind = "not a readable gzip file" if gzipped(path) else f"cannot read this {what}"
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise SlateError(f"{kind} ({reason})", f"{path}:{number + 1}") from None


def read_document(
    path: str | os.PathLike[str], what: str = "file", limit: int | None = None
) -> bytes:
    """A whole input file's bytes (a JSON document), at most ``limit`` of them (default:
    :data:`~spdrank.core.defaults.MAX_DOCUMENT_BYTES`).

    The same rules as :func:`input_lines`: a regular file or a pipe, ``.gz`` gunzipped, a byte
    order mark at the start skipped. The bytes are not decoded: a JSON reader decodes them.
    """
    path = Path(path)
    limit = MAX_DOCUMENT_BYTES if limit is None else limit
    try:
        with _decompressed(_open_checked(path, what, regular_only=False), path) as fh:
            data = fh.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        kind = "not a readable gzip file" if gzipped(path) else f"cannot read this {what}"
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise SlateError(f"{kind} ({reason})", str(path)) from None
    if len(data) > limit:
        raise SlateError(f"the {what} is longer than {limit:,} bytes, the most spdrank reads "
                         f"as one {what}", str(path))
    return data.removeprefix(BOM)


def read_text(path: str | os.PathLike[str], what: str = "file", limit: int | None = None) -> str:
    """A whole input file as text (:func:`read_document`'s bytes), strictly UTF-8: a byte that
    is not is an error naming its offset."""
    data = read_document(path, what, limit)
    error = _utf8_error(data, 0, str(path), line=False)
    if error is not None:
        raise error
    return data.decode("utf-8")
