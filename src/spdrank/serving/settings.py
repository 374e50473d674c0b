"""The server's knobs, :class:`ServeSettings`: the one source of their defaults and help.

``spdrank serve`` derives a flag from each field (name, type, default, choices, help and the
smallest value it takes come from the field), so a knob added here is a flag at once and the
two cannot disagree. Plain Python (no FastAPI, no torch): the flags are built from it when the
command line is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spdrank.serving.policy import (
    BATCH_POLICIES,
    DEFAULT_BATCH_POLICY,
    DEFAULT_MAX_PADDING,
    check_max_padding,
    check_policy,
)

#: The longest a deadline the server keeps may be, in seconds: a day. A longer one means
#: "never", which lets a client hold a connection for good, and past ``threading.TIMEOUT_MAX``
#: the event loop's timers refuse it.
MAX_TIMEOUT_SECONDS = 86_400.0


def _knob(default: Any, help_text: str, minimum: float | None = None,
          maximum: float | None = None, **extra: Any) -> Any:
    """A settings field whose metadata says how its flag reads (help, smallest and largest
    value, choices, and ``needs``: the field without which it means nothing)."""
    return field(default=default, metadata={"help": help_text, "minimum": minimum,
                                            "maximum": maximum, **extra})


@dataclass
class ServeSettings:
    """The server's knobs (``spdrank serve`` flags); each field's help is in its metadata.

    ``batch_policy`` and ``max_padding`` are the batch policy's (see
    :mod:`spdrank.serving.policy`); the timeouts are the deadlines slow clients get
    (:mod:`spdrank.serving.deadlines`); the rest size the batcher's queue and batches and the
    gate.
    """

    max_batch_size: int = _knob(8, "slates per prefill (1 = no batching)", minimum=1)
    max_wait_ms: float = _knob(
        5.0,
        "how long the oldest waiting request may wait for others to join its batch",
        minimum=0,
        maximum=60_000,  # a minute: a batch waited for longer serves no one
    )
    max_queue: int = _knob(
        64, "requests waiting for a batch before new ones get 503 + Retry-After", minimum=1
    )
    max_body_bytes: int = _knob(1_000_000, "larger bodies get 413", minimum=1)
    batch_policy: str = _knob(
        DEFAULT_BATCH_POLICY,
        "how a collected batch shares prefills: padded (one prefill), bucketed (by prompt "
        "length, padding within --max-padding), single (one prefill per slate) or auto "
        "(single on a CPU, where batching saves nothing; bucketed on an accelerator)",
        choices=BATCH_POLICIES,
    )
    max_padding: float = _knob(
        DEFAULT_MAX_PADDING,
        "bucketed: padded positions a prefill may hold, as a share of its real tokens",
        minimum=0,
    )

    window: int = _knob(
        0,
        "rank a request of more documents than the model's K by sliding windows of this many "
        "(RankGPT's scheme, bottom-up, one prefill a window; at most K); 0: refuse such a "
        "request with 422",
        minimum=0,
    )
    window_stride: int = _knob(
        0, "with --window: how far each window moves up the list (0: half the window, "
        "RankGPT's 20 and 10)", minimum=1, needs="window"
    )
    max_documents: int = _knob(
        1_000, "with --window: the most documents one request may send", minimum=1,
        needs="window",
    )

    header_timeout: float = _knob(
        10.0,
        "seconds a connection has to send a request's headers (the first request's from "
        "connecting, a later one's from its first byte); past it the server answers 408 and "
        "closes the connection",
        minimum=0.1,
        maximum=MAX_TIMEOUT_SECONDS,
    )
    body_timeout: float = _knob(
        30.0,
        "seconds a request has to send its whole body once its headers are in; past it the "
        "server answers 408 and closes the connection",
        minimum=0.1,
        maximum=MAX_TIMEOUT_SECONDS,
    )
    keep_alive_timeout: float = _knob(
        5.0,
        "seconds an idle keep-alive connection stays open between requests",
        minimum=0.1,
        maximum=MAX_TIMEOUT_SECONDS,
    )

    def __post_init__(self) -> None:
        check_policy(self.batch_policy)
        check_max_padding(self.max_padding)
        if self.window and not self.window_stride:
            self.window_stride = max(self.window // 2, 1)
        if self.window and self.window_stride > self.window:
            raise ValueError(
                f"--window-stride ({self.window_stride}) must not exceed --window ({self.window})"
            )
