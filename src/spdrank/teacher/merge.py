"""Join the label files of sharded runs into one, in the slates' order.

Shards are labelled independently (``--shard i/n`` on n machines), so merging must catch what
independence allows: a qid labelled in two files with different rankings (two teachers, or
labels made from different slates), with the same ranking but different scores, or by two
teachers (backend, mode or prompt template), is an error naming both ``file:line``; the same
label twice is harmless and counted (where only one copy has scores, that copy is kept). A
label's scores go into the labelled slates as ``teacher_scores``. Slates without any label
are reported, and the merged files are written only when every slate has one (unless
``allow_missing``), so a merged file is never silently partial. A shard's torn last line (a
killed run) is skipped, not repaired: merge never modifies its inputs.

The files must be one teacher's, by the rule a labelling run holds its own file to
(:mod:`spdrank.teacher.run`): two files of which neither holds a label of a teacher the other
does are refused, naming both and their teachers, since shards of one run always share theirs
and the merged slates would otherwise train on two teachers' rankings under one name; labels
of several teachers that the files do share (a run that resumed a file under another backend
left it so, and was warned) are said in one line, as the run said them.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spdrank.backbone.templates import PromptTemplate
from spdrank.core.files import atomic_writer
from spdrank.core.slates import dumps_slate, read_unique_slates
from spdrank.teacher.labels import (
    Label,
    LabelError,
    apply_label,
    check_ranking,
    read_labels,
)
from spdrank.teacher.run import describe_teacher, made_by

log = logging.getLogger(__name__)

#: What made a label: its backend, mode and prompt template (:func:`spdrank.teacher.run.made_by`).
Teacher = tuple[Any, Any, PromptTemplate]


@dataclass
class MergeSummary:
    slates: int = 0
    labelled: int = 0
    duplicates: int = 0
    missing: list[str] = field(default_factory=list)
    #: Labelled qids that are not in the slates file.
    unknown: list[str] = field(default_factory=list)
    per_file: dict[str, int] = field(default_factory=dict)
    written: bool = False
    out: str = ""
    slates_out: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def collect_labels(paths: Sequence[str | os.PathLike[str]], summary: MergeSummary) -> dict[str, Label]:
    """qid -> label over every file; conflicting labels for one qid, or files of two teachers,
    raise a LabelError (see the module doc)."""
    files: dict[str, dict[str, Label]] = {}
    for path in paths:
        if not Path(path).exists():
            raise FileNotFoundError(f"no such label file: {path}")
        files[str(path)] = read_labels(path, repair=False)
        summary.per_file[str(path)] = len(files[str(path)])
    _check_one_teacher(files)
    merged: dict[str, Label] = {}
    for labels in files.values():
        for qid, label in labels.items():
            seen = merged.get(qid)
            if seen is None:
                merged[qid] = label
                continue
            _check_same(seen, label)
            summary.duplicates += 1
            if seen.scores is None and label.scores is not None:
                merged[qid] = label
    return merged


def _teachers(labels: dict[str, Label]) -> dict[Teacher, Label]:
    """Each teacher of a file's labels, with its first label (to name a place)."""
    first: dict[Teacher, Label] = {}
    for label in labels.values():
        first.setdefault(made_by(label), label)
    return first


def _check_one_teacher(files: dict[str, dict[str, Label]]) -> None:
    """Refuse two files that share no teacher, naming a label of each; say in one line which
    teachers the files share when they share more than one (the run's own rule for a mixed
    file: :func:`spdrank.teacher.run._warn_mixed`)."""
    made = {path: _teachers(labels) for path, labels in files.items() if labels}
    paths = list(made)
    for i, path in enumerate(paths):
        for other in paths[:i]:
            if made[path].keys() & made[other].keys():
                continue
            mine, theirs = next(iter(made[path].values())), next(iter(made[other].values()))
            raise LabelError(
                f"{path} holds labels by {_named(made[path])}, {other} labels by "
                f"{_named(made[other])} ({theirs.where}): the two files share no teacher, so "
                "they are not shards of one run, and the merged slates would carry two "
                "teachers' rankings as one's; merge each teacher's files apart, or relabel "
                "one with the other's --backend, --mode and --prompt",
                mine.where,
            )
    counts = Counter(made_by(label) for labels in files.values() for label in labels.values())
    if len(counts) > 1:
        log.warning(
            "the label files mix teachers: %s; the merged slates carry each label's own",
            "; ".join(f"{count} by {describe_teacher(teacher)} ("
                      + ", ".join(p for p in paths if teacher in made[p]) + ")"
                      for teacher, count in counts.items()),
        )


def _named(teachers: dict[Teacher, Label]) -> str:
    return " and ".join(describe_teacher(teacher) for teacher in teachers)


def _check_same(seen: Label, label: Label) -> None:
    """Two labels of one qid must be one teacher's, agree on the ranking, and on the scores
    where both have them: the copy kept decides the slate's ``teacher_scores`` and prompt."""
    qid = label.record["qid"]
    if made_by(seen) != made_by(label):
        raise LabelError(
            f"qid {qid!r} is labelled here by {describe_teacher(made_by(label))} and at {seen.where} "
            f"by {describe_teacher(made_by(seen))}: one slate's labels must be one teacher's",
            label.where,
        )
    if seen.ranking != label.ranking:
        raise LabelError(
            f"qid {qid!r} has conflicting rankings here and at {seen.where}", label.where
        )
    if seen.scores is not None and label.scores is not None and seen.scores != label.scores:
        raise LabelError(
            f"qid {qid!r} has conflicting scores here and at {seen.where}", label.where
        )


def merge_labels(
    label_paths: Sequence[str | os.PathLike[str]],
    slates: str | os.PathLike[str],
    out: str | os.PathLike[str],
    slates_out: str | os.PathLike[str],
    allow_missing: bool = False,
) -> MergeSummary:
    """Write the merged labels (slates order) and the labelled slates; see the module doc."""
    summary = MergeSummary(out=str(out), slates_out=str(slates_out))
    labels = collect_labels(label_paths, summary)
    seen: set[str] = set()
    for slate in read_unique_slates(slates):  # first pass: validate and find the gaps
        qid = slate.query.qid
        seen.add(qid)
        summary.slates += 1
        label = labels.get(qid)
        if label is None:
            summary.missing.append(qid)
        else:
            check_ranking(label, slate)
            summary.labelled += 1
    summary.unknown = [qid for qid in labels if qid not in seen]
    if summary.missing and not allow_missing:
        return summary
    with atomic_writer(out) as fh_labels, atomic_writer(slates_out) as fh_slates:
        for slate in read_unique_slates(slates):
            label = labels.get(slate.query.qid)
            if label is None:
                continue
            fh_labels.write(json.dumps(label.record, ensure_ascii=False, separators=(",", ":")))
            fh_labels.write("\n")
            fh_slates.write(dumps_slate(apply_label(label, slate)))
            fh_slates.write("\n")
    summary.written = True
    return summary


def format_merge(summary: MergeSummary) -> str:
    lines = [
        f"{len(summary.per_file)} label files: "
        + ", ".join(f"{path} ({n})" for path, n in summary.per_file.items()),
        (
            f"slates {summary.slates}: {summary.labelled} labelled, "
            f"{len(summary.missing)} missing; "
            f"{summary.duplicates} duplicate labels (same ranking) dropped"
        ),
    ]
    if summary.missing:
        shown = ", ".join(summary.missing[:10]) + (" ..." if len(summary.missing) > 10 else "")
        lines.append(f"missing qids: {shown}")
    if summary.unknown:
        shown = ", ".join(summary.unknown[:10]) + (" ..." if len(summary.unknown) > 10 else "")
        lines.append(f"{len(summary.unknown)} labelled qids are not in the slates: {shown}")
    if summary.written:
        lines.append(f"merged labels: {summary.out}\nlabelled slates: {summary.slates_out}")
    else:
        lines.append("nothing written: label the missing slates, or pass --allow-missing")
    return "\n".join(lines)
