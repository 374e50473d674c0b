"""The one gate every JSON input passes: slate files, label files and HTTP bodies alike.

A line of a slate file and the body of a request are parsed by :func:`loads` and nothing
else, so the CLI and the server refuse the same inputs with the same words; the server only
adds an HTTP status. :func:`loads` refuses, naming the field (``candidates[3].doc.title``):

- text that is not JSON, or JSON nested deeper than :data:`MAX_DEPTH` (Python's parser would
  otherwise hit its recursion limit);
- ``NaN``, ``Infinity`` and ``-Infinity`` (Python's parser accepts them; JSON does not);
- numbers that no float holds: ``1e999`` (parsed as infinity), integers of more digits than
  Python converts (:data:`MAX_INT_DIGITS`);
- strings (values or keys) holding a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but
  not text: no tokenizer reads it and no UTF-8 writer writes it back);
- an object that gives one key twice (``{"qid": "a", "qid": "b"}``): Python's parser keeps
  the last value without a word, so which one a reader saw would be the parser's choice, not
  the file's.

These hold for every field, extra fields included, because spdrank writes extra fields back
out (result records, labelled slates, HTTP answers) and must be able to. What a field must be
(a string, a number within float range) is :class:`~spdrank.core.slates.Slate`'s to check;
what a model can read (at most K candidates, features it can normalise) is the model's to
check (:meth:`spdrank.model.ranker.SPDRanker.check`), which the server, ``rank`` and ``eval``
call.

What an id may hold is said here once (:func:`id_problem`): a slate's ids are checked by it
as they are read (:func:`as_id`), and a TREC run's as they are written
(:func:`spdrank.core.outputs.check_trec_ids`), so the two cannot disagree.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Containers nested deeper than this are refused: slates need 4 levels, extras a few more.
MAX_DEPTH = 64

#: The most digits Python converts between int and str (its int_max_str_digits limit).
MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300

_SURROGATE = re.compile("[\ud800-\udfff]")


class SlateError(ValueError):
    """An input that cannot be used, with where it came from (``file:line``) when known.

    ``field`` names the offending field (``query.qid``) when one is to blame, which the server
    reports as the error's ``param``; ``syntax`` marks input that is not JSON at all.
    """

    def __init__(
        self,
        message: str,
        where: str | None = None,
        field: str | None = None,
        syntax: bool = False,
    ) -> None:
        self.where = where
        self.field = field
        self.syntax = syntax
        self.detail = message
        super().__init__(f"{where}: {message}" if where else message)


class _Constant:
    """``NaN`` / ``Infinity`` / ``-Infinity`` as parsed, kept to be refused with their field."""

    def __init__(self, name: str) -> None:
        self.name = name


class _HugeInt:
    """An integer literal of more digits than Python converts, kept to be refused by field."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits.lstrip("-"))


def _parse_int(digits: str) -> int | _HugeInt:
    return _HugeInt(digits) if len(digits) > MAX_INT_DIGITS else int(digits)


class RepeatedKey(ValueError):
    """A JSON object gave ``key`` twice (raised from inside the parser by :func:`unique_keys`)."""

    def __init__(self, key: str) -> None:
        self.key = key
        shown = repr(key) if len(key) <= 60 else repr(key[:60]) + "..."
        super().__init__(f"the key {shown} appears twice in one object")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict (``json.loads``' ``object_pairs_hook``), refusing a key
    given twice with :class:`RepeatedKey`. The dict is built in C first; the pairs are walked
    only when it came out shorter than they are."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return out


def loads(data: bytes | str, where: str | None = None) -> Any:
    """Parse one JSON document and refuse what spdrank cannot carry (see the module doc)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SlateError(
                f"not UTF-8 text (byte {exc.start + 1} of the line)", where, syntax=True
            ) from None
    try:
        value = json.loads(data, parse_constant=_Constant, parse_int=_parse_int,
                           object_pairs_hook=unique_keys)
    except RepeatedKey as exc:
        raise SlateError(f"{exc}: JSON would keep its last value without a word, so each key "
                         "may appear once", where, field=exc.key) from None
    except json.JSONDecodeError as exc:
        raise SlateError(
            f"invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
            if exc.lineno > 1 else f"invalid JSON ({exc.msg} at column {exc.colno})",
            where,
            syntax=True,
        ) from None
    except RecursionError:
        raise SlateError(
            f"invalid JSON: nested too deeply (at most {MAX_DEPTH} levels)", where, syntax=True
        ) from None
    check_tree(value, where)
    return value


def field_path(parent: str, key: str | int) -> str:
    """``candidates`` + 3 -> ``candidates[3]``; ``doc`` + ``title`` -> ``doc.title``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def check_tree(value: Any, where: str | None = None) -> None:
    """Refuse, naming the field, anything in ``value`` that spdrank could not write back.

    Walked with an explicit stack, so no input's depth can exhaust Python's.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        label = path or "the value"
        if isinstance(node, str):
            check_text(node, label, where)
        elif isinstance(node, float):
            if not math.isfinite(node):
                _refuse(where, path, f"{label} is beyond the float range (a literal like 1e999?)")
        elif isinstance(node, _Constant):
            _refuse(where, path, f"{label}: {node.name} is not valid JSON (numbers must be finite)",
                    syntax=True)
        elif isinstance(node, _HugeInt):
            _refuse(where, path, f"{label} is an integer of {node.digits} digits, more than the "
                    f"{MAX_INT_DIGITS} spdrank reads (give ids as strings)")
        elif isinstance(node, (dict, list)):
            if depth >= MAX_DEPTH:
                short = path if len(path) <= 60 else path[:60] + "..."
                _refuse(where, short, f"{short} is nested too deeply (at most {MAX_DEPTH} levels)")
            items = list(node.items() if isinstance(node, dict) else enumerate(node))
            for key, child in reversed(items):  # popped in document order
                child_path = field_path(path, key)
                if isinstance(key, str) and (problem := surrogate_problem(key)):
                    _refuse(where, path, f"a key of {label} {problem}")
                stack.append((child, child_path, depth + 1))


def surrogate_problem(text: str) -> str | None:
    """What is wrong with ``text`` if it holds a lone UTF-16 surrogate, else None."""
    if text.isascii() or not (m := _SURROGATE.search(text)):
        return None
    return (
        f"holds a lone UTF-16 surrogate (U+{ord(m.group()):04X} at character {m.start() + 1}): "
        "not valid Unicode text"
    )


#: The Unicode categories of characters that show nothing: controls, format characters (zero
#: widths, joiners, bidi marks, U+FEFF) and separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only whitespace, controls and format characters.

    ``str.strip`` keeps a zero-width space or a bidi mark, so a title of those alone would
    pass as text and give the model an item with nothing to read. The scan stops at the first
    visible character, so an ordinary text costs one look.
    """
    return all(c.isspace() or unicodedata.category(c) in INVISIBLE_CATEGORIES for c in text)


def check_text(text: str, label: str, where: str | None = None, field: str | None = None) -> None:
    """Refuse a string holding a lone UTF-16 surrogate: it is not text any encoder writes."""
    if problem := surrogate_problem(text):
        raise SlateError(f"{label} {problem}", where, field=field or label)


def _refuse(where: str | None, path: str, message: str, syntax: bool = False) -> None:
    raise SlateError(message, where, field=path or None, syntax=syntax)


def as_float(value: Any, label: str, where: str | None = None, field: str | None = None) -> float:
    """A number as a finite float (a JSON number, or a numpy one a caller passed); a boolean,
    or an integer beyond float range, is refused.

    ``label`` names the value in the message (``candidates[0].score (docid 'a')``), ``field``
    is its bare path (``candidates[0].score``, the server's ``param``; default: ``label``).
    """
    field = field or label
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise SlateError(
            f"{label} must be a number, got {type(value).__name__}", where, field=field
        )
    try:
        out = float(value)
    except OverflowError:
        raise SlateError(
            f"{label} is an integer of {len(str(abs(value)))} digits, beyond the float range "
            "(about 1.8e308)", where, field=field,
        ) from None
    if not math.isfinite(out):
        raise SlateError(f"{label} must be finite, got {out}", where, field=field)
    return out


#: What an id may not hold, said once for the messages that refuse one.
ID_RULE = "ids must be non-empty, with no whitespace, control or format characters"


def id_problem(text: str) -> str | None:
    """What makes ``text`` unfit to be an id, or None.

    Ids are matched character for character (a run's docids against the qrels', clicks
    against candidates) and written into TREC lines, which are split on whitespace. So an id
    is non-empty and holds no whitespace (it would shift every field after it), and no control
    or format character (NUL, a right-to-left override, a zero-width space), which breaks the
    tools that read such lines or makes two different ids look alike. Printable ASCII
    without a space, what nearly every id is, costs one look.
    """
    if not text:
        return "is empty"
    if text.isascii() and text.isprintable() and " " not in text:
        return None
    for char in text:
        if char.isspace():
            return f"holds whitespace ({codepoint(char)})"
        if unicodedata.category(char) in ("Cc", "Cf"):
            return f"holds a control or format character ({codepoint(char)})"
    return None


def codepoint(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``: a character named so that a message shows it."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def check_id(
    text: str, label: str, where: str | None = None, field: str | None = None,
    empty_ok: bool = False,
) -> None:
    """Refuse ``text`` as an id when :func:`id_problem` finds it unfit (an empty one too,
    unless ``empty_ok``: a slate's qid may be left out), naming ``label``."""
    problem = None if empty_ok and not text else id_problem(text)
    if problem:
        raise SlateError(f"{label} {text!r} {problem}: {ID_RULE}", where, field=field or label)


def as_id(
    value: Any, label: str, where: str | None = None, field: str | None = None,
    empty_ok: bool = False,
) -> str:
    """An id (qid, docid, history item), checked by :func:`check_id`.

    A string, or an integer (a recommendation log numbers its items), which becomes its
    decimal text; anything else (a boolean, null, a number with a fraction, an object) is
    refused rather than turned into text that no other file would match.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SlateError(
            f"{label} must be a string, got {type(value).__name__}", where, field=field or label
        )
    text = str(value)
    check_id(text, label, where, field, empty_ok)
    return text


@contextmanager
def located(where: str | None) -> Iterator[None]:
    """Add ``where`` (``file:line``) to a :class:`SlateError` raised without one."""
    try:
        yield
    except SlateError as exc:
        if exc.where is not None or where is None:
            raise
        raise SlateError(exc.detail, where, field=exc.field) from None
