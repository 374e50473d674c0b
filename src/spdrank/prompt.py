"""One prompt per slate, as token ids, plus the readout index of every candidate.

The prompt holds an instruction, the user context and the numbered candidates, wrapped in the
model's chat template when it has one. SPD reads each candidate's hidden states over the tokens of
its text (the LAST token, or the mean of all of them), so those positions must be exact
whatever the text holds. With ``history_items`` the user context is read the same way: each
line of it is one history item, and the head may read each item's states too.

That is why the prompt is assembled from separately tokenized pieces instead of tokenizing
one long string: a candidate's tokens are produced from its own text alone (truncated to a
per-candidate budget), with special-token strings split into ordinary tokens. A title holding
``[3]``, newlines, ``<|im_end|>`` or 10,000 characters can therefore neither move another
candidate's readout nor become a control token. The chat template's own text (before and
after the user message) is the only place special tokens are parsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

DEFAULT_INSTRUCTION = (
    "Rank the candidate items by how likely the user is to choose each one next, "
    "given the user's history."
)
_SENTINEL = "\u2063SPDRANK_BODY\u2063"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: How an item's token states reach the head: its last token's, the mean of all of them, or
#: every one of them (for a head that matches tokens: the history head).
READOUTS = ("last", "mean", "tokens")
#: A history line's leading list number (``"3. "``): a place in the list, not the item's text.
_LIST_NUMBER = re.compile(r"^\s*\d+[.)]\s+")


@dataclass
class PromptSettings:
    """How a slate becomes a prompt; saved in a checkpoint so inference matches training."""

    instruction: str = DEFAULT_INSTRUCTION
    #: Tokens kept from each candidate's text (the head of the text).
    max_item_tokens: int = 32
    #: Tokens kept from the user context (its end: the most recent history).
    max_query_tokens: int = 512
    use_chat_template: bool = True
    #: How candidates are numbered: "numbers" ([1], [2], ...) or "letters" ([A] ... [Z], [a] ...
    #: [z]: one token each, which FIRST needs to read a candidate's logit off one position).
    labels: str = "numbers"
    #: Text appended after the assistant turn opens (FIRST appends "[" and reads the next token).
    answer_prefix: str = ""
    #: How an item's token states reach the head: "last" (the paper's readout), "mean" (every
    #: token of the item's text, averaged) or "tokens" (all of them, up to ``max_item_tokens``:
    #: the history head then matches candidates with history items token by token).
    readout: str = "last"
    #: Read the user context as items: each non-empty line is one history item (a leading
    #: ``"3. "`` list number excluded), cut to ``max_item_tokens`` and spanned like a
    #: candidate, so a head can compare candidates with what the user chose before.
    history_items: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptSettings:
        return cls(**data)

    def __post_init__(self) -> None:
        if self.readout not in READOUTS:
            raise ValueError(f"unknown readout {self.readout!r}: use one of {list(READOUTS)}")

    def label(self, index: int) -> str:
        """The identifier of the candidate at 0-based ``index``."""
        if self.labels == "numbers":
            return str(index + 1)
        if self.labels == "letters":
            if index >= len(LETTERS):
                raise ValueError(f"letter labels name at most {len(LETTERS)} candidates")
            return LETTERS[index]
        raise ValueError(f"unknown labels {self.labels!r}: use numbers or letters")


@dataclass
class EncodedPrompt:
    input_ids: list[int]
    #: Index in ``input_ids`` of the last token of each candidate's text.
    readout: list[int]
    #: Which candidates were cut to ``max_item_tokens``.
    truncated: list[bool]
    query_truncated: bool = False
    #: The candidates' normalised upstream features [n, F], for a model that reads them (the
    #: prompt builder leaves this None; :meth:`spdrank.model.SPDRanker.encode` fills it in).
    features: np.ndarray | None = None
    #: Index of the first token of each candidate's text (its span ends at ``readout``).
    first: list[int] | None = None
    #: ``(first, last)`` token indices of each history item, oldest first (``history_items``).
    history: list[tuple[int, int]] | None = None


class PromptBuilder:
    """Renders slates into token ids for one tokenizer and one set of settings."""

    def __init__(self, tokenizer: Any, settings: PromptSettings | None = None) -> None:
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        if self.settings.max_item_tokens < 1:
            raise ValueError("max_item_tokens must be at least 1")
        self._prefix, self._suffix = self._template_ends()
        self._literal_cache: dict[str, list[int]] = {}

    def _template_ends(self) -> tuple[list[int], list[int]]:
        """Token ids of the chat template around the user message (special tokens parsed)."""
        tok = self.tokenizer
        ends = template_around(tok, []) if self.settings.use_chat_template else None
        if ends is not None:
            return self._encode(ends[0], specials=True), self._encode(ends[1], specials=True)
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        return bos, self._encode("\nRanking:", specials=False)

    def _encode(self, text: str, specials: bool = False) -> list[int]:
        """Token ids of ``text``; with ``specials=False`` special-token strings stay plain text."""
        if not text:
            return []
        return list(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=not specials)[
                "input_ids"
            ]
        )

    def _literal(self, text: str) -> list[int]:
        if text not in self._literal_cache:
            self._literal_cache[text] = self._encode(text)
        return self._literal_cache[text]

    def encode(self, query_text: str, candidate_texts: Sequence[str]) -> EncodedPrompt:
        s = self.settings
        ids: list[int] = list(self._prefix)
        ids += self._literal(s.instruction + "\n\nUser history:\n")
        if s.history_items:
            history, query_truncated = self._history(query_text, ids)
        else:
            history = None
            query = self._encode(query_text)
            query_truncated = len(query) > s.max_query_tokens
            ids += query[-s.max_query_tokens :] if query_truncated else query
        ids += self._literal(f"\n\nCandidates ({len(candidate_texts)}):")
        first: list[int] = []
        readout: list[int] = []
        truncated: list[bool] = []
        for i, text in enumerate(candidate_texts):
            ids += self._literal(f"\n[{s.label(i)}] ")
            # Text that yields no tokens is read out at its marker's last token.
            item = self._encode(text)
            truncated.append(len(item) > s.max_item_tokens)
            first.append(len(ids) if item else len(ids) - 1)
            ids += item[: s.max_item_tokens]
            readout.append(len(ids) - 1)
        ids += self._literal("\n")
        ids += self._suffix
        ids += self._literal(s.answer_prefix)
        return EncodedPrompt(
            ids, readout, truncated, query_truncated, first=first, history=history
        )

    def _history(self, query_text: str, ids: list[int]) -> tuple[list[tuple[int, int]], bool]:
        """Append the user context as items, one per non-empty line, to ``ids``; their spans.

        The most recent lines that fit ``max_query_tokens`` are kept (a line is never cut in
        the middle of the budget: older lines are dropped whole), each line's text cut to
        ``max_item_tokens`` like a candidate's.
        """
        s = self.settings
        lines: list[tuple[list[int], list[int]]] = []
        for line in query_text.splitlines():
            if not line.strip():
                continue
            number = _LIST_NUMBER.match(line)
            cut = number.end() if number else 0
            lines.append((self._encode(line[:cut]), self._encode(line[cut:])[: s.max_item_tokens]))
        kept: list[tuple[list[int], list[int]]] = []
        used = 0
        for number_ids, text_ids in reversed(lines):
            size = len(number_ids) + len(text_ids) + 1
            if kept and used + size > s.max_query_tokens:
                break
            kept.append((number_ids, text_ids))
            used += size
        kept.reverse()
        spans: list[tuple[int, int]] = []
        for k, (number_ids, text_ids) in enumerate(kept):
            if k:
                ids += self._literal("\n")
            ids += number_ids
            if text_ids:
                spans.append((len(ids), len(ids) + len(text_ids) - 1))
                ids += text_ids
        return spans, len(kept) < len(lines)

    def item_tokens(self, text: str) -> list[int]:
        """The tokens a candidate's text contributes (after the budget): its readout is the last."""
        return self._encode(text)[: self.settings.max_item_tokens]


def template_around(
    tokenizer: Any, earlier: Sequence[dict[str, str]], **template_kwargs: Any
) -> tuple[str, str] | None:
    """The chat template's text before and after a final user message, or None without one.

    Rendering the template around a sentinel (instead of around the real text) is what keeps
    a user's text from ever being parsed for special tokens: only these two strings are.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    rendered = tokenizer.apply_chat_template(
        [*earlier, {"role": "user", "content": _SENTINEL}],
        tokenize=False,
        add_generation_prompt=True,
        **template_kwargs,
    )
    before, sep, after = rendered.partition(_SENTINEL)
    if not sep:
        raise ValueError("the chat template dropped the user message")
    return before, after


def render_text(
    query_text: str, candidate_texts: Sequence[str], instruction: str = DEFAULT_INSTRUCTION
) -> str:
    """The prompt body :meth:`PromptBuilder.encode` tokenizes, as one string.

    The autoregressive teacher (``spdrank.teacher.prompt``) shows its model this same text, so
    teacher and student see the user context and the numbered ``[i] title`` lines identically.
    Budgets are the caller's: pass texts already cut. Must stay in step with ``encode``'s
    literals (``tests/test_teacher_prompt.py`` checks that the two agree token for token).
    """
    lines = "".join(f"\n[{i}] {text}" for i, text in enumerate(candidate_texts, start=1))
    return (
        f"{instruction}\n\nUser history:\n{query_text}"
        f"\n\nCandidates ({len(candidate_texts)}):{lines}\n"
    )
