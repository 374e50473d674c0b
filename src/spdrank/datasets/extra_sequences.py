"""The sequences of users who make no slate, kept for the counts: ``extra_sequences.txt``.

With candidate lists, a user without one has nothing to rank, so makes no slate; but their
items are still evidence of what follows what. So their sequences (history + target, as a
slate would hold them) are written beside ``train.jsonl`` and counted like a training
user's: in the build's features, and by the baselines ``spdrank eval`` fits
(:func:`default_extra_sequences` finds the file, :func:`iter_extra_sequences` reads it).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from spdrank.core.files import atomic_writer
from spdrank.datasets.lines import numbered_lines
from spdrank.datasets.split import counted_sequence

#: The sequences of users who make no slate (no candidate list), for the counts only.
EXTRA_SEQUENCES_FILE = "extra_sequences.txt"

#: How the manifest describes the sequences of users without a candidate list.
EXTRA_SEQUENCES_POLICY = (
    "users without a candidate list make no slate, but their sequences (history + target, as "
    "a slate would hold them) are written to extra_sequences.txt and counted like training "
    "slates: in the features, and by the baselines `spdrank eval` fits beside train.jsonl"
)


def write_extra_sequences(
    stack: ExitStack, out: Path, extra: list[tuple[str, list[str]]], history: int
) -> dict[str, dict[str, Any]]:
    """Write the only-counted users' sequences (renamed into place with the slates); their
    manifest entry, or none when there are none."""
    if not extra:
        return {}
    digest = hashlib.sha256()
    fh = stack.enter_context(atomic_writer(out / EXTRA_SEQUENCES_FILE))
    for user, items in extra:
        line = " ".join([user, *counted_sequence(items, history)]) + "\n"
        fh.write(line)
        digest.update(line.encode("utf-8"))
    return {EXTRA_SEQUENCES_FILE: {"sequences": len(extra), "sha256": digest.hexdigest()}}


def iter_extra_sequences(path: str | os.PathLike[str]) -> Iterator[list[str]]:
    """The item sequences of an ``extra_sequences.txt`` (``user item item ...`` lines), for
    fitting count baselines on users who make no slate."""
    for _, line in numbered_lines(Path(path)):
        fields = line.split()
        if len(fields) > 1:
            yield fields[1:]


def default_extra_sequences(train: str | os.PathLike[str]) -> Path | None:
    """``extra_sequences.txt`` beside a training file, when a build wrote one there."""
    path = Path(train).parent / EXTRA_SEQUENCES_FILE
    return path if path.is_file() else None
