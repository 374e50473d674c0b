"""The listwise teacher's chat prompt, RankGPT-style: user context, numbered candidates, answer.

The body (instruction, ``User history:``, ``Candidates (N):`` and the ``[i] title`` lines) is
:func:`spdrank.prompt.render_text`, the very text the student's prompt tokenizes, so the
teacher ranks exactly what the student will see; only the answer instruction differs. Titles
are cut to the student's per-candidate token budget with the teacher's tokenizer when one is
known (``hf`` backend, or ``--tokenizer``), else to a character budget (about 4 characters a
token), so a 10,000-character title cannot blow the teacher's context either.

Two modes: ``direct`` asks for the ranking only (few decode passes); ``reasoning`` asks the
model to think first and put the ranking on its last line (many passes; the paper's slower,
slightly better teacher).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spdrank.prompt import DEFAULT_INSTRUCTION, render_text
from spdrank.slates import Slate

MODES: tuple[str, ...] = ("direct", "reasoning")

DEFAULT_SYSTEM = (
    "You are an expert recommender system. Given a user's history, you rank candidate items "
    "by how likely the user is to choose each one next."
)

#: Characters per token assumed when no tokenizer is known (English text, BPE vocabularies).
CHARS_PER_TOKEN = 4


@dataclass
class TeacherPromptSettings:
    """How a slate becomes the teacher's messages; budgets default to the student's."""

    mode: str = "direct"
    instruction: str = DEFAULT_INSTRUCTION
    system: str = DEFAULT_SYSTEM
    #: Tokens kept from each candidate's text (its head), as ``PromptSettings.max_item_tokens``.
    max_item_tokens: int = 32
    #: Tokens kept from the user context (its end: the most recent history).
    max_query_tokens: int = 512

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown teacher mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.max_item_tokens < 1 or self.max_query_tokens < 1:
            raise ValueError("max_item_tokens and max_query_tokens must be at least 1")


def answer_instruction(n: int, mode: str) -> str:
    """What the teacher is asked to answer, per mode (the parser reads the same format)."""
    fmt = (
        f"in the format [i] > [j] > ... using the candidate numbers, "
        f"every number from 1 to {n} exactly once"
    )
    if mode == "reasoning":
        return (
            f"First think step by step about the user's preferences and each candidate. Then, "
            f"on the last line, write the ranking of all {n} candidates, most likely first, {fmt}."
        )
    return (
        f"Rank all {n} candidates, most likely first. Answer only with the ranking, {fmt}, "
        f"and nothing else: no explanation."
    )


def cut_head(text: str, budget: int, tokenizer: Any | None = None) -> str:
    """The head of ``text`` within ``budget`` tokens (or ``budget * 4`` characters)."""
    if tokenizer is None:
        limit = budget * CHARS_PER_TOKEN
        return text if len(text) <= limit else text[:limit].rstrip()
    ids = _tokens(tokenizer, text)
    if len(ids) <= budget:
        return text
    # A cut inside a multi-byte character decodes to U+FFFD: drop it rather than show it.
    return tokenizer.decode(ids[:budget]).rstrip("\ufffd").rstrip()


def cut_tail(text: str, budget: int, tokenizer: Any | None = None) -> str:
    """The end of ``text`` within ``budget`` tokens: the most recent history survives."""
    if tokenizer is None:
        limit = budget * CHARS_PER_TOKEN
        return text if len(text) <= limit else text[-limit:].lstrip()
    ids = _tokens(tokenizer, text)
    if len(ids) <= budget:
        return text
    return tokenizer.decode(ids[-budget:]).lstrip("\ufffd").lstrip()


def _tokens(tokenizer: Any, text: str) -> list[int]:
    # As the student counts them: no special tokens added, special-token strings split.
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def user_message(
    slate: Slate, settings: TeacherPromptSettings, tokenizer: Any | None = None
) -> str:
    """The user turn: the student's prompt body plus the answer instruction."""
    titles = [cut_head(t, settings.max_item_tokens, tokenizer) for t in slate.candidate_texts()]
    query = cut_tail(slate.query.text, settings.max_query_tokens, tokenizer)
    body = render_text(query, titles, settings.instruction)
    return body + "\n" + answer_instruction(len(slate), settings.mode)


def build_messages(
    slate: Slate, settings: TeacherPromptSettings | None = None, tokenizer: Any | None = None
) -> list[dict[str, str]]:
    """The chat messages (``[{role, content}]``) that ask the teacher to rank ``slate``."""
    settings = settings or TeacherPromptSettings()
    messages = []
    if settings.system:
        messages.append({"role": "system", "content": settings.system})
    messages.append({"role": "user", "content": user_message(slate, settings, tokenizer)})
    return messages
