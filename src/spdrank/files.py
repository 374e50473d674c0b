"""Files as spdrank reads and writes them, whatever they hold: JSONL lines (plain or gzip)
located as ``file:line``, atomic writes, and a file's digest.

Every JSONL reader (slates, teacher labels, score files) goes through :func:`iter_lines` and
:func:`parse_json_line`, so a bad line is reported the same way everywhere: a
:class:`~spdrank.validation.SlateError` naming ``file:line``. A ``.gz`` suffix means gzip,
read and written. Writing goes to a temporary sibling that replaces the target only once
complete, so an interrupted write never leaves a half-written file behind.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import secrets
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from spdrank.validation import SlateError, loads


class _ClosingGzipFile(gzip.GzipFile):
    """A GzipFile over a file object it owns, so closing it closes the file too."""

    def close(self) -> None:
        raw = self.fileobj
        try:
            super().close()
        finally:
            if raw is not None:
                raw.close()


def gzipped(path: Path) -> bool:
    """Whether spdrank reads and writes ``path`` as gzip (by its ``.gz`` suffix)."""
    return path.suffix == ".gz"


def _open_for_writing(path: Path, gz: bool) -> IO[str]:
    if gz:
        # No file name (it would be the temporary's) and mtime 0 in the gzip header, so
        # the same text gives the same bytes.
        raw = open(path, "wb")  # noqa: SIM115 - closed by the _ClosingGzipFile
        zipped = _ClosingGzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
        return io.TextIOWrapper(zipped, encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def iter_json_lines(path: str | os.PathLike[str], what: str = "file") -> Iterator[tuple[str, Any]]:
    """``(file:line, parsed JSON)`` for each non-blank line of a JSONL file (``.gz`` too).

    Every reader goes through :func:`iter_lines` and :func:`parse_json_line`, so bad lines
    are reported the same way everywhere: a :class:`SlateError` naming ``file:line``.
    """
    path = Path(path)
    for lineno, _, line in iter_lines(path, what):
        where = f"{path}:{lineno}"
        yield where, parse_json_line(line, where)


def iter_lines(path: str | os.PathLike[str], what: str = "file") -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset, raw line)`` for each non-blank line (``.gz`` too).

    Lines are read as bytes so the offset of each is known: seeking to it in a plain file
    reads that line again (for gzip the offsets count decompressed bytes and cannot be
    sought). Line numbers count blank lines too, as an editor does.
    """
    path = Path(path)
    if not path.exists():
        raise SlateError(f"no such {what}: {path}")
    if path.is_dir():
        raise SlateError(f"{path} is a directory, not a {what}")
    lineno = 0
    try:
        with gzip.open(path, "rb") if gzipped(path) else open(path, "rb") as fh:
            offset = 0
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    yield lineno, offset, line
                offset += len(line)
    except (OSError, EOFError, zlib.error) as exc:
        # A .gz file that is not gzip, or was cut short; or a file the OS cannot read.
        kind = "not a readable gzip file" if gzipped(path) else f"cannot read this {what}"
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise SlateError(f"{kind} ({reason})", f"{path}:{lineno + 1}") from None


def parse_json_line(line: bytes, where: str) -> Any:
    """One JSONL line, parsed through spdrank's one JSON gate (:func:`spdrank.validation.loads`):
    a :class:`SlateError` naming ``where`` and the field if it is not JSON spdrank can carry."""
    return loads(line, where)


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A new empty temporary sibling of ``path`` to fill; it replaces ``path`` only on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp: its 0600 mode would stay on the result; this one gets the umask's.
    while True:
        tmp_path = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """Write a text file through a temporary sibling that replaces ``path`` only on success."""
    path = Path(path)
    with _replacing(path) as tmp_path, _open_for_writing(tmp_path, gz=gzipped(path)) as fh:
        yield fh
        fh.flush()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling, synced to disk before the swap,
    so that a file under its final name is always whole (what resumable writers rely on)."""
    with _replacing(Path(path)) as tmp_path, open(tmp_path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's bytes, read in chunks (for manifests and checks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
