"""The ``openai`` teacher: one or many OpenAI-compatible ``/v1/chat/completions`` servers.

Teacher labelling at scale runs against vLLM (or llama.cpp's server on a laptop), many
requests in flight: a thread pool keeps ``concurrency`` requests going on each server, and
outcomes are yielded as they finish so the label file grows one record at a time. Which
server takes a request is :mod:`~spdrank.teacher.servers`' choice (the least-loaded one in
rotation). Each attempt has a total deadline, ``timeout_s`` from connect to the last byte
of the answer (httpx's timeouts bound each socket operation only, so a server trickling a
byte at a time would hold an attempt for ever): every socket operation of the attempt is
given what is left of it (:func:`deadline`). An attempt also reads at most
:data:`~spdrank.core.defaults.MAX_ANSWER_BYTES` (:class:`AnswerTooLarge`), uncompressed, so a
server streaming without end is cut at once. A failed attempt is retried on its server with
exponential back-off (with jitter, so a restarted server is not hit by every thread at once),
or after the answer's ``Retry-After`` when that is longer (at most :data:`MAX_RETRY_AFTER_S`),
on connection errors, timeouts, 408/409/429, 5xx and 200 answers that are not a completion
(invalid JSON, no ``choices``); other 4xx answers (bad request) fail the slate at once. A
401/403 (the key refused) or a 404 for the model ends the run at once with one line
(:class:`ServerRefused`): every slate would fail alike. A request whose retries all failed
takes its server out of rotation and is asked again on another server, once per server, so a
dead server among several loses no slates. The openai client's own retries are off, so this
module is the one layer that retries and the count of attempts is ours. Greedy (temperature
0); decode passes are ``usage.completion_tokens``.

``guided`` asks the server to constrain each answer to the ranking format for the slate's
size (:mod:`~spdrank.teacher.grammar`: a GBNF ``grammar`` for llama.cpp, a regex for vLLM),
merged into each request's body over ``extra_body``; the backend's name then ends in
``+guided-KIND`` so the label records say how their answers were decoded.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from spdrank.core.defaults import MAX_ANSWER_BYTES
from spdrank.teacher.backends import (
    Generation,
    Job,
    Outcome,
    default_max_new_tokens,
    server_backend_name,
)
from spdrank.teacher.grammar import guided_body
from spdrank.teacher.servers import Server, ServerPool, backoff_delay

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429}

#: The longest wait a server's ``Retry-After`` gets before the retry: a server asking for
#: longer is asked again after this long (and its slate moves on if it still refuses).
MAX_RETRY_AFTER_S = 120.0


class ServerRefused(ValueError):
    """A server refused the run itself (the API key, the model name): every slate would fail
    the same way, so the run stops at once with this one-line message."""


def refusal(exc: Exception, url: str, model: str | None) -> str | None:
    """The one-line reason to stop the run when ``exc`` is a refusal of the run, else None."""
    import openai

    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        reason = "401 Unauthorized" if exc.status_code == 401 else "403 Forbidden"
        return f"{url} refused the API key ({reason}): check --api-key (default $OPENAI_API_KEY)"
    if isinstance(exc, openai.NotFoundError) and model:
        return (
            f"{url} has no model {model!r} (404 Not Found): check --model-name, and that "
            "--base-url is the API root (like http://host:8000/v1)"
        )
    return None


# -- the total deadline and the bytes of an attempt ---------------------------------------

#: ``time.monotonic()`` by which this thread's current attempt must be over; None: no deadline.
_DEADLINE: ContextVar[float | None] = ContextVar("spdrank_teacher_deadline", default=None)


class AnswerTooLarge(Exception):
    """A server sent more for one request than any answer holds, or sent it compressed (whose
    size unpacked nothing bounds): read no further. The server's fault, so it is retried and
    another server asked, as an answer that is not a completion is."""


class _Budget:
    """The bytes the current attempt may still read."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise AnswerTooLarge(
                f"the answer passed {self.limit:,} bytes (a server that keeps sending?): read "
                "no further"
            )


#: What this thread's current attempt may still read; None: no bound.
_BUDGET: ContextVar[_Budget | None] = ContextVar("spdrank_teacher_budget", default=None)


@contextmanager
def deadline(seconds: float, max_bytes: int = MAX_ANSWER_BYTES) -> Iterator[None]:
    """Every request this thread sends inside the block ends within ``seconds`` of its start,
    and reads at most ``max_bytes`` from the network in all.

    The clients of :func:`deadline_client` read both before each connect, read and write, so
    the request fails with a timeout once the time is spent, however slowly the bytes come, and
    with :class:`AnswerTooLarge` once the bytes are, however fast.
    """
    token = _DEADLINE.set(time.monotonic() + seconds)
    budget = _BUDGET.set(_Budget(max_bytes))
    try:
        yield
    finally:
        _BUDGET.reset(budget)
        _DEADLINE.reset(token)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the deadline; ``error`` once nothing is left."""
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the attempt's total deadline (--timeout) passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """An httpcore2 network stream whose every operation ends by the thread's deadline, and
    whose reads are counted against its budget."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import httpcore2

        data = self._inner.read(max_bytes, _left(timeout, httpcore2.ReadTimeout))
        budget = _BUDGET.get()
        if budget is not None:
            budget.spend(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import httpcore2

        self._inner.write(buffer, _left(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> _DeadlineStream:
        import httpcore2

        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      _left(timeout, httpcore2.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """An httpcore2 network backend whose connections obey the thread's deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None) -> _DeadlineStream:
        import httpcore2

        return _DeadlineStream(self._inner.connect_tcp(
            host, port, _left(timeout, httpcore2.ConnectTimeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> _DeadlineStream:
        import httpcore2

        return _DeadlineStream(self._inner.connect_unix_socket(
            path, _left(timeout, httpcore2.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _refuse_compressed(response: Any) -> None:
    """A response hook: an answer compressed despite ``Accept-Encoding: identity`` is
    refused, since the bytes counted are the compressed ones and a small body can unpack to
    any size."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerTooLarge(f"the answer is compressed ({encoding}), which was not asked for: "
                             "its size unpacked cannot be bounded")


def deadline_client(timeout_s: float) -> Any:
    """The openai client's own HTTP client (its defaults, proxies from the environment), with
    every connection pool's network backend wrapped so that :func:`deadline` holds, asking
    for answers as they are (not compressed) and refusing any other.

    httpx2 takes a network backend only through the pools it builds itself, so the wrapper is
    put on each of them (the direct one and any proxy's) before a connection exists.
    """
    from openai import DefaultHttpxClient

    client = DefaultHttpxClient(timeout=timeout_s, headers={"Accept-Encoding": "identity"},
                                event_hooks={"response": [_refuse_compressed]})
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None:
            client.close()
            raise RuntimeError(
                f"cannot bound the teacher's requests: {type(transport).__name__} has no "
                "connection pool with a network backend (an httpx2 this spdrank does not know)"
            )
        pool._network_backend = _DeadlineBackend(backend)
    return client


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """The wait an answer's headers ask for before a retry, in seconds; None when they ask none.

    ``Retry-After`` is delay-seconds or an HTTP-date; ``retry-after-ms`` (OpenAI's API sends
    it) is read first. A date in the past asks for no wait; an unreadable value asks none.
    """
    if headers is None:
        return None
    headers = {name.lower(): value for name, value in headers.items()}
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = headers.get("retry-after")
    seconds = _seconds(value)
    if seconds is not None or value is None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, said without a zone
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _seconds(text: str | None) -> float | None:
    """``text`` as a number of seconds >= 0 (inf included: the cap bounds it), else None."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None  # NaN fails the comparison too


class MalformedAnswer(Exception):
    """A 200 answer that is not a chat completion (no ``choices``, no message): a server in
    trouble, so it is retried with back-off like a 5xx rather than failing the slate."""


def first_choice(response: Any) -> Any:
    """The answer's first choice; :class:`MalformedAnswer` when it has none to read."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise MalformedAnswer("a 200 answer without 'choices'")
    choice = choices[0]
    if getattr(choice, "message", None) is None:
        raise MalformedAnswer("a 200 answer whose first choice has no 'message'")
    return choice


class OpenAIBackend:
    """Chat completions over HTTP, ``concurrency`` requests at a time on each server."""

    needs_prompt = True

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model_name: str | None = None,
        api_key: str = "none",
        mode: str = "direct",
        concurrency: int = 8,
        timeout_s: float = 120.0,
        retries: int = 4,
        backoff_s: float = 1.0,
        server_backoff_s: float = 30.0,
        max_new_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        tokenizer: Any | None = None,
        guided: str | None = None,
    ) -> None:
        from openai import OpenAI

        if retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("--retries and --retry-backoff must be >= 0, --timeout > 0")
        if guided is not None:
            if mode != "direct":
                raise ValueError("--guided constrains the whole answer: it needs --mode direct")
            guided_body(guided, 1)  # an unknown kind fails before any request
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        self.servers = ServerPool(
            [
                Server(url, OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout_s,
                                   http_client=deadline_client(timeout_s)))
                for url in urls
            ],
            limit=concurrency,
            backoff_s=server_backoff_s,
        )
        self.mode = mode
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_new_tokens = max_new_tokens
        self.extra_body = extra_body
        self.guided = guided
        self.tokenizer = tokenizer
        if model_name:
            for server in self.servers:
                server.model_name = model_name
        else:
            try:
                self._find_models()
            except ValueError:  # no run: its connections go now
                self.close()
                raise
        models = dict.fromkeys(s.model_name for s in self.servers if s.model_name)
        self.name = server_backend_name(models, guided)

    def _find_models(self) -> None:
        """Ask each server for its model; one that cannot answer starts out of rotation, one
        that refuses the key ends the run."""
        import openai

        unreachable = []
        for server in self.servers:
            try:
                with deadline(self.timeout_s):
                    server.model_name = self._served_model(server)
            except openai.APIError as exc:
                stop = refusal(exc, server.url, None)
                if stop is not None:
                    raise ServerRefused(stop) from exc
                unreachable.append(f"{server.url} ({exc})")
                self.servers.take_out(server, f"cannot list its models: {exc}")
        if len(unreachable) == len(self.servers):
            raise ValueError(
                f"cannot list the models at {', '.join(unreachable)}: is the server up? "
                "(or pass --model-name)"
            )

    def _served_model(self, server: Server) -> str:
        """The server's first model: vLLM and llama.cpp serve one, so it need not be named."""
        models = [m.id for m in server.client.models.list(timeout=self.timeout_s)]
        if not models:
            raise ValueError(f"{server.url} lists no models; pass --model-name")
        if len(models) > 1:
            log.warning(
                "%s serves %d models; using %s (pass --model-name)", server.url, len(models), models[0]
            )
        return models[0]

    # -- one request ------------------------------------------------------------------------

    def _retryable(self, exc: Exception) -> bool:
        import openai

        if isinstance(exc, (openai.APIConnectionError, openai.InternalServerError)):
            return True  # APITimeoutError is an APIConnectionError
        if isinstance(exc, (MalformedAnswer, AnswerTooLarge, openai.APIResponseValidationError,
                            ValueError)):
            return True  # a 200 whose body is not a completion (ValueError: not JSON), or past all
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code in _RETRY_STATUS or exc.status_code >= 500
        return False

    def retry_delay(self, exc: Exception, attempt: int) -> float:
        """The wait before retry ``attempt + 1``: the back-off, or the answer's ``Retry-After``
        when that is longer, up to :data:`MAX_RETRY_AFTER_S`."""
        delay = backoff_delay(self.backoff_s, attempt)
        response = getattr(exc, "response", None)  # an answer's status error carries it
        asked = retry_after_s(getattr(response, "headers", None))
        return delay if asked is None else max(delay, min(asked, MAX_RETRY_AFTER_S))

    def request_body(self, n: int) -> dict[str, Any] | None:
        """Extra request fields for a slate of ``n``: ``extra_body``, then the constraint."""
        if self.guided is None:
            return self.extra_body
        return {**(self.extra_body or {}), **guided_body(self.guided, n)}

    def request(self, job: Job, server: Server) -> Generation:
        """One completion from ``server``, retried; raises the last error when every attempt failed."""
        cap = self.max_new_tokens or default_max_new_tokens(len(job.slate), self.mode)
        body = self.request_body(len(job.slate))
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            try:
                with deadline(self.timeout_s):
                    if server.model_name is None:  # it was down when the run started
                        server.model_name = self._served_model(server)
                    response = server.client.chat.completions.create(
                        model=server.model_name,
                        messages=job.messages or [],
                        temperature=0.0,
                        max_tokens=cap,
                        timeout=self.timeout_s,
                        extra_body=body,
                    )
                choice = first_choice(response)
            except Exception as exc:
                if attempt == self.retries or not self._retryable(exc):
                    raise
                delay = self.retry_delay(exc, attempt)
                log.debug("qid %s: %s; retry %d in %.2f s", job.slate.query.qid, exc, attempt + 1, delay)
                if self.servers.closed.wait(delay):
                    raise  # the run is over
                continue
            latency = (time.perf_counter() - t0) * 1000.0
            usage = getattr(response, "usage", None)
            return Generation(
                text=choice.message.content or "",
                decode_passes=getattr(usage, "completion_tokens", None),
                latency_ms=latency,
                hit_max_tokens=choice.finish_reason == "length",
                server=server.url,
                backend=server_backend_name([str(server.model_name)], self.guided),
                extra={"attempts": attempt + 1},
            )
        raise AssertionError("unreachable")

    def _outcome(self, job: Job) -> Outcome:
        """Ask the servers in turn until one answers, each at most once for this slate."""
        failed: dict[Server, str] = {}
        while (server := self.servers.acquire(exclude=failed.keys())) is not None:
            try:
                generation = self.request(job, server)
            # A failure is reported per slate (and retried on rerun) and the run decides when to
            # stop, unless the server refused the run itself.
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                if not self._retryable(exc):  # the request's fault: every server would refuse it
                    self.servers.release(server)
                    stop = refusal(exc, server.url, server.model_name)
                    if stop is not None:  # the run's fault: every slate would fail alike
                        raise ServerRefused(stop) from exc
                    return Outcome(job, error=f"{server.url}: {why}")
                self.servers.release(server, failure=why)
                failed[server] = why
                continue
            self.servers.release(server)
            return Outcome(job, generation)
        if not failed:
            return Outcome(job, error="the run ended before a server was free")
        return Outcome(job, error="; ".join(f"{s.url}: {why}" for s, why in failed.items()))

    # -- many requests ----------------------------------------------------------------------

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        capacity = self.servers.capacity
        threads = ThreadPoolExecutor(capacity, thread_name_prefix="teacher")
        pending: set[Future[Outcome]] = set()
        try:
            for job in jobs:
                pending.add(threads.submit(self._outcome, job))
                if len(pending) >= capacity:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in done)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        finally:
            # Stopped early (too many failures, Ctrl-C): drop what has not started.
            threads.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.servers.close()
        for server in self.servers:
            server.client.close()
