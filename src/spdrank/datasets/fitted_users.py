"""Who is in a fit: the sequence each user gave the rankers fitted on a training file, so that a
slate of that user can be ranked by counts that leave it out (``leave_out``), exactly.

A slate's user is its qid, as spdrank's builders write it, and each user has one slate in one
file (:mod:`spdrank.datasets.split`). ``spdrank data features`` and ``spdrank teacher
--backend ranker:NAME`` ask it when the slates they rank are ones the ranker was fitted on (the
training file, or a copy of it), so that no slate's feature or label counts its own target.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from spdrank.core.slates import Slate, SlateError, iter_slates, training_sequence
from spdrank.datasets.lines import numbered_lines


@dataclass
class FittedUsers:
    """The sequence each user contributed to a fit, by qid (a slate's user), with where it was
    read; a user fitted twice is refused when a slate of theirs asks to be left out."""

    sequences: dict[str, list[str]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    twice: dict[str, str] = field(default_factory=dict)

    def add(self, user: str, sequence: list[str], where: str) -> None:
        if user in self.sequences:
            self.twice[user] = f"{self.where[user]} and {where}"
        self.sequences[user] = sequence
        self.where[user] = where

    def __contains__(self, user: object) -> bool:
        return isinstance(user, str) and self.user_of(user) in self.sequences

    def user_of(self, qid: str) -> str:
        """The user a slate's qid stands for: itself, or for a window of a user's slate
        (``<qid>#<j>``, :func:`spdrank.datasets.search.training_windows`) that slate's user,
        whose target the window holds too."""
        while qid not in self.sequences and "#" in qid:
            qid = qid.rpartition("#")[0]
        return qid

    def sequence(self, slate: Slate, where: str) -> list[str] | None:
        """The fitted sequence of ``slate``'s user, to leave out; None when not fitted."""
        user = self.user_of(slate.query.qid)
        if user in self.twice:
            raise SlateError(f"user {user!r} has two fitted sequences ({self.twice[user]}): "
                             "leaving the user out of the counts is ambiguous", where)
        return self.sequences.get(user)


def fitted_users(train: Path, extra: Path | None) -> FittedUsers:
    """Each user of the training slates (``training_sequence``, as the fit reads it) and of
    the extra sequences (``extra``: the user id first on each line)."""
    users = FittedUsers()
    for where, slate in iter_slates(train):
        users.add(slate.query.qid, training_sequence(slate), where)
    if extra is not None:
        for lineno, line in numbered_lines(extra):
            fields = line.split()
            if len(fields) > 1:
                users.add(fields[0], fields[1:], f"{extra}:{lineno}")
    return users


#: A ``"qid"`` key and its value (a JSON string or integer) in a slate's line.
_QID = re.compile(rb'"qid"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')


def listed_users(path: Path) -> set[str]:
    """Every qid a slate file's lines name (its slates' users, and any other ``"qid"`` key),
    found by a scan of the lines rather than a parse of every slate: a fast superset, to
    decide whether the exact :func:`fitted_users` is worth reading."""
    from spdrank.core.files import iter_lines

    found: set[str] = set()
    for line in iter_lines(path, "slates file"):
        for match in _QID.finditer(line.raw):
            value = json.loads(match.group(1))
            found.add(value if isinstance(value, str) else str(value))
    return found


def possible_users(qids: set[str]) -> set[str]:
    """Every user the slates of ``qids`` may stand for: each qid, and for a window's
    (``<qid>#<j>``) each qid it may be a window of (:meth:`FittedUsers.user_of`)."""
    out = set(qids)
    for qid in qids:
        while "#" in qid:
            qid = qid.rpartition("#")[0]
            out.add(qid)
    return out
