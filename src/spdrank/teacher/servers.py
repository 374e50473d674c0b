"""The servers an ``openai`` teacher run spreads its requests over, and which one is asked next.

One labelling process can keep many OpenAI-compatible servers busy (a vLLM per GPU, a
llama.cpp server per machine). Each server takes at most ``limit`` requests at a time, and a
request goes to the least-loaded server in rotation. A server that failed a request for
reasons of its own (connection refused, timeout, 5xx or 429, after the request's retries) is
taken out of rotation for a back-off period, doubled each time it fails again, so the other
servers carry the load and the slate is asked elsewhere; the first answer it gives puts it
back. When every server a request may still try is out of rotation, the request goes to the
one due back soonest: a lone server, or a cluster that is all down, is asked just as if there
were no rotation, and its slates fail as they would without it.

The list of servers comes from ``--base-url`` (repeatable) and ``--base-urls-file``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spdrank.core.inputs import input_lines

log = logging.getLogger(__name__)

#: A server out of rotation again and again waits at most 2**3 back-off periods.
MAX_DOUBLINGS = 3


def backoff_delay(base_s: float, attempt: int) -> float:
    """``base_s * 2**attempt``, jittered down to half so that threads failing together
    (every request to a server that just restarted) do not all come back at once."""
    return base_s * 2**attempt * random.uniform(0.5, 1.0)


@dataclass(eq=False)  # compared by identity, so a server can sit in a set
class Server:
    """One server: how to reach it and how busy it is (guarded by its pool's lock)."""

    url: str
    #: The client that sends its requests (an ``openai.OpenAI``).
    client: Any
    #: The model to ask for; None until the server has said (it was down at the start).
    model_name: str | None = None
    in_flight: int = 0
    #: Requests given to it so far; among equally loaded servers the least used goes first.
    started: int = 0
    #: Failures in a row; back to 0 when it answers.
    failures: int = 0
    #: ``time.monotonic()`` until which it is out of rotation.
    down_until: float = 0.0


class ServerPool:
    """Hands out request slots on servers: ``limit`` per server, the least-loaded first."""

    def __init__(self, servers: Sequence[Server], limit: int, backoff_s: float) -> None:
        if not servers:
            raise ValueError("no server to send requests to")
        if limit < 1:
            raise ValueError("--concurrency must be at least 1")
        if backoff_s < 0:
            raise ValueError("--server-backoff must be >= 0")
        self._servers = list(servers)
        self.limit = limit
        self.backoff_s = backoff_s
        #: Set when the run is over: no more slots are handed out and retry waits end early.
        self.closed = threading.Event()
        self._changed = threading.Condition()

    def __iter__(self) -> Iterator[Server]:
        return iter(self._servers)

    def __len__(self) -> int:
        return len(self._servers)

    @property
    def capacity(self) -> int:
        """Requests in flight when every server is busy."""
        return self.limit * len(self._servers)

    def acquire(self, exclude: Collection[Server] = ()) -> Server | None:
        """A slot on the best server not in ``exclude``, waiting for one to free up.

        None when ``exclude`` holds every server (the caller has tried them all) or the pool
        is closed. The caller must :meth:`release` the server it gets.
        """
        with self._changed:
            while not self.closed.is_set():
                candidates = [s for s in self._servers if s not in exclude]
                if not candidates:
                    return None
                now = time.monotonic()
                in_rotation = [s for s in candidates if s.down_until <= now]
                if in_rotation:
                    free = [s for s in in_rotation if s.in_flight < self.limit]
                    best = min(free, key=lambda s: (s.in_flight, s.started), default=None)
                else:  # all out of rotation: the one due back soonest, as if there were none
                    free = [s for s in candidates if s.in_flight < self.limit]
                    best = min(free, key=lambda s: s.down_until, default=None)
                if best is not None:
                    best.in_flight += 1
                    best.started += 1
                    return best
                # Full: wait for a release, or for a server to come back (it may have room).
                returns = [s.down_until - now for s in candidates if s.down_until > now]
                self._changed.wait(min(returns, default=None))
            return None

    def release(self, server: Server, failure: str | None = None) -> None:
        """Give the slot back; ``failure`` says why the server failed, None if it answered."""
        with self._changed:
            server.in_flight -= 1
            if failure is None:
                server.failures = 0
                server.down_until = 0.0
            else:
                self._take_out(server, failure)
            self._changed.notify_all()

    def take_out(self, server: Server, why: str) -> None:
        """Take ``server`` out of rotation without a request (e.g. it could not be reached)."""
        with self._changed:
            self._take_out(server, why)
            self._changed.notify_all()

    def _take_out(self, server: Server, why: str) -> None:
        now = time.monotonic()
        if server.down_until > now:
            return  # a request sent before it went down: the same outage, not a new one
        server.failures += 1
        pause = backoff_delay(self.backoff_s, min(server.failures - 1, MAX_DOUBLINGS))
        server.down_until = now + pause
        log.warning("%s failed (%s): out of rotation for %.1f s", server.url, why, pause)

    def close(self) -> None:
        """End the run: waiting requests get no slot, retry waits end now."""
        self.closed.set()
        with self._changed:
            self._changed.notify_all()


# -- the list of servers ----------------------------------------------------------------------


def check_base_url(text: str, where: str) -> str:
    """``text`` as a server URL (``http[s]://host[:port]/...``, no trailing ``/``)."""
    url = text.strip()
    if not _is_http_url(url):
        raise ValueError(f"{where}: not a server URL (like http://host:8000/v1): {url!r}")
    return url.rstrip("/")


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        # .port raises ValueError for a port that is not a number in range
        return (
            parts.scheme in ("http", "https")
            and bool(parts.hostname)
            and parts.port != 0
            and not any(c.isspace() for c in url)
        )
    except ValueError:
        return False


def _url_lines(path: Path) -> Iterator[tuple[str, str]]:
    """``(url text, file:line)`` for each line that holds one; ``#`` starts a comment."""
    for line in input_lines(path, "server list"):
        text = line.text.split("#", 1)[0].strip()
        if text:
            yield text, f"{path}:{line.number}"


def collect_base_urls(urls: Sequence[str] = (), file: str | Path | None = None) -> list[str]:
    """The servers named by ``--base-url`` values and a ``--base-urls-file``, each once.

    A URL listed twice would silently double that server's concurrency, so it is an error
    naming both places, as is a line that is not a URL (``file:line``) or an empty file.
    """
    sources = [(text, "--base-url") for text in urls]
    if file is not None:
        path = Path(file)
        if not path.exists():
            raise FileNotFoundError(f"no such server list: {path}")
        from_file = list(_url_lines(path))
        if not from_file:
            raise ValueError(f"{path}: no server URLs in it")
        sources += from_file
    first: dict[str, str] = {}
    for text, where in sources:
        url = check_base_url(text, where)
        if url in first:
            raise ValueError(f"{where}: {url} is listed twice (first at {first[url]})")
        first[url] = where
    return list(first)
