"""Search slates from the field's own files: retrieve results, TREC runs, topics, corpora, qrels.

A search engineer arrives with what pyserini, rank_llm or BEIR wrote: a first-stage run and the
judgements it is scored against. Two inputs make slates:

- a **retrieve-results JSON** (pyserini / RankGPT / rank_llm): a list of ``{"query": text,
  "hits": [{"qid", "docid", "content", "rank", "score"}]}`` (JSONL with one such object a
  line too), where each hit carries its passage;
- a **TREC run** (``qid Q0 docid rank score tag``) with a **topics** file and a **corpus**,
  which hold the query and passage texts the run only names.

Either way each query becomes one slate: its hits as candidates in the run's order (score
descending, ties by docid descending, which is how trec_eval orders a run), the first-stage
score as each candidate's ``score``, and, with **qrels**, every judgement of the query as the
slate's graded ``relevance``, judged passages outside the run included.

Passages are stored as ``doc = {"title", "text"}`` (title only when the source has one), so a
BEIR document keeps both parts and an MS MARCO v2 segment is read from its ``segment`` field.
Every bad line is a :class:`~spdrank.validation.SlateError` naming ``file:line``.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spdrank.files import iter_json_lines, iter_lines, parse_json_line
from spdrank.slates import Slate
from spdrank.validation import SlateError

#: Fields of a corpus record that hold its id, title and body, in the order they are looked up
#: (BEIR's ``_id/title/text``, pyserini's ``id/contents``, MS MARCO v2's ``docid/segment`` and
#: ``pid/passage``).
_ID_FIELDS = ("_id", "docid", "pid", "id")
_TITLE_FIELDS = ("title",)
_TEXT_FIELDS = ("text", "contents", "segment", "passage", "body")
#: Fields of a topics record: BEIR's ``_id/text``, or ``qid/query`` (rank_llm, ir_datasets).
_QID_FIELDS = ("_id", "qid", "query_id", "id")
_QUERY_FIELDS = ("text", "query", "title")


@dataclass
class SearchBuild:
    """What a build wrote, for the command's summary."""

    queries: int = 0
    candidates: int = 0
    judged_queries: int = 0
    #: Queries of the run that the qrels do not judge (their slates carry no ``relevance``).
    unjudged: list[str] = field(default_factory=list)
    #: Queries judged with no passage at the relevance level (they score 0, as in trec_eval).
    no_relevant: list[str] = field(default_factory=list)


def _as_text(value: Any, label: str, where: str) -> str:
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
        data = _read_json(path)
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


def _read_json(path: Path) -> Any:
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
            qid = _as_text(rec[qid_field], qid_field, where)
            topics[qid] = _as_text(rec[text_field], text_field, where)
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
            docid = _as_text(rec[id_field], id_field, where)
            if wanted is not None and docid not in wanted:
                continue
            doc = {"text": _as_text(rec[text_field], text_field, where)}
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


def read_retrieve_results(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, list[dict]]]:
    """``(qid, query, hits)`` of a retrieve-results file: a JSON list (pyserini, RankGPT and
    rank_llm write one) or JSONL, one ``{"query", "hits"}`` object a line. Each hit is
    ``{"docid", "content", "score", ...}``; the qid is the hits' ``qid`` (or the record's)."""
    path = Path(path)
    if path.suffix == ".json":
        data = _read_json(path)
        if not isinstance(data, list):
            raise SlateError("a retrieve-results JSON is a list of {query, hits} objects",
                             f"{path}:1")
        records: Iterator[tuple[str, Any]] = (
            (f"{path}: record {i}", rec) for i, rec in enumerate(data)
        )
    else:
        records = iter_json_lines(path, "retrieve-results file")
    for where, rec in records:
        if not isinstance(rec, dict) or "query" not in rec or "hits" not in rec:
            raise SlateError("a retrieve-results record is an object with 'query' and 'hits'",
                             where)
        query = rec["query"]
        qid = None
        if isinstance(query, dict):  # rank_llm's request shape: {"text", "qid"}
            qid, query = query.get("qid"), query.get("text")
        if not isinstance(query, str):
            raise SlateError("'query' must be a string (or {text, qid})", where)
        hits = rec["hits"]
        if not isinstance(hits, list) or not hits:
            raise SlateError("'hits' must be a non-empty list", where)
        qid = qid if qid is not None else rec.get("qid", hits[0].get("qid") if
                                                   isinstance(hits[0], dict) else None)
        if qid is None:
            raise SlateError("the record names no qid (in the record or its hits)", where)
        yield _as_text(qid, "qid", where), query, [_check_hit(h, i, where)
                                                  for i, h in enumerate(hits)]


def _check_hit(hit: Any, i: int, where: str) -> dict:
    if not isinstance(hit, dict) or "docid" not in hit:
        raise SlateError(f"hits[{i}] must be an object with a 'docid'", where)
    if not any(k in hit for k in ("content", "text", "contents")):
        raise SlateError(f"hits[{i}] (docid {hit['docid']!r}) carries no passage text "
                         "('content')", where)
    return hit


# -- slates ---------------------------------------------------------------------------------


def search_slate(
    qid: str,
    query: str,
    hits: list[tuple[str, dict[str, str], float]],
    judgements: Mapping[str, int] | None,
    where: str,
) -> Slate:
    """One query's slate: hits ``(docid, doc, score)`` in rank order, its judgements graded.

    Built through :meth:`Slate.from_dict`, the one gate every slate passes, so a hit that no
    slate file could hold is refused here with the query named.
    """
    data: dict[str, Any] = {
        "query": {"qid": qid, "text": query},
        "candidates": [{"docid": d, "doc": doc, "score": s} for d, doc, s in hits],
    }
    if judgements is not None:
        data["relevance"] = dict(judgements)
    return Slate.from_dict(data, where=where)


def slates_from_retrieve_results(
    path: str | os.PathLike[str],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    depth: int | None = None,
) -> Iterator[Slate]:
    """A slate per query of a retrieve-results file, its hits cut to the first ``depth``."""
    for qid, query, hits in read_retrieve_results(path):
        ordered = sorted(hits, key=lambda h: h.get("rank", 0)) if all(
            "rank" in h for h in hits) else hits
        rows = [
            (str(h["docid"]), _hit_doc(h), float(h.get("score", 0.0) or 0.0))
            for h in ordered[:depth]
        ]
        yield search_slate(qid, query, rows, None if qrels is None else qrels.get(qid),
                           f"{path}: query {qid}")


def _hit_doc(hit: Mapping[str, Any]) -> dict[str, str]:
    text_field = next(k for k in ("content", "text", "contents") if k in hit)
    doc = {"text": hit[text_field]}
    if isinstance(hit.get("title"), str) and hit["title"].strip():
        doc = {"title": hit["title"], **doc}
    return doc


def slates_from_run(
    run_path: str | os.PathLike[str],
    topics_path: str | os.PathLike[str],
    corpus_path: str | os.PathLike[str],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    depth: int | None = None,
) -> Iterator[Slate]:
    """A slate per query of a TREC run, texts from the topics and the corpus."""
    run = read_run(run_path)
    topics = read_topics(topics_path)
    wanted = {d for docs in run.values() for d, _ in docs[:depth]}
    corpus = read_corpus(corpus_path, wanted)
    missing = sorted(wanted - corpus.keys())
    if missing:
        raise SlateError(f"{corpus_path} holds no passage for {len(missing)} docids of the run, "
                         f"e.g. {missing[:3]}")
    for qid, docs in run.items():
        if qid not in topics:
            raise SlateError(f"{topics_path} holds no query {qid!r} of the run {run_path}")
        rows = [(d, corpus[d], s) for d, s in docs[:depth]]
        yield search_slate(qid, topics[qid], rows, None if qrels is None else qrels.get(qid),
                           f"{run_path}: query {qid}")


def summarize(slates: list[Slate], rel: int) -> SearchBuild:
    """What :func:`build` reports: counts, unjudged queries, queries without a relevant one."""
    out = SearchBuild(queries=len(slates), candidates=sum(len(s) for s in slates))
    for s in slates:
        if s.relevance is None:
            out.unjudged.append(s.query.qid)
            continue
        out.judged_queries += 1
        if not any(g >= rel for g in s.relevance.values()):
            out.no_relevant.append(s.query.qid)
    return out


# -- training windows -----------------------------------------------------------------------


def training_windows(
    slate: Slate, window: int, stride: int, subsets: int = 0, seed: int = 0
) -> list[Slate]:
    """A labelled slate cut into slates of ``window`` candidates a student can train on.

    A student reads at most K candidates, and ranks a longer list by sliding windows
    (:mod:`spdrank.windows`); it trains on what those windows show it: the sliding windows over
    the slate's own order (its first stage's), bottom-up by ``stride``, plus ``subsets`` random
    subsets (seeded by ``seed`` and the qid) that mix passages from every depth. Each keeps the
    slate's query and judgements; its teacher ranking (and scores) and clicks are the slate's,
    restricted to its candidates. The qids are ``<qid>#<j>``, unique within the file.
    """
    from dataclasses import replace

    from spdrank.windows import Windows

    n = len(slate)
    spans = [list(range(start, end)) for start, end in Windows(window, stride).spans(n)]
    if n > window:  # a slate within one window is kept whole, once
        rng = random.Random(f"{seed}:{slate.query.qid}")
        spans += [sorted(rng.sample(range(n), window)) for _ in range(subsets)]
    out = []
    for j, span in enumerate(spans):
        part = [slate.candidates[i] for i in span]
        ids = {c.docid for c in part}
        keep = [i for i, d in enumerate(slate.teacher or ()) if d in ids]
        out.append(replace(
            slate,
            query=replace(slate.query, qid=f"{slate.query.qid}#{j}"),
            candidates=part,
            clicked=None if slate.clicked is None else [d for d in slate.clicked if d in ids],
            teacher=None if slate.teacher is None else [slate.teacher[i] for i in keep],
            teacher_scores=(None if slate.teacher_scores is None
                            else [slate.teacher_scores[i] for i in keep]),
        ))
    return out
