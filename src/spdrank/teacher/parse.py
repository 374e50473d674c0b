"""Read a ranking out of an LLM's answer, say what was wrong with it, and repair it.

An autoregressive ranker does not always emit a legal permutation (a small model seldom
does), and a training target must be one. So every answer gets:

- the ids as read (``[i]`` numbers, 1-based, in the order given, repeats and all);
- a **status**, one of :data:`STATUSES`; when several problems apply, the first in
  :data:`PRECEDENCE` wins (all of them are kept in ``issues``):

  1. ``wrong_format``: the answer is not exactly ``[i] > [j] > ...`` (after an optional
     ``Label:`` prefix, surrounding ``*``/backticks and a final period), or holds no ids.
     First, as in rank_llm's response analysis: an answer that breaks the format cannot be
     trusted to mean what the other checks assume.
  2. ``out_of_range``: an id outside ``1..n`` (usually the model lost track of the numbering,
     which is then also the cause of the missing ones).
  3. ``repetition``: a valid id given more than once (the classic degenerate loop, which in
     turn usually leaves ids missing).
  4. ``missing``: some candidates never named (the model stopped early or hit its token cap).

- the **repaired** permutation, rank_llm's ``receive_permutation``: the valid ids in the order
  given, repeats dropped, then every missing candidate in its original order.

Which text is read: everything after the last ``</think>``; then, in ``direct`` mode, the
whole answer; in ``reasoning`` mode the LAST line that holds a ranking (a line with a chain
``[a] > [b]`` is preferred over one that only mentions ``[a]``). When no ``[i]`` appears at
all, bare numbers are read instead (rank_llm's fallback), always as ``wrong_format``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OK = "ok"
WRONG_FORMAT = "wrong_format"
OUT_OF_RANGE = "out_of_range"
REPETITION = "repetition"
MISSING = "missing"

#: Problems in precedence order: a slate's status is the first that applies.
PRECEDENCE: tuple[str, ...] = (WRONG_FORMAT, OUT_OF_RANGE, REPETITION, MISSING)
#: Every status, ``ok`` first (the order summaries print them in).
STATUSES: tuple[str, ...] = (OK, *PRECEDENCE)

_ID = re.compile(r"\[\s*(\d+)\s*\]")
_CHAIN = re.compile(r"\[\s*\d+\s*\]\s*>\s*\[\s*\d+\s*\]")
_NUMBER = re.compile(r"\d+")
_STRICT = re.compile(r"\[\d+\](?:\s*>\s*\[\d+\])*")
_LABEL = re.compile(r"^[A-Za-z][A-Za-z ]{0,39}:\s*")


@dataclass
class Parsed:
    """One answer, judged and repaired."""

    status: str
    #: Every problem found, in :data:`PRECEDENCE` order (empty when ``status`` is ``ok``).
    issues: list[str] = field(default_factory=list)
    #: Ids as read (1-based, in the order given, may repeat or be out of range).
    ids: list[int] = field(default_factory=list)
    #: The repaired ranking as 0-based candidate indices: always a full permutation.
    permutation: list[int] = field(default_factory=list)


def _answer(text: str) -> str:
    """The part after the last ``</think>``: a reasoning model's thoughts are not its answer."""
    return text.rsplit("</think>", 1)[-1]


def _ranking_line(answer: str) -> str | None:
    """The last line with a chain ``[a] > [b]``, else the last line with an ``[a]``."""
    lines = answer.splitlines()
    for pattern in (_CHAIN, _ID):
        for line in reversed(lines):
            if pattern.search(line):
                return line
    return None


def _well_formed(text: str) -> bool:
    core = text.strip().strip("*`").strip()
    core = _LABEL.sub("", core, count=1).strip().strip("*`").strip()
    if core.endswith("."):
        core = core[:-1].rstrip()
    return _STRICT.fullmatch(core) is not None


def extract_ids(text: str, mode: str = "direct") -> tuple[list[int], bool]:
    """The ids an answer gives, in order, and whether it followed the format exactly."""
    answer = _answer(text)
    scope = _ranking_line(answer) if mode == "reasoning" else answer
    if scope is not None and _ID.search(scope):
        return [int(m) for m in _ID.findall(scope)], _well_formed(scope)
    if mode == "reasoning":  # no ranking line: the last non-empty line, read leniently
        lines = [line for line in answer.splitlines() if line.strip()]
        scope = lines[-1] if lines else ""
    return [int(m) for m in _NUMBER.findall(scope or "")], False


def repair(ids: list[int], n: int) -> list[int]:
    """rank_llm's repair: valid ids in order, repeats dropped, then the missing ones in order."""
    seen: set[int] = set()
    out: list[int] = []
    for i in ids:
        if 1 <= i <= n and i not in seen:
            seen.add(i)
            out.append(i - 1)
    out.extend(j for j in range(n) if j + 1 not in seen)
    return out


def judge_ids(ids: list[int], n: int, well_formed: bool = True) -> Parsed:
    """Status, issues and repaired permutation of 1-based ``ids`` for a slate of ``n``."""
    issues: list[str] = []
    if not well_formed or not ids:
        issues.append(WRONG_FORMAT)
    if any(not 1 <= i <= n for i in ids):
        issues.append(OUT_OF_RANGE)
    valid = [i for i in ids if 1 <= i <= n]
    distinct = set(valid)
    if len(distinct) < len(valid):
        issues.append(REPETITION)
    if len(distinct) < n:
        issues.append(MISSING)
    return Parsed(
        status=issues[0] if issues else OK,
        issues=issues,
        ids=list(ids),
        permutation=repair(ids, n),
    )


def parse_response(text: str, n: int, mode: str = "direct") -> Parsed:
    """Judge and repair a teacher's answer for a slate of ``n`` candidates."""
    if n < 1:
        raise ValueError("a slate has at least one candidate")
    ids, well_formed = extract_ids(text, mode)
    return judge_ids(ids, n, well_formed)


def render_ids(ids: list[int]) -> str:
    """``[3] > [1] > [2]``: the format the teacher is asked for (used for non-text teachers)."""
    return " > ".join(f"[{i}]" for i in ids)
