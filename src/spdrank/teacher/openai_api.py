"""The ``openai`` teacher: one or many OpenAI-compatible ``/v1/chat/completions`` servers.

Teacher labelling at scale runs against vLLM (or llama.cpp's server on a laptop), many
requests in flight: a thread pool keeps ``concurrency`` requests going on each server, and
outcomes are yielded as they finish so the label file grows one record at a time. Which
server takes a request is :mod:`~spdrank.teacher.servers`' choice (the least-loaded one in
rotation). Each request has its own timeout and is retried on its server with exponential
back-off (with jitter, so a restarted server is not hit by every thread at once) on
connection errors, timeouts, 408/409/429, 5xx and 200 answers that are not a completion
(invalid JSON, no ``choices``); other 4xx answers (bad request, auth) fail at once. A request whose retries all failed takes its server out of rotation and is asked
again on another server, once per server, so a dead server among several loses no slates.
The client's own retries are off so the count of attempts is ours. Greedy (temperature 0);
decode passes are ``usage.completion_tokens``.

``guided`` asks the server to constrain each answer to the ranking format for the slate's
size (:mod:`~spdrank.teacher.grammar`: a GBNF ``grammar`` for llama.cpp, a regex for vLLM),
merged into each request's body over ``extra_body``; the backend's name then ends in
``+guided-KIND`` so the label records say how their answers were decoded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from spdrank.teacher.backends import Generation, Job, Outcome, default_max_new_tokens
from spdrank.teacher.grammar import guided_body
from spdrank.teacher.servers import Server, ServerPool, backoff_delay

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429}


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
                Server(url, OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout_s))
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
        self._suffix = f"+guided-{guided}" if guided else ""
        self.tokenizer = tokenizer
        if model_name:
            for server in self.servers:
                server.model_name = model_name
        else:
            self._find_models()
        models = dict.fromkeys(s.model_name for s in self.servers if s.model_name)
        self.name = "openai:" + ",".join(models) + self._suffix

    def _find_models(self) -> None:
        """Ask each server for its model; one that cannot answer starts out of rotation."""
        import openai

        unreachable = []
        for server in self.servers:
            try:
                server.model_name = self._served_model(server)
            except openai.APIError as exc:
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
        if isinstance(exc, (MalformedAnswer, openai.APIResponseValidationError, ValueError)):
            return True  # a 200 whose body is not a completion (ValueError: not JSON)
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code in _RETRY_STATUS or exc.status_code >= 500
        return False

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
                delay = backoff_delay(self.backoff_s, attempt)
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
                backend=f"openai:{server.model_name}{self._suffix}",
                extra={"attempts": attempt + 1},
            )
        raise AssertionError("unreachable")

    def _outcome(self, job: Job) -> Outcome:
        """Ask the servers in turn until one answers, each at most once for this slate."""
        failed: dict[Server, str] = {}
        while (server := self.servers.acquire(exclude=failed.keys())) is not None:
            try:
                generation = self.request(job, server)
            # Any failure is reported per slate (and retried on rerun); the run decides when to stop.
            except Exception as exc:  # noqa: BLE001
                why = f"{type(exc).__name__}: {exc}"
                if not self._retryable(exc):  # the request's fault: every server would refuse it
                    self.servers.release(server)
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
