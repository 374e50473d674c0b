"""Progress of long loops: a tqdm bar on a terminal, a log line every few seconds elsewhere.

A bar redraws one line in place, which a terminal shows and a log file cannot: tqdm hides
itself when stderr is not a terminal, so a run of minutes under a job runner, CI or ``| tee``
would say nothing until it ended, and a bar forced on writes carriage returns into the log.
Both forms here keep the bar on a terminal and, off one, log
``eval: 300/1118 slates, 12.3 slates/s, about 1 min 6 s left`` every ``every_s`` seconds (and a
last line when they logged any), so a long run says how far it is and when it ends, and a short
one stays quiet.

:func:`track` wraps a loop over items; :class:`Progress` is advanced by hand, for work that is
not one item per iteration (a training step, a batch of slates) or that reports figures of
its own beside the count (a running loss).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tqdm import tqdm

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Seconds between two progress lines off a terminal.
EVERY_S = 10.0


def _shows_bar(mode: bool | None, stream: IO[str]) -> bool:
    """``mode`` True: a bar always; None: a bar on a terminal (False is handled by callers)."""
    return bool(mode) or stream.isatty()


def track(
    items: Iterable[T],
    desc: str,
    unit: str = "item",
    total: int | None = None,
    mode: bool | None = None,
    every_s: float | None = None,
    file: IO[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[T]:
    """``items``, reporting progress: ``mode`` True a bar always, False nothing, None a bar on
    a terminal (``file``, default stderr) and a log line every ``every_s`` seconds elsewhere
    (default :data:`EVERY_S`)."""
    stream = file or sys.stderr
    if mode is False:
        yield from items
    elif _shows_bar(mode, stream):
        yield from _bar(items, desc, unit, total, stream)
    else:
        lines = _Lines(desc, unit, total, 0, EVERY_S if every_s is None else every_s, clock)
        for item in items:
            yield item
            lines.advance(1)
        lines.finish("done")


def _bar(
    items: Iterable[T], desc: str, unit: str, total: int | None, stream: IO[str]
) -> Iterator[T]:
    from tqdm import tqdm

    bar = tqdm(items, desc=desc, unit=unit, total=total, file=stream)
    try:
        yield from bar
    finally:
        bar.close()


class Progress:
    """A count advanced by hand, with figures of the caller's beside it (``loss=0.4123``).

    ``mode`` as :func:`track`'s: True a bar always, False nothing, None a bar on a terminal
    (``file``, default stderr) and a log line every ``every_s`` seconds elsewhere. ``initial``:
    the count already done when it starts (a resumed run); the rate counts only what this one
    does. Call :meth:`close` when the work ends, as it ends or fails.
    """

    def __init__(
        self,
        desc: str,
        unit: str = "item",
        total: int | None = None,
        initial: int = 0,
        mode: bool | None = None,
        every_s: float | None = None,
        file: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        stream = file or sys.stderr
        self._bar: tqdm | None = None
        self._lines: _Lines | None = None
        if mode is False:
            return
        if _shows_bar(mode, stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, file=stream,
                dynamic_ncols=True,
            )
        else:
            every = EVERY_S if every_s is None else every_s
            self._lines = _Lines(desc, unit, total, initial, every, clock)

    def update(self, n: int = 1, **postfix: object) -> None:
        """``n`` more done; ``postfix``: the caller's figures now, shown after the count."""
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(**postfix)
        elif self._lines is not None:
            if postfix:
                self._lines.postfix = ", ".join(f"{k}={v}" for k, v in postfix.items())
            self._lines.advance(n)

    def write(self, text: str) -> None:
        """A line of its own on stdout, printed above the bar when there is one."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text)

    def close(self) -> None:
        """Close the bar, or log the last line when lines were logged: ``(done)``, or
        ``(stopped)`` short of the total."""
        if self._bar is not None:
            self._bar.close()
        elif self._lines is not None:
            lines = self._lines
            short = lines.total is not None and lines.done < lines.total
            lines.finish("stopped" if short else "done")
        self._bar = self._lines = None


class _Lines:
    """Progress as log lines: one when ``every_s`` seconds have passed since the last, and a
    last one at the end when any was logged."""

    def __init__(
        self,
        desc: str,
        unit: str,
        total: int | None,
        initial: int,
        every_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.desc, self.unit, self.total = desc, unit, total
        self.every_s, self.clock = every_s, clock
        self.initial = self.done = initial
        self.start = self.last = clock()
        self.logged = False
        #: The caller's figures, appended to each line.
        self.postfix = ""

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s:
            log.info("%s", self.line(now))
            self.last, self.logged = now, True

    def finish(self, how: str) -> None:
        """The last line, ending ``(how)``, when any was logged (a short loop stays quiet)."""
        if self.logged:
            log.info("%s (%s)", self.line(self.clock()), how)

    def line(self, now: float) -> str:
        """``eval: 300/1118 slates, 12.3 slates/s, about 1 min 6 s left`` (no ``/total`` and
        no time left when the total is unknown), then the caller's figures."""
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        elapsed = now - self.start
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        left = ""
        if self.total is not None and rate > 0 and self.done < self.total:
            left = f", about {duration((self.total - self.done) / rate)} left"
        figures = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {count} {self.unit}s, {rate:.1f} {self.unit}s/s{left}{figures}"


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 14 min``: a time a person reads at a glance."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
