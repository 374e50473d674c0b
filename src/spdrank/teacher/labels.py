"""The label file: one JSON record per slate, appended, flushed and fsynced one by one.

Teacher labels are expensive (an LLM run per slate), so they must survive ``kill -9`` and
power loss. Records are only ever appended, each as one ``write`` of a complete line followed
by ``flush`` + ``fsync``; a crash can therefore damage only the LAST line. On opening, a last
line without its newline or that is not valid JSON is a torn write: it is cut away (and the
slate relabelled), never parsed as data. Damage anywhere else is not ours to guess about and
is an error naming ``file:line``, as is a qid that appears twice.

An exclusive ``flock`` on the file stops two runs from appending to the same labels at once.

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

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from spdrank.backbone.templates import (
    DEFAULT_TEMPLATE,
    TEACHER_PROMPT_FIELD,
    PromptTemplate,
    record_of,
    template_from_record,
)
from spdrank.core.slates import Slate, SlateError, check_teacher_scores
from spdrank.teacher.backends import Generation
from spdrank.teacher.parse import judge_ids, parse_response

log = logging.getLogger(__name__)

try:  # POSIX; elsewhere there is simply no guard against two writers
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


class LabelError(SlateError):
    """A label file that cannot be used, naming ``file:line``."""


@dataclass
class Label:
    record: dict[str, Any]
    #: ``file:line`` the record came from (for error messages).
    where: str

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


def read_labels(path: str | os.PathLike[str], repair: bool = False) -> dict[str, Label]:
    """qid -> label from a label file. A torn last line is cut off with ``repair``, else skipped."""
    path = Path(path)
    labels: dict[str, Label] = {}
    torn: tuple[int, int, str] | None = None  # (line number, byte offset, why)
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            where = f"{path}:{lineno}"
            if torn is not None:  # a bad line with good lines after it: not a torn tail
                raise LabelError(f"corrupt record ({torn[2]})", f"{path}:{torn[0]}")
            if not raw.endswith(b"\n"):
                torn = (lineno, start, "no trailing newline")
                continue
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                torn = (lineno, start, f"invalid JSON: {exc}")
                continue
            _check_record(data, where)
            qid = data["qid"]
            if qid in labels:
                raise LabelError(
                    f"duplicate qid {qid!r} (first at {labels[qid].where}): "
                    "qids must be unique within the file",
                    where,
                )
            labels[qid] = Label(data, where)
    if torn is not None:
        lineno, start, why = torn
        if repair:
            log.warning("%s:%d: torn last line (%s) cut away; that slate is relabelled", path, lineno, why)
            os.truncate(path, start)
        else:
            log.warning("%s:%d: torn last line (%s) ignored", path, lineno, why)
    return labels


def _check_record(data: Any, where: str) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("qid"), str):
        raise LabelError("a label record must be a JSON object with a string 'qid'", where)
    ranking = data.get("ranking")
    if not isinstance(ranking, list) or not all(isinstance(d, str) for d in ranking):
        raise LabelError("a label record needs 'ranking': a list of docids", where)
    if data.get("scores") is not None:
        try:
            check_teacher_scores(data["scores"], ranking, names=("scores", "ranking"))
        except SlateError as exc:
            raise LabelError(str(exc), where) from None
    if data.get("prompt") is not None:
        try:
            template_from_record(data["prompt"], "'prompt'")
        except ValueError as exc:
            raise LabelError(str(exc), where) from None


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


class LabelStore:
    """An open label file: the records so far, and ``append`` for new ones."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix == ".gz":
            raise ValueError(f"{self.path}: the label file is appended to; it cannot be gzip")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fh: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if fcntl is not None:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._fh.close()
                raise ValueError(f"{self.path} is being written by another run") from None
        if created:  # make the new file's directory entry durable too
            _fsync_dir(self.path.parent)
        self.labels = read_labels(self.path, repair=True)
        with open(self.path, "rb") as fh:
            self._lines = sum(1 for _ in fh)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably: one line, flushed and fsynced before returning."""
        qid = record["qid"]
        if qid in self.labels:
            raise LabelError(f"qid {qid!r} is already labelled", str(self.path))
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._lines += 1
        self.labels[qid] = Label(record, f"{self.path}:{self._lines}")

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> LabelStore:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
