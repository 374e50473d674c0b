"""The slate: one query and the candidates to rank for it, as JSONL.

The format follows castorini/rank_llm's request (``query`` + ``candidates`` with ``docid``,
``doc`` and ``score``) so its retrieve results feed in directly, plus optional labels:
``clicked`` (binary positives, e.g. a recommendation log's clicks), ``relevance`` (graded
judgements ``{docid: grade}`` as in TREC qrels, judged documents outside the candidates
included, for search) and ``teacher`` (a full ranking, best first), with
``teacher_scores`` when the teacher ranked by a score (aligned with ``teacher``, so equal
scores say which candidates the teacher left tied).
A candidate may also carry ``features``: numbers from the upstream system (a retriever score,
the item's popularity) that a model trained with ``--features`` reads next to the text.
A candidate's ``score`` may be left out (or null), as rank_llm's format allows: it then orders
as 0 wherever the first stage's scores order candidates, but a model reading the feature
``score`` refuses it as it refuses any feature a candidate lacks, and writing leaves it out, so
"no score" stays distinct from a score of 0.
Extra fields are kept as they are, so a round trip through spdrank loses nothing.

Every id a slate names (its qid, docids, history items, clicks, judged documents) passes one
rule, :func:`spdrank.core.validation.id_problem`: non-empty (a qid may be left out), with no
whitespace, control or format character. It is the rule of a TREC run line too
(:func:`spdrank.core.outputs.check_trec_ids`), so a slate that was read can always be written.
An id may be given as an integer (a log's item number), read as its decimal text.

Slate files are read and written through :mod:`spdrank.core.files`: reading streams line by line
(plain or gzip) and every malformed line raises one :class:`SlateError` that names
``file:line`` and the problem; writing is atomic, so an interrupted write never leaves a
half-written file behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spdrank.core.files import (  # noqa: F401 - the file helpers are importable from here too
    atomic_write_bytes,
    atomic_writer,
    gzipped,
    iter_json_lines,
    iter_lines,
    parse_json_line,
)
from spdrank.core.validation import (
    SlateError,
    as_float,
    as_id,
    check_id,
    check_text,
    is_blank,
)

T = TypeVar("T")

#: Fields of ``doc`` searched, in order, for a candidate's text.
TEXT_FIELDS: tuple[str, ...] = ("title", "text", "contents")

#: The feature name that reads a candidate's own ``score`` field.
SCORE_FEATURE = "score"

#: A slate's own fields; any other top-level key is kept in ``Slate.extra``.
_SLATE_FIELDS = ("query", "candidates", "clicked", "relevance", "teacher", "teacher_scores")

#: The highest relevance grade a slate may carry (TREC's scales stop at 4; this bounds a
#: gain's size without judging any collection's scale).
MAX_GRADE = 1_000

#: The slate field (kept in ``Slate.extra``) naming clicked items that are not candidates,
#: because the retriever did not return them: the click metrics count each as a miss.
NOT_RETRIEVED = "clicked_not_retrieved"


@dataclass
class Query:
    qid: str
    text: str
    #: Item ids of the user's history, oldest first, when the slate came from an interaction
    #: log. Rankers that need interaction statistics (popularity, co-occurrence) read it.
    history: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Candidate:
    docid: str
    doc: dict[str, Any]
    #: The first stage's score; 0.0 when none was given (see ``scored``).
    score: float = 0.0
    #: Upstream signals by name (finite numbers); None when the candidate carries none.
    features: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Whether ``score`` was given. A slate file may leave it out (or send null), and 0.0 in
    #: its place still orders the candidates as listed, but a model reading the feature
    #: ``score`` must not take that 0.0 for a value someone sent. True by default, so code
    #: that builds candidates with their scores needs no change.
    scored: bool = True

    def feature(self, name: str) -> float | None:
        """The value of feature ``name``, or None when the candidate lacks it.

        ``score`` is the candidate's own score field, so a retriever's score needs no copy
        under ``features``; a candidate whose score was not given lacks it.
        """
        if name == SCORE_FEATURE:
            return self.score if self.scored else None
        return None if self.features is None else self.features.get(name)

    def text(self, fields: tuple[str, ...] = TEXT_FIELDS) -> str:
        """The candidate's text: the first of ``fields`` present in ``doc``; a document with
        a ``title`` and a body (BEIR's ``{title, text}``) reads as both, title first."""
        for name in fields:
            if name in self.doc:
                return with_body(self.doc, name, fields)
        raise SlateError(f"candidate {self.docid!r} has none of the text fields {list(fields)}")


def with_body(doc: dict[str, Any], name: str, fields: tuple[str, ...]) -> str:
    """``doc[name]``, followed by the document's body when ``name`` is its title: the first
    later field of ``fields`` the document holds as non-blank text."""
    text = doc[name]
    if name != "title":
        return text
    body = next(
        (doc[f] for f in fields[fields.index(name) + 1 :]
         if isinstance(doc.get(f), str) and not is_blank(doc[f])),
        None,
    )
    if body is None or is_blank(text):
        return text if body is None else body
    return f"{text.rstrip()}{'' if text.rstrip()[-1] in '.!?:;' else '.'} {body}"


@dataclass
class Slate:
    query: Query
    candidates: list[Candidate]
    clicked: list[str] | None = None
    teacher: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The teacher's score of each item of ``teacher`` (non-increasing), when it ranked by one:
    #: candidates with equal scores are ties, which fidelity metrics do not count as an order.
    teacher_scores: list[float] | None = None
    #: Graded judgements of the query, ``{docid: grade >= 0}``, as TREC qrels hold them: every
    #: judged document, candidates or not (the judged metrics' ideal ranking reads them all).
    relevance: dict[str, int] | None = None

    @property
    def docids(self) -> list[str]:
        return [c.docid for c in self.candidates]

    def __len__(self) -> int:
        return len(self.candidates)

    # -- conversion -------------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls, data: Any, where: str | None = None, text_fields: tuple[str, ...] = TEXT_FIELDS
    ) -> Slate:
        """Build and validate a slate from parsed JSON; raises :class:`SlateError`."""
        if not isinstance(data, dict):
            raise SlateError(f"a slate must be a JSON object, got {type(data).__name__}", where)
        for key in ("query", "candidates"):
            if key not in data:
                raise SlateError(f"missing field {key!r}", where)
        query = _parse_query(data["query"], where)
        candidates = _parse_candidates(data["candidates"], where, text_fields)
        docids = {c.docid for c in candidates}
        clicked = _parse_id_list(data.get("clicked"), "clicked", docids, where)
        teacher = _parse_id_list(data.get("teacher"), "teacher", docids, where)
        if teacher is not None:
            if len(set(teacher)) != len(teacher):
                dup = next(d for d in teacher if teacher.count(d) > 1)
                raise SlateError(f"'teacher' repeats docid {dup!r}", where)
            if len(teacher) != len(candidates):
                missing = [d for d in (c.docid for c in candidates) if d not in set(teacher)]
                raise SlateError(
                    f"'teacher' is not a full permutation of the {len(candidates)} candidates: "
                    f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}",
                    where,
                )
        teacher_scores = _parse_teacher_scores(data.get("teacher_scores"), teacher, where)
        relevance = parse_relevance(data.get("relevance"), where)
        extra = {k: v for k, v in data.items() if k not in _SLATE_FIELDS}
        slate = cls(
            query=query,
            candidates=candidates,
            clicked=clicked,
            teacher=teacher,
            extra=extra,
            teacher_scores=teacher_scores,
            relevance=relevance,
        )
        if NOT_RETRIEVED in extra:
            _check_not_retrieved(extra[NOT_RETRIEVED], slate, where)
        return slate

    def to_dict(self) -> dict[str, Any]:
        query: dict[str, Any] = {"qid": self.query.qid, "text": self.query.text}
        if self.query.history is not None:
            query["history"] = list(self.query.history)
        query.update(self.query.extra)
        out: dict[str, Any] = {
            "query": query,
            "candidates": [_candidate_dict(c) for c in self.candidates],
        }
        if self.clicked is not None:
            out["clicked"] = list(self.clicked)
        if self.relevance is not None:
            out["relevance"] = dict(self.relevance)
        if self.teacher is not None:
            out["teacher"] = list(self.teacher)
        if self.teacher_scores is not None:
            out["teacher_scores"] = list(self.teacher_scores)
        out.update(self.extra)
        return out

    def candidate_texts(self, fields: tuple[str, ...] = TEXT_FIELDS) -> list[str]:
        return [c.text(fields) for c in self.candidates]


def clicked_not_retrieved(slate: Slate) -> list[str]:
    """The slate's clicked items its candidates lack (:data:`NOT_RETRIEVED`); ``[]`` if none.

    A :class:`SlateError` naming the slate when the field is not a list of ids, or names a
    candidate (a retrieved click belongs in ``clicked``).
    """
    raw = slate.extra.get(NOT_RETRIEVED)
    return [] if raw is None else _check_not_retrieved(raw, slate, f"slate {slate.query.qid!r}")



def training_sequence(slate: Slate) -> list[str]:
    """A training slate's interactions in time order: its history, then its clicked items
    (those the retriever did not return, too: the user still interacted with them)."""
    clicked = list(slate.clicked or ()) + clicked_not_retrieved(slate)
    return list(slate.query.history or ()) + clicked


def _check_not_retrieved(raw: Any, slate: Slate, where: str | None) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(d, str) for d in raw):
        raise SlateError(f"{NOT_RETRIEVED!r} must be a list of item ids", where,
                         field=NOT_RETRIEVED)
    for i, item in enumerate(raw):
        check_id(item, f"{NOT_RETRIEVED}[{i}]", where)
    retrieved = set(slate.docids).intersection(raw)
    if retrieved:
        raise SlateError(
            f"{NOT_RETRIEVED!r} names candidates {sorted(retrieved)[:5]}: a click among the "
            "candidates belongs in 'clicked'",
            where,
            field=NOT_RETRIEVED,
        )
    return list(raw)


def _candidate_dict(c: Candidate) -> dict[str, Any]:
    # A score not given is left out, so the line read back is the same candidate (unscored).
    out: dict[str, Any] = {"docid": c.docid, "doc": c.doc}
    if c.scored:
        out["score"] = c.score
    if c.features is not None:
        out["features"] = dict(c.features)
    return out | c.extra


def parse_features(
    raw: Any, label: str, where: str | None = None, path: str | None = None
) -> dict[str, float]:
    """Validate a ``features`` object: names to finite numbers; raises :class:`SlateError`.

    ``label`` names the owner in messages (``candidates[3] (docid 'x')``), so an error says
    which candidate and which feature to fix. ``score`` is refused as a name: it is the
    candidate's own field, and two values under one name would be ambiguous.
    """
    if not isinstance(raw, dict):
        raise SlateError(f"{label}: 'features' must be an object {{name: number}}, got "
                         f"{type(raw).__name__}", where)
    out: dict[str, float] = {}
    for name, value in raw.items():
        if name == SCORE_FEATURE:
            raise SlateError(
                f"{label}: features.{SCORE_FEATURE} is not allowed: 'score' is the candidate's "
                "own score field, read as the feature 'score'", where,
            )
        field = f"{path}.features.{name}" if path else None
        out[name] = as_float(value, f"{label}: features.{name}", where, field)
    return out


def parse_relevance(raw: Any, where: str | None = None) -> dict[str, int] | None:
    """Validate ``relevance``: ``{docid: grade}``, each grade an integer from 0 to
    :data:`MAX_GRADE`; raises :class:`SlateError` naming the entry. Docids need not be
    candidates: a judged document the retriever missed still counts against the ranking."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SlateError(
            f"'relevance' must be an object {{docid: grade}}, got {type(raw).__name__}",
            where, field="relevance",
        )
    out: dict[str, int] = {}
    for docid, grade in raw.items():
        check_id(docid, "relevance key", where, "relevance")
        check_text(docid, f"relevance key {docid!r}", where, "relevance")
        if isinstance(grade, bool) or not isinstance(grade, int) or not 0 <= grade <= MAX_GRADE:
            raise SlateError(
                f"relevance[{docid!r}] must be an integer grade from 0 to {MAX_GRADE}, got "
                f"{grade!r}",
                where, field=f"relevance.{docid}",
            )
        out[docid] = grade
    return out


def _parse_query(raw: Any, where: str | None) -> Query:
    if isinstance(raw, str):  # rank_llm also accepts a bare query string
        raw = {"qid": "", "text": raw}
    if not isinstance(raw, dict):
        raise SlateError(f"'query' must be an object or a string, got {type(raw).__name__}", where)
    if "text" not in raw:
        raise SlateError("missing field 'query.text'", where)
    if not isinstance(raw["text"], str):
        raise SlateError(f"'query.text' must be a string, got {type(raw['text']).__name__}", where)
    check_text(raw["text"], "query.text", where)
    qid = as_id(raw.get("qid", ""), "query.qid", where, empty_ok=True)
    check_text(qid, "query.qid", where)
    history = raw.get("history")
    if history is not None and not isinstance(history, list):
        raise SlateError("'query.history' must be a list of item ids", where, field="query.history")
    extra = {k: v for k, v in raw.items() if k not in ("qid", "text", "history")}
    return Query(
        qid=qid,
        text=raw["text"],
        history=(
            [as_id(h, f"query.history[{i}]", where) for i, h in enumerate(history)]
            if history is not None else None
        ),
        extra=extra,
    )


def _parse_candidates(raw: Any, where: str | None, text_fields: tuple[str, ...]) -> list[Candidate]:
    if not isinstance(raw, list):
        raise SlateError(f"'candidates' must be a list, got {type(raw).__name__}", where)
    if not raw:
        raise SlateError("'candidates' is empty: a slate needs at least one candidate", where)
    seen: set[str] = set()
    out: list[Candidate] = []
    for i, cand in enumerate(raw):
        label = f"candidates[{i}]"
        if not isinstance(cand, dict):
            raise SlateError(f"{label} must be an object, got {type(cand).__name__}", where)
        if "docid" not in cand:
            raise SlateError(f"{label} has no 'docid'", where)
        docid = as_id(cand["docid"], f"{label}.docid", where)
        check_text(docid, f"{label}.docid", where)
        if docid in seen:
            raise SlateError(f"duplicate docid {docid!r} at {label}", where)
        seen.add(docid)
        doc = cand.get("doc")
        if not isinstance(doc, dict):
            raise SlateError(f"{label} (docid {docid!r}) has no 'doc' object with its text", where)
        present = [f for f in text_fields if f in doc]
        if not present:
            raise SlateError(
                f"{label} (docid {docid!r}) has no text: 'doc' holds none of {list(text_fields)}",
                where,
            )
        text = doc[present[0]]
        if not isinstance(text, str):
            raise SlateError(
                f"{label}.doc.{present[0]} (docid {docid!r}) must be a string, "
                f"got {type(text).__name__}",
                where,
            )
        if is_blank(text):
            raise SlateError(f"{label}.doc.{present[0]} (docid {docid!r}) is empty (no visible "
                             "character)", where)
        check_text(
            text, f"{label}.doc.{present[0]} (docid {docid!r})", where, f"{label}.doc.{present[0]}"
        )
        # A score left out or null is not given: 0.0 keeps the listed order wherever scores
        # order candidates, and ``scored`` tells a model reading 'score' that it is missing.
        scored = cand.get("score") is not None
        score = (as_float(cand["score"], f"{label}.score (docid {docid!r})", where,
                          f"{label}.score") if scored else 0.0)
        features = cand.get("features")
        if features is not None:
            features = parse_features(features, f"{label} (docid {docid!r})", where, label)
        extra = {k: v for k, v in cand.items() if k not in ("docid", "doc", "score", "features")}
        out.append(
            Candidate(docid=docid, doc=doc, score=score, features=features, extra=extra,
                      scored=scored)
        )
    return out


def check_teacher_scores(
    raw: Any,
    teacher: list[str] | None,
    where: str | None = None,
    names: tuple[str, str] = ("teacher_scores", "teacher"),
) -> list[float]:
    """Validate scores of a teacher ranking; raises :class:`SlateError` naming the problem.

    They must be finite numbers, one per item of ``teacher``, and non-increasing along it:
    scores that disagreed with the ranking would make its ties (equal scores) meaningless.
    ``names``: the fields of the scores and of the ranking, as the messages call them.
    """
    field_name, ranking_name = names
    if teacher is None:
        raise SlateError(f"{field_name!r} needs a {ranking_name!r} ranking to align with", where)
    if not isinstance(raw, list):
        raise SlateError(
            f"{field_name!r} must be a list of numbers, got {type(raw).__name__}", where
        )
    if len(raw) != len(teacher):
        raise SlateError(
            f"{field_name!r} has {len(raw)} scores for the {len(teacher)} items of "
            f"{ranking_name!r}",
            where,
        )
    values = [
        as_float(value, f"{field_name}[{i}] (docid {teacher[i]!r})", where, f"{field_name}[{i}]")
        for i, value in enumerate(raw)
    ]
    for i, value in enumerate(values):
        label = f"{field_name}[{i}] (docid {teacher[i]!r})"
        if i and value > values[i - 1]:
            raise SlateError(
                f"{field_name!r} must be non-increasing along {ranking_name!r}: {label} = "
                f"{value} is above the {values[i - 1]} before it",
                where,
            )
    return values


def _parse_teacher_scores(
    raw: Any, teacher: list[str] | None, where: str | None
) -> list[float] | None:
    return None if raw is None else check_teacher_scores(raw, teacher, where)


def _parse_id_list(raw: Any, name: str, docids: set[str], where: str | None) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise SlateError(f"{name!r} must be a list of docids, got {type(raw).__name__}", where)
    ids = [as_id(x, f"{name}[{i}]", where) for i, x in enumerate(raw)]
    unknown = [d for d in ids if d not in docids]
    if unknown:
        raise SlateError(f"{name!r} names docids that are not candidates: {unknown[:5]}", where)
    return ids


# -- slate files ----------------------------------------------------------------------


def read_slates(
    path: str | os.PathLike[str], text_fields: tuple[str, ...] = TEXT_FIELDS
) -> Iterator[Slate]:
    """Stream validated slates from a JSONL file (``.gz`` too); blank lines are skipped.

    Streaming keeps memory flat for files larger than memory; the first bad line stops the
    iteration with a :class:`SlateError` naming ``file:line``.
    """
    for _, slate in iter_slates(path, text_fields):
        yield slate


def iter_slates(
    path: str | os.PathLike[str], text_fields: tuple[str, ...] = TEXT_FIELDS
) -> Iterator[tuple[str, Slate]]:
    """``(file:line, slate)`` for each slate of a JSONL file, validated as it is read."""
    for where, data in iter_json_lines(path, "slate file"):
        yield where, Slate.from_dict(data, where=where, text_fields=text_fields)


def unique_qids(
    located: Iterable[tuple[str, Slate]], allow_blank: bool = False
) -> Iterator[tuple[str, Slate]]:
    """Pass ``(file:line, slate)`` pairs through, failing on a repeated qid with both lines.

    Outputs keyed by qid (teacher labels, TREC runs) would merge two slates sharing one.
    ``allow_blank`` lets any number of slates leave the qid empty (rank_llm's bare query
    string has none); they are then told apart by their place in the file.
    """
    first: dict[str, str] = {}
    for where, slate in located:
        qid = slate.query.qid
        if qid in first:
            raise SlateError(
                f"duplicate qid {qid!r} (first at {first[qid]}): qids must be unique within the "
                "file",
                where,
                field="query.qid",
            )
        if qid or not allow_blank:
            first[qid] = where
        yield where, slate


class Placed:
    """Slates from ``(file:line, slate)`` pairs that remember where the last one handed out was
    read, so that an error its ranking raises without a place (a feature a ranker reads and
    the slate lacks) names that line: :meth:`naming` wraps the loop that ranks them."""

    def __init__(self, located: Iterable[tuple[str, Slate]]) -> None:
        self._located = iter(located)
        self.where: str | None = None

    def __iter__(self) -> Iterator[Slate]:
        return self

    def __next__(self) -> Slate:
        self.where, slate = next(self._located)
        return slate

    @contextmanager
    def naming(self) -> Iterator[None]:
        """Add the last slate's ``file:line`` to a :class:`SlateError` raised without one."""
        try:
            yield
        except SlateError as exc:
            if exc.where is not None or self.where is None:
                raise
            raise SlateError(exc.detail, self.where, field=exc.field) from None


def read_unique_slates(path: str | os.PathLike[str]) -> Iterator[Slate]:
    """Slates from a file, failing on a repeated qid with ``file:line`` of both copies."""
    for _, slate in unique_qids(iter_slates(path)):
        yield slate


def load_slates(path: str | os.PathLike[str], limit: int | None = None) -> list[Slate]:
    """Read up to ``limit`` slates into a list (validates every line it reads)."""
    out: list[Slate] = []
    if limit is not None and limit <= 0:
        return out
    for slate in read_slates(path):
        out.append(slate)
        if limit is not None and len(out) >= limit:
            break  # before reading (and validating) the line after the last one wanted
    return out


def dumps_slate(slate: Slate) -> str:
    """One slate as one JSON line; ASCII-safe and with a stable key order, for byte-identical output."""
    return json.dumps(
        slate.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )


def write_slates(path: str | os.PathLike[str], slates: Iterable[Slate]) -> int:
    """Write slates as JSONL atomically; returns the number written."""
    n = 0
    with atomic_writer(path) as fh:
        for slate in slates:
            fh.write(dumps_slate(slate))
            fh.write("\n")
            n += 1
    return n


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive groups of ``size`` items (the last may be shorter), streamed."""
    if size < 1:
        raise ValueError(f"a batch size must be at least 1, got {size}")
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def as_slate(
    query: str | Query | Slate, candidates: Sequence[Any] | None,
    text_fields: tuple[str, ...] = TEXT_FIELDS,
) -> Slate:
    """Accept a Slate, or a query plus candidates given as strings, dicts or Candidates, held
    to what a slate file's line is held to (:meth:`Slate.from_dict`, reading ``text_fields``):
    objects built by hand skip the reader's checks, and a repeated docid, a feature given as
    text or a blank passage would otherwise be ranked as if they meant something."""
    if isinstance(query, Slate):
        if candidates is not None:
            raise ValueError("pass either a Slate or a query with candidates, not both")
        slate = query
    else:
        if candidates is None:
            raise ValueError("rank() needs candidates: rank(query, candidates) or rank(slate)")
        if isinstance(candidates, (str, bytes, dict)) or not isinstance(candidates, Sequence):
            raise TypeError(f"candidates must be a list of strings, dicts or Candidates, got "
                            f"{type(candidates).__name__}")
        if not isinstance(query, (str, Query)):
            raise TypeError(f"query must be a string, a Query or a Slate, got "
                            f"{type(query).__name__}")
        q = query if isinstance(query, Query) else Query(qid="", text=query)
        cands: list[Candidate] = []
        for i, c in enumerate(candidates):
            if isinstance(c, Candidate):
                cands.append(c)
            elif isinstance(c, str):  # a bare text carries no first-stage score
                cands.append(Candidate(docid=str(i), doc={"text": c}, scored=False))
            elif isinstance(c, dict):
                cands.append(Slate.from_dict({"query": "", "candidates": [c]}).candidates[0])
            else:
                raise TypeError(f"candidate {i} must be a string, a dict or a Candidate")
        slate = Slate(query=q, candidates=cands)
    try:
        data = slate.to_dict()
    except (AttributeError, TypeError) as exc:
        raise TypeError(f"rank(): the slate's parts are not what a Slate holds ({exc})") from None
    return Slate.from_dict(data, where="rank()", text_fields=text_fields)
