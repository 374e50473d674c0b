"""The labelling run: select slates, skip the labelled ones, label the rest, write it all down.

Resumable by construction: the label file (:mod:`spdrank.teacher.labels`) is the only state.
A rerun with the same arguments selects the same slates, skips every qid that already has a
record and labels the others, so a killed run loses at most the slates in flight. Slates
whose request failed are not recorded (a rerun retries them); after ``max_failures`` of them
the run stops, since a dead server would otherwise burn every slate's retries. Labels of
another backend, mode or prompt template than the run's are said; a run with nothing left to
label whose selected slates hold none of its own is refused, since it would hand back another
teacher's labels as its labelled slates.

Selection: ``--shard i/n`` keeps the slates whose 0-based index in the file (counting slates,
not lines) is ``i`` modulo ``n``, so n machines can label disjoint parts of one file with no
coordination (``spdrank teacher merge`` joins them); ``--limit N`` then keeps the first N of
those. Both are fixed by the file, so they select the same slates on every rerun.

When every selected slate has a label, the selected slates are also written with ``teacher``
filled (atomically), ready for training, ``teacher_scores`` where the label has scores and
``teacher_prompt`` where it was made under another prompt template than the default.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spdrank.backbone.templates import DEFAULT_TEMPLATE, PromptTemplate
from spdrank.core.slates import Slate, read_unique_slates, write_slates
from spdrank.teacher.backends import Backend, Job
from spdrank.teacher.labels import Label, LabelError, LabelStore, apply_label, make_record
from spdrank.teacher.parse import OK, STATUSES
from spdrank.teacher.prompt import CutTally, TeacherPromptSettings, build_messages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shard:
    """Slates whose index ``% count == index``."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            i, n = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
        if n < 1 or not 0 <= i < n:
            raise ValueError(f"--shard i/n needs 0 <= i < n, got {text!r}")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def default_slates_out(out: str | Path) -> Path:
    """``labels.jsonl`` -> ``labels.slates.jsonl`` beside it."""
    out = Path(out)
    return out.with_name(f"{out.stem}.slates.jsonl")


def select(path: Path, shard: Shard | None = None, limit: int | None = None) -> Iterator[Slate]:
    """The slates a run covers, in file order (see the module docstring)."""
    taken = 0
    if limit is not None and limit <= 0:
        return
    for index, slate in enumerate(read_unique_slates(path)):
        if shard is not None and index % shard.count != shard.index:
            continue
        yield slate
        taken += 1
        if limit is not None and taken >= limit:
            return


@dataclass
class RunOptions:
    slates: Path
    out: Path
    slates_out: Path | None = None
    prompt: TeacherPromptSettings = field(default_factory=TeacherPromptSettings)
    limit: int | None = None
    shard: Shard | None = None
    #: Stop after this many failed slates (0: never stop).
    max_failures: int = 10
    #: None: a progress bar on a terminal, log lines elsewhere (:mod:`spdrank.core.progress`).
    progress: bool | None = None


@dataclass
class RunSummary:
    selected: int = 0
    already_labelled: int = 0
    labelled_now: int = 0
    failed: int = 0
    aborted: bool = False
    #: Status counts over every selected slate's record (earlier runs' included).
    statuses: dict[str, int] = field(default_factory=dict)
    unlabelled: int = 0
    mean_decode_passes: float | None = None
    mean_latency_ms: float | None = None
    wall_s: float = 0.0
    backend: str | None = None
    mode: str = "direct"
    #: The prompt template's name (:mod:`spdrank.backbone.templates`).
    prompt: str = "recommendation"
    shard: str | None = None
    limit: int | None = None
    labels: str = ""
    slates_out: str | None = None
    #: Slates labelled now by each server (backends that spread slates over servers).
    servers: dict[str, int] = field(default_factory=dict)
    #: The first 20 failures, ``qid: why``.
    errors: list[str] = field(default_factory=list)
    #: Candidates the teacher read in this run, and how many it read cut to the token budget
    #: (None: a backend that reads no text, ``ranker:`` and ``file:``).
    candidates_read: int | None = None
    candidates_cut: int | None = None
    max_item_tokens: int | None = None
    #: A fusion chosen on validation slates (``ranker:fusion:best:...``): what it chose, its
    #: validation score and every candidate's.
    chosen: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_teacher(
    options: RunOptions,
    make_backend: Callable[[], Backend],
    backend_name: Callable[[], str | None] | None = None,
) -> RunSummary:
    """Label the selected slates not yet in ``options.out``; ``make_backend`` only if needed.

    ``backend_name``: the ``backend`` its labels would record, known without building it (None
    where only the built backend knows), which a run with nothing left to label checks the
    file's labels against (:func:`_check_reused`), as a run that labels does with the built
    backend's (:func:`_warn_mixed`).
    """
    t0 = time.perf_counter()
    mode = options.prompt.mode
    template = options.prompt.template
    summary = RunSummary(
        mode=mode,
        prompt=template.name,
        shard=str(options.shard) if options.shard else None,
        limit=options.limit,
        labels=str(options.out),
    )
    # Read (and validate) the input before the label file is opened: a run that refuses its
    # input leaves no empty labels.jsonl behind.
    selected = [s.query.qid for s in select(options.slates, options.shard, options.limit)]
    with LabelStore(options.out) as store:
        summary.selected = len(selected)
        todo = [qid for qid in selected if qid not in store.labels]
        summary.already_labelled = len(selected) - len(todo)
        if todo:
            backend = make_backend()
            summary.backend = backend.name
            summary.chosen = getattr(backend, "choice", None)
            _warn_mixed(store, backend.name, mode, template)
            _label(options, backend, store, len(todo), summary)
        elif backend_name is not None and (name := backend_name()) is not None:
            _check_reused(store, selected, name, mode, template)
        _summarise(store, selected, summary)
        if summary.unlabelled == 0 and summary.selected:
            slates_out = options.slates_out or default_slates_out(options.out)
            write_slates(slates_out, _labelled(options, store))
            summary.slates_out = str(slates_out)
    summary.wall_s = time.perf_counter() - t0
    return summary


def _label(
    options: RunOptions, backend: Backend, store: LabelStore, total: int, summary: RunSummary
) -> None:
    from spdrank.core.progress import Progress

    tally = getattr(backend, "tally", None) or (CutTally() if backend.needs_prompt else None)

    def jobs() -> Iterator[Job]:
        for slate in select(options.slates, options.shard, options.limit):
            if slate.query.qid in store.labels:
                continue
            messages = (
                build_messages(slate, options.prompt, backend.tokenizer, tally)
                if backend.needs_prompt
                else None
            )
            yield Job(slate, messages)

    bar = Progress("teacher", unit="slate", total=total, mode=options.progress)
    ok = 0
    outcomes = backend.generate(jobs())
    try:
        for outcome in outcomes:
            qid = outcome.job.slate.query.qid
            if outcome.generation is None:
                summary.failed += 1
                message = f"{qid}: {outcome.error}"
                log.warning("teacher failed on qid %s", message)
                if len(summary.errors) < 20:
                    summary.errors.append(message)
                if options.max_failures and summary.failed >= options.max_failures:
                    summary.aborted = True
                    log.error("%d slates failed: stopping (see --max-failures)", summary.failed)
                    break
            else:
                record = make_record(
                    outcome.job.slate, outcome.generation, backend.name, summary.mode,
                    options.prompt.template,
                )
                store.append(record)
                summary.labelled_now += 1
                if outcome.generation.server is not None:
                    server = outcome.generation.server
                    summary.servers[server] = summary.servers.get(server, 0) + 1
                ok += record["status"] == OK
            bar.update(1, ok=f"{ok / max(1, summary.labelled_now):.0%}", failed=summary.failed)
    finally:
        close = getattr(outcomes, "close", None)
        if close is not None:
            close()
        backend.close()
        bar.close()
        if tally is not None:
            summary.candidates_read, summary.candidates_cut = tally.candidates, tally.cut
            summary.max_item_tokens = options.prompt.max_item_tokens


def made_by(label: Label) -> tuple[Any, Any, PromptTemplate]:
    """What made a label: its backend, mode and prompt template."""
    return label.record.get("backend"), label.record.get("mode"), label.template


def describe_teacher(teacher: tuple[Any, Any, PromptTemplate]) -> str:
    """A teacher as the labelling run names one: ``BACKEND (MODE mode, NAME prompt)``."""
    backend, mode, template = teacher
    return f"{backend} ({mode} mode, {template.name} prompt)"


def _warn_mixed(store: LabelStore, backend: str, mode: str, template: PromptTemplate) -> None:
    """Warn when the file holds labels of another backend, mode or prompt template."""
    run = (backend, mode, template)
    others = Counter(key for label in store.labels.values() if (key := made_by(label)) != run)
    for (other, other_mode, other_template), count in others.items():
        log.warning(
            "%s already holds %d labels from %s (%s mode, %s prompt); this run asks for %s "
            "(%s mode, %s prompt)",
            store.path, count, other, other_mode, other_template.name, backend, mode,
            template.name,
        )


def _check_reused(
    store: LabelStore, selected: list[str], backend: str, mode: str, template: PromptTemplate
) -> None:
    """With every selected slate labelled, the run hands back the file's labels as they are:
    refused when not one of them is the asked backend's (mode, template), since the labelled
    slates would be another teacher's under this run's name; warned, as a run that labels is
    (:func:`_warn_mixed`), when some are: such a run left the file mixed, and its rerun must
    still end as it did.
    """
    run = (backend, mode, template)
    labels = [store.labels[qid] for qid in selected]
    if not labels or any(made_by(label) == run for label in labels):
        _warn_mixed(store, backend, mode, template)
        return
    others = Counter(made_by(label) for label in labels)
    made = "; ".join(f"{count} by {describe_teacher(other)}" for other, count in others.items())
    raise LabelError(
        f"all {len(labels)} selected slates are labelled already, {made}, none by "
        f"{describe_teacher(run)}, which this run asks for; their labelled "
        "slates would carry another teacher's rankings, so nothing is written: label into "
        "another --out, or name the backend that made them",
        labels[0].where,
    )


def _summarise(store: LabelStore, selected: list[str], summary: RunSummary) -> None:
    counts = dict.fromkeys(STATUSES, 0)
    passes: list[float] = []
    latency: list[float] = []
    for qid in selected:
        label = store.labels.get(qid)
        if label is None:
            summary.unlabelled += 1
            continue
        rec = label.record
        counts[rec.get("status", "?")] = counts.get(rec.get("status", "?"), 0) + 1
        if rec.get("decode_passes") is not None:
            passes.append(rec["decode_passes"])
        if rec.get("latency_ms") is not None:
            latency.append(rec["latency_ms"])
    summary.statuses = counts
    summary.mean_decode_passes = sum(passes) / len(passes) if passes else None
    summary.mean_latency_ms = sum(latency) / len(latency) if latency else None


def _labelled(options: RunOptions, store: LabelStore) -> Iterator[Slate]:
    for slate in select(options.slates, options.shard, options.limit):
        yield apply_label(store.labels[slate.query.qid], slate)


def format_summary(summary: RunSummary) -> str:
    """The run summary as a table a person can read."""
    head = f"teacher {summary.backend or '(no new labels needed)'}, {summary.mode} mode"
    if summary.prompt != DEFAULT_TEMPLATE.name:
        head += f", {summary.prompt} prompt"
    if summary.shard:
        head += f", shard {summary.shard}"
    if summary.limit is not None:
        head += f", limit {summary.limit}"
    chosen = summary.chosen
    if chosen is not None:
        head += (f" (chosen as {chosen['from']} on {chosen['on']}: {chosen['metric']} "
                 f"{chosen['score']:.4f} over {chosen['slates']} slates)")
    lines = [
        head,
        f"slates selected {summary.selected}: {summary.already_labelled} already labelled, "
        f"{summary.labelled_now} labelled now, {summary.failed} failed"
        + (" (stopped early)" if summary.aborted else ""),
        "",
        f"{'status':<14}{'count':>8}{'share':>9}",
    ]
    total = sum(summary.statuses.values())
    for status, count in summary.statuses.items():
        share = f"{count / total:.1%}" if total else "-"
        lines.append(f"{status:<14}{count:>8}{share:>9}")
    if summary.candidates_read:
        budget = (f"at {summary.max_item_tokens} tokens" if summary.max_item_tokens
                  else "at the budget that fits each slate's N in the context")
        lines.append(f"\ncut to the token budget: {summary.candidates_cut} of "
                     f"{summary.candidates_read} candidates read ({budget}; --max-item-tokens)")
    if summary.mean_decode_passes is not None:
        lines.append(f"\nmean decode passes / slate: {summary.mean_decode_passes:.1f}")
    if summary.mean_latency_ms is not None:
        lines.append(f"mean latency ms / slate:    {summary.mean_latency_ms:.1f}")
    if summary.servers:
        width = max(len(url) for url in summary.servers)
        lines.append(f"\n{'server':<{width}}{'labelled now':>14}")
        lines.extend(f"{url:<{width}}{count:>14}" for url, count in sorted(summary.servers.items()))
    if summary.errors:
        lines.append(f"\nfirst failure: {summary.errors[0]}")
    lines.append(f"\nlabels: {summary.labels}")
    if summary.slates_out:
        lines.append(f"labelled slates: {summary.slates_out}")
    elif summary.unlabelled and (summary.backend or "").startswith("file:"):
        # A file's rankings are what they are: the same command would fail the same slates.
        source = summary.backend.removeprefix("file:")
        lines.append(
            f"{summary.unlabelled} selected slates have no label: {source} has no ranking for "
            "them (the first failure names one); add their rankings to it and rerun, or "
            "select slates it ranks (labelled slates are written once all are labelled)"
        )
    elif summary.unlabelled:
        lines.append(
            f"{summary.unlabelled} selected slates have no label yet: rerun the same command to "
            "retry them (labelled slates are written once all are labelled)"
        )
    return "\n".join(lines)
