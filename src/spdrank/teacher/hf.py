"""The ``hf`` teacher: a local transformers model, greedy, batched with left padding.

Any Hugging Face id or path works; ``bundled`` is the bundled SmolLM2 (through
:func:`spdrank.backbone.locate.resolve_path`). The model's chat template wraps the messages,
rendered around a sentinel as the student's prompt is: only the template's own text is parsed for
special tokens, so a title holding ``<|im_end|>`` stays plain text and cannot end the turn.
Reasoning models whose template takes ``enable_thinking`` (Qwen3) get it set from the mode.

Decode passes are the generated tokens up to and including the first end-of-sequence token
(one forward pass each); latency is the whole batch's wall time (batch size 1 gives the
per-slate latency a single request would see).

``constrained`` masks, at every step, the tokens that would not continue a valid ranking
(:mod:`~spdrank.teacher.constrained`): every answer is then a full permutation (status
``ok``) and its decode passes are exact. The backend's name ends in ``+constrained`` so the
label records say so. ``layers`` keeps the first L layers only (a cheaper, weaker teacher).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from spdrank.backbone.prompt import template_around
from spdrank.core.slates import batched
from spdrank.teacher.backends import (
    Generation,
    Job,
    Outcome,
    default_max_new_tokens,
    model_backend_name,
)
from spdrank.teacher.constrained import PermutationLogitsProcessor, Pieces, build_pieces
from spdrank.teacher.lm import load_causal_lm

log = logging.getLogger(__name__)


class HFBackend:
    """Greedy generation with a local model; ``generate`` yields one batch at a time."""

    needs_prompt = True

    def __init__(
        self,
        model: str = "bundled",
        mode: str = "direct",
        batch_size: int = 4,
        max_new_tokens: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        constrained: bool = False,
        layers: int | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        import torch

        if batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        if constrained and mode != "direct":
            raise ValueError("--constrained decodes the ranking alone: it needs --mode direct")
        self.name = model_backend_name("hf", model, layers, constrained)
        self.mode = mode
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.constrained = constrained
        self.model, self.tokenizer, self.device = load_causal_lm(
            model, layers, device, dtype, trust_remote_code
        )
        self._torch = torch
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.stop_ids = self.eos_ids | {self.tokenizer.pad_token_id}
        self._pieces: dict[int, Pieces] = {}

    # -- prompt -----------------------------------------------------------------------------

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the chat; the last user message's text never yields special tokens."""
        tok = self.tokenizer
        body = messages[-1]["content"]
        ends = template_around(tok, messages[:-1], enable_thinking=self.mode == "reasoning")
        if ends is not None:
            before, after = ends
        else:
            bos = tok.bos_token or ""
            before = bos + "".join(m["content"] + "\n\n" for m in messages[:-1])
            after = "\nAnswer:\n"
        return self._ids(before, True) + self._ids(body, False) + self._ids(after, True)

    def _ids(self, text: str, specials: bool) -> list[int]:
        if not text:
            return []
        out = self.tokenizer(text, add_special_tokens=False, split_special_tokens=not specials)
        return list(out["input_ids"])

    # -- generation -------------------------------------------------------------------------

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        for batch in batched(jobs, self.batch_size):
            yield from self._run(batch)

    def _run(self, batch: list[Job]) -> list[Outcome]:
        torch = self._torch
        prompts = [self.encode(job.messages or []) for job in batch]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        processors, cap = self._constraint(batch, width)
        config = copy.deepcopy(self.model.generation_config)
        config.do_sample = False
        config.temperature = None
        config.top_p = None
        config.top_k = None
        config.max_new_tokens = cap
        config.pad_token_id = pad
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=config,
                logits_processor=processors,
            )
        latency = (time.perf_counter() - t0) * 1000.0
        outcomes = []
        for job, prompt, row in zip(batch, prompts, out[:, width:].tolist()):
            count = next((i + 1 for i, t in enumerate(row) if t in self.stop_ids), len(row))
            text = self.tokenizer.decode(row[:count], skip_special_tokens=True)
            stopped = count < len(row) or (bool(row) and row[-1] in self.stop_ids)
            generation = Generation(
                text=text,
                decode_passes=count,
                latency_ms=latency,
                hit_max_tokens=not stopped and count >= cap,
                extra={"prompt_tokens": len(prompt)},
            )
            outcomes.append(Outcome(job, generation))
        return outcomes

    def _constraint(self, batch: list[Job], width: int) -> tuple[Any, int]:
        """The logits processors for ``batch`` (None unconstrained) and its token cap.

        Constrained, the default cap is the longest answer the constraint allows, so no
        answer is ever cut short; a smaller ``--max-new-tokens`` still applies.
        """
        if not self.constrained:
            cap = self.max_new_tokens or max(
                default_max_new_tokens(len(job.slate), self.mode) for job in batch
            )
            return None, cap
        from transformers import LogitsProcessorList

        pieces = [self.pieces(len(job.slate)) for job in batch]
        cap = self.max_new_tokens or max(p.max_tokens() for p in pieces)
        processor = PermutationLogitsProcessor(pieces, self.eos_ids, width)
        return LogitsProcessorList([processor]), cap

    def pieces(self, n: int) -> Pieces:
        """The answer pieces for a slate of ``n`` (tokenized once per slate size)."""
        if n not in self._pieces:
            self._pieces[n] = build_pieces(self.tokenizer, n)
        return self._pieces[n]

    def close(self) -> None:
        self.model = None
