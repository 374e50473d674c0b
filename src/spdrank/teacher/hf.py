"""The ``hf`` teacher: a local transformers model, greedy, batched with left padding.

Any Hugging Face id or path works; ``bundled`` is the bundled SmolLM2 (through
:func:`spdrank.backbone.resolve_path`). The model's chat template wraps the messages, rendered
around a sentinel as the student's prompt is: only the template's own text is parsed for
special tokens, so a title holding ``<|im_end|>`` stays plain text and cannot end the turn.
Reasoning models whose template takes ``enable_thinking`` (Qwen3) get it set from the mode.

Decode passes are the generated tokens up to and including the first end-of-sequence token
(one forward pass each); latency is the whole batch's wall time (batch size 1 gives the
per-slate latency a single request would see).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Iterator

from spdrank.prompt import template_around
from spdrank.slates import batched
from spdrank.teacher.backends import Generation, Job, Outcome, default_max_new_tokens

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
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from spdrank.backbone import load_tokenizer, resolve_device, resolve_dtype, resolve_path

        if batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        self.name = f"hf:{model}"
        self.mode = mode
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.device = resolve_device(device)
        path = resolve_path(model)
        self.tokenizer = load_tokenizer(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype, self.device)
        ).to(self.device)
        self.model.eval()
        self._torch = torch
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.stop_ids.add(self.tokenizer.pad_token_id)

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
        cap = self.max_new_tokens or max(
            default_max_new_tokens(len(job.slate), self.mode) for job in batch
        )
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

    def close(self) -> None:
        self.model = None
