"""The field's own files for search: TREC qrels and runs, topics and corpora.

pyserini, rank_llm, ir_datasets and BEIR write these; reading them is I/O every layer above
needs (a run file is a ranker, a qrels file scores any ranking, a corpus and topics make search
slates), so it lives here, below them all. Every file is read through the one input reader
(:mod:`spdrank.core.inputs`: a regular file or a pipe, bounded, strict UTF-8, a leading byte
order mark skipped), and every bad line is a :class:`~spdrank.core.validation.SlateError`
naming ``file:line``: an id that is empty or holds a control character, a field of the wrong
type, and anything read twice (a judgement, a run's docid for one query, a topic, a passage),
which is refused naming both lines rather than resolved by whichever came last.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spdrank.core.files import iter_lines, parse_json_line
from spdrank.core.inputs import input_lines, read_document
from spdrank.core.slates import MAX_GRADE
from spdrank.core.validation import SlateError, as_id, check_id, is_blank

#: Fields of a corpus record that hold its id, title and body, in the order they are looked up
#: (BEIR's ``_id/title/text``, pyserini's ``id/contents``, MS MARCO v2's ``docid/segment`` and
#: ``pid/passage``).
_ID_FIELDS = ("_id", "docid", "pid", "id")
_TEXT_FIELDS = ("text", "contents", "segment", "passage", "body")
#: Fields of a topics record: BEIR's ``_id/text``, or ``qid/query`` (rank_llm, ir_datasets).
_QID_FIELDS = ("_id", "qid", "query_id", "id")
_QUERY_FIELDS = ("text", "query", "title")

#: A grade as a TREC file writes it: ASCII digits, perhaps signed (no ``1_0``, no other
#: script's digits, which ``int`` would read).
_GRADE = re.compile(r"[+-]?[0-9]+")
#: A score as a TREC run writes it: a decimal number, perhaps with an exponent.
_SCORE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def as_text(value: Any, label: str, where: str) -> str:
    """A text field given as a string, or an integer read as its decimal text."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SlateError(f"{label} must be a string or an integer, got {type(value).__name__}",
                         where, field=label)
    return str(value)


def twice(what: str, path: Path, first: int, where: str) -> SlateError:
    """The error for something a file holds twice, naming both lines."""
    return SlateError(f"{what} appears twice (first at {path}:{first}): each must appear once "
                      "in the file", where)


# -- qrels ----------------------------------------------------------------------------------


def read_qrels(path: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """Judgements ``{qid: {docid: grade}}`` from TREC qrels (``qid iter docid grade`` lines),
    BEIR's ``qrels/*.tsv`` (``query-id corpus-id score`` lines, under an optional header line
    of those names), or JSON of that shape (grades as integers or integer strings, as
    ir_datasets dumps them). One file holds one of the two line formats: its first line says
    which.

    Negative grades (some collections mark spam with -1 or -2) are kept as 0: trec_eval
    counts neither as relevant nor as gain. A document judged twice for one query is refused,
    even with the same grade: which judgement holds is the file's to say, not the reader's.
    """
    path = Path(path)
    if path.suffix == ".json":
        return _qrels_from_json(path)
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    for lineno, qid, docid, grade in _qrels_lines(path):
        where = f"{path}:{lineno}"
        check_id(qid, "the qid", where)
        check_id(docid, "the docid", where)
        if (qid, docid) in lines:
            raise twice(f"the judgement of docid {docid!r} for query {qid!r}", path,
                        lines[qid, docid], where)
        lines[qid, docid] = lineno
        qrels.setdefault(qid, {})[docid] = _grade(grade, "the grade", where)
    return qrels


#: BEIR's qrels header line, which a qrels TSV may start with.
BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")
#: The line formats of qrels, by their number of fields.
_QRELS_FORMATS = {4: "TREC's qid iter docid grade", 3: "BEIR's query-id corpus-id score"}


def _qrels_lines(path: Path) -> Iterator[tuple[int, str, str, str]]:
    """``(line number, qid, docid, grade)`` of each judgement of a qrels file in TREC's or
    BEIR's line format. The first line fixes the format: a line with the other count of
    fields after it is refused, as is one with neither, naming the place; BEIR's header is
    skipped on the first line alone (anywhere else it is a bad grade, not a header)."""
    count: int | None = None
    for line in input_lines(path, "qrels file"):
        parts = line.text.split()
        if not parts:
            continue
        where = f"{path}:{line.number}"
        if count is None:
            if len(parts) not in _QRELS_FORMATS:
                raise SlateError(f"a qrels line has 4 fields ({_QRELS_FORMATS[4]}) or 3 "
                                 f"({_QRELS_FORMATS[3]}), got {len(parts)}", where)
            count = len(parts)
            if tuple(p.lower() for p in parts) == BEIR_QRELS_HEADER:
                continue
        if len(parts) != count:
            raise SlateError(f"a qrels line has {count} fields ({_QRELS_FORMATS[count]}), as "
                             f"the file's first line has, got {len(parts)}", where)
        if count == 4:
            yield line.number, parts[0], parts[2], parts[3]
        else:
            yield line.number, parts[0], parts[1], parts[2]


def _qrels_from_json(path: Path) -> dict[str, dict[str, int]]:
    where = str(path)
    raw = read_document(path, "qrels file")
    data = parse_json_line(raw, where)  # a qid, or a docid of a query, given twice: refused
    if not isinstance(data, dict):
        raise SlateError("qrels JSON must be an object {qid: {docid: grade}}", where)
    qrels: dict[str, dict[str, int]] = {}
    for qid, docs in data.items():
        check_id(qid, "the qid", where)
        if not isinstance(docs, dict):
            raise SlateError(f"qrels[{qid!r}] must be an object {{docid: grade}}", where)
        for docid in docs:
            check_id(docid, f"the docid of qrels[{qid!r}]", where)
        qrels[qid] = {d: _grade(g, f"qrels[{qid!r}][{d!r}]", where) for d, g in docs.items()}
    return qrels


def _fields(path: Path, what: str, kind: str, names: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line of a whitespace-separated TREC file (a
    ``what``) whose ``kind`` lines hold the fields ``names`` says; one line naming the place
    when a line holds others."""
    count = len(names.split())
    for line in input_lines(path, what):
        parts = line.text.split()
        if not parts:
            continue
        if len(parts) != count:
            raise SlateError(f"a {kind} line has {count} fields ({names}), got {len(parts)}",
                             f"{path}:{line.number}")
        yield line.number, parts


def _grade(value: Any, label: str, where: str) -> int:
    """A judgement's grade: an integer (or one written as a string, or a float without a
    fraction), at most :data:`~spdrank.core.slates.MAX_GRADE`; a negative one read as 0."""
    if isinstance(value, str) and _GRADE.fullmatch(value) and len(value) <= 20:
        grade = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        grade = value
    elif isinstance(value, float) and value.is_integer():
        grade = int(value)
    else:
        raise SlateError(f"{label} must be an integer grade, got {value!r}"[:300], where)
    if grade > MAX_GRADE:
        raise SlateError(f"{label} must be at most {MAX_GRADE}, got {grade}", where)
    return max(grade, 0)


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """A whole JSON document, read bounded (:func:`spdrank.core.inputs.read_document`) and
    parsed through spdrank's one JSON gate; errors name the file."""
    path = Path(path)
    return parse_json_line(read_document(path, what), str(path))


# -- topics and corpora ---------------------------------------------------------------------


def _first(record: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in record), None)


def read_topics(path: str | os.PathLike[str]) -> dict[str, str]:
    """Query texts by qid: a TSV (``qid<TAB>text``, MS MARCO's queries files) or JSONL
    (BEIR's ``queries.jsonl``: ``_id`` and ``text``; or ``qid`` and ``query``).

    A TSV query is everything after the first tab, tabs within it kept. A qid read twice, an
    empty query or an unfit qid is refused naming the line.
    """
    path = Path(path)
    topics: dict[str, str] = {}
    lines: dict[str, int] = {}
    for lineno, qid, text in _topic_records(path):
        where = f"{path}:{lineno}"
        if qid in lines:
            raise twice(f"query {qid!r}", path, lines[qid], where)
        if is_blank(text):
            raise SlateError(f"query {qid!r} has an empty text (nothing but whitespace or "
                             "invisible characters)", where)
        lines[qid] = lineno
        topics[qid] = text
    return topics


def _topic_records(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line number, qid, text)`` of each topic of a topics file, the qid checked."""
    if _is_jsonl(path):
        for lineno, where, rec in _json_records(path, "topics file"):
            qid_field = _first(rec, _QID_FIELDS) if isinstance(rec, dict) else None
            text_field = _first(rec, _QUERY_FIELDS) if isinstance(rec, dict) else None
            if qid_field is None or text_field is None:
                raise SlateError(f"a topic needs one of {list(_QID_FIELDS)} and one of "
                                 f"{list(_QUERY_FIELDS)}", where)
            yield (lineno, as_id(rec[qid_field], qid_field, where),
                   as_text(rec[text_field], text_field, where))
        return
    for lineno, where, text in _tsv_lines(path, "topics file"):
        qid, tab, query = text.partition("\t")
        if not tab:
            raise SlateError("a topics line is 'qid<TAB>query text'", where)
        check_id(qid, "the qid", where)
        yield lineno, qid, query


def _tsv_lines(path: Path, what: str) -> Iterator[tuple[int, str, str]]:
    """``(line number, file:line, text)`` of each non-blank line of a TSV file, its line end
    cut and every tab kept (a field's text may hold one)."""
    for line in input_lines(path, what):
        text = line.text.rstrip("\r\n")
        if text.strip():
            yield line.number, f"{path}:{line.number}", text


def _json_records(path: Path, what: str) -> Iterator[tuple[int, str, Any]]:
    """``(line number, file:line, record)`` of each non-blank line of a JSONL file."""
    for line in iter_lines(path, what):
        where = f"{path}:{line.number}"
        yield line.number, where, parse_json_line(line.raw, where)


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
    ``docid<TAB>title<TAB>text``. Every docid is checked; one kept twice is refused naming
    both lines (the ids left out are not remembered: a corpus may hold millions), and so is a
    ``wanted`` passage without text, naming its line.
    """
    path = Path(path)
    corpus: dict[str, dict[str, str]] = {}
    lines: dict[str, int] = {}
    for lineno, docid, doc in _corpus_records(path):
        if wanted is not None and docid not in wanted:
            continue
        if docid in lines:
            raise twice(f"docid {docid!r}", path, lines[docid], f"{path}:{lineno}")
        if wanted is not None and all(is_blank(v) for v in doc.values()):
            raise SlateError(f"passage {docid!r} has an empty text (nothing but whitespace or "
                             "invisible characters), and a slate of the run holds it: a "
                             "candidate needs text to be ranked", f"{path}:{lineno}")
        lines[docid] = lineno
        corpus[docid] = doc
    return corpus


def _corpus_records(path: Path) -> Iterator[tuple[int, str, dict[str, str]]]:
    """``(line number, docid, {"title", "text"})`` of each passage of a corpus file."""
    if _is_jsonl(path):
        for lineno, where, rec in _json_records(path, "corpus file"):
            if not isinstance(rec, dict):
                raise SlateError("a corpus line must be a JSON object", where)
            id_field, text_field = _first(rec, _ID_FIELDS), _first(rec, _TEXT_FIELDS)
            if id_field is None or text_field is None:
                raise SlateError(f"a corpus record needs one of {list(_ID_FIELDS)} and one of "
                                 f"{list(_TEXT_FIELDS)}", where)
            docid = as_id(rec[id_field], id_field, where)
            doc = {"text": as_text(rec[text_field], text_field, where)}
            title = rec.get("title")
            if isinstance(title, str) and title.strip():
                doc = {"title": title, **doc}
            yield lineno, docid, doc
        return
    for lineno, where, text in _tsv_lines(path, "corpus file"):
        parts = text.split("\t")
        if len(parts) not in (2, 3):
            raise SlateError("a corpus TSV line is 'docid<TAB>text' or 'docid<TAB>title<TAB>text'",
                             where)
        check_id(parts[0], "the docid", where)
        doc = {"text": parts[-1]} if len(parts) == 2 else {"title": parts[1], "text": parts[2]}
        yield lineno, parts[0], doc


# -- runs -----------------------------------------------------------------------------------


def read_run(path: str | os.PathLike[str]) -> dict[str, list[tuple[str, float]]]:
    """A TREC run: ``{qid: [(docid, score), ...]}``, each query's list in trec_eval's order
    (score descending, equal scores by docid descending; the rank column is not read). A
    docid ranked twice for one query is refused naming both lines."""
    path = Path(path)
    run: dict[str, dict[str, float]] = {}
    lines: dict[tuple[str, str], int] = {}
    for lineno, (qid, _, docid, _, score, _) in _fields(path, "TREC run", "TREC run",
                                                       "qid Q0 docid rank score tag"):
        where = f"{path}:{lineno}"
        check_id(qid, "the qid", where)
        check_id(docid, "the docid", where)
        if (qid, docid) in lines:
            raise twice(f"docid {docid!r} for query {qid!r}", path, lines[qid, docid], where)
        lines[qid, docid] = lineno
        run.setdefault(qid, {})[docid] = _score(score, where)
    return {qid: trec_order(docs) for qid, docs in run.items()}


def _score(text: str, where: str) -> float:
    """A run line's score: a finite decimal number (not ``nan``, nor ``1_0``, which Python
    alone would read)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None and not math.isfinite(value):
        raise SlateError(f"the score {text[:40]!r} is not finite", where)
    if value is None or not _SCORE.fullmatch(text):
        raise SlateError(f"the score {text[:40]!r} is not a number", where)
    return value


def trec_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """``(docid, score)`` pairs as trec_eval ranks them: score descending, then docid
    descending."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)
