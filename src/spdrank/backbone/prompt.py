"""One prompt per slate, as token ids, plus the token span of every candidate's text.

The prompt holds an instruction, the user context and the numbered candidates, wrapped in the
model's chat template when it has one; their wording (instruction and headers) is the
settings' prompt template (:mod:`spdrank.backbone.templates`: recommendation or search). SPD reads each candidate's hidden states over the tokens of
its text (the LAST token, or the mean of all of them), so those positions must be exact
whatever the text holds. With ``history_items`` the user context is read the same way: each
line of it is one history item, and the head may read each item's states too.

That is why the prompt is assembled from separately tokenized pieces instead of tokenizing
one long string: a candidate's tokens are produced from its own text alone (truncated to a
per-candidate budget), with special-token strings split into ordinary tokens. A title holding
``[3]``, newlines, ``<|im_end|>`` or 10,000 characters can therefore neither move another
candidate's span nor become a control token. The chat template's own text (before and
after the user message) is the only place special tokens are parsed.

Catalogues repeat: the same titles come back slate after slate, and tokenizing one costs far
more than looking it up. So a builder keeps the token ids of the item texts it has seen (a
bounded least-recently-used cache keyed by the text) and the ids of its literal pieces, and
tokenizes a slate's unseen texts in one call. Tokenizing a text alone gives the same ids
whether done once or many times, one at a time or in a batch, so the cache cannot change a
prompt (``tests/backbone/test_prompt.py`` checks the ids, spans and flags against a builder
without it).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from spdrank.backbone.chat import render_chat_template
from spdrank.backbone.templates import (
    DEFAULT_TEMPLATE,
    PromptTemplate,
    record_of,
    template_from_record,
)
from spdrank.core.defaults import DEFAULT_ITEM_TOKENS, PAPER_READOUT

if TYPE_CHECKING:
    import numpy as np

#: The recommendation template's instruction (what a prompt without a template says).
DEFAULT_INSTRUCTION = DEFAULT_TEMPLATE.instruction
_SENTINEL = "\u2063SPDRANK_BODY\u2063"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: How an item's token states reach the head: its last token's, the mean of all of them,
#: every one of them, or one mean per word (the last two for the history head's match).
READOUTS = ("last", "mean", "tokens", "words")
#: The readouts that keep several rows per item (its tokens, its words), up to the token budget.
UNIT_READOUTS = ("tokens", "words")
#: A history line's leading list number (``"3. "``): a place in the list, not the item's text.
_LIST_NUMBER = re.compile(r"^\s*\d+[.)]\s+")
#: Item texts whose token ids a builder keeps: more than a catalogue like Beauty's (12k items)
#: holds, at most a few tens of MB for titles.
DEFAULT_CACHE_SIZE = 65_536
#: User contexts (history texts) whose tokens a builder keeps, and the longest it keeps.
QUERY_CACHE_SIZE = 1_024
MAX_CACHED_QUERY_CHARS = 32_768
#: Literal pieces a builder keeps (counts, history list numbers: a few hundred in practice).
MAX_LITERALS = 4_096
#: Longer texts are tokenized every time rather than cached, so a few huge texts cannot fill
#: memory with their keys.
MAX_CACHED_CHARS = 2_048
#: Characters of a text tokenized per token of its budget: a text is cut to this many times
#: its budget before it is tokenized (its head for an item, its end for a user context), so
#: a huge title costs what its budget does. Tokens average a few characters and rarely
#: exceed a few dozen, so the kept tokens of any ordinary text are unchanged.
CHARS_PER_TOKEN_BOUND = 64


@dataclass
class PromptSettings:
    """How a slate becomes a prompt; saved in a checkpoint so inference matches training."""

    #: Tokens kept from each candidate's text (the head of the text); None only until
    #: :meth:`spdrank.model.ranker.SPDRanker.build` fits it to the backbone's context.
    max_item_tokens: int | None = DEFAULT_ITEM_TOKENS
    #: Tokens kept from the user context (its end: the most recent history).
    max_query_tokens: int = 512
    use_chat_template: bool = True
    #: How candidates are numbered: "numbers" ([1], [2], ...) or "letters" ([A] ... [Z], [a] ...
    #: [z]: one token each, which FIRST needs to read a candidate's logit off one position).
    labels: str = "numbers"
    #: Text appended after the assistant turn opens (FIRST appends "[" and reads the next token).
    answer_prefix: str = ""
    #: How an item's token states reach the head (the readout): "last" (the paper's),
    #: "mean" (every token of the item's text, averaged), "tokens" (all of them, up to
    #: ``max_item_tokens``: the history head then matches candidates with history items token
    #: by token) or "words" (one mean per word of the text, :mod:`spdrank.backbone.words`:
    #: matched word by word). A model config given no prompt builds the one ``spdrank train``
    #: builds for its head instead (:func:`spdrank.model.config.default_prompt`).
    readout: str = PAPER_READOUT
    #: Read the user context as items: each non-empty line is one history item (a leading
    #: ``"3. "`` list number excluded), cut to ``max_item_tokens`` and spanned like a
    #: candidate, so a head can compare candidates with what the user chose before.
    history_items: bool = False
    #: The prompt's wording (instruction, headers; the teachers' texts too), recorded in the
    #: checkpoint so that a model ranks with the template it was trained on.
    template: PromptTemplate = DEFAULT_TEMPLATE

    @property
    def instruction(self) -> str:
        """The prompt's first line, the template's (``{n}`` unfilled)."""
        return self.template.instruction

    def to_dict(self) -> dict[str, Any]:
        """The settings as a checkpoint stores them: the instruction first, as ever, and the
        template unless it is the default, so a recommendation checkpoint's config is what it
        was before templates were recorded."""
        data = {"instruction": self.template.instruction, **asdict(self)}
        template = record_of(self.template)
        if template is None:
            del data["template"]
        else:
            data["template"] = template
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptSettings:
        """Settings from :meth:`to_dict`'s record; without a template, the default one (what
        every checkpoint saved before templates were recorded was trained with), its
        instruction the record's."""
        data = dict(data)
        template = template_from_record(data.pop("template", None), "prompt settings")
        instruction = data.pop("instruction", template.instruction)
        if instruction != template.instruction:  # set through the API before templates
            template = replace(template, instruction=instruction)
        return cls(**data, template=template)

    def __post_init__(self) -> None:
        if self.readout not in READOUTS:
            raise ValueError(f"unknown readout {self.readout!r}: use one of {list(READOUTS)}")
        if not isinstance(self.template, PromptTemplate):
            raise TypeError("prompt settings: 'template' must be a PromptTemplate")

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
    """A slate's prompt as token ids, and where each candidate's text sits in them: the span
    ``item_first..item_last`` (inclusive) that the readout pools."""

    input_ids: list[int]
    #: Index in ``input_ids`` of the first token of each candidate's text (a text without
    #: tokens: its marker's last token, as ``item_last``).
    item_first: list[int]
    #: Index in ``input_ids`` of the last token of each candidate's text.
    item_last: list[int]
    #: Which candidates were cut to ``max_item_tokens``.
    truncated: list[bool]
    query_truncated: bool = False
    #: The candidates' normalised upstream features [n, F], for a model that reads them (the
    #: prompt builder leaves this None; :meth:`spdrank.model.ranker.SPDRanker.encode` fills it in).
    features: np.ndarray | None = None
    #: ``(first, last)`` token indices of each history item, oldest first (``history_items``).
    history: list[tuple[int, int]] | None = None

    @property
    def longest(self) -> int:
        """The longest sequence the backbone reads of this input at once (here all of it):
        what must fit its positions."""
        return len(self.input_ids)


#: A cached text's tokens: its token ids cut to the budget, and whether the cut removed any.
Tokens = tuple[tuple[int, ...], bool]


class TokenCache:
    """A bounded least-recently-used map from a text to its :data:`Tokens`.

    Only what a prompt keeps is stored (the ids after the budget, and the flag), so a hit
    costs a dictionary lookup; texts longer than ``max_chars`` are not stored, so a few huge
    ones cannot fill memory with their keys.
    """

    def __init__(self, size: int, max_chars: int = MAX_CACHED_CHARS) -> None:
        if size < 0:
            raise ValueError(f"a token cache size must be at least 0, got {size}")
        self.size = size
        self.max_chars = max_chars
        self._entries: OrderedDict[str, Tokens] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str) -> Tokens | None:
        return self.get_many([text])[0]

    def get_many(self, texts: Sequence[str]) -> list[Tokens | None]:
        """Each text's entry (None where absent), each hit marked as the most recently used."""
        entries = self._entries
        found = [entries.get(text) for text in texts]
        touch = entries.move_to_end
        for text, entry in zip(texts, found):
            if entry is not None:
                touch(text)
        return found

    def put(self, text: str, entry: Tokens) -> None:
        if not self.size or len(text) > self.max_chars:
            return
        self._entries[text] = entry
        self._entries.move_to_end(text)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


class PromptBuilder:
    """Renders slates into token ids for one tokenizer and one set of settings.

    The settings are read once, at construction (the template's ends, the literals and the
    cached item tokens all depend on them): build a new builder for other settings.
    ``cache_size``: how many item texts' token ids to keep (0 keeps none).
    """

    def __init__(
        self,
        tokenizer: Any,
        settings: PromptSettings | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        if self.settings.max_item_tokens is None:
            raise ValueError("max_item_tokens is not set: SPDRanker.build fits it to the "
                             "backbone's context, or pass a number")
        if self.settings.max_item_tokens < 1:
            raise ValueError("max_item_tokens must be at least 1")
        self._backend = _plain_backend(tokenizer)
        self._prefix, self._suffix = self._template_ends()
        self._literal_cache: dict[str, list[int]] = {}
        self._items = TokenCache(cache_size)
        # A user's history text comes back when the same user is ranked again (a refresh, the
        # next page); it is kept whole up to the query budget, so fewer and longer entries.
        self._queries = TokenCache(min(cache_size, QUERY_CACHE_SIZE), MAX_CACHED_QUERY_CHARS)
        #: ``"\n[label] "`` of each candidate index, grown as larger slates arrive.
        self._labels: list[list[int]] = []
        #: The prompt's start for each slate size (one entry when the instruction names no {n}).
        self._heads: dict[int, list[int]] = {}
        #: The candidates' header for each slate size (one entry unless it names {n}).
        self._headers: dict[int, list[int]] = {}
        self._tail = self._literal("\n") + self._suffix + self._literal(self.settings.answer_prefix)

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

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """``_encode(text)`` of each text (special-token strings plain), in one tokenizer call.

        Each text is still tokenized alone; one call only saves the per-call cost. A fast
        tokenizer with no truncation or padding of its own is called directly: the library's
        wrapper would run the same backend call with the same settings, and nothing else.
        """
        out: list[list[int]] = [[] for _ in texts]
        todo = [i for i, text in enumerate(texts) if text]
        if not todo:
            return out
        batch = [texts[i] for i in todo]
        backend = self._backend
        if backend is not None and backend.truncation is None and backend.padding is None:
            encoded = _backend_encode(backend, batch)
        else:
            encoded = self.tokenizer(batch, add_special_tokens=False, split_special_tokens=True)[
                "input_ids"
            ]
        for i, ids in zip(todo, encoded):
            out[i] = list(ids)
        return out

    def _literal(self, text: str) -> list[int]:
        """Token ids of a piece of the prompt's own text (a count, a history line's number)."""
        ids = self._literal_cache.get(text)
        if ids is None:
            ids = self._encode(text)
            # Pieces repeat (a few counts and list numbers); the bound is for odd inputs.
            if len(self._literal_cache) < MAX_LITERALS:
                self._literal_cache[text] = ids
        return ids

    def _head(self, n: int) -> list[int]:
        """The template head, the instruction and the context header, for a slate of ``n``."""
        head = self._heads.get(n)
        if head is None:
            t = self.settings.template
            text = f"{t.render('instruction', n=n)}\n\n{t.context_header}\n"
            head = self._prefix + self._literal(text)
            if len(self._heads) < MAX_LITERALS:
                self._heads[n] = head
        return head

    def _header(self, n: int) -> list[int]:
        """The candidates' header after the user context, for a slate of ``n``."""
        header = self._headers.get(n)
        if header is None:
            header = self._literal(f"\n\n{self.settings.template.render('candidates_header', n=n)}")
            if len(self._headers) < MAX_LITERALS:
                self._headers[n] = header
        return header

    def template_tokens(self, n: int) -> int:
        """How many tokens of a slate of ``n``'s prompt are the template's own: the chat
        template, the instruction, the headers, the candidates' markers and the tail. No
        ``--max-item-tokens`` or ``--window`` shrinks these, so a prompt past the backbone's
        positions whose template alone fills most of them is the template's to shorten."""
        return (len(self._head(n)) + len(self._header(n)) + sum(map(len, self._label_ids(n)))
                + len(self._tail))

    def _label_ids(self, n: int) -> list[list[int]]:
        """The markers ``"\n[label] "`` before the first ``n`` candidates."""
        labels = self._labels
        while len(labels) < n:
            labels.append(self._encode(f"\n[{self.settings.label(len(labels))}] "))
        return labels

    def _item_tokens(self, texts: Sequence[str], query: str | None = None) -> tuple[list[Tokens], Tokens]:
        """Each text's item tokens (cut to the budget, and whether they were cut) and, given a
        ``query``, its tokens (its end kept, up to the query budget), from the caches or from
        one tokenizer call for all the texts they lack."""
        budget = self.settings.max_item_tokens
        chars = budget * CHARS_PER_TOKEN_BOUND
        query_chars = self.settings.max_query_tokens * CHARS_PER_TOKEN_BOUND
        found = self._items.get_many(texts)
        missing = list(dict.fromkeys(t for t, f in zip(texts, found) if f is None))
        query_tokens = self._queries.get(query) if query is not None else ((), False)
        asked = [t[:chars] for t in missing]
        if query_tokens is None:
            asked.append(query[-query_chars:])
        encoded = self._encode_many(asked)
        fresh: dict[str, Tokens] = {}
        for text, ids in zip(missing, encoded):
            fresh[text] = (tuple(ids[:budget]), len(ids) > budget or len(text) > chars)
            self._items.put(text, fresh[text])
        if query_tokens is None:
            ids = encoded[-1]
            cut = len(ids) > self.settings.max_query_tokens or len(query) > query_chars
            query_tokens = (tuple(ids[-self.settings.max_query_tokens :] if cut else ids), cut)
            self._queries.put(query, query_tokens)
        items = [f if f is not None else fresh[t] for t, f in zip(texts, found)]
        return items, query_tokens

    def encode(self, query_text: str, candidate_texts: Sequence[str]) -> EncodedPrompt:
        s = self.settings
        ids: list[int] = list(self._head(len(candidate_texts)))
        if s.history_items:
            lines = _history_lines(query_text)
            found, _ = self._item_tokens([*(text for _, text in lines), *candidate_texts])
            items = found[len(lines) :]
            history, query_truncated = self._history(lines, found[: len(lines)], ids)
        else:
            history = None
            items, (query, query_truncated) = self._item_tokens(candidate_texts, query_text)
            ids += query
        ids += self._header(len(candidate_texts))
        n = len(items)
        item_first: list[int] = [0] * n
        item_last: list[int] = [0] * n
        truncated: list[bool] = [False] * n
        for i, (label, (item, cut)) in enumerate(zip(self._label_ids(n), items)):
            ids += label
            truncated[i] = cut
            # Text that yields no tokens is read out at its marker's last token.
            item_first[i] = len(ids) if item else len(ids) - 1
            ids += item
            item_last[i] = len(ids) - 1
        ids += self._tail
        return EncodedPrompt(
            ids, item_first=item_first, item_last=item_last, truncated=truncated,
            query_truncated=query_truncated, history=history,
        )

    def _history(
        self,
        lines: list[tuple[str, str]],
        items: list[tuple[tuple[int, ...], bool]],
        ids: list[int],
    ) -> tuple[list[tuple[int, int]], bool]:
        """Append the history ``lines`` (their texts' ``items``) to ``ids``; their spans.

        The most recent lines that fit ``max_query_tokens`` are kept (a line is never cut in
        the middle of the budget: older lines are dropped whole), each line's text cut to
        ``max_item_tokens`` like a candidate's.
        """
        s = self.settings
        numbered = [(self._literal(number), text) for (number, _), (text, _) in zip(lines, items)]
        kept: list[tuple[list[int], tuple[int, ...]]] = []
        used = 0
        for number_ids, text_ids in reversed(numbered):
            size = len(number_ids) + len(text_ids) + 1
            if kept and used + size > s.max_query_tokens:
                break
            kept.append((number_ids, text_ids))
            used += size
        kept.reverse()
        spans: list[tuple[int, int]] = []
        newline = self._literal("\n")
        for k, (number_ids, text_ids) in enumerate(kept):
            if k:
                ids += newline
            ids += number_ids
            if text_ids:
                spans.append((len(ids), len(ids) + len(text_ids) - 1))
                ids += text_ids
        return spans, len(kept) < len(lines)

    def item_tokens(self, text: str) -> list[int]:
        """The tokens a candidate's text contributes (after the budget): what its
        ``item_first..item_last`` span in a prompt holds."""
        items, _ = self._item_tokens([text])
        return list(items[0][0])


@dataclass
class CandidatePrompts(EncodedPrompt):
    """A slate as one sequence a candidate: the user context, then that candidate alone.

    A pointwise reranker (monoT5, RankLLaMA, a cross-encoder) reads each candidate in its own
    sequence with the query, so a candidate's state depends on the context and on itself, never
    on the other candidates. ``input_ids`` holds the sequences back to back, ``lengths`` their
    lengths: the whole is the tokens the backbone processes for the slate, which is what the
    code that counts a prompt's tokens reads. ``item_first`` and ``item_last`` index into each
    candidate's *own* sequence (its text's first and last tokens; the last is its sequence's
    last token).
    """

    lengths: list[int] = field(default_factory=list)

    def sequences(self) -> list[list[int]]:
        """Each candidate's token ids, in the slate's order."""
        out, start = [], 0
        for length in self.lengths:
            out.append(self.input_ids[start : start + length])
            start += length
        return out

    @property
    def longest(self) -> int:
        """The longest sequence the backbone reads: what must fit its positions."""
        return max(self.lengths, default=0)


def encode_candidates(
    builder: PromptBuilder, query_text: str, candidate_texts: Sequence[str]
) -> CandidatePrompts:
    """The slate's candidates, each in its own single-candidate prompt with ``query_text``.

    Each sequence is the builder's own prompt holding that candidate alone (the same template,
    instruction, history and ``[1]`` marker, the same token budgets and guarantees about
    special tokens), cut right after the candidate's last token: under causal attention nothing
    after that token can move its state, so the chat template's closing tokens would be
    computed for nothing. The builder caches the query's and the items' token ids, so the
    context is tokenized once a slate however many candidates share it.
    """
    ids: list[int] = []
    lengths: list[int] = []
    item_first: list[int] = []
    item_last: list[int] = []
    truncated: list[bool] = []
    query_truncated = False
    for text in candidate_texts:
        one = builder.encode(query_text, [text])
        end = one.item_last[0] + 1
        ids += one.input_ids[:end]
        lengths.append(end)
        item_first.append(one.item_first[0])
        item_last.append(end - 1)
        truncated.append(one.truncated[0])
        query_truncated = one.query_truncated
    return CandidatePrompts(
        ids, item_first=item_first, item_last=item_last, truncated=truncated,
        query_truncated=query_truncated, lengths=lengths,
    )


def _history_lines(query_text: str) -> list[tuple[str, str]]:
    """The user context's non-empty lines, each split into its leading list number (``"3. "``,
    or ``""``) and the item's text."""
    lines = []
    for line in query_text.splitlines():
        if not line.strip():
            continue
        number = _LIST_NUMBER.match(line)
        cut = number.end() if number else 0
        lines.append((line[:cut], line[cut:]))
    return lines


def _plain_backend(tokenizer: Any) -> Any | None:
    """The fast tokenizer's backend when calling it directly gives what the tokenizer's call
    gives (no truncation or padding configured on it, no control-token sanitising), else None."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    needed = ("encode_batch", "encode_special_tokens", "truncation", "padding")
    if backend is None or not all(hasattr(backend, name) for name in needed):
        return None
    return backend


def _backend_encode(backend: Any, texts: list[str]) -> list[list[int]]:
    """The backend's token ids of ``texts``, special-token strings split into ordinary tokens.

    The backend holds the special-token switch as state shared with the tokenizer (which sets it
    on every call), so it is set here for the call and put back after. The batch call without
    offsets is used where the backend has it: the ids are the same.
    """
    before = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]
    finally:
        backend.encode_special_tokens = before


def template_around(
    tokenizer: Any, earlier: Sequence[dict[str, str]], **template_kwargs: Any
) -> tuple[str, str] | None:
    """The chat template's text before and after a final user message, or None without one.

    Rendering the template around a sentinel (instead of around the real text) is what keeps
    a user's text from ever being parsed for special tokens: only these two strings are.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    rendered = render_chat_template(
        tokenizer,
        [*earlier, {"role": "user", "content": _SENTINEL}],
        add_generation_prompt=True,
        **template_kwargs,
    )
    before, sep, after = rendered.partition(_SENTINEL)
    if not sep:
        raise ValueError("the chat template dropped the user message")
    return before, after


def render_text(
    query_text: str,
    candidate_texts: Sequence[str],
    instruction: str | None = None,
    template: PromptTemplate = DEFAULT_TEMPLATE,
) -> str:
    """The prompt body :meth:`PromptBuilder.encode` tokenizes, as one string, in
    ``template``'s wording (``instruction``: the template's unless given).

    The autoregressive teacher (``spdrank.teacher.prompt``) shows its model this same text, so
    teacher and student see the user context and the numbered ``[i] title`` lines identically.
    Budgets are the caller's: pass texts already cut. Must stay in step with ``encode``'s
    literals (``tests/teacher/test_teacher_prompt.py`` checks that the two agree token for token).
    """
    n = len(candidate_texts)
    lines = "".join(f"\n[{i}] {text}" for i, text in enumerate(candidate_texts, start=1))
    instruction = template.render("instruction", n=n) if instruction is None else instruction
    return (
        f"{instruction}\n\n{template.context_header}\n{query_text}"
        f"\n\n{template.render('candidates_header', n=n)}{lines}\n"
    )


def fitted_item_tokens(context: int, positions: int, query_tokens: int) -> int:
    """A per-candidate token budget that lets ``positions`` candidates and a query of
    ``query_tokens`` fit ``context`` positions: the room left after the query and
    :data:`PROMPT_OVERHEAD` tokens of template, shared by the candidates less each one's
    :data:`LABEL_TOKENS` of numbering, within [:data:`MIN_FITTED_TOKENS`,
    :data:`MAX_FITTED_TOKENS`]."""
    room = (context - query_tokens - PROMPT_OVERHEAD) // max(positions, 1) - LABEL_TOKENS
    return max(MIN_FITTED_TOKENS, min(MAX_FITTED_TOKENS, room))


#: Tokens of a prompt that are neither candidates nor the query: the chat template, the
#: instruction and the headers (a generous bound; the context check catches any excess).
PROMPT_OVERHEAD = 192
#: Tokens each candidate's numbering takes (``"\n[12] "``).
LABEL_TOKENS = 6
MIN_FITTED_TOKENS = 8
MAX_FITTED_TOKENS = 512


#: The share of candidates cut past which the cut summary says how to keep more of them.
MOST_CUT = 0.5


class Cuts:
    """Running counts of encoded candidates and queries, and of those cut to their budget."""

    def __init__(self) -> None:
        self.candidates = self.candidates_cut = self.queries = self.queries_cut = 0

    def add(self, encoded: EncodedPrompt) -> None:
        self.candidates += len(encoded.truncated)
        self.candidates_cut += sum(encoded.truncated)
        self.queries += 1
        self.queries_cut += bool(encoded.query_truncated)

    def summary(self, budget: int) -> str:
        """One line for a user: how much was cut, and by which budget; when most candidates
        were cut, what keeps more of them, since a cut text is read without its end."""
        line = (
            f"cut to the token budget: {self.candidates_cut} of {self.candidates} candidates "
            f"(at {budget} tokens), {self.queries_cut} of {self.queries} queries"
        )
        if self.candidates and self.candidates_cut / self.candidates > MOST_CUT:
            line += (f"; {self.candidates_cut / self.candidates:.0%} of the candidates were "
                     "read without their end: a larger --max-item-tokens, as far as the "
                     "backbone's context allows K of them, keeps more of each")
        return line
