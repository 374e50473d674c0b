"""Validation queries held out of a training file, for a run given no eval slates.

A student is only worth keeping when it does better than something on queries it did not
train on: its best epoch is chosen there, and there it is compared with the first stage it
reranks (:mod:`spdrank.eval.first_stage`). ``spdrank train --holdout N`` sets N of the
file's queries aside for that, so a user with one file still gets both.

Queries, not slates, are held out: the windows ``spdrank data windows`` cuts from one query
(qids ``<qid>#<j>``) share its passages and labels, and a window of a held-out query left in
training would leak it. The draw is seeded (by the run's ``--seed``) over the sorted query
ids, so the same file and seed hold out the same queries on every machine, and a resumed run
reads the files it started with. Lines are copied as they are, never re-serialised.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from spdrank.core.files import atomic_writer, check_outputs, iter_lines, parse_json_line
from spdrank.core.slates import SlateError

#: The folder under a run's directory that holds the two parts.
HOLDOUT_DIR = "holdout"


def query_of(qid: str) -> str:
    """The query a slate belongs to: its qid up to a window's ``#<j>``."""
    return qid.split("#", 1)[0]


def _qid(line: bytes, where: str) -> str:
    data = parse_json_line(line, where)
    query = data.get("query") if isinstance(data, dict) else None
    qid = query.get("qid") if isinstance(query, dict) else None
    if not isinstance(qid, (str, int)) or isinstance(qid, bool):
        raise SlateError("a slate needs a query with a qid to be held out by query", where)
    return str(qid)


def holdout_problem(holdout: float) -> str | None:
    """What makes ``holdout`` no ``--holdout`` value, or None: it is a whole number of
    queries or a share strictly between 0 and 1, and finite (``inf`` and ``nan`` are
    neither, and ``int`` of them raises)."""
    if not math.isfinite(holdout) or holdout <= 0 or (holdout >= 1 and not holdout.is_integer()):
        return f"is a number of queries or a share below 1, got {holdout}"
    return None


def held_out_count(holdout: float, queries: int) -> int:
    """How many of ``queries`` queries ``--holdout`` sets aside: N itself, or a share below 1
    of them (at least one)."""
    problem = holdout_problem(float(holdout))
    if problem:
        raise ValueError(f"--holdout {problem}")
    return int(holdout) if holdout >= 1 else max(1, round(holdout * queries))


def held_parts(folder: str | Path) -> tuple[Path, Path]:
    """The two parts ``--holdout`` writes in ``folder`` (a run's ``OUT/holdout``): what the run
    trains on, and the held-out queries it is judged on."""
    return Path(folder) / "train.jsonl", Path(folder) / "validation.jsonl"


def hold_out(
    slates: str | Path, holdout: float, folder: str | Path, seed: int
) -> tuple[Path, Path]:
    """Split ``slates`` into ``folder/train.jsonl`` and ``folder/validation.jsonl``, the
    latter holding every slate of the queries ``holdout`` asks for (:func:`held_out_count`),
    drawn with ``seed``; the two paths.

    Refuses a number that would leave no query to train on, and a ``slates`` file that is
    one of the two parts (a run given its own held-out part to train on): writing the part
    would destroy it.
    """
    slates = Path(slates)
    train, validation = held_parts(folder)
    check_outputs({"--slates": slates}, {"--out": [train, validation]})
    queries = sorted({query_of(_qid(line, f"{slates}:{n}"))
                      for n, _, line in iter_lines(slates, "slate file")})
    count = held_out_count(holdout, len(queries))
    if count >= len(queries):
        raise ValueError(f"--holdout {count} would leave none of {slates}'s {len(queries)} "
                         "queries to train on: hold out fewer, or pass --eval-slates")
    held = set(random.Random(seed).sample(queries, count))
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_writer(train) as kept, atomic_writer(validation) as out:
        for n, _, line in iter_lines(slates, "slate file"):
            text = line.decode("utf-8").rstrip("\r\n") + "\n"
            (out if query_of(_qid(line, f"{slates}:{n}")) in held else kept).write(text)
    return train, validation
