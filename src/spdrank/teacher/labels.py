"""The label file: one JSON record per slate, appended, flushed and fsynced one by one.

Teacher labels are expensive (an LLM run per slate), so they must survive ``kill -9`` and
power loss. The file is a journal (:mod:`spdrank.core.journal`) keyed by ``qid``: records are
only ever appended, each as one ``write`` of a complete line followed by ``flush`` + ``fsync``,
so a crash can damage only the LAST line. On opening, a last line without its newline or that
is not valid JSON is a torn write: it is cut away (and the slate relabelled), never parsed as
data. Damage anywhere else is not ours to guess about and is a :class:`LabelError` naming
``file:line``, as is a qid that appears twice. An exclusive ``flock`` on the file stops two
runs from appending to the same labels at once. What is the label file's own: the record check
(:func:`_check_record`), the :class:`Label` entries and the words of its messages (``LABELS``).

A record: ``qid``, ``status``, ``issues``, ``n``, ``raw`` (the answer text), ``parsed``
(1-based ids as read), ``ranking`` (the repaired permutation as docids, best first),
``decode_passes``, ``latency_ms``, ``hit_max_tokens``, ``backend``, ``mode``; ``server``
(the URL that answered) when the backend spreads slates over servers; ``scores`` (aligned with
``ranking``, non-increasing) when the teacher ranks by a score alone, so that its equal scores
reach the labelled slates as ties (``teacher_scores``). Records without ``scores`` (LLM
teachers, older files) are read as before. ``prompt``: the prompt template the labels were
made under (:mod:`spdrank.backbone.templates`, its name and texts), absent for the default
``recommendation`` one (so its files are what they always were, and older files read as
made under it); the labelled slates carry it as ``teacher_prompt``, which training checks.
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

from spdrank.backbone.templates import (
    DEFAULT_TEMPLATE,
    TEACHER_PROMPT_FIELD,
    PromptTemplate,
    record_of,
    template_from_record,
)
from spdrank.core.journal import Entry, Journal, Kind, read_journal
from spdrank.core.slates import Slate, SlateError, check_teacher_scores
from spdrank.core.validation import check_id
from spdrank.teacher.backends import Generation
from spdrank.teacher.parse import judge_ids, parse_response

log = logging.getLogger(__name__)


class LabelError(SlateError):
    """A label file that cannot be used, naming ``file:line``."""


class Label(Entry):
    """One label record and the ``file:line`` it came from (``where``)."""

    @property
    def ranking(self) -> list[str]:
        return self.record["ranking"]

    @property
    def scores(self) -> list[float] | None:
        """The teacher's scores aligned with :attr:`ranking`, when it ranked by a score."""
        return self.record.get("scores")

    @property
    def template(self) -> PromptTemplate:
        """The prompt template the label was made under (absent: the default one)."""
        return template_from_record(self.record.get("prompt"), self.where)


def make_record(
    slate: Slate,
    generation: Generation,
    backend: str,
    mode: str,
    template: PromptTemplate = DEFAULT_TEMPLATE,
) -> dict[str, Any]:
    """Judge and repair ``generation`` for ``slate``: the record the label file stores.

    ``backend`` names the run's backend; the generation's own ``backend``, when set (the
    model of the server that answered), is more precise and wins. ``template``: the prompt
    template of the run, recorded unless it is the default.
    """
    n = len(slate)
    if generation.ids is not None:
        parsed = judge_ids(generation.ids, n, well_formed=True)
    else:
        parsed = parse_response(generation.text, n, mode)
    docids = slate.docids
    ranking = [docids[i] for i in parsed.permutation]
    scores = _ranking_scores(slate, generation, ranking)
    prompt = record_of(template)
    return {
        "qid": slate.query.qid,
        "status": parsed.status,
        "issues": parsed.issues,
        "n": n,
        "raw": generation.text,
        "parsed": parsed.ids,
        "ranking": ranking,
        **({"scores": scores} if scores is not None else {}),
        "decode_passes": generation.decode_passes,
        "latency_ms": round(generation.latency_ms, 3),
        "hit_max_tokens": generation.hit_max_tokens,
        "backend": generation.backend or backend,
        "mode": mode,
        **({"prompt": prompt} if prompt is not None else {}),
        **({"server": generation.server} if generation.server is not None else {}),
        **generation.extra,
    }


def _ranking_scores(
    slate: Slate, generation: Generation, ranking: list[str]
) -> list[float] | None:
    """The generation's scores in the order of the (repaired) ``ranking``, if it has them.

    None when it has none, or when the repair added candidates the teacher never scored:
    a score made up for them would claim ties the teacher did not make.
    """
    if generation.scores is None or generation.ids is None:
        return None
    if len(generation.scores) != len(generation.ids):
        raise LabelError(
            f"qid {slate.query.qid!r}: the teacher gave {len(generation.scores)} scores for "
            f"{len(generation.ids)} ranked ids"
        )
    docids = slate.docids
    by_docid: dict[str, float] = {}
    for i, score in zip(generation.ids, generation.scores):
        if 1 <= i <= len(docids):
            by_docid.setdefault(docids[i - 1], score)  # the repair keeps a first occurrence
    if not all(d in by_docid for d in ranking):
        return None
    scores = [by_docid[d] for d in ranking]
    check_teacher_scores(scores, ranking, f"qid {slate.query.qid!r}", ("scores", "ranking"))
    return scores


#: The label file as a journal: its errors, entries, logger and words.
LABELS = Kind(
    error=LabelError,
    entry=Label,
    logger=log,
    file="the label file",
    record="a label record",
    twice="duplicate {key} {value!r} (first at {first}): {key}s must be unique within the file",
    again="{key} {value!r} is already labelled",
    redone="that slate is relabelled",
)


def read_labels(path: str | os.PathLike[str], repair: bool = False) -> dict[str, Label]:
    """qid -> label from a label file. A torn last line is cut off with ``repair``, else skipped."""
    return cast("dict[str, Label]", read_journal(path, "qid", _check_record, repair, LABELS))


def _check_record(data: dict[str, Any]) -> None:
    """A label record's own fields (the journal has checked its string ``qid``); its ids
    held to the rule every slate's are (:func:`~spdrank.core.validation.check_id`; the qid may
    be empty, as a slate's may)."""
    check_id(data["qid"], "qid", empty_ok=True)
    ranking = data.get("ranking")
    if not isinstance(ranking, list) or not all(isinstance(d, str) for d in ranking):
        raise LabelError("a label record needs 'ranking': a list of docids")
    for i, docid in enumerate(ranking):
        check_id(docid, f"ranking[{i}]")
    if data.get("scores") is not None:
        check_teacher_scores(data["scores"], ranking, names=("scores", "ranking"))
    if data.get("prompt") is not None:
        template_from_record(data["prompt"], "'prompt'")


def check_ranking(label: Label, slate: Slate) -> list[str]:
    """The label's ranking, checked to be a permutation of ``slate``'s candidates."""
    ranking = label.ranking
    if len(ranking) != len(slate) or set(ranking) != set(slate.docids):
        raise LabelError(
            f"the ranking for qid {slate.query.qid!r} is not a permutation of that slate's "
            f"{len(slate)} candidates (labels made from other slates?)",
            label.where,
        )
    return list(ranking)


def apply_label(label: Label, slate: Slate) -> Slate:
    """Fill ``slate``'s ``teacher`` from the label (checked against its candidates), its
    ``teacher_scores`` from the label's scores, or None when the teacher gave none, and its
    ``teacher_prompt`` from the label's template (none for the default one)."""
    slate.teacher = check_ranking(label, slate)
    scores = label.scores
    slate.teacher_scores = None if scores is None else [float(x) for x in scores]
    prompt = label.record.get("prompt")
    if prompt is None:
        slate.extra.pop(TEACHER_PROMPT_FIELD, None)
    else:
        slate.extra[TEACHER_PROMPT_FIELD] = prompt
    return slate


class LabelStore(Journal):
    """An open label file: the records so far (``labels``), and ``append`` for new ones."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, "qid", _check_record, LABELS)

    @property
    def labels(self) -> dict[str, Label]:
        """qid -> label, the records so far (this run's appends included)."""
        return cast("dict[str, Label]", self.entries)
