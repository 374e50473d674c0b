"""Training slates from a corpus alone: synthetic queries, as InPars and Promptagator make them.

A search engineer often has a corpus and no judged queries. InPars (Bonifacio et al. 2022;
v2, Jeronymo et al. 2023) and Promptagator (Dai et al. 2022) showed that an LLM shown a few
``Document: ... Relevant Query: ...`` examples writes, for any passage, a query that passage
answers, and that a filter keeping the queries a retriever can round-trip back to their
passage leaves data good enough to train rerankers on. Here:

1. **sample**: the corpus' passages with text, shuffled by the seed, the first N. The order is
   a prefix of every larger N's, so asking for more passages later reuses what is done.
2. **write**: a :class:`QueryWriter` (the bundled SmolLM2, any HF model or an OpenAI-compatible
   server: :mod:`spdrank.teacher.query_writers`) completes a :class:`QueryPrompt`, few-shot
   examples kept as data (``spdrank/data/queries/inpars.json``, or a user's file), for each
   passage. Each answer is appended to a journal beside the output
   (:mod:`spdrank.core.journal`) as it arrives, so a killed run loses at most the passages in
   flight and a rerun skips every passage already written for. Each record holds what its
   query was made from (the writer and its settings, the prompt's digest, and the digest of
   the passage text as the prompt showed it, cut to ``max_passage_words``), and a rerun that
   would make it from anything else is refused: its queries would be another run's under
   this one's name.
3. **screen**: the answer's first line, cleaned, is dropped when empty, cut off at the token
   cap or longer than ``max_query_words``, a repeat of an earlier query, or when its source
   passage is not in BM25's top ``keep_top`` over the whole corpus (Promptagator's round-trip
   filter, with BM25 as the retriever): a query its passage does not answer lexically well is
   more often one it does not answer at all. Every drop is counted by its reason.
4. **slates**: each kept query's BM25 top ``depth`` over the corpus (passages scoring 0 left
   out, as a BM25 run returns none), in BM25's order with its score as ``score``, and the
   source passage as the slate's ``relevance`` ``{docid: 1}``: a weak judgement (one passage
   known relevant, the others unjudged rather than irrelevant), which is what a teacher
   labels and what ``train --target relevance`` or ``eval`` read. qids are ``synth-<docid>``.

Screening and slates are recomputed from the journal on every run (BM25 over the corpus costs
seconds, the LLM hours), so changing ``keep_top`` or ``depth`` writes nothing new.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spdrank.core.files import parse_json_line
from spdrank.core.journal import Journal
from spdrank.core.progress import Progress
from spdrank.core.slates import Candidate, Slate, write_slates
from spdrank.core.trec import read_corpus, read_json
from spdrank.core.validation import SlateError, is_blank
from spdrank.datasets.search import is_retrieve_results, retrieved_passages, search_slate
from spdrank.rankers.bm25 import K1, B, tokenize

log = logging.getLogger(__name__)

#: Why a written query is not kept, in the order the screen asks.
DROP_REASONS = ("empty", "too_long", "duplicate", "not_retrieved")

#: The prefix of every synthetic slate's qid (``synth-<docid>``).
QID_PREFIX = "synth-"


# -- the prompt -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryPrompt:
    """A few-shot prompt as data: example passages with their queries, then the passage.

    ``render`` is plain text for a completion, ending ``Relevant Query:``: a small base or
    instruct model continues the pattern, where a chat template makes SmolLM2-135M answer
    about the task instead. ``instruction`` is the system message a chat server gets with it.
    """

    name: str
    #: ``(passage, query)`` pairs, shown in order.
    examples: tuple[tuple[str, str], ...]
    instruction: str
    document_label: str = "Document"
    query_label: str = "Relevant Query"

    def render(self, passage: str) -> str:
        shots = "".join(
            f"Example {i}:\n{self.document_label}: {doc}\n{self.query_label}: {query}\n\n"
            for i, (doc, query) in enumerate(self.examples, start=1)
        )
        return (f"{shots}Example {len(self.examples) + 1}:\n{self.document_label}: "
                f"{passage}\n{self.query_label}:")

    def digest(self) -> str:
        """A short hash of everything the prompt says: journal records made under another
        prompt are not this run's."""
        text = json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def prompt_from_json(data: Any, where: str) -> QueryPrompt:
    """A prompt from its JSON: ``name``, ``instruction``, ``examples`` (a non-empty list of
    ``{document, query}``), optional ``document_label``/``query_label``; other keys (a
    ``source``) are notes. Every wrong field is a :class:`SlateError` naming it."""
    if not isinstance(data, dict):
        raise SlateError("a query prompt is a JSON object", where)

    def text(obj: dict[str, Any], key: str, label: str, default: str | None = None) -> str:
        value = obj.get(key, default)
        if not isinstance(value, str) or is_blank(value):
            raise SlateError(f"{label} must be a non-blank string", where, field=label)
        return value

    examples = data.get("examples")
    if not isinstance(examples, list) or not examples:
        raise SlateError("'examples' must be a non-empty list of {document, query}", where,
                         field="examples")
    pairs = []
    for i, ex in enumerate(examples):
        if not isinstance(ex, dict):
            raise SlateError(f"examples[{i}] must be an object {{document, query}}", where,
                             field=f"examples[{i}]")
        pairs.append((text(ex, "document", f"examples[{i}].document"),
                      text(ex, "query", f"examples[{i}].query")))
    return QueryPrompt(
        name=text(data, "name", "name"),
        examples=tuple(pairs),
        instruction=text(data, "instruction", "instruction"),
        document_label=text(data, "document_label", "document_label", "Document"),
        query_label=text(data, "query_label", "query_label", "Relevant Query"),
    )


def load_prompt(path: str | os.PathLike[str] | None = None) -> QueryPrompt:
    """A user's prompt file, or (None) the bundled InPars prompt: three MS MARCO passages with
    their queries (``spdrank/data/queries/inpars.json``, its source recorded in it)."""
    if path is None:
        from importlib.resources import files

        raw = (files("spdrank") / "data" / "queries" / "inpars.json").read_bytes()
        return prompt_from_json(parse_json_line(raw, "spdrank/data/queries/inpars.json"),
                                "spdrank/data/queries/inpars.json")
    return prompt_from_json(read_json(Path(path)), str(path))


# -- writers --------------------------------------------------------------------------------


@dataclass
class PromptJob:
    """One passage to write a query for."""

    docid: str
    #: The rendered few-shot prompt (:meth:`QueryPrompt.render`).
    prompt: str
    #: The prompt's instruction, for a writer that sends it as a system message.
    instruction: str
    #: The digest of the passage text the prompt shows (:func:`passage_digest`), journalled
    #: with the query so that a rerun can tell the passage or its cut changed.
    passage: str = ""


@dataclass
class Written:
    """A writer's answer for one passage, or why there is none."""

    docid: str
    text: str = ""
    #: Generation stopped at the token cap (a query with no line end was cut short).
    hit_max_tokens: bool = False
    #: Why no answer came back; such a passage is not journalled, so a rerun retries it.
    error: str | None = None


class QueryWriter(Protocol):
    """Anything that writes a query from a prompt: answers come back in any order."""

    #: Names the model (``hf:bundled``, ``openai:NAME``): recorded with every query.
    name: str
    #: What else the queries depend on (token cap, temperature, seed), recorded alike.
    settings: dict[str, Any]

    def write(self, jobs: Iterable[PromptJob]) -> Iterator[Written]: ...

    def close(self) -> None: ...


# -- options and results --------------------------------------------------------------------


@dataclass(frozen=True)
class QueryOptions:
    """What a run is asked to do; each field is the command's flag of the same name."""

    passages: int = 1000
    seed: int = 0
    keep_top: int = 20
    depth: int = 100
    max_query_words: int = 32
    max_passage_words: int = 256
    #: Stop writing after this many failed passages (0: never).
    max_failures: int = 10

    def check(self) -> None:
        """Refuse what cannot run, naming the flag, before any input is read."""
        for name in ("passages", "keep_top", "depth", "max_query_words", "max_passage_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.keep_top > self.depth:
            raise ValueError(f"--keep-top ({self.keep_top}) must not exceed --depth "
                             f"({self.depth}): a kept query's slate holds its source passage")
        if self.max_failures < 0:
            raise ValueError("--max-failures must be >= 0")


@dataclass
class SyntheticBuild:
    """What a run did, for the command's summary."""

    corpus: int = 0
    sampled: int = 0
    #: Passages whose query came from the journal of an earlier run.
    reused: int = 0
    #: Queries written by this run.
    written: int = 0
    #: Passages whose writer failed (retried on the next run), with the first few reasons.
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    #: Wall seconds this run spent writing queries.
    write_s: float = 0.0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    #: Slates written (0 while some sampled passage still has no query).
    slates: int = 0
    candidates: int = 0
    #: ``(docid, query)`` of the first kept queries, to show.
    examples: list[tuple[str, str]] = field(default_factory=list)

    @property
    def missing(self) -> int:
        """Sampled passages still without a query."""
        return self.sampled - self.reused - self.written


# -- the corpus -----------------------------------------------------------------------------


def passage_texts(corpus: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """Each passage's text as a slate shows it (a title, then its body), blank ones left out:
    a passage that shows nothing can prompt no query."""
    texts = {}
    for docid, doc in corpus.items():
        text = Candidate(docid=docid, doc=doc).text()
        if not is_blank(text):
            texts[docid] = text
    return texts


def sample_passages(docids: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` docids (all when fewer), a seeded shuffle's first: the sample of a larger ``n``
    starts with this one."""
    order = list(docids)
    random.Random(seed).shuffle(order)
    return order[:n]


def cut_words(text: str, words: int) -> str:
    """``text``'s first ``words`` words (whitespace-separated), for a prompt of bounded size."""
    parts = text.split()
    return text.strip() if len(parts) <= words else " ".join(parts[:words])


def passage_digest(shown: str) -> str:
    """A short hash of the passage text a prompt shows (cut): the journal keys a query by its
    docid, and the same docid with other text, or cut elsewhere, prompts another query."""
    return hashlib.sha256(shown.encode()).hexdigest()[:12]


class CorpusBM25:
    """BM25 over a whole corpus, as :mod:`spdrank.rankers.bm25` scores a slate (Anserini's MS
    MARCO settings, English stopwords, no stemmer), with ties broken by corpus order."""

    def __init__(self, docids: Sequence[str], texts: Sequence[str]) -> None:
        import bm25s

        self.docids = list(docids)
        self.position = {d: i for i, d in enumerate(self.docids)}
        self.index = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.index.index(tokenize(list(texts)), show_progress=False)
        self.vocabulary = set(self.index.vocab_dict)

    def scores(self, query: str) -> Any:
        """The query's BM25 score of every passage (a numpy array in corpus order)."""
        import numpy as np

        terms = [t for t in tokenize([query])[0] if t in self.vocabulary]
        if not terms:
            return np.zeros(len(self.docids), dtype=np.float32)
        return self.index.get_scores(terms)

    def rank_of(self, scores: Any, docid: str) -> int | None:
        """``docid``'s 0-based rank under ``scores``, None when it scores 0 (not retrieved)."""
        i = self.position[docid]
        s = scores[i]
        if s <= 0:
            return None
        return int((scores > s).sum() + (scores[:i] == s).sum())

    def top(self, scores: Any, k: int) -> list[tuple[str, float]]:
        """The first ``k`` passages scoring above 0, best first, ties in corpus order."""
        import numpy as np

        pos = np.flatnonzero(scores > 0)
        if len(pos) > k:
            kth = np.partition(scores[pos], len(pos) - k)[len(pos) - k]  # the k-th largest
            above = pos[scores[pos] > kth]
            ties = pos[scores[pos] == kth][: k - len(above)]
            pos = np.concatenate([above, ties])
        order = pos[np.lexsort((pos, -scores[pos]))]
        return [(self.docids[i], float(scores[i])) for i in order]


# -- screening ------------------------------------------------------------------------------


_PREFIX = re.compile(r"^(?:(?:relevant\s+)?query|question)\s*[:\-]\s*", re.IGNORECASE)
_QUOTES = "\"'“”‘’`"


def clean_query(raw: str) -> str:
    """The query in a writer's answer: its first non-blank line, without a ``Query:`` label,
    surrounding quotes, control, format and unpaired surrogate characters, its spaces
    collapsed. A format character (a right-to-left override, a zero-width space) shows
    nothing a search query needs, and printed raw it reorders or hides the text around it
    on the terminal that shows the query."""
    text = "".join(c for c in raw
                   if c.isspace() or unicodedata.category(c) not in ("Cs", "Cc", "Cf"))
    line = next((ln for ln in text.split("\n") if not is_blank(ln)), "")
    line = _PREFIX.sub("", line.strip())
    line = line.strip().strip(_QUOTES).strip()
    return " ".join(line.split())


def query_key(query: str) -> str:
    """What two queries share when one repeats the other: their words, lowercased."""
    return " ".join(re.findall(r"\w+", query.lower()))


def was_cut(raw: str, hit_max_tokens: bool) -> bool:
    """Whether the answer stopped at the token cap before its first line ended."""
    return hit_max_tokens and "\n" not in raw.lstrip()


@dataclass
class Screened:
    kept: list[tuple[str, str, list[tuple[str, float]]]]  # (docid, query, BM25 top depth)
    dropped: Counter[str]


def screen(
    answers: Sequence[tuple[str, str, bool]], bm25: CorpusBM25, options: QueryOptions
) -> Screened:
    """The answers ``(docid, raw, hit_max_tokens)``, in sample order, screened: each kept one
    with its query and its BM25 top ``depth``; each dropped one counted by its reason
    (:data:`DROP_REASONS`: the first that applies). A repeat is dropped after its first
    occurrence, whatever became of that one."""
    kept: list[tuple[str, str, list[tuple[str, float]]]] = []
    dropped: Counter[str] = Counter()
    seen: set[str] = set()
    for docid, raw, hit_max_tokens in answers:
        query = clean_query(raw)
        key = query_key(query)
        if not key:
            dropped["empty"] += 1
            continue
        if was_cut(raw, hit_max_tokens) or len(query.split()) > options.max_query_words:
            dropped["too_long"] += 1
            continue
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        scores = bm25.scores(query)
        rank = bm25.rank_of(scores, docid)
        if rank is None or rank >= options.keep_top:
            dropped["not_retrieved"] += 1
            continue
        kept.append((docid, query, bm25.top(scores, options.depth)))
    return Screened(kept, dropped)


# -- the run --------------------------------------------------------------------------------


def journal_path(out: str | os.PathLike[str]) -> Path:
    """Where the written queries are journalled: beside ``out``, ``NAME.queries.jsonl``."""
    out = Path(out)
    name = out.name.removesuffix(".gz").removesuffix(".jsonl")
    return out.with_name(f"{name}.queries.jsonl")


def _check_record(record: dict[str, Any]) -> None:
    for name, kind in (("raw", str), ("writer", str), ("prompt", str), ("settings", dict)):
        if not isinstance(record.get(name), kind):
            raise SlateError(f"a query record needs {name!r} ({kind.__name__})")
    if not isinstance(record.get("hit_max_tokens"), bool):
        raise SlateError("a query record needs 'hit_max_tokens' (true or false)")
    if not isinstance(record.get("passage", ""), str):
        raise SlateError("a query record's 'passage' is the digest of its passage (str)")


def _check_made_alike(journal: Journal, writer: QueryWriter, prompt: QueryPrompt) -> None:
    """Refuse a journal written by another model, prompt or settings: its queries would be
    mixed with this run's as if one run had made them."""
    ours = {"writer": writer.name, "prompt": prompt.digest(), "settings": writer.settings}
    for entry in journal.entries.values():
        theirs = {k: entry.record[k] for k in ours}
        if theirs != ours:
            differ = ", ".join(f"{k} {theirs[k]!r} (now {ours[k]!r})" for k in ours
                               if theirs[k] != ours[k])
            raise SlateError(
                f"this query was written with {differ}: pass another --out, or remove "
                f"{journal.path} to start over", entry.where)


def _check_passages(journal: Journal, shown: Mapping[str, str], corpus: str, words: int) -> None:
    """Refuse a query written from other text than its passage's prompt shows now (``shown``,
    docid -> text as cut): another corpus' passage under the same docid, or another
    ``--max-passage-words``. A record without the digest cannot be checked: said in one
    line, and reused as it is."""
    unchecked = 0
    for docid, entry in journal.entries.items():
        recorded = entry.record.get("passage")
        if recorded is None:
            unchecked += 1
        elif recorded != passage_digest(shown[docid]):
            raise SlateError(
                f"this query was written from other text than docid {docid!r} shows now: its "
                f"text in {corpus}, cut to its first {words} words (--max-passage-words), "
                f"is not what the writer was given; pass another --out, or remove "
                f"{journal.path} to start over", entry.where)
    if unchecked:
        log.warning("%d queries in %s record no digest of the passage text they were written "
                    "from, so a changed corpus or --max-passage-words cannot be told: they are "
                    "reused as they are (remove the file to write them anew)", unchecked,
                    journal.path)


def write_queries(
    jobs: Sequence[PromptJob],
    writer: QueryWriter,
    journal: Journal,
    prompt: QueryPrompt,
    build: SyntheticBuild,
    max_failures: int,
    progress: bool | None = None,
) -> None:
    """Write a query for each job, journalling each answer as it arrives; failures counted in
    ``build`` (and not journalled), the writing stopped after ``max_failures`` of them."""
    bar = Progress("queries", unit="passage", total=build.sampled, initial=build.reused,
                   mode=progress)
    passages = {job.docid: job.passage for job in jobs}
    t0 = time.perf_counter()
    try:
        for answer in writer.write(jobs):
            if answer.error is not None:
                build.failed += 1
                if len(build.errors) < 5:
                    build.errors.append(f"{answer.docid}: {answer.error}")
                if max_failures and build.failed >= max_failures:
                    break
            else:
                raw = "".join(c for c in answer.text if unicodedata.category(c) != "Cs")
                journal.append({
                    "docid": answer.docid, "raw": raw, "hit_max_tokens": answer.hit_max_tokens,
                    "writer": writer.name, "prompt": prompt.digest(),
                    "passage": passages[answer.docid], "settings": writer.settings,
                })
                build.written += 1
            bar.update(1, failed=build.failed)
    finally:
        build.write_s = time.perf_counter() - t0
        bar.close()


def build_synthetic(
    corpus_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    writer: QueryWriter,
    options: QueryOptions,
    prompt: QueryPrompt | None = None,
    progress: bool | None = None,
) -> SyntheticBuild:
    """The whole run: sample, write (resuming the journal), screen, and, once every sampled
    passage has its query, write the slates to ``out`` atomically. ``prompt``: the bundled
    InPars prompt unless given."""
    options.check()
    prompt = prompt or load_prompt()
    corpus = (retrieved_passages(corpus_path) if is_retrieve_results(corpus_path)
              else read_corpus(corpus_path))
    texts = passage_texts(corpus)
    if not texts:
        raise SlateError(f"{corpus_path} holds no passage with text: nothing to write queries "
                         "for")
    build = SyntheticBuild(corpus=len(corpus))
    sample = sample_passages(list(texts), options.passages, options.seed)
    build.sampled = len(sample)
    with Journal(journal_path(out), "docid", _check_record) as journal:
        _check_made_alike(journal, writer, prompt)
        strangers = [e for d, e in journal.entries.items() if d not in texts]
        if strangers:
            raise SlateError(f"docid {strangers[0].record['docid']!r} is not a passage of "
                             f"{corpus_path}: the journal is another corpus'", strangers[0].where)
        shown = {d: cut_words(texts[d], options.max_passage_words)
                 for d in (*journal.entries, *sample)}
        _check_passages(journal, shown, str(corpus_path), options.max_passage_words)
        todo = [d for d in sample if d not in journal.entries]
        build.reused = build.sampled - len(todo)
        jobs = [PromptJob(d, prompt.render(shown[d]), prompt.instruction,
                          passage_digest(shown[d])) for d in todo]
        if jobs:
            write_queries(jobs, writer, journal, prompt, build, options.max_failures, progress)
        records = {d: e.record for d, e in journal.entries.items()}
    if build.missing:
        return build
    bm25 = CorpusBM25(list(texts), list(texts.values()))
    answers = [(d, records[d]["raw"], records[d]["hit_max_tokens"]) for d in sample]
    screened = screen(answers, bm25, options)
    build.kept, build.dropped = len(screened.kept), screened.dropped
    build.examples = [(d, q) for d, q, _ in screened.kept[:5]]
    where = str(journal_path(out))
    slates = (
        synthetic_slate(docid, query, hits, corpus, f"{where}: docid {docid}")
        for docid, query, hits in screened.kept
    )
    build.slates = write_slates(out, slates)
    build.candidates = sum(len(hits) for _, _, hits in screened.kept)
    return build


def synthetic_slate(
    docid: str,
    query: str,
    hits: Sequence[tuple[str, float]],
    corpus: Mapping[str, dict[str, Any]],
    where: str,
) -> Slate:
    """A kept query's slate: BM25's ``hits`` as candidates, its source passage the one judged
    relevant (grade 1)."""
    rows = [(d, corpus[d], score) for d, score in hits]
    return search_slate(f"{QID_PREFIX}{docid}", query, rows, {docid: 1}, where)
