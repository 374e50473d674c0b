"""Progress of long loops: a tqdm bar on a terminal, a log line every few seconds elsewhere.

A bar redraws one line in place, which a terminal shows and a log file cannot: tqdm hides
itself when stderr is not a terminal, so a run of minutes under a job runner, CI or ``| tee``
would say nothing until it ended. :func:`track` keeps the bar on a terminal and, off one, logs
``eval: 300/1118 slates, 12.3 slates/s`` every ``every_s`` seconds (and a last line when it
logged any), so a long run says how far it is and a short one stays quiet.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Seconds between two progress lines off a terminal.
EVERY_S = 10.0


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
    elif mode or stream.isatty():
        yield from _bar(items, desc, unit, total, stream)
    else:
        yield from _lines(items, desc, unit, total, EVERY_S if every_s is None else every_s, clock)


def _bar(
    items: Iterable[T], desc: str, unit: str, total: int | None, stream: IO[str]
) -> Iterator[T]:
    from tqdm import tqdm

    bar = tqdm(items, desc=desc, unit=unit, total=total, file=stream)
    try:
        yield from bar
    finally:
        bar.close()


def _lines(
    items: Iterable[T],
    desc: str,
    unit: str,
    total: int | None,
    every_s: float,
    clock: Callable[[], float],
) -> Iterator[T]:
    start = last = clock()
    done = 0
    logged = False
    for item in items:
        yield item
        done += 1
        now = clock()
        if now - last >= every_s:
            log.info("%s", _line(desc, unit, done, total, now - start))
            last, logged = now, True
    if logged:
        log.info("%s (done)", _line(desc, unit, done, total, clock() - start))


def _line(desc: str, unit: str, done: int, total: int | None, elapsed: float) -> str:
    """``eval: 300/1118 slates, 12.3 slates/s`` (no ``/total`` when the total is unknown)."""
    count = f"{done}/{total}" if total is not None else f"{done}"
    rate = done / elapsed if elapsed > 0 else 0.0
    return f"{desc}: {count} {unit}s, {rate:.1f} {unit}s/s"
