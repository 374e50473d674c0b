"""The field's own files for search: TREC qrels and runs, topics and corpora.

pyserini, rank_llm, ir_datasets and BEIR write these; reading them is I/O every layer above
needs (a run file is a ranker, a qrels file scores any ranking, a corpus and topics make search
slates), so it lives here, below them all. Every bad line is a
:class:`~spdrank.core.validation.SlateError` naming ``file:line``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spdrank.core.files import iter_json_lines, iter_lines, parse_json_line
from spdrank.core.validation import SlateError

#: Fields of a corpus record that hold its id, title and body, in the order they are looked up
#: (BEIR's ``_id/title/text``, pyserini's ``id/contents``, MS MARCO v2's ``docid/segment`` and
#: ``pid/passage``).
_ID_FIELDS = ("_id", "docid", "pid", "id")
_TITLE_FIELDS = ("title",)
_TEXT_FIELDS = ("text", "contents", "segment", "passage", "body")
#: Fields of a topics record: BEIR's ``_id/text``, or ``qid/query`` (rank_llm, ir_datasets).
_QID_FIELDS = ("_id", "qid", "query_id", "id")
_QUERY_FIELDS = ("text", "query", "title")



def as_text(value: Any, label: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SlateError(f"{label} must be a string or an integer, got {type(value).__name__}",
                         where)
    return str(value)


# -- qrels ----------------------------------------------------------------------------------


def read_qrels(path: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """Judgements ``{qid: {docid: grade}}`` from TREC qrels (``qid iter docid grade`` lines)
    or JSON of that shape (grades as integers or integer strings, as ir_datasets dumps them).

    Negative grades (some collections mark spam with -1 or -2) are kept as 0: trec_eval
    counts neither as relevant nor as gain.
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    if path.suffix == ".json":
        where = f"{path}:1"
        data = read_json(path)
        if not isinstance(data, dict):
            raise SlateError("qrels JSON must be an object {qid: {docid: grade}}", where)
        for qid, docs in data.items():
            if not isinstance(docs, dict):
                raise SlateError(f"qrels[{qid!r}] must be an object {{docid: grade}}", where)
            qrels[qid] = {d: _grade(g, f"qrels[{qid!r}][{d!r}]", where) for d, g in docs.items()}
        return qrels
    for where, (qid, _, docid, grade) in _fields(path, "qrels file", "qrels",
                                                     "qid iter docid grade"):
        qrels.setdefault(qid, {})[docid] = _grade(grade, "the grade", where)
    return qrels


def _fields(path: Path, what: str, kind: str, names: str) -> Iterator[tuple[str, list[str]]]:
    """``(file:line, fields)`` of each line of a whitespace-separated TREC file (a ``what``)
    whose ``kind`` lines hold the fields ``names`` says; one line naming the place when a line
    holds others."""
    count = len(names.split())
    for lineno, _, raw in iter_lines(path, what):
        where = f"{path}:{lineno}"
        parts = raw.decode("utf-8", errors="replace").split()
        if len(parts) != count:
            raise SlateError(f"a {kind} line has {count} fields ({names}), got {len(parts)}",
                             where)
        yield where, parts


def _grade(value: Any, label: str, where: str) -> int:
    try:
        grade = int(value)
    except (TypeError, ValueError):
        raise SlateError(f"{label} must be an integer grade, got {value!r}", where) from None
    if isinstance(value, float) and value != grade:
        raise SlateError(f"{label} must be an integer grade, got {value!r}", where)
    return max(grade, 0)


def read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return parse_json_line(fh.read(), f"{path}")
    except OSError as exc:
        raise SlateError(f"cannot read {path}: {exc.strerror or exc}") from None


# -- topics and corpora ---------------------------------------------------------------------


def _first(record: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in record), None)


def read_topics(path: str | os.PathLike[str]) -> dict[str, str]:
    """Query texts by qid: a TSV (``qid<TAB>text``, MS MARCO's queries files) or JSONL
    (BEIR's ``queries.jsonl``: ``_id`` and ``text``; or ``qid`` and ``query``)."""
    path = Path(path)
    topics: dict[str, str] = {}
    if _is_jsonl(path):
        for where, rec in iter_json_lines(path, "topics file"):
            qid_field = _first(rec, _QID_FIELDS) if isinstance(rec, dict) else None
            text_field = _first(rec, _QUERY_FIELDS) if isinstance(rec, dict) else None
            if qid_field is None or text_field is None:
                raise SlateError(f"a topic needs one of {list(_QID_FIELDS)} and one of "
                                 f"{list(_QUERY_FIELDS)}", where)
            qid = as_text(rec[qid_field], qid_field, where)
            topics[qid] = as_text(rec[text_field], text_field, where)
        return topics
    for lineno, _, raw in iter_lines(path, "topics file"):
        where = f"{path}:{lineno}"
        parts = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
        if len(parts) < 2:
            raise SlateError("a topics line is 'qid<TAB>query text'", where)
        topics[parts[0]] = parts[1]
    return topics


def _is_jsonl(path: Path) -> bool:
    name = path.name.removesuffix(".gz")
    return name.endswith((".jsonl", ".json"))


def read_corpus(
    path: str | os.PathLike[str], wanted: set[str] | None = None
) -> dict[str, dict[str, str]]:
    """Passages by docid as ``{"title", "text"}`` dicts, keeping only ``wanted`` ids when given
    (a corpus is far larger than a run's hits, and is streamed).

    JSONL: BEIR (``_id``, ``title``, ``text``), pyserini (``id``, ``contents``), MS MARCO v2
    (``docid``, ``title``, ``segment`` / ``pid``, ``passage``). TSV: ``docid<TAB>text`` or
    ``docid<TAB>title<TAB>text``.
    """
    path = Path(path)
    corpus: dict[str, dict[str, str]] = {}
    if _is_jsonl(path):
        for where, rec in iter_json_lines(path, "corpus file"):
            if not isinstance(rec, dict):
                raise SlateError("a corpus line must be a JSON object", where)
            id_field, text_field = _first(rec, _ID_FIELDS), _first(rec, _TEXT_FIELDS)
            if id_field is None or text_field is None:
                raise SlateError(f"a corpus record needs one of {list(_ID_FIELDS)} and one of "
                                 f"{list(_TEXT_FIELDS)}", where)
            docid = as_text(rec[id_field], id_field, where)
            if wanted is not None and docid not in wanted:
                continue
            doc = {"text": as_text(rec[text_field], text_field, where)}
            title = rec.get("title")
            if isinstance(title, str) and title.strip():
                doc = {"title": title, **doc}
            corpus[docid] = doc
        return corpus
    for lineno, _, raw in iter_lines(path, "corpus file"):
        where = f"{path}:{lineno}"
        parts = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
        if len(parts) not in (2, 3):
            raise SlateError("a corpus TSV line is 'docid<TAB>text' or 'docid<TAB>title<TAB>text'",
                             where)
        if wanted is not None and parts[0] not in wanted:
            continue
        corpus[parts[0]] = (
            {"text": parts[1]} if len(parts) == 2 else {"title": parts[1], "text": parts[2]}
        )
    return corpus


# -- runs -----------------------------------------------------------------------------------


def read_run(path: str | os.PathLike[str]) -> dict[str, list[tuple[str, float]]]:
    """A TREC run: ``{qid: [(docid, score), ...]}``, each query's list in trec_eval's order
    (score descending, equal scores by docid descending; the rank column is not read)."""
    path = Path(path)
    run: dict[str, dict[str, float]] = {}
    for where, (qid, _, docid, _, score, _) in _fields(path, "TREC run", "TREC run",
                                                        "qid Q0 docid rank score tag"):
        try:
            value = float(score)
        except ValueError:
            raise SlateError(f"the score {score!r} is not a number", where) from None
        if not math.isfinite(value):
            raise SlateError(f"the score {score!r} is not finite", where)
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise SlateError(f"docid {docid!r} appears twice for query {qid!r}", where)
        docs[docid] = value
    return {qid: trec_order(docs) for qid, docs in run.items()}


def trec_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """``(docid, score)`` pairs as trec_eval ranks them: score descending, then docid
    descending."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)
