"""What a teacher backend is, and the two that need no LLM: ``ranker:NAME`` and ``file:PATH``.

A backend turns a stream of jobs (a slate and, for LLM backends, its chat messages) into a
stream of outcomes, in whatever order they finish: the run loop writes each one to the label
file as soon as it arrives, so a batched or concurrent backend loses at most the slates in
flight when killed. A failed job (a request that kept failing) is an outcome with ``error``
set and is NOT recorded, so a rerun retries it.

``ranker:NAME`` makes any built-in baseline the teacher (a cheap, deterministic stand-in for
an LLM, and a way to test the whole pipeline); a ranker that orders by its scores alone
(``ranks_by_scores``: popularity, ``title_similarity``, ``feature:NAME``) also hands over its
scores, so the candidates it scored equally are recorded as ties rather than as an order.
A fusion chosen on validation slates (``ranker:fusion:best:...``) labels as the plain fusion
spec it chose, and each record carries the choice (``chosen``: the spec asked for, the one
chosen, the metric, its validation score, the slates and their file).
``file:PATH`` takes permutations computed elsewhere: ``{qid, ranking: [docids]}`` lines (a
label file works), slates with ``teacher`` filled, ranked results whose ``candidates`` (or
``hits``) are in ranked order (``spdrank rank``'s output, rank_llm's and RankGPT's, as JSONL
or one JSON list), or a TREC run. Which ranking a record means is in
:func:`_qid_and_ranking`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spdrank.core.files import iter_json_lines, iter_lines
from spdrank.core.outputs import RANKED_MARK
from spdrank.core.ranking import Ranker
from spdrank.core.slates import Slate, SlateError
from spdrank.core.validation import as_id
from spdrank.teacher.parse import render_ids

if TYPE_CHECKING:
    from spdrank.rankers.run_ranker import RunRanker

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One slate to label; ``messages`` is set for backends that read a prompt."""

    slate: Slate
    messages: list[dict[str, str]] | None = None


@dataclass
class Generation:
    """A backend's answer for one slate."""

    #: The raw answer (for non-text teachers, the ranking rendered as ``[i] > [j] > ...``).
    text: str
    #: Sequential decode passes (generated tokens); 0 for non-LLM teachers, None if unknown.
    decode_passes: int | None
    #: Wall time of the call that produced it (a whole batch for batched backends).
    latency_ms: float
    #: Ids already known (1-based, 0 = not a candidate): skips text parsing; non-text teachers.
    ids: list[int] | None = None
    #: The teacher's score of each of ``ids`` (non-increasing), from a teacher that ranks by a
    #: score alone: equal scores are ties. None for teachers without such scores (LLMs).
    scores: list[float] | None = None
    #: Generation stopped at the token cap (the ranking is probably cut short).
    hit_max_tokens: bool = False
    #: The server that answered, for backends that spread slates over several.
    server: str | None = None
    #: The answering model's name when it varies by server; else the backend's name is used.
    backend: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    job: Job
    generation: Generation | None = None
    #: Why no answer came back (after retries); such slates are retried on the next run.
    error: str | None = None


class Backend(Protocol):
    """Anything that labels slates; ``name`` goes into every record (``hf:MODEL`` ...)."""

    name: str
    #: Whether jobs need chat messages (LLM backends) or only the slate.
    needs_prompt: bool
    #: The tokenizer that measures the prompt's token budgets, when one is known.
    tokenizer: Any | None

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        """Label the jobs; yield one outcome per job, in completion order."""
        ...

    def close(self) -> None:
        """Release what the backend holds (threads, connections, model memory)."""
        ...


def default_max_new_tokens(n: int, mode: str) -> int:
    """Token cap for a slate of ``n``: ``[12] > `` is ~5 tokens; reasoning gets 1,024 more."""
    return 6 * n + (1024 if mode == "reasoning" else 16)


def model_backend_name(
    kind: str, model: str, layers: int | None = None, constrained: bool = False
) -> str:
    """``KIND:MODEL[,layers=L][+constrained]``, the ``backend`` a local model teacher's labels
    record (``hf``, ``likelihood``): one rule, so the command names it without loading it."""
    return (f"{kind}:{model}" + (f",layers={layers}" if layers else "")
            + ("+constrained" if constrained else ""))


def server_backend_name(models: Iterable[str], guided: str | None = None) -> str:
    """``openai:MODEL[,MODEL...][+guided-KIND]``, the ``backend`` a server teacher's labels
    record: one rule, so the command names it without asking a server."""
    return "openai:" + ",".join(models) + (f"+guided-{guided}" if guided else "")


class RankerBackend:
    """Any :class:`~spdrank.core.ranking.Ranker` (fitted already) as the teacher; 0 decode passes.

    The ranking's scores go along only when the ranker says its scores alone decide its order
    (``ranks_by_scores``): the co-occurrence ranker breaks its score ties by popularity, so
    its equal scores are not ties, and recording them as such would discard that order.
    """

    needs_prompt = False
    tokenizer = None

    def __init__(self, ranker: Ranker, delay_s: float = 0.0,
                 leave_out: Callable[[Slate], Sequence[str] | None] | None = None) -> None:
        self.ranker = ranker
        #: Each slate's own fitted sequence, which a count-based ranker fitted on the slates'
        #: users leaves out of its counts (``rank(slate, leave_out=...)``); None: fitted on
        #: none of them.
        self.leave_out = leave_out
        # A fusion chosen on validation slates (fusion:best:...) labels as the plain spec it
        # chose, which is its name here; each record says what it was chosen from, and how.
        choice = getattr(ranker, "choice", None)
        self.name = f"ranker:{choice.spec if choice is not None else ranker.name}"
        #: The choice's record (``chosen`` in each label), or None for any other ranker.
        self.chosen: dict[str, Any] | None = choice.record() if choice is not None else None
        #: The choice with every candidate's score, for the run summary.
        self.choice: dict[str, Any] | None = choice.to_dict() if choice is not None else None
        #: Sleep before each slate; for tests that need a slow teacher (e.g. to kill mid-run).
        self.delay_s = delay_s

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        for job in jobs:
            if self.delay_s:
                time.sleep(self.delay_s)
            t0 = time.perf_counter()
            if self.leave_out is None:
                ranking = self.ranker.rank(job.slate)
            else:
                ranking = self.ranker.rank(job.slate,  # type: ignore[call-arg]
                                           leave_out=self.leave_out(job.slate))
            latency = (time.perf_counter() - t0) * 1000.0
            generation = _from_docids(job.slate, ranking.docids, latency, text=None)
            if getattr(self.ranker, "ranks_by_scores", False) and ranking.scores is not None:
                generation.scores = [float(x) for x in ranking.scores]
            if self.chosen is not None:
                generation.extra["chosen"] = self.chosen
            yield Outcome(job, generation)

    def close(self) -> None:
        """Say what of the slates labelled now the ranker did not rank (a fusion's ``run:PATH``
        component of another id space), in ``eval``'s words."""
        note = getattr(self.ranker, "coverage_note", None)
        line = note() if note is not None else None
        if line:
            log.warning(line)


class FileBackend:
    """Permutations computed elsewhere, read from a file keyed by qid.

    Each record is ``{"qid": ..., "ranking": [docids]}`` (so a label file works), a slate with
    ``teacher`` set or a ranked result; ``spdrank rank``'s output gives the model's ranking,
    not the ``teacher`` its slates carried (:func:`_qid_and_ranking`). A qid twice in the file
    is an error naming ``file:line``; a slate whose qid the file lacks fails (and is retried on
    rerun, e.g. after the file grows). Such a ranking claims to be the slate's: docids that are
    not its candidates are kept as out-of-range ids, so the status says so and the repair drops
    them.

    A TREC run is a ranker over a collection, not a permutation of one slate: it is ranked
    with :class:`spdrank.rankers.run_ranker.RunRanker`, by the one rule ``eval --run`` ranks
    it with (:func:`spdrank.rankers.run_ranker.run_ranking`), its scores recorded so the
    candidates it does not rank are a tie below the others, and the record says how many it
    ranked (``ranked``). So the label file, replayed by ``eval --labels``, scores and counts
    valid exactly as ``eval --run`` of the run does, and the slates it ranks little of are
    said in the same line as there (:func:`~spdrank.rankers.run_ranker.coverage_line`), when
    the backend closes.
    """

    needs_prompt = False
    tokenizer = None

    def __init__(self, path: str | Path, delay_s: float = 0.0) -> None:
        self.path = Path(path)
        self.name = f"file:{path}"
        self.delay_s = delay_s
        self.run: RunRanker | None = None
        self.rankings: dict[str, list[str]] = {}
        if is_trec_run(self.path):
            from spdrank.rankers.run_ranker import RunRanker

            self.run = RunRanker(self.path, name="teacher")
        else:
            self.rankings = read_rankings(self.path)

    def generate(self, jobs: Iterable[Job]) -> Iterator[Outcome]:
        for job in jobs:
            if self.delay_s:
                time.sleep(self.delay_s)
            qid = job.slate.query.qid
            if self.run is not None:
                if not self.run.ranks(qid):
                    yield Outcome(job, error=f"{self.path} has no ranking for qid {qid!r}")
                    continue
                ranking = self.run.rank(job.slate)
                generation = _from_docids(job.slate, ranking.docids, 0.0, text=None)
                generation.scores = [float(x) for x in ranking.scores or ()]
                generation.extra["ranked"] = self.run.ranked[qid][0]
                yield Outcome(job, generation)
                continue
            docids = self.rankings.get(qid)
            if docids is None:
                yield Outcome(job, error=f"{self.path} has no ranking for qid {qid!r}")
                continue
            text = json.dumps(docids, ensure_ascii=False)
            yield Outcome(job, _from_docids(job.slate, docids, 0.0, text=text))

    def close(self) -> None:
        """Say, in ``eval --run``'s words, what of the slates labelled now a run did not rank."""
        note = self.run.coverage_note() if self.run is not None else None
        if note:
            log.warning(note)


def _from_docids(slate: Slate, docids: list[str], latency_ms: float, text: str | None) -> Generation:
    position = {d: i for i, d in enumerate(slate.docids, start=1)}
    ids = [position.get(d, 0) for d in docids]
    return Generation(
        text=render_ids(ids) if text is None else text,
        decode_passes=0,
        latency_ms=latency_ms,
        ids=ids,
    )


def read_rankings(path: Path) -> dict[str, list[str]]:
    """qid -> docids, best first, from any of the files :class:`FileBackend` reads."""
    if is_trec_run(path):
        from spdrank.core.trec import read_run

        return {qid: [d for d, _ in ranked] for qid, ranked in read_run(path).items()}
    out: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for where, data in _records(path):
        qid, ranking = _qid_and_ranking(data, where)
        if qid in out:
            raise SlateError(
                f"duplicate qid {qid!r} (first at {first[qid]}): qids must be unique within the file",
                where,
            )
        out[qid] = ranking
        first[qid] = where
    return out


def is_trec_run(path: Path) -> bool:
    """Whether ``path`` is a TREC run: its first non-blank line is six fields, not JSON.

    The file is read again as what it is, so it must be a regular file, not a pipe.
    """
    for number, _, line in iter_lines(path, "rankings file", regular_only=True):
        text = line.decode("utf-8").strip()
        if text.startswith(("{", "[")):
            return False
        fields = len(text.split())
        if fields == 6:
            return True
        raise SlateError(f"{path}:{number}: neither JSON (a ranking record starts with '{{' "
                         f"or '[') nor a TREC run line (6 fields: qid Q0 docid rank score tag); "
                         f"it has {fields} field{'s' if fields != 1 else ''}")
    return False


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """The file's records with where each is: JSONL lines, or the items of one JSON list
    (rank_llm and RankGPT write their results as a list)."""
    lines = iter_json_lines(path, "rankings file")
    for where, data in lines:
        if isinstance(data, list):
            yield from ((f"{where} item {i}", item) for i, item in enumerate(data))
        else:
            yield where, data



def _qid_and_ranking(data: Any, where: str) -> tuple[str, list[str]]:
    """The qid and the ranking, best first, that one record means.

    In this order: ``ranking`` (a label record); a ranked result of ``spdrank rank``, known by
    its :data:`RANKED_MARK`, by its ``candidates``' order, since the ``teacher`` it carries is
    the input slate's label, carried along, not the model's ranking; a slate's ``teacher``
    (a labelled slate lists its candidates in their original order); any other ranked
    result's ``candidates``; RankGPT's ``hits``. Slates labelled after they were ranked keep
    the mark, so their ``teacher`` is not read here: their label file gives it.
    """
    if not isinstance(data, dict):
        raise SlateError("expected a JSON object", where)
    query = data.get("query")
    ranked = isinstance(query, dict) and isinstance(data.get("candidates"), list)
    if "ranking" in data:
        qid, ranking = data.get("qid"), data["ranking"]
    elif ranked and RANKED_MARK in data:
        qid, ranking = query.get("qid", ""), _ids(data["candidates"], "candidates", where)
    elif isinstance(query, dict) and data.get("teacher") is not None:
        qid, ranking = query.get("qid", ""), data["teacher"]
    elif ranked:
        qid, ranking = query.get("qid", ""), _ids(data["candidates"], "candidates", where)
    elif "query" in data and isinstance(data.get("hits"), list):
        hits = data["hits"]
        qid = hits[0].get("qid", "") if hits and isinstance(hits[0], dict) else ""
        ranking = _ids(hits, "hits", where)
    else:
        raise SlateError(
            "expected {qid, ranking: [docids]}, a slate with 'teacher', a ranked result "
            "(query + candidates or hits, best first) or a TREC run", where,
        )
    if not isinstance(ranking, list):
        raise SlateError("the ranking must be a list of docids", where)
    return (as_id(qid, "qid", where, empty_ok=True),
            [as_id(d, f"ranking[{i}]", where) for i, d in enumerate(ranking)])


def _ids(items: list[Any], name: str, where: str) -> list[Any]:
    """The docids of a ranked result's candidates (or hits), in their order."""
    if not all(isinstance(c, dict) and "docid" in c for c in items):
        raise SlateError(f"every item of {name!r} must be an object with a 'docid'", where)
    return [c["docid"] for c in items]
