"""Deadlines for slow clients at the connection, where uvicorn sets none of its own.

uvicorn closes a keep-alive connection left idle between requests (``timeout_keep_alive``),
but it gives a client any time it likes to send a request's headers: a client that opens
connections and sends half a request line on each holds them all open (the slowloris attack).
:class:`HeaderDeadlineProtocol` is uvicorn's h11 protocol plus one timer per connection,
armed when the connection is made and when the first byte of a later request arrives on it,
and disarmed as soon as that request's headers are complete. A connection still short of its
headers when the timer fires is closed: with a 408 in the server's error shape when part of a
request had arrived, silently when nothing had (a client opening a connection ahead of use
would otherwise read the 408 as the answer to a request it sends at that moment).

The body deadline is the gate's, which reads the body (:mod:`spdrank.serving.gate`).
:func:`uvicorn_options` is what ``spdrank serve`` (and the tests' servers) pass to uvicorn so
the settings' three deadlines are in force; the app served by another ASGI server has only
the gate's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from spdrank.serving.gate import error_json
from spdrank.serving.settings import ServeSettings

log = logging.getLogger(__name__)


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections that take more than ``header_timeout``
    seconds to send a request's headers."""

    header_timeout: ClassVar[float] = ServeSettings.header_timeout

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        # Between requests h11 waits in IDLE: this byte starts a request, and its headers'
        # time with it. Once h11 has the whole head it leaves IDLE (to read a body, or done).
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        """The deadline passed with the headers incomplete: answer 408 if a request had begun,
        then close."""
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:
            message = (
                f"the request headers did not arrive within {self.header_timeout:g} s; "
                "the connection is closed"
            )
            body = json.dumps(error_json(408, message, "header_timeout")).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode("ascii") + body)
        log.debug("closed %s: no request headers within %g s", self.client, self.header_timeout)
        self.transport.close()


def header_deadline_protocol(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """:class:`HeaderDeadlineProtocol` with its deadline set to ``header_timeout`` seconds
    (uvicorn builds one protocol per connection from the class it is given)."""
    return type(
        "HeaderDeadlineProtocol",
        (HeaderDeadlineProtocol,),
        {"header_timeout": header_timeout, "__module__": __name__},
    )


def uvicorn_options(settings: ServeSettings) -> dict[str, Any]:
    """The ``uvicorn.run`` / ``uvicorn.Config`` arguments that put ``settings``' header and
    keep-alive deadlines in force (the body deadline is the app's own)."""
    return {
        "http": header_deadline_protocol(settings.header_timeout),
        "timeout_keep_alive": settings.keep_alive_timeout,
    }
