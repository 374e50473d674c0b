"""The ``likelihood`` teacher: rank candidates by how much the user's history raises their title,
or (the ``search`` template) by how likely each passage makes the query.

A listwise teacher decodes its ranking token by token, and a small model loses track of the
ids. This teacher decodes nothing: each candidate's score is the pointwise mutual information
between the user's history and its title under the LM,

    score(c) = log p(title_c | history prompt) - log p(title_c | neutral prompt),

a ranking is always a full permutation (status ``ok``), and decode passes are 0. The
subtraction matters: ``log p(title | history)`` alone prefers short, generic titles, which
any context makes likely; the neutral term measures exactly that prior and removes it.

The history prompt is a chat whose user turn holds the history and asks for the item the
user will choose next; the title is the assistant's answer. The neutral prompt is the same
chat with the history left out, so the difference isolates what the history contributes
(rather than what the instruction's wording does). Without a chat template both are plain
text ending in ``The user will choose next:`` and the title follows after a space.

Cost per slate: one forward over the history prompt (its KV cache kept), then one batched
forward of all ``n`` titles on that cache (right-padded; causal attention keeps a title's
tokens blind to its padding), and the same over the neutral prompt, whose cache is computed
once per run. A title's neutral log-probability does not depend on the slate, so it is
remembered (by token ids, up to ``neutral_memo`` titles) and computed again only for titles
not seen yet. Titles are cut to ``max_item_tokens`` tokens and tokenized alone, with
special-token strings split, as the student's prompt does; the history keeps its last
``max_query_tokens`` tokens. Latency is each slate's own wall time.

The prompt template (:mod:`spdrank.backbone.templates`) holds the texts, and its
``likelihood`` kind says what is scored. ``item`` is the above. ``query`` is query likelihood,
as UPR scores it (Sachan et al. 2022): a passage is as relevant as the query is likely after
it, ``score(p) = log p(query | prompt(p))``, where the template's scoring text holds the
passage (``Passage: {passage}`` ... ``Question:``) and the query is the answer. No neutral
term is needed, since the query is the same for every passage. The slate's ``n`` prompts,
each followed by the query's tokens, are right-padded into one batch and run in one
forward pass; each row's query tokens' log-probabilities are summed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from spdrank.backbone.prompt import CHARS_PER_TOKEN_BOUND, template_around
from spdrank.backbone.templates import DEFAULT_TEMPLATE, PromptTemplate
from spdrank.core.slates import Slate
from spdrank.teacher.backends import Generation, Job, Outcome, model_backend_name
from spdrank.teacher.lm import load_causal_lm
from spdrank.teacher.parse import render_ids
from spdrank.teacher.prompt import CutTally

#: The recommendation template's texts (the ``item`` kind).
SYSTEM = DEFAULT_TEMPLATE.likelihood_system
ASK = DEFAULT_TEMPLATE.likelihood_ask
PLAIN_ASK = DEFAULT_TEMPLATE.likelihood_plain
#: Rows of the LM head's output computed at once when scoring a query ([rows, vocabulary]).
LOGIT_ROWS = 512
_PASSAGE = "\u2063SPDRANK_PASSAGE\u2063"


@dataclass
class Prefix:
    """A prompt run once: its KV cache per layer ([1, heads, P, d] keys and values), its
    length, and the log-probabilities of the token that follows it ([V])."""

    keys_values: list[tuple[torch.Tensor, torch.Tensor]]
    length: int
    next_logprobs: torch.Tensor


class LikelihoodBackend:
    """Scores every candidate of a slate by PMI with the user's history (``item`` kind) or
    by the query's likelihood after it (``query`` kind); best first."""

    needs_prompt = False

    def __init__(
        self,
        model: str = "bundled",
        layers: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_item_tokens: int = 32,
        max_query_tokens: int = 512,
        neutral_memo: int = 100_000,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        trust_remote_code: bool = False,
    ) -> None:
        if max_item_tokens < 1 or max_query_tokens < 1:
            raise ValueError("--max-item-tokens and --max-query-tokens must be at least 1")
        self.name = model_backend_name("likelihood", model, layers)
        self.max_item_tokens = max_item_tokens
        self.max_query_tokens = max_query_tokens
        #: The candidates scored, and those cut to ``max_item_tokens`` (the run reports it).
        self.tally = CutTally()
        self.model, self.tokenizer, self.device = load_causal_lm(
            model, layers, device, dtype, trust_remote_code
        )
        self.template = template
        system = [{"role": "system", "content": template.likelihood_system}]
        self._ends = template_around(self.tokenizer, system if template.likelihood_system else [])
        self._neutral_memo_size = neutral_memo
        self._neutral_memo: dict[tuple[int, ...], float] = {}
        self._neutral: Prefix | None = None

    # -- token ids ---------------------------------------------------------------------------

    def _ids(self, text: str, specials: bool = False) -> list[int]:
        if not text:
            return []
        out = self.tokenizer(text, add_special_tokens=False, split_special_tokens=not specials)
        return list(out["input_ids"])

    def _head(self, text: str) -> str:
        """``text`` cut to what ``max_item_tokens`` tokens can hold, before it is tokenized."""
        return text[: self.max_item_tokens * CHARS_PER_TOKEN_BOUND]

    def prompt_ids(self, history: str | None) -> list[int]:
        """The history prompt's token ids (the neutral prompt's with ``history=None``).

        Only the template's own text is parsed for special tokens, so a history holding
        ``<|im_end|>`` stays plain text.
        """
        t = self.template
        body: list[int] = []
        if history is not None:
            query = self._ids(history[-self.max_query_tokens * CHARS_PER_TOKEN_BOUND :])[
                -self.max_query_tokens :
            ]
            body = self._ids(t.context_header + "\n") + query + self._ids("\n\n")
        if self._ends is not None:
            before, after = self._ends
            return (
                self._ids(before, True) + body + self._ids(t.likelihood_ask)
                + self._ids(after, True)
            )
        return self._bos() + body + self._ids(t.likelihood_plain)

    def _bos(self) -> list[int]:
        return [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []

    def title_ids(self, slate: Slate) -> list[list[int]]:
        """Each candidate's title tokens, cut to ``max_item_tokens``."""
        lead = "" if self._ends is not None else " "
        ids = [self._ids(lead + self._head(text) if text else "")
               for text in slate.candidate_texts()]
        self._count(ids, len(slate.candidate_texts()))
        return [i[: self.max_item_tokens] for i in ids]

    def _count(self, ids: list[list[int]], n: int) -> None:
        self.tally.candidates += n
        self.tally.cut += sum(len(i) > self.max_item_tokens for i in ids)

    def passage_prompt_ids(self, slate: Slate) -> list[list[int]]:
        """The ``query`` kind's prompt for each candidate: the scoring text around its text
        (cut to ``max_item_tokens``), in the chat template when there is one; the query's
        tokens (:meth:`query_ids`) follow it.

        The passage is tokenized alone, special-token strings split; a space before
        ``{passage}`` is tokenized with it (`` word``), as running text would be.
        """
        t = self.template
        chat = self._ends is not None
        ask = t.render("likelihood_ask" if chat else "likelihood_plain", passage=_PASSAGE)
        before, _, after = ask.partition(_PASSAGE)
        lead = " " if before.endswith(" ") else ""
        head, tail = self._ids(before[: len(before) - len(lead)]), self._ids(after)
        if chat:
            head = self._ids(self._ends[0], True) + head
            tail = tail + self._ids(self._ends[1], True)
        else:
            head = self._bos() + head
        texts = slate.candidate_texts()
        ids = [self._ids(lead + self._head(text)) for text in texts]
        self._count(ids, len(texts))
        return [head + i[: self.max_item_tokens] + tail for i in ids]

    def query_ids(self, query: str) -> list[int]:
        """The query's tokens as the ``query`` kind scores them: its head, up to
        ``max_query_tokens``; after a space without a chat template, as a title is."""
        lead = "" if self._ends is not None else " "
        chars = self.max_query_tokens * CHARS_PER_TOKEN_BOUND
        return self._ids(lead + query[:chars] if query else "")[: self.max_query_tokens]

    # -- forward passes ----------------------------------------------------------------------

    @torch.inference_mode()
    def sequence_logprobs(self, prompts: Sequence[list[int]], target: Sequence[int]) -> list[float]:
        """log p(target | prompt) for each prompt, in one batched forward pass.

        Each row is a prompt followed by ``target`` (its last token left out: it predicts
        nothing scored), right-padded: causal attention keeps a row's real tokens blind to
        its padding. Target token ``k`` of row ``i`` is scored by the state at position
        ``len(prompt_i) - 1 + k``; only those states reach the LM head, a few rows at a
        time. An empty target scores 0.
        """
        n, q = len(prompts), len(target)
        if q == 0 or n == 0:
            return [0.0] * n
        if any(not p for p in prompts):
            raise ValueError("a scored prompt needs at least one token")
        rows = [list(p) + list(target[:-1]) for p in prompts]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        pad = 0 if pad is None else pad
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=self.device)
        mask = torch.tensor(
            [[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device
        )
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        starts = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        positions = starts[:, None] + torch.arange(q, device=self.device)[None, :]
        rows_at = torch.arange(n, device=self.device)[:, None]
        picked = hidden[rows_at, positions].reshape(n * q, -1)
        targets = torch.tensor(list(target), device=self.device).repeat(n)
        head = self.model.get_output_embeddings()
        token_logprobs = torch.empty(n * q, dtype=torch.float64, device=self.device)
        for start in range(0, n * q, LOGIT_ROWS):
            stop = start + LOGIT_ROWS
            logits = head(picked[start:stop]).float()
            chosen = logits.gather(1, targets[start:stop, None])[:, 0]
            token_logprobs[start:stop] = chosen - logits.logsumexp(dim=-1)
        return token_logprobs.view(n, q).sum(dim=1).tolist()

    @torch.inference_mode()
    def run_prefix(self, ids: Sequence[int]) -> Prefix:
        """One forward over a prompt; keeps its cache and the next token's log-probabilities."""
        out = self.model(
            input_ids=torch.tensor([list(ids)], device=self.device),
            use_cache=True,
            logits_to_keep=1,
        )
        keys_values = [(layer.keys, layer.values) for layer in out.cache.layers]
        logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        return Prefix(keys_values, len(ids), logprobs)

    @torch.inference_mode()
    def continuation_logprobs(self, prefix: Prefix, titles: Sequence[list[int]]) -> list[float]:
        """log p(title | prefix) for each title, in one batched forward on the prefix's cache.

        Titles are right-padded; a title's first token is scored by the prefix's own next-token
        distribution, each later token by the title's previous position. An empty title
        scores 0.
        """
        from transformers import DynamicCache

        n = len(titles)
        width = max((len(t) for t in titles), default=0)
        if width == 0:
            return [0.0] * n
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([t + [pad] * (width - len(t)) for t in titles], device=self.device)
        real = torch.tensor(
            [[1] * len(t) + [0] * (width - len(t)) for t in titles], device=self.device
        )
        first = prefix.next_logprobs[ids[:, 0]]
        if width == 1:
            return (first * real[:, 0]).tolist()
        # The last position predicts nothing that is scored: leave it out of the forward.
        inputs, mask = ids[:, :-1], real[:, :-1]
        cache = DynamicCache(
            config=self.model.config,
            ddp_cache_data=[
                (k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in prefix.keys_values
            ]
        )
        attention = torch.cat(
            [torch.ones(n, prefix.length, dtype=mask.dtype, device=self.device), mask], dim=1
        )
        positions = torch.arange(prefix.length, prefix.length + width - 1, device=self.device)
        hidden = self.model.get_decoder()(
            input_ids=inputs,
            attention_mask=attention,
            position_ids=positions.unsqueeze(0).expand(n, -1),
            cache=cache,
            use_cache=True,
        ).last_hidden_state
        scored = real[:, 1:].bool()  # positions whose next token is a real title token
        logits = self.model.get_output_embeddings()(hidden[scored]).float()
        targets = ids[:, 1:][scored]
        token_logprobs = logits.gather(1, targets[:, None])[:, 0] - logits.logsumexp(dim=-1)
        rows = torch.arange(n, device=self.device)[:, None].expand(-1, width - 1)[scored]
        totals = (first * real[:, 0]).double()
        totals.index_add_(0, rows, token_logprobs.double())
        return totals.tolist()

    def neutral_logprobs(self, titles: Sequence[list[int]]) -> list[float]:
        """log p(title | neutral prompt) per title, computing only the titles not seen yet."""
        if self._neutral is None:
            self._neutral = self.run_prefix(self.prompt_ids(None))
        keys = [tuple(t) for t in titles]
        todo = list(dict.fromkeys(k for k in keys if k not in self._neutral_memo))
        fresh = dict(zip(todo, self.continuation_logprobs(self._neutral, [list(k) for k in todo])))
        out = [self._neutral_memo.get(k, fresh.get(k)) for k in keys]
        for key, value in fresh.items():
            if len(self._neutral_memo) < self._neutral_memo_size:
                self._neutral_memo[key] = value
        return out

    def scores(self, slate: Slate) -> list[float]:
        """Each candidate's score, in slate order: its PMI with the history (``item``), or
        the query's log-likelihood after it (``query``)."""
        if self.template.likelihood == "query":
            return self.sequence_logprobs(
                self.passage_prompt_ids(slate), self.query_ids(slate.query.text)
            )
        titles = self.title_ids(slate)
        prefix = self.run_prefix(self.prompt_ids(slate.query.text))
        context = self.continuation_logprobs(prefix, titles)
        neutral = self.neutral_logprobs(titles)
        return [c - p for c, p in zip(context, neutral)]

    # -- the backend -------------------------------------------------------------------------

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        for job in jobs:
            t0 = time.perf_counter()
            scores = self.scores(job.slate)
            latency = (time.perf_counter() - t0) * 1000.0
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
            ids = [i + 1 for i in order]
            yield Outcome(
                job,
                Generation(
                    text=render_ids(ids),
                    decode_passes=0,
                    latency_ms=latency,
                    ids=ids,
                    scores=[scores[i] for i in order],
                ),
            )

    def close(self) -> None:
        self.model = None
