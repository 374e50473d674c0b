"""Training slates read as they are needed, in a seeded order, from files larger than memory.

A :class:`SlateSource` answers one question: which slates sit at positions ``start:stop`` of
epoch ``e``'s order? (And, for readers of per-slate data kept elsewhere such as
:mod:`spdrank.model.state_cache`, what is each one's place among the file's slates?) That order is a pure function of (seed, epoch), so a resumed run, or
another process of a data-parallel run, reads exactly the slates an uninterrupted single
process would. Two sources answer it, picked by the file's name:

- **A plain JSONL file is indexed.** One pass records the byte offset and line number of every
  slate (two int64 arrays: 16 bytes a slate, 3.2 MB for 200,000 slates). An epoch's order is
  a seeded permutation of that index, and a slate is read by seeking to its line.
- **A gzip file is streamed**, since it cannot be sought. Each epoch reads it in file order
  through a seeded shuffle buffer of ``buffer_size`` raw lines (default 1,024, so memory holds
  about that many lines). Taking positions further on in the epoch skips the slates before
  them without parsing them, which is how a resumed run replays its place: it re-reads the
  file from the start and skips what was consumed. The shuffle is local: a slate comes out no
  earlier than ``buffer_size`` positions before its place in the file, so a file written in
  some order (by user, by date) keeps that order coarsely. Shuffle such a file once when
  writing it, or leave it uncompressed.

**When bad slates fail.** The first pass (the index, or the count of a gzip file) parses and
validates every slate it reads, including the caller's ``check`` (e.g. that a slate fits the
model and has the labels its target needs), so a bad line fails with its ``file:line`` before
training starts rather than hours into it. The pass costs about what reading the file as
slates costs, once per run. Slates read later are validated again (it is cheap), and a file
that changed after the pass is refused, since its offsets no longer point at its lines. Being
read more than once, the file must be a regular file: a pipe is refused before the first pass.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from spdrank.core.defaults import MAX_LINE_BYTES
from spdrank.core.files import gzipped, iter_lines, parse_json_line
from spdrank.core.slates import Slate, SlateError

#: A slate check: raises ValueError saying what is wrong (the source adds ``file:line``), or
#: :class:`SkipSlate` to leave the slate out.
Check = Callable[[Slate], None]


class SkipSlate(ValueError):
    """Raised by a check for a slate training leaves out (and counts) rather than refuses:
    click logs are full of impressions without a click, which a clicks target cannot use."""

#: Raw lines a gzip file's shuffle buffer holds.
DEFAULT_BUFFER = 1024


def _accept(slate: Slate) -> None:
    """The default check: any slate that parses."""


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The indexed order of epoch ``epoch``: a permutation of ``range(n)`` seeded by both."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


class SlateSource(ABC):
    """The slates of one file (its first ``limit``, when limited) in a seeded order per epoch."""

    def __init__(self, path: Path, count: int, seed: int, check: Check) -> None:
        self.path = path
        self.count = count
        self.seed = seed
        self.check = check
        self._stamp = _stamp(path)
        #: Slates the check left out (:class:`SkipSlate`), and the first one's reason.
        self.skipped = 0
        self.skip_reason: str | None = None

    def __len__(self) -> int:
        return self.count

    def take(self, epoch: int, start: int, stop: int) -> list[Slate]:
        """The slates at positions ``start:stop`` of epoch ``epoch``'s order."""
        return [slate for _, slate in self.take_numbered(epoch, start, stop)]

    def take_numbered(self, epoch: int, start: int, stop: int) -> list[tuple[int, Slate]]:
        """Like :meth:`take`, each slate with its 0-based place among the file's slates."""
        if not 0 <= start <= stop <= self.count:
            raise IndexError(f"positions {start}:{stop} are outside 0:{self.count}")
        if _stamp(self.path) != self._stamp:
            raise SlateError(
                f"{self.path} changed after training started reading it; its index no longer "
                "matches it: rerun the command to read it afresh"
            )
        return [
            (index, self._load(lineno, line))
            for index, lineno, line in self._lines(epoch, start, stop)
        ]

    @abstractmethod
    def _lines(self, epoch: int, start: int, stop: int) -> Iterable[tuple[int, int, bytes]]:
        """``(place in the file, line number, raw line)`` of the slates at ``start:stop``."""

    def _load(self, lineno: int, line: bytes) -> Slate:
        return load_slate(self.path, lineno, line, self.check)


def load_slate(path: Path, lineno: int, line: bytes, check: Check) -> Slate:
    """Parse, validate and check one raw line; every failure names ``file:line``."""
    where = f"{path}:{lineno}"
    slate = Slate.from_dict(parse_json_line(line, where), where=where)
    try:
        check(slate)
    except SkipSlate as exc:
        raise SkipSlate(f"{where}: {exc}") from None
    except ValueError as exc:
        raise SlateError(str(exc), where) from None
    return slate


def scan(
    path: Path, limit: int | None, check: Check, skipped: list[tuple[int, str]] | None = None
) -> Iterator[tuple[int, int]]:
    """``(line number, byte offset)`` of each of the first ``limit`` slates, each validated;
    slates the check skips are appended to ``skipped`` (line number, reason) and not counted."""
    if limit is not None and limit <= 0:
        return
    n = 0
    for lineno, offset, line in iter_lines(path, "slate file", regular_only=True):
        try:
            load_slate(path, lineno, line, check)
        except SkipSlate as exc:
            if skipped is not None:  # the first reason is kept, for the log
                skipped.append((lineno, "" if skipped else str(exc)))
            continue
        n += 1
        yield lineno, offset
        if n == limit:
            break  # before reading (and validating) the line after the last one wanted


class IndexedSlates(SlateSource):
    """A plain JSONL file, read by seeking to each slate's line in a permuted order."""

    def __init__(
        self, path: Path, linenos: np.ndarray, offsets: np.ndarray, seed: int, check: Check
    ) -> None:
        super().__init__(path, len(offsets), seed, check)
        self.linenos = linenos
        self.offsets = offsets
        self._order: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s permutation of the index (the latest one is kept)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.count, self.seed, epoch))
        return self._order[1]

    def _lines(self, epoch: int, start: int, stop: int) -> list[tuple[int, int, bytes]]:
        out = []
        with open(self.path, "rb") as fh:
            for i in self.order(epoch)[start:stop]:
                fh.seek(int(self.offsets[i]))
                out.append((int(i), int(self.linenos[i]), fh.readline(MAX_LINE_BYTES + 1)))
        return out


@dataclass
class _Cursor:
    """Where a gzip stream stands: the next position of epoch ``epoch`` that ``lines`` gives."""

    epoch: int
    position: int
    lines: Iterator[tuple[int, int, bytes]]


class StreamedSlates(SlateSource):
    """A gzip file, streamed in file order through a seeded shuffle buffer each epoch."""

    def __init__(
        self,
        path: Path,
        count: int,
        seed: int,
        check: Check,
        buffer_size: int = DEFAULT_BUFFER,
        skip_lines: frozenset[int] = frozenset(),
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"a shuffle buffer holds at least 1 slate, got {buffer_size}")
        super().__init__(path, count, seed, check)
        self.buffer_size = buffer_size
        #: Line numbers of the slates the check skipped: the stream passes over them.
        self.skip_lines = skip_lines
        self._cursor: _Cursor | None = None

    def shuffled(self, epoch: int) -> Iterator[tuple[int, int, bytes]]:
        """Epoch ``epoch``'s order: each ``(place, line number, raw line)``, once, through the
        shuffle buffer.

        Once the buffer is full, each line read replaces a uniformly drawn buffered line,
        which comes out; at the end of the file the rest come out in a seeded order.
        """
        rng = np.random.default_rng([self.seed, epoch])
        buffer: list[tuple[int, int, bytes]] = []
        kept = (x for x in iter_lines(self.path, "slate file", regular_only=True)
                if x[0] not in self.skip_lines)
        lines = islice(kept, self.count)
        for index, (lineno, _, line) in enumerate(lines):
            if len(buffer) < self.buffer_size:
                buffer.append((index, lineno, line))
                continue
            j = int(rng.integers(self.buffer_size))
            yield buffer[j]
            buffer[j] = (index, lineno, line)
        for j in rng.permutation(len(buffer)):
            yield buffer[j]

    def _lines(self, epoch: int, start: int, stop: int) -> list[tuple[int, int, bytes]]:
        cursor = self._cursor
        if cursor is None or cursor.epoch != epoch or cursor.position > start:
            cursor = self._cursor = _Cursor(epoch, 0, self.shuffled(epoch))
        skipped = sum(1 for _ in islice(cursor.lines, start - cursor.position))
        out = list(islice(cursor.lines, stop - start))
        if skipped + len(out) != stop - cursor.position:
            raise SlateError(f"{self.path} ended before its slate {stop} of {self.count}")
        cursor.position = stop
        return out


def open_slate_source(
    path: str | os.PathLike[str],
    seed: int,
    check: Check = _accept,
    limit: int | None = None,
    buffer_size: int = DEFAULT_BUFFER,
) -> SlateSource:
    """Index (plain JSONL) or count (``.gz``) the first ``limit`` slates of ``path``.

    Every slate is validated and checked on the way, so a bad one fails here with its
    ``file:line``; slates the check skips are counted in ``skipped``. Raises
    :class:`SlateError` for a file with no slates to train on.
    """
    path = Path(path)
    skipped: list[tuple[int, str]] = []
    if gzipped(path):
        count = sum(1 for _ in scan(path, limit, check, skipped))
        source: SlateSource = StreamedSlates(
            path, count, seed, check, buffer_size, frozenset(n for n, _ in skipped)
        )
    else:
        # array('q') grows by 8 bytes a slate; a list of ints would cost ~5 times that.
        linenos, offsets = array("q"), array("q")
        for lineno, offset in scan(path, limit, check, skipped):
            linenos.append(lineno)
            offsets.append(offset)
        source = IndexedSlates(
            path, np.frombuffer(linenos, np.int64), np.frombuffer(offsets, np.int64), seed, check
        )
    source.skipped = len(skipped)
    source.skip_reason = skipped[0][1] if skipped else None
    if not len(source):
        left_out = f" ({len(skipped)} skipped; the first: {skipped[0][1]})" if skipped else ""
        raise SlateError(f"{path} holds no slates to train on{left_out}")
    return source
