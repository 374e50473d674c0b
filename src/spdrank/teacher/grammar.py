"""Server-side constraints for the ``openai`` teacher: a grammar or regex per slate size.

Servers constrain decoding with a grammar compiled from the request, not with our code, so
the constraint must be a string: a GBNF grammar for llama.cpp's server (``grammar``), a
regular expression for vLLM (``structured_outputs.regex``, or ``guided_regex`` before vLLM
0.12). Both fix the format ``[i] > [j] > ...``, exactly ``n`` ids, and every id in
``1..n``. Neither forbids repeats: an automaton for the permutations of ``n`` ids needs a
state per subset of ids already named (``2^n``), and context-free grammars for them are
exponential in ``n`` too, so a constraint a request can carry cannot say "each id once".
The repair in :mod:`~spdrank.teacher.parse` handles what is left (a
repeated id, and so a missing one). The ``hf`` backend's constraint
(:mod:`~spdrank.teacher.constrained`) runs in process and does forbid repeats.

Both strings grow linearly in ``n`` (one alternative per id, one item per position), a few
kilobytes at ``n = 100``.
"""

from __future__ import annotations

from typing import Any

#: ``--guided`` choices: which request field carries the constraint.
GUIDED: tuple[str, ...] = ("llama", "vllm", "vllm-legacy")


def _ids(n: int) -> list[str]:
    if n < 1:
        raise ValueError("a slate has at least one candidate")
    # Longest first, so a backtracking matcher tries "12" before "1".
    return [str(i) for i in range(n, 0, -1)]


def gbnf(n: int) -> str:
    """A GBNF grammar of ``[i] > [j] > ...`` with exactly ``n`` ids, each in ``1..n``.

    The ``n`` items are written out rather than as ``{n-1}`` repetition, which older
    llama.cpp builds do not parse.
    """
    alternatives = " | ".join(f'"{i}"' for i in _ids(n))
    items = ' " > " '.join(["item"] * n)
    return f'root ::= {items}\nitem ::= "[" id "]"\nid ::= {alternatives}\n'


def permutation_regex(n: int) -> str:
    """A regular expression of ``[i] > [j] > ...`` with exactly ``n`` ids, each in ``1..n``."""
    item = r"\[(?:" + "|".join(_ids(n)) + r")\]"
    return item if n == 1 else f"{item}(?: > {item}){{{n - 1}}}"


def guided_body(kind: str, n: int) -> dict[str, Any]:
    """The request fields that constrain one answer for a slate of ``n`` on a ``kind`` server."""
    if kind == "llama":
        return {"grammar": gbnf(n)}
    if kind == "vllm":
        return {"structured_outputs": {"regex": permutation_regex(n)}}
    if kind == "vllm-legacy":
        return {"guided_regex": permutation_regex(n)}
    raise ValueError(f"unknown --guided {kind!r}; choose from {', '.join(GUIDED)}")
