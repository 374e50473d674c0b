"""Write a whole directory (a checkpoint, a training state) so it is never seen half-written.

A directory is filled in a temporary sibling, ``.NAME.HOST-PID.XXXXXXXX.tmp``, swapped in
once complete and removed on any exception. A process killed where no handler runs (SIGKILL,
the OOM killer) cannot remove it, so its name says whose it was: the next fill of the same
target removes the temporaries of processes of this host that have ended
(:func:`sweep_leftovers`), and leaves a live process's work alone.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from spdrank.core.files import write_errors


def _host() -> str:
    """This host's name as a temporary's name holds it."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _temporary(target: Path) -> Path:
    """A new empty directory beside ``target``, named for it and for this process."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{_host()}-{os.getpid()}.",
                                 suffix=".tmp", dir=target.parent))


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(target: Path) -> None:
    """Remove the temporaries of ``target`` that processes of this host left when they were
    killed: their owner has ended, so nobody will finish or remove them. A temporary of a
    running process, or of another host (a shared file system), is kept."""
    owned = re.compile(rf"\.{re.escape(target.name)}\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)"
                       r"\.[^/]+\.tmp")
    host = _host()
    for sibling in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        found = owned.fullmatch(sibling.name)
        if (found and found["host"] == host and not _alive(int(found["pid"]))
                and sibling.is_dir() and not sibling.is_symlink()):
            shutil.rmtree(sibling, ignore_errors=True)


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to fill; on success it replaces ``path``.

    An exception (or a kill) before the swap leaves the previous ``path`` untouched; a write
    the file system refuses (a full disk, a read-only folder) is a
    :class:`~spdrank.core.files.WriteError` naming ``path``. The swap is
    two renames, so a crash between them leaves the old copy beside it as ``.<name>.old``.
    A symlink is followed: its target is what gets replaced, and the link stays. The new
    directory gets the mode of the one it replaces, or the umask's for a new one (mkdtemp's
    0700 would otherwise stay on it).
    """
    path = Path(os.path.realpath(path))
    with write_errors(path, any_errno=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(path)
        tmp = _temporary(path)
    try:
        with write_errors(path, any_errno=True):
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.is_dir()
                     else 0o777 & ~_umask())
        with write_errors(path):
            yield tmp
        with write_errors(path, any_errno=True):
            old = path.with_name(f".{path.name}.old")
            if path.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    """The process's umask: from /proc where Linux shows it, else by setting it and setting it
    straight back (which another thread creating a file at that moment could notice)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def filled_once(target: Path, fill: Callable[[Path], None], marker: str = "config.json") -> Path:
    """``target``, filled by ``fill`` into a temporary sibling the first time it is asked for
    (a converted or unpacked model in a cache): complete once it holds ``marker``, never seen
    half-filled, and a process that finds another one finished first keeps that one."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(target)
    tmp = _temporary(target)
    try:
        fill(tmp)
        if (target / marker).is_file():  # another process finished first
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
