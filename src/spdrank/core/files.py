"""Files as spdrank reads and writes them, whatever they hold: JSONL lines (plain or gzip)
located as ``file:line``, atomic writes, and a file's digest.

Every JSONL reader (slates, teacher labels, score files) goes through :func:`iter_lines` and
:func:`parse_json_line`, so a bad line is reported the same way everywhere: a
:class:`~spdrank.core.validation.SlateError` naming ``file:line``; its lines come from the one
input reader (:mod:`spdrank.core.inputs`), which bounds them and refuses what is not a file. A ``.gz`` suffix means gzip,
read and written. Writing goes to a temporary sibling that replaces the target only once
complete, so an interrupted write never leaves a half-written file behind; a symlink's target
is what gets replaced (with its mode), and a stream (``/dev/null``, ``/dev/stdout``, a FIFO) is
written in place (:func:`output_target`). :func:`check_outputs` refuses, before a command does
any work, outputs that would overwrite one of its inputs or another of its outputs.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from spdrank.core.inputs import Line, gzipped, input_lines
from spdrank.core.validation import loads

#: The errors by which a file system refuses a write already under way (a full disk, a quota,
#: a file past its size limit, a folder remounted read-only, a failing device): raised by a
#: ``write``, ``flush`` or ``fsync`` whatever the code around it was doing, so they are the
#: output's. Refusals of a path itself (no permission) come from opening or renaming it,
#: which the writers here do themselves.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


class WriteError(OSError):
    """An output the file system would not let spdrank write, named with the OS's reason:
    ``cannot write out/ranked.jsonl: No space left on device``. Whatever was written of it is
    gone (the previous file, if any, is as it was), so the message is all there is to act on.
    """

    def __init__(self, path: str | os.PathLike[str], cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.strerror}"


@contextmanager
def write_errors(path: str | os.PathLike[str], any_errno: bool = False) -> Iterator[None]:
    """Turn a refused write of ``path`` into one :class:`WriteError` naming it: an OSError of
    :data:`WRITE_ERRNOS`, or (``any_errno``, around code that only writes ``path``) any
    OSError. One already naming an output passes unchanged."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:
        if any_errno or exc.errno in WRITE_ERRNOS:
            raise WriteError(path, exc) from None
        raise


class _ClosingGzipFile(gzip.GzipFile):
    """A GzipFile over a file object it owns, so closing it closes the file too."""

    def close(self) -> None:
        raw = self.fileobj
        try:
            super().close()
        finally:
            if raw is not None:
                raw.close()


def _open_for_writing(path: Path, gz: bool, append: bool = False) -> IO[str]:
    """``path`` opened for text, gzipped or not; ``append`` for a stream, which is never
    truncated (a ``>>`` redirection behind ``/dev/stdout`` keeps what it holds)."""
    if gz:
        # No file name (it would be the temporary's) and mtime 0 in the gzip header, so
        # the same text gives the same bytes.
        raw = open(path, "ab" if append else "wb")  # noqa: SIM115 - closed by the _ClosingGzipFile
        zipped = _ClosingGzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
        return io.TextIOWrapper(zipped, encoding="utf-8")
    return open(path, "a" if append else "w", encoding="utf-8")


def iter_json_lines(path: str | os.PathLike[str], what: str = "file") -> Iterator[tuple[str, Any]]:
    """``(file:line, parsed JSON)`` for each non-blank line of a JSONL file (``.gz`` too).

    Every reader goes through :func:`iter_lines` and :func:`parse_json_line`, so bad lines
    are reported the same way everywhere: a :class:`SlateError` naming ``file:line``.
    """
    path = Path(path)
    for lineno, _, line in iter_lines(path, what):
        where = f"{path}:{lineno}"
        yield where, parse_json_line(line, where)


def iter_lines(
    path: str | os.PathLike[str], what: str = "file", regular_only: bool = False
) -> Iterator[Line]:
    """``(line number, byte offset, raw line)`` for each non-blank line (``.gz`` too), read
    through the one input reader (:func:`spdrank.core.inputs.input_lines`: a regular file or
    a pipe, lines and file bounded, strict UTF-8, a leading byte order mark skipped).

    Lines are read as bytes so the offset of each is known: seeking to it in a plain file
    reads that line again (for gzip the offsets count decompressed bytes and cannot be
    sought). Line numbers count blank lines too, as an editor does. ``regular_only`` refuses
    a pipe, for a reader that reads the file again.
    """
    for line in input_lines(path, what, regular_only=regular_only):
        if line.raw.strip():
            yield line


def parse_json_line(line: bytes, where: str) -> Any:
    """One JSONL line, parsed through spdrank's one JSON gate (:func:`spdrank.core.validation.loads`):
    a :class:`SlateError` naming ``where`` and the field if it is not JSON spdrank can carry."""
    return loads(line, where)


@dataclass(frozen=True)
class OutputTarget:
    """Where and how an output path is written (:func:`output_target`).

    ``path`` is the file that changes: the end of the path's symlinks, so a link stays a
    link and its target gets the new contents. A *stream* (a character device such as
    ``/dev/null`` or a terminal, a FIFO, or anything reached through ``/dev/stdout`` and
    ``/dev/fd/N``) is opened as given and appended to, never replaced: replacing it would put
    a regular file where the device was, or detach the name from the descriptor it stands for.
    ``mode`` holds the permission bits of a regular file the write replaces (None for a new one).
    """

    path: Path
    stream: bool
    mode: int | None


def _through_fd_link(path: Path) -> bool:
    """Whether ``path`` reaches its file through ``/proc`` (``/dev/stdout``, ``/dev/fd/N``): a
    name for an open descriptor, which only writing in place reaches."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        folder = os.path.realpath(os.path.dirname(current))
        if folder == "/proc" or folder.startswith("/proc/"):
            return True
        current = os.path.join(folder, os.path.basename(current))
        if not os.path.islink(current):
            return False
        current = os.path.join(folder, os.readlink(current))
    return False


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _existing_folder(path: Path, given: Path) -> None:
    """Refuse a folder path whose nearest existing ancestor is not a directory (the folder
    could never be made), naming the output and the ancestor."""
    for ancestor in (path, *path.parents):
        if ancestor.exists() or ancestor.is_symlink():
            if not ancestor.is_dir():
                raise NotADirectoryError(
                    f"cannot write {given}: {ancestor} is a file, not a directory"
                )
            return


def output_target(path: str | os.PathLike[str]) -> OutputTarget:
    """How ``path`` would be written, checked without changing anything (:class:`OutputTarget`).

    A regular file (or a new one) is written through a temporary sibling of the symlinks'
    target, renamed onto it once complete, with the mode of the file it replaces. A directory,
    socket or block device is refused, and so is a path under a file, each in one line naming it.
    """
    given = Path(path)
    if _through_fd_link(given):
        return OutputTarget(given, stream=True, mode=None)
    real = Path(os.path.realpath(given))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # under a file: named below
    except OSError as exc:  # a symlink loop, a name too long
        raise ValueError(f"cannot write {given}: {exc.strerror or exc}") from None
    if st is None:
        _existing_folder(real.parent, given)
        if given.is_symlink() and not real.parent.is_dir():
            raise FileNotFoundError(
                f"cannot write {given}: it links to {real}, whose folder does not exist"
            )
        return OutputTarget(real, stream=False, mode=None)
    if stat.S_ISREG(st.st_mode):
        return OutputTarget(real, stream=False, mode=stat.S_IMODE(st.st_mode))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return OutputTarget(given, stream=True, mode=None)
    where = given if real == given.absolute() else f"{given} (a link to {real})"
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"cannot write {where}: it is a directory, not a file")
    raise ValueError(
        f"cannot write {where}: it is {_kind(st.st_mode)} (an output must be a regular file, "
        "a character device such as /dev/null, or a FIFO)"
    )


def _sibling_name(real: Path) -> Path:
    """A hidden name beside ``real`` that no file holds yet (``.NAME.HEX.tmp``)."""
    return real.with_name(f".{real.name}.{secrets.token_hex(6)}.tmp")


def _named_sibling(real: Path) -> Path:
    """A new empty file beside ``real``, hidden and recognisable as a temporary."""
    # Not tempfile.mkstemp: its 0600 mode would stay on a new file; this one gets the umask's.
    while True:
        tmp_path = _sibling_name(real)
        try:
            os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp_path
        except FileExistsError:
            continue


def _unnamed_file(folder: Path) -> int | None:
    """A descriptor of a new file in ``folder`` that has no name (Linux's ``O_TMPFILE``), or
    None where the system or the file system cannot make one, or ``/proc/self/fd`` cannot
    reopen it. A file without a name vanishes with the process however it ends: a kill
    that no handler sees (SIGKILL, the OOM killer) leaves no temporary behind."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY, 0o666)
    except OSError:  # a file system without unnamed files: a named temporary instead
        return None


def _publish(fd: int, real: Path) -> None:
    """Give the unnamed file ``fd`` the name ``real``: a link cannot replace a file, so it is
    linked under a fresh hidden name first and that name renamed onto ``real``. Where the
    file system refuses the link, its bytes are copied to a named sibling instead."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            name = _sibling_name(real)
            try:
                os.link(str(fd), name, src_dir_fd=proc, follow_symlinks=True)
                break
            except FileExistsError:
                continue
            except OSError:
                name = _named_sibling(real)
                shutil.copyfile(f"/proc/self/fd/{fd}", name)
                os.chmod(name, stat.S_IMODE(os.fstat(fd).st_mode))
                break
    finally:
        os.close(proc)
    try:
        os.replace(name, real)
    except BaseException:
        name.unlink(missing_ok=True)
        raise


@contextmanager
def _replacing(path: Path) -> Iterator[tuple[Path, bool]]:
    """``(file to fill, stream?)``: for a regular file a new empty temporary in its target's
    folder, which replaces the target only on success; a stream is yielded as it is.

    The temporary has no name while it is filled where the system allows it
    (:func:`_unnamed_file`; it is reached through ``/proc/self/fd``), else it is a hidden
    sibling ``.NAME.HEX.tmp`` removed on any exception, SIGTERM's included.
    """
    target = output_target(path)
    if target.stream:
        with write_errors(path):
            yield target.path, True
        return
    real = target.path
    with write_errors(path, any_errno=True):
        real.parent.mkdir(parents=True, exist_ok=True)
        fd = _unnamed_file(real.parent)
        tmp_path = _named_sibling(real) if fd is None else Path(f"/proc/self/fd/{fd}")
    try:
        with write_errors(path, any_errno=True):
            if target.mode is not None:  # the file it replaces keeps its permissions
                os.chmod(tmp_path, target.mode)
        with write_errors(path):
            yield tmp_path, False
        with write_errors(path, any_errno=True):
            if fd is None:
                os.replace(tmp_path, real)
            else:
                _publish(fd, real)
    except BaseException:
        if fd is None:
            tmp_path.unlink(missing_ok=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)


@contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """Write a text file through a temporary sibling that replaces ``path`` only on success
    (a stream such as ``/dev/stdout`` is written in place: :func:`output_target`)."""
    path = Path(path)
    with _replacing(path) as (file, stream), _open_for_writing(
        file, gz=gzipped(path), append=stream
    ) as fh:
        yield fh
        fh.flush()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling, synced to disk before the swap,
    so that a file under its final name is always whole (what resumable writers rely on)."""
    with _replacing(Path(path)) as (file, stream), open(file, "ab" if stream else "wb") as fh:
        fh.write(data)
        fh.flush()
        if not stream:
            os.fsync(fh.fileno())


#: What :func:`check_outputs` takes per option: a path, several, or None (not given).
Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None


def _each(paths: Paths) -> list[Path]:
    if paths is None:
        return []
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths if p is not None]


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: by inode when both exist (hard links, bind mounts),
    else by their symlink-resolved absolute paths."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: Path, folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real != top and os.path.commonpath([real, top]) == top


def _model_folders(models: Mapping[str, Paths] | None) -> list[tuple[str, Path]]:
    """The ``(option, folder)`` of each model a command reads from a folder of this machine (a
    hub name or a ``config:`` spec names no folder, and nothing there can be overwritten)."""
    return [(name, path) for name, paths in (models or {}).items() for path in _each(paths)
            if path.is_dir()]


def _refuse_in_model(name: str, path: Path, models: list[tuple[str, Path]]) -> None:
    """Refuse output ``path`` (of option ``name``) when it is, or lies inside, a model folder."""
    for option, folder in models:
        if same_file(path, folder) or _inside(path, folder):
            raise ValueError(
                f"{name} {path} is inside {option} {folder}: writing it would change the "
                f"model's own files; {_choose(name)}"
            )


def check_outputs(
    inputs: Mapping[str, Paths],
    outputs: Mapping[str, Paths],
    folders: Mapping[str, Paths] | None = None,
    models: Mapping[str, Paths] | None = None,
) -> None:
    """Refuse, before any work, outputs that cannot be written or would destroy another file of
    the same command: each output must be writable (:func:`output_target`) and name no input and
    no other output, compared after resolving symlinks. ``folders`` are output directories the
    command replaces whole: no input or output may lie inside one either. ``models`` are the
    folders of models the command reads (a checkpoint, a backbone): no output may lie inside
    one (``--output ckpt/head.safetensors`` would corrupt the model it ranks with), and no
    output folder may hold one.

    Keys are the options as the user typed them (``--output``), so the one-line error says which
    two collide. Streams (``/dev/null``, a terminal, a FIFO) are left out of the comparison:
    writing to one destroys nothing.
    """
    model_folders = _model_folders(models)
    seen = [("input", name, p) for name, paths in inputs.items() for p in _each(paths)]
    seen += [("model", name, folder) for name, folder in model_folders]
    for name, path in ((n, p) for n, paths in outputs.items() for p in _each(paths)):
        target = output_target(path)
        if target.stream and not target.path.is_file():
            continue
        _refuse_in_model(name, path, model_folders)
        for role, other, earlier in seen:
            if same_file(path, earlier):
                raise ValueError(
                    f"{name} {path} is the same file as {other} {earlier}: writing it would "
                    f"destroy the {role}; {_choose(name)}"
                )
        seen.append(("other output", name, path))
    for name, folder in ((n, p) for n, paths in (folders or {}).items() for p in _each(paths)):
        if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            raise NotADirectoryError(f"{name} {folder} exists and is not a directory")
        _existing_folder(Path(os.path.realpath(folder)).parent, folder)
        _refuse_in_model(name, folder, model_folders)
        for _, other, path in [*seen, ("", "the working directory", Path.cwd())]:
            if same_file(path, folder) or _inside(path, folder):
                raise ValueError(
                    f"{other} {path} is inside {name} {folder}, which is replaced whole: "
                    f"{_choose(name)}"
                )


def _choose(name: str) -> str:
    """What to change, for an output named ``name``: its flag, or the flag it is derived from
    (``--out's queries journal``, made from ``--out``, is changed by ``--out``)."""
    return f"choose another {name.split(chr(39))[0] if name.startswith('-') else name}"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's bytes, read in chunks (for manifests and checks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
