"""The listwise teacher's chat prompt, RankGPT-style: user context, numbered candidates, answer.

The body (instruction, ``User history:``, ``Candidates (N):`` and the ``[i] title`` lines) is
:func:`spdrank.backbone.prompt.render_text`, the very text the student's prompt tokenizes, so the
teacher ranks exactly what the student will see; only the answer instruction differs. Titles
are cut to the student's per-candidate token budget with the teacher's tokenizer when one is
known (``hf`` backend, or ``--tokenizer``), else to a character budget (about 4 characters a
token), so a 10,000-character title cannot blow the teacher's context either.

The texts (the body's instruction and headers, the system message, the answer instruction)
are the settings' prompt template (:mod:`spdrank.backbone.templates`), the student's own.

Two modes: ``direct`` asks for the ranking only (few decode passes); ``reasoning`` asks the
model to think first and put the ranking on its last line (many passes; the paper's slower,
slightly better teacher).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spdrank.backbone.prompt import CHARS_PER_TOKEN_BOUND, fitted_item_tokens, render_text
from spdrank.backbone.templates import DEFAULT_TEMPLATE, PromptTemplate
from spdrank.core.slates import Slate

MODES: tuple[str, ...] = ("direct", "reasoning")

#: The recommendation template's system message.
DEFAULT_SYSTEM = DEFAULT_TEMPLATE.system

#: Characters per token assumed when no tokenizer is known (English text, BPE vocabularies).
CHARS_PER_TOKEN = 4


@dataclass
class TeacherPromptSettings:
    """How a slate becomes the teacher's messages; budgets default to the student's."""

    mode: str = "direct"
    #: The body's instruction and the system message; None: the template's.
    instruction: str | None = None
    system: str | None = None
    #: Tokens kept from each candidate's text (its head), as ``PromptSettings.max_item_tokens``;
    #: None: for each slate, what lets its N candidates and the query fit ``context``.
    max_item_tokens: int | None = 32
    #: Tokens kept from the user context (its end: the most recent history).
    max_query_tokens: int = 512
    #: The prompt's wording: the student's template, so teacher and student read one text.
    template: PromptTemplate = DEFAULT_TEMPLATE
    #: The teacher model's positions, which a fitted budget shares out.
    context: int = 8192

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown teacher mode {self.mode!r}; choose from {', '.join(MODES)}")
        if (self.max_item_tokens is not None and self.max_item_tokens < 1) \
                or self.max_query_tokens < 1:
            raise ValueError("max_item_tokens and max_query_tokens must be at least 1")

    def item_budget(self, n: int) -> int:
        """The token budget of each of a slate's ``n`` candidates."""
        if self.max_item_tokens is not None:
            return self.max_item_tokens
        return fitted_item_tokens(self.context, n, self.max_query_tokens)


def answer_instruction(
    n: int, mode: str, template: PromptTemplate = DEFAULT_TEMPLATE, query: str = ""
) -> str:
    """What the teacher is asked to answer, per mode, in ``template``'s words (the parser
    reads the ``[i] > [j]`` format they ask for); ``query`` fills a ``{query}`` they hold."""
    field = "reasoning_answer" if mode == "reasoning" else "answer"
    return template.render(field, n=n, query=query)


@dataclass
class CutTally:
    """Candidates a teacher read, and how many it read cut to the token budget: what the run
    summary reports, since a cut passage is a different passage."""

    candidates: int = 0
    cut: int = 0

    def add(self, originals: Sequence[str], kept: Sequence[str]) -> None:
        self.candidates += len(originals)
        self.cut += sum(a != b for a, b in zip(originals, kept))


def cut_head(text: str, budget: int, tokenizer: Any | None = None) -> str:
    """The head of ``text`` within ``budget`` tokens (or ``budget * 4`` characters)."""
    if tokenizer is None:
        limit = budget * CHARS_PER_TOKEN
        return text if len(text) <= limit else text[:limit].rstrip()
    chars = budget * CHARS_PER_TOKEN_BOUND  # a huge text is cut before it is tokenized
    ids = _tokens(tokenizer, text[:chars])
    if len(ids) <= budget and len(text) <= chars:
        return text
    # A cut inside a multi-byte character decodes to U+FFFD: drop it rather than show it.
    return tokenizer.decode(ids[:budget]).rstrip("\ufffd").rstrip()


def cut_tail(text: str, budget: int, tokenizer: Any | None = None) -> str:
    """The end of ``text`` within ``budget`` tokens: the most recent history survives."""
    if tokenizer is None:
        limit = budget * CHARS_PER_TOKEN
        return text if len(text) <= limit else text[-limit:].lstrip()
    chars = budget * CHARS_PER_TOKEN_BOUND
    ids = _tokens(tokenizer, text[-chars:])
    if len(ids) <= budget and len(text) <= chars:
        return text
    return tokenizer.decode(ids[-budget:]).lstrip("\ufffd").lstrip()


def _tokens(tokenizer: Any, text: str) -> list[int]:
    # As the student counts them: no special tokens added, special-token strings split.
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def user_message(
    slate: Slate,
    settings: TeacherPromptSettings,
    tokenizer: Any | None = None,
    tally: CutTally | None = None,
) -> str:
    """The user turn: the student's prompt body plus the answer instruction; ``tally``
    counts the candidates cut to the budget."""
    texts = slate.candidate_texts()
    budget = settings.item_budget(len(texts))
    titles = [cut_head(t, budget, tokenizer) for t in texts]
    if tally is not None:
        tally.add(texts, titles)
    query = cut_tail(slate.query.text, settings.max_query_tokens, tokenizer)
    template = settings.template
    body = render_text(query, titles, settings.instruction, template)
    return body + "\n" + answer_instruction(len(slate), settings.mode, template, query)


def build_messages(
    slate: Slate,
    settings: TeacherPromptSettings | None = None,
    tokenizer: Any | None = None,
    tally: CutTally | None = None,
) -> list[dict[str, str]]:
    """The chat messages (``[{role, content}]``) that ask the teacher to rank ``slate``
    (``tally``: counts the candidates cut to the budget)."""
    settings = settings or TeacherPromptSettings()
    messages = []
    system = settings.template.system if settings.system is None else settings.system
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user_message(slate, settings, tokenizer, tally)})
    return messages
