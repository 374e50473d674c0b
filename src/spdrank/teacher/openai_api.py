"""The ``openai`` teacher: any OpenAI-compatible ``/v1/chat/completions`` server.

Teacher labelling at scale runs against vLLM (or llama.cpp's server on a laptop), many
requests in flight: a thread pool keeps ``concurrency`` requests going, and outcomes are
yielded as they finish so the label file grows one record at a time. Each request has its own
timeout and is retried with exponential back-off (with jitter, so a restarted server is not
hit by every thread at once) on connection errors, timeouts, 408/409/429 and 5xx; other
4xx answers (bad request, auth) fail at once. The client's own retries are off so the count
of attempts is ours. Greedy (temperature 0); decode passes are ``usage.completion_tokens``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from spdrank.teacher.backends import Generation, Job, Outcome, default_max_new_tokens

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429}


class OpenAIBackend:
    """Chat completions over HTTP, ``concurrency`` requests at a time."""

    needs_prompt = True

    def __init__(
        self,
        base_url: str,
        model_name: str | None = None,
        api_key: str = "none",
        mode: str = "direct",
        concurrency: int = 8,
        timeout_s: float = 120.0,
        retries: int = 4,
        backoff_s: float = 1.0,
        max_new_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        from openai import OpenAI

        if concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        if retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("--retries and --retry-backoff must be >= 0, --timeout > 0")
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        self.mode = mode
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_new_tokens = max_new_tokens
        self.extra_body = extra_body
        self.tokenizer = tokenizer
        self.model_name = model_name or self._served_model()
        self.name = f"openai:{self.model_name}"

    def _served_model(self) -> str:
        """The server's first model: vLLM and llama.cpp serve one, so it need not be named."""
        import openai

        try:
            models = [m.id for m in self.client.models.list(timeout=self.timeout_s)]
        except openai.APIError as exc:
            raise ValueError(
                f"cannot list the models at {self.client.base_url} ({exc}): is the server up? "
                "(or pass --model-name)"
            ) from None
        if not models:
            raise ValueError("the server lists no models; pass --model-name")
        if len(models) > 1:
            log.warning("the server serves %d models; using %s (pass --model-name)", len(models), models[0])
        return models[0]

    # -- one request ------------------------------------------------------------------------

    def _retryable(self, exc: Exception) -> bool:
        import openai

        if isinstance(exc, (openai.APIConnectionError, openai.InternalServerError)):
            return True  # APITimeoutError is an APIConnectionError
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code in _RETRY_STATUS or exc.status_code >= 500
        return False

    def request(self, job: Job) -> Generation:
        """One completion, retried; raises the last error when every attempt failed."""
        cap = self.max_new_tokens or default_max_new_tokens(len(job.slate), self.mode)
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            try:
                response = self.client.chat.completions.create(
                    model=self.model_name,
                    messages=job.messages or [],
                    temperature=0.0,
                    max_tokens=cap,
                    timeout=self.timeout_s,
                    extra_body=self.extra_body,
                )
            except Exception as exc:
                if attempt == self.retries or not self._retryable(exc):
                    raise
                delay = self.backoff_s * 2**attempt * random.uniform(0.5, 1.0)
                log.debug("qid %s: %s; retry %d in %.2f s", job.slate.query.qid, exc, attempt + 1, delay)
                time.sleep(delay)
                continue
            latency = (time.perf_counter() - t0) * 1000.0
            choice = response.choices[0]
            usage = response.usage
            return Generation(
                text=choice.message.content or "",
                decode_passes=usage.completion_tokens if usage is not None else None,
                latency_ms=latency,
                hit_max_tokens=choice.finish_reason == "length",
                extra={"attempts": attempt + 1},
            )
        raise AssertionError("unreachable")

    def _outcome(self, job: Job) -> Outcome:
        try:
            return Outcome(job, self.request(job))
        # Any failure is reported per slate (and retried on rerun); the run decides when to stop.
        except Exception as exc:  # noqa: BLE001
            return Outcome(job, error=f"{type(exc).__name__}: {exc}")

    # -- many requests ----------------------------------------------------------------------

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="teacher")
        pending: set[Future[Outcome]] = set()
        try:
            for job in jobs:
                pending.add(pool.submit(self._outcome, job))
                if len(pending) >= self.concurrency:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in done)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        finally:
            # Stopped early (too many failures, Ctrl-C): drop what has not started.
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.client.close()
