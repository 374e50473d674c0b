"""The LLMs that write synthetic queries (:mod:`spdrank.datasets.synthetic_queries`).

A query writer is a teacher of another kind: an LLM run once, offline, whose answers become
training data. It lives beside the teacher's backends because it loads and calls the same
models the same way: a local model through :func:`~spdrank.teacher.lm.load_causal_lm` (the
bundled SmolLM2 or any HF model), an OpenAI-compatible server through the teacher's
:class:`~spdrank.teacher.openai_api.OpenAIBackend` (its concurrency, per-attempt deadline,
retries with back-off and failover between servers), each passage sent as a one-candidate job.

Greedy by default (InPars decodes greedily); ``temperature`` > 0 samples (Promptagator),
seeded: a local model by the seed and each batch's first docid, a server by a ``seed`` field
in the request, which vLLM and llama.cpp honour.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from spdrank.core.slates import Candidate, Query, Slate, batched
from spdrank.datasets.synthetic_queries import PromptJob, Written
from spdrank.teacher.backends import Job
from spdrank.teacher.lm import load_causal_lm

#: New tokens a query may take by default: an MS MARCO query is 6 words, 30 is far past it.
MAX_NEW_TOKENS = 32


def _settings(max_new_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    """What the queries depend on beside the model: the seed only when sampling."""
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    if not temperature >= 0:
        raise ValueError("--temperature must be >= 0")
    out: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": temperature}
    return {**out, "seed": seed} if temperature > 0 else out


class HFQueryWriter:
    """A local causal LM completing the few-shot prompt, batched with left padding; each
    answer stops at its first line end (or the end-of-sequence token, or the token cap)."""

    def __init__(
        self,
        model: str = "bundled",
        batch_size: int = 8,
        max_new_tokens: int = MAX_NEW_TOKENS,
        temperature: float = 0.0,
        seed: int = 0,
        device: str = "auto",
        dtype: str = "auto",
        trust_remote_code: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        self.settings = _settings(max_new_tokens, temperature, seed)
        self.name = f"hf:{model}"
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.temperature, self.seed = temperature, seed
        self._load_args = (model, None, device, dtype, trust_remote_code)
        self.model: Any = None

    def load(self) -> None:
        """Load the model, once, when there is a query to write: a rerun with every query
        journalled, or one refused for its settings, loads nothing."""
        if self.model is not None:
            return
        self.model, self.tokenizer, self.device = load_causal_lm(*self._load_args)
        tok = self.tokenizer
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (
            eos[0] if isinstance(eos, list) else eos)
        self.stop_ids = set(eos if isinstance(eos, list) else [eos]) | {self.pad_id}

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids; a passage's text never yields special tokens."""
        out = self.tokenizer(prompt, add_special_tokens=True, split_special_tokens=True)
        return list(out["input_ids"])

    def write(self, jobs: Iterable[PromptJob]) -> Iterator[Written]:
        for batch in batched(jobs, self.batch_size):
            self.load()
            yield from self._run(batch)

    def _run(self, batch: Sequence[PromptJob]) -> list[Written]:
        import torch

        prompts = [self.encode(job.prompt) for job in batch]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        config = copy.deepcopy(self.model.generation_config)
        config.do_sample = self.temperature > 0
        config.temperature = self.temperature if config.do_sample else None
        config.top_p = config.top_k = None
        config.max_new_tokens = self.max_new_tokens
        config.pad_token_id = self.pad_id
        config.stop_strings = ["\n"]
        if config.do_sample:
            digest = hashlib.sha256(f"{self.seed}:{batch[0].docid}".encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], "little"))
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                generation_config=config, tokenizer=self.tokenizer,
            )
        answers = []
        for job, row in zip(batch, out[:, width:].tolist()):
            stop = next((i for i, t in enumerate(row) if t in self.stop_ids), None)
            text = self.tokenizer.decode(row if stop is None else row[:stop],
                                         skip_special_tokens=True)
            hit = stop is None and len(row) >= self.max_new_tokens
            answers.append(Written(job.docid, text, hit_max_tokens=hit))
        return answers

    def close(self) -> None:
        self.model = None


class OpenAIQueryWriter:
    """An OpenAI-compatible chat server (vLLM, llama.cpp, OpenAI's API): the prompt's
    instruction as the system message, the few-shot prompt as the user's; many requests in
    flight, as the teacher sends them."""

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model_name: str,
        api_key: str = "none",
        max_new_tokens: int = MAX_NEW_TOKENS,
        temperature: float = 0.0,
        seed: int = 0,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        retries: int = 4,
    ) -> None:
        from spdrank.teacher.openai_api import OpenAIBackend

        self.settings = _settings(max_new_tokens, temperature, seed)
        self.name = f"openai:{model_name}"
        # temperature rides in the request body, where it replaces the teacher's greedy 0
        sampling = {"temperature": temperature, "seed": seed} if temperature > 0 else None
        self.backend = OpenAIBackend(
            base_urls, model_name, api_key, concurrency=concurrency, timeout_s=timeout_s,
            retries=retries, max_new_tokens=max_new_tokens, extra_body=sampling,
        )

    def write(self, jobs: Iterable[PromptJob]) -> Iterator[Written]:
        requests = (
            Job(Slate(Query(job.docid, ""), [Candidate(job.docid, {"text": job.prompt})]),
                messages=[{"role": "system", "content": job.instruction},
                          {"role": "user", "content": job.prompt}])
            for job in jobs
        )
        for outcome in self.backend.generate(requests):
            docid = outcome.job.slate.query.qid
            if outcome.generation is None:
                yield Written(docid, error=outcome.error or "no answer")
            else:
                yield Written(docid, outcome.generation.text,
                              hit_max_tokens=outcome.generation.hit_max_tokens)

    def close(self) -> None:
        self.backend.close()
