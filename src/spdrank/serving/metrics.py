"""Prometheus text exposition, hand-written.

Five metric families do not justify a dependency: counters, one gauge and fixed-bucket
histograms render in a few lines of the text format (version 0.0.4). Updates take a lock, so
the event loop and the inference thread may both record.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: Labels = ()) -> str:
    pairs = labels + extra
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Family:
    kind = ""

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        self.name = name
        self.help = help_text
        self._lock = lock

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    kind = "counter"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        lines = self.header()
        for key, value in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(key)} {_num(value)}")
        return lines


class Gauge(_Family):
    kind = "gauge"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._value = 0.0

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def render(self) -> list[str]:
        return self.header() + [f"{self.name} {_num(self._value)}"]


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, lock: threading.Lock, buckets: Sequence[float]
    ) -> None:
        super().__init__(name, help_text, lock)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1  # +Inf bucket (= count)
            total[0] += value

    def count(self, **labels: str) -> int:
        with self._lock:
            series = self._series.get(tuple(sorted(labels.items())))
            return series[0][-1] if series else 0

    def render(self) -> list[str]:
        lines = self.header()
        for key, (counts, total) in sorted(self._series.items()):
            for bound, count in zip((*self.buckets, math.inf), counts):
                lines.append(f"{self.name}_bucket{_labels(key, (('le', _num(bound)),))} {count}")
            lines.append(f"{self.name}_sum{_labels(key)} {_num(total[0])}")
            lines.append(f"{self.name}_count{_labels(key)} {counts[-1]}")
        return lines


class ServerMetrics:
    """The server's metrics: requests, errors, latency, queueing and batching, nothing more."""

    def __init__(self) -> None:
        lock = threading.Lock()
        self._lock = lock
        self.requests = Counter(
            "spdrank_requests_total", "HTTP requests by route and status code.", lock
        )
        self.errors = Counter(
            "spdrank_errors_total", "Error responses by route and error type.", lock
        )
        self.latency = Histogram(
            "spdrank_request_duration_seconds",
            "Wall time from request received to response sent, by route.",
            lock,
            LATENCY_BUCKETS,
        )
        self.queue_wait = Histogram(
            "spdrank_queue_wait_seconds",
            "Time a slate waited between admission and the start of its batch.",
            lock,
            LATENCY_BUCKETS,
        )
        self.inference = Histogram(
            "spdrank_inference_seconds",
            "Time of one batched inference (tokenize, prefill, head, assignment).",
            lock,
            LATENCY_BUCKETS,
        )
        self.batch_size = Histogram(
            "spdrank_batch_size", "Slates per batched prefill.", lock, BATCH_BUCKETS
        )
        self.queue_depth = Gauge(
            "spdrank_queue_depth", "Slates admitted and waiting for a batch.", lock
        )
        self.rejected = Counter(
            "spdrank_rejected_total", "Requests refused because the queue was full.", lock
        )
        self.abandoned = Counter(
            "spdrank_abandoned_total",
            "Queued requests dropped unrun because their client disconnected.",
            lock,
        )

    def families(self) -> Iterable[_Family]:
        return (
            self.requests,
            self.errors,
            self.latency,
            self.queue_wait,
            self.inference,
            self.batch_size,
            self.queue_depth,
            self.rejected,
            self.abandoned,
        )

    def render(self) -> str:
        with self._lock:
            lines = [line for family in self.families() for line in family.render()]
        return "\n".join(lines) + "\n"
