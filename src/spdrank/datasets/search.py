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
Every bad line is a :class:`~spdrank.core.validation.SlateError` naming ``file:line``.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from spdrank.core.files import iter_json_lines
from spdrank.core.slates import Slate
from spdrank.core.trec import read_corpus, read_json, read_run, read_topics
from spdrank.core.validation import SlateError, as_float, as_id, is_blank

logger = logging.getLogger(__name__)


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
    #: Queries with a passage at the relevance level, none of them among their candidates
    #: (they score 0 whatever a reranker does).
    none_retrieved: list[str] = field(default_factory=list)
    #: Judged queries none of whose judged passages (of any grade) is among their candidates.
    none_judged_retrieved: list[str] = field(default_factory=list)


#: The largest rank a retrieve-results hit may give: no first stage returns a billion hits for
#: one query, and a rank past it (a 400-digit number) is damage that would sort its hit last.
MAX_RANK = 10**9


class Hit(NamedTuple):
    """One hit of a retrieve-results record, checked: its docid, passage, first-stage score
    and rank (each None when it has none)."""

    docid: str
    doc: dict[str, str]
    score: float | None
    rank: int | None


def read_retrieve_results(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, list[Hit]]]:
    """``(qid, query, hits)`` of a retrieve-results file: a JSON list (pyserini, RankGPT and
    rank_llm write one) or JSONL, one ``{"query", "hits"}`` object a line. Each hit is
    ``{"docid", "content", "score", "rank", ...}``; the qid is the record's, else its query's
    (rank_llm's ``{text, qid}``), else its first hit's, and every hit that names a qid must
    name that one. A qid of two records is refused naming both."""
    path = Path(path)
    if path.suffix == ".json":
        data = read_json(path, "retrieve-results file")
        if not isinstance(data, list):
            raise SlateError("a retrieve-results JSON is a list of {query, hits} objects",
                             f"{path}:1")
        records: Iterator[tuple[str, Any]] = (
            (f"{path}: record {i}", rec) for i, rec in enumerate(data)
        )
    else:
        records = iter_json_lines(path, "retrieve-results file")
    first: dict[str, str] = {}
    for where, rec in records:
        qid, query, hits = _retrieved_record(rec, where)
        if qid in first:
            raise SlateError(f"query {qid!r} appears twice (first at {first[qid]}): each query "
                             "must have one record", where)
        first[qid] = where
        yield qid, query, hits


def is_retrieve_results(path: str | os.PathLike[str]) -> bool:
    """Whether a file is a retrieve-results JSON list (what pyserini, RankGPT and rank_llm
    write), not a corpus: a ``.json`` file whose first character is ``[``."""
    path = Path(path)
    if path.suffix != ".json":
        return False
    with path.open(encoding="utf-8") as fh:
        return fh.read(4096).lstrip()[:1] == "["


def retrieved_passages(path: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """The distinct passages of a retrieve-results file by docid, in the order first seen: the
    corpus a team already holds when it has a first stage's results and no corpus file."""
    passages: dict[str, dict[str, str]] = {}
    for _, _, hits in read_retrieve_results(path):
        for hit in hits:
            passages.setdefault(hit.docid, hit.doc)
    return passages


def _retrieved_record(rec: Any, where: str) -> tuple[str, str, list[Hit]]:
    """One retrieve-results record's qid, query text and checked hits."""
    if not isinstance(rec, dict) or "query" not in rec or "hits" not in rec:
        raise SlateError("a retrieve-results record is an object with 'query' and 'hits'",
                         where)
    query, qid = rec["query"], rec.get("qid")
    if isinstance(query, dict):  # rank_llm's request shape: {"text", "qid"}
        qid, query = query.get("qid", qid), query.get("text")
    if not isinstance(query, str) or is_blank(query):
        raise SlateError("'query' must be a string that shows something, not empty or only "
                         "whitespace and invisible characters (or {text, qid})", where,
                         field="query")
    hits = rec["hits"]
    if not isinstance(hits, list) or not hits:
        raise SlateError("'hits' must be a non-empty list", where, field="hits")
    if qid is None and isinstance(hits[0], dict):
        qid = hits[0].get("qid")
    if qid is None:
        raise SlateError("the record names no qid (in the record or its hits)", where)
    qid = as_id(qid, "qid", where)
    checked = [_check_hit(h, i, qid, where) for i, h in enumerate(hits)]
    _check_ranks(checked, where)
    scored = [isinstance(h, dict) and h.get("score") is not None for h in hits]
    if any(scored) and not all(scored):
        raise SlateError(f"hits[{scored.index(False)}] has no 'score' and hits[{scored.index(True)}] "
                         "has one: a hit without one would score 0, above or below the rest "
                         "by chance, so every hit has one or none does", where,
                         field=f"hits[{scored.index(False)}]")
    return qid, query, checked


def _check_ranks(hits: list[Hit], where: str) -> None:
    """A record's ranks order its hits, so they must be an order: every hit ranked or none
    (a mix would be sorted by half of them), each rank given once."""
    ranked = [i for i, h in enumerate(hits) if h.rank is not None]
    if ranked and len(ranked) != len(hits):
        unranked = next(i for i, h in enumerate(hits) if h.rank is None)
        raise SlateError(f"hits[{unranked}] has no 'rank' and hits[{ranked[0]}] has one: a "
                         "record's ranks order its hits, so every hit has one or none does",
                         where, field=f"hits[{unranked}]")
    first: dict[int, int] = {}
    for i, hit in enumerate(hits):
        if hit.rank is not None and hit.rank in first:
            raise SlateError(f"hits[{i}].rank {hit.rank} is also hits[{first[hit.rank]}]'s: "
                             "each hit of a record has its own rank", where,
                             field=f"hits[{i}].rank")
        if hit.rank is not None:
            first[hit.rank] = i


def _check_hit(hit: Any, i: int, qid: str, where: str) -> Hit:
    """Hit ``i`` of query ``qid``'s record, each field's type checked, naming the field."""
    label = f"hits[{i}]"
    if not isinstance(hit, dict) or "docid" not in hit:
        raise SlateError(f"{label} must be an object with a 'docid'", where, field=label)
    docid = as_id(hit["docid"], f"{label}.docid", where)
    if "qid" in hit and as_id(hit["qid"], f"{label}.qid", where) != qid:
        raise SlateError(f"{label}.qid {hit['qid']!r} is not the record's qid {qid!r}: a "
                         "record holds the hits of one query", where, field=f"{label}.qid")
    text_field = next((k for k in ("content", "text", "contents") if k in hit), None)
    if text_field is None:
        raise SlateError(f"{label} (docid {docid!r}) carries no passage text ('content')",
                         where, field=label)
    if not isinstance(hit[text_field], str):
        raise SlateError(f"{label}.{text_field} must be a string, got "
                         f"{type(hit[text_field]).__name__}", where, field=f"{label}.{text_field}")
    doc = {"text": hit[text_field]}
    if isinstance(hit.get("title"), str) and hit["title"].strip():
        doc = {"title": hit["title"], **doc}
    score = hit.get("score")
    rank = hit.get("rank")
    if "rank" in hit and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise SlateError(f"{label}.rank must be an integer, got {type(rank).__name__}", where,
                         field=f"{label}.rank")
    if rank is not None and not 1 <= rank <= MAX_RANK:
        shown = str(rank) if len(str(rank)) <= 20 else f"an integer of {len(str(rank))} digits"
        raise SlateError(f"{label}.rank must be between 1 and {MAX_RANK:,}, got {shown}", where,
                         field=f"{label}.rank")
    return Hit(docid, doc, None if score is None else as_float(score, f"{label}.score", where),
               rank)


# -- slates ---------------------------------------------------------------------------------


def search_slate(
    qid: str,
    query: str,
    hits: list[tuple[str, dict[str, str], float | None]],
    judgements: Mapping[str, int] | None,
    where: str,
) -> Slate:
    """One query's slate: hits ``(docid, doc, score)`` in rank order, its judgements graded.
    A hit without a score (None) is a candidate without one, so a model that reads the
    first stage's score refuses it rather than read 0.

    Built through :meth:`Slate.from_dict`, the one gate every slate passes, so a hit that no
    slate file could hold is refused here with the query named.
    """
    data: dict[str, Any] = {
        "query": {"qid": qid, "text": query},
        "candidates": [{"docid": d, "doc": doc, **({} if s is None else {"score": s})}
                       for d, doc, s in hits],
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
    rising: list[str] = []
    for qid, query, hits in read_retrieve_results(path):
        ranked = all(h.rank is not None for h in hits)
        ordered = sorted(hits, key=lambda h: h.rank or 0) if ranked else hits
        if any(b.score > a.score for a, b in itertools.pairwise(ordered)
               if a.score is not None and b.score is not None):
            rising.append(qid)
        rows = [(h.docid, h.doc, h.score) for h in ordered[:depth]]
        yield search_slate(qid, query, rows, None if qrels is None else qrels.get(qid),
                           f"{path}: query {qid}")
    if rising:
        logger.warning(
            "%s: in %s queries (e.g. %s) a hit scores above the one ranked before it: the hits "
            "are kept in their ranks' order, and their scores are read as higher-is-better "
            "(the feature `score`, the ranker `retriever`); if the score is a distance, negate it",
            path, f"{len(rising):,}", ", ".join(repr(q) for q in rising[:3]),
        )


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
        docids = set(s.docids)
        if not docids & s.relevance.keys():
            out.none_judged_retrieved.append(s.query.qid)
        if not any(g >= rel for g in s.relevance.values()):
            out.no_relevant.append(s.query.qid)
        elif not any(g >= rel for d, g in s.relevance.items() if d in docids):
            out.none_retrieved.append(s.query.qid)
    return out


# -- training windows -----------------------------------------------------------------------


def training_windows(
    slate: Slate, window: int, stride: int, subsets: int = 0, seed: int = 0
) -> list[Slate]:
    """A labelled slate cut into slates of ``window`` candidates a student can train on.

    A student reads at most K candidates, and ranks a longer list by sliding windows
    (:mod:`spdrank.rankers.windows`); it trains on what those windows show it: the sliding windows over
    the slate's own order (its first stage's), bottom-up by ``stride``, plus ``subsets`` random
    subsets (seeded by ``seed`` and the qid) that mix passages from every depth, each one
    neither a window nor another subset (:func:`random_subsets`: fewer when the slate has
    fewer). Each keeps the
    slate's query and judgements; its teacher ranking (and scores) and clicks are the slate's,
    restricted to its candidates. The qids are ``<qid>#<j>``, unique within the file.
    """
    from dataclasses import replace

    from spdrank.rankers.windows import Windows

    n = len(slate)
    spans = [tuple(range(start, end)) for start, end in Windows(window, stride).spans(n)]
    if n > window:  # a slate within one window is kept whole, once
        rng = random.Random(f"{seed}:{slate.query.qid}")
        spans += random_subsets(n, window, subsets, set(spans), rng)
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


def random_subsets(
    n: int, size: int, count: int, taken: set[tuple[int, ...]], rng: random.Random
) -> list[tuple[int, ...]]:
    """``count`` subsets of ``size`` of ``range(n)`` (sorted index tuples) drawn with ``rng``,
    none twice and none in ``taken``; all there are, in a random order, when fewer remain.

    While at least half of all C(n, size) subsets are free, each is drawn directly and a repeat
    drawn again (a draw then succeeds at least every other time); past that, few subsets
    exist, and they are listed and sampled.
    """
    from itertools import combinations
    from math import comb

    if comb(n, size) > 2 * (count + len(taken)):
        seen, out = set(taken), []
        while len(out) < count:
            subset = tuple(sorted(rng.sample(range(n), size)))
            if subset not in seen:
                seen.add(subset)
                out.append(subset)
        return out
    free = [subset for subset in combinations(range(n), size) if subset not in taken]
    return rng.sample(free, min(count, len(free)))


def subsets_allowed(n: int, window: int, stride: int) -> int:
    """How many random subsets :func:`training_windows` can cut from a slate of ``n``: every
    subset of ``window`` candidates but its full sliding windows (none for a slate within
    one window)."""
    from math import comb

    from spdrank.rankers.windows import Windows

    if n <= window:
        return 0
    full = {span for span in Windows(window, stride).spans(n) if span[1] - span[0] == window}
    return comb(n, window) - len(full)
