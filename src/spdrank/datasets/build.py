"""Slates from any interaction log: one user a line, items in time order, plus item titles.

The setup is leave-one-out next-item prediction, as in the SPD paper: a user's last item is
the **target** and the items before it the **history** (:mod:`spdrank.datasets.split`),
rendered with their titles into ``query.text`` as ``"1. <title>\\n2. <title>..."`` and kept
as ids in ``query.history`` (:mod:`spdrank.datasets.titles`); the **candidates** are the
target among negatives or an upstream retriever's list (:mod:`spdrank.datasets.candidates`),
shuffled so the target's position carries no signal; ``clicked = [target]``. With
``features`` each candidate also carries the features :mod:`spdrank.datasets.features` fits;
with ``retriever`` ``sasrec`` the candidates are SASRec's top ``candidates`` items with its
scores, the target never inserted (a missed one is a miss in eval;
:mod:`spdrank.datasets.sasrec_features`).

This module puts those parts together and writes the files: it reads the inputs
(:func:`build_from_files`: :mod:`spdrank.datasets.log`, :mod:`spdrank.datasets.titles`,
:mod:`spdrank.datasets.candidates`), makes each user's slate, and describes the build in its
manifest.

Determinism: every user's slate comes from its own ``random.Random`` seeded with
``(seed, user id)`` (string seeds are hashed with SHA-512, not Python's randomized ``hash``),
the splits from their own seeded generators over the sorted user ids, and nothing iterates a
set; so the same inputs and parameters give byte-identical files, and a user's slate does not
depend on the other users, the line order, ``eval_fraction`` or ``validation`` (which file it
lands in does; its ``features``, counted over the other training users, do depend on them,
but not on the order).

Output (:func:`build_slates`): ``train.jsonl``, ``eval.jsonl``, ``valid.jsonl`` (only with
``validation``), ``extra_sequences.txt`` (only for users without a candidate list,
:mod:`spdrank.datasets.extra_sequences`) and ``manifest.json`` (counts, parameters, sha256 of
inputs and outputs; no timestamps). All are written to temporary files renamed only once
everything is written, so an error leaves a previous build in the output directory as it
was. A build without ``validation`` writes exactly what builds did before the option existed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from spdrank import __version__
from spdrank.core.files import atomic_writer, sha256_file
from spdrank.core.slates import NOT_RETRIEVED, Candidate, Query, Slate, dumps_slate
from spdrank.datasets.candidates import (
    CANDIDATE_SCORES_POLICY,
    RANK_SCORES_POLICY,
    SAMPLED_POLICY,
    CandidateLists,
    NegativeSampler,
    Retrieved,
    check_sampled,
    count_list,
    read_candidate_lists,
    slate_candidates,
    warn_inserted,
)
from spdrank.datasets.extra_sequences import (
    EXTRA_SEQUENCES_FILE,
    EXTRA_SEQUENCES_POLICY,
    write_extra_sequences,
)
from spdrank.datasets.features import FEATURES_POLICY, CandidateFeatures, fit_features
from spdrank.datasets.log import InteractionLog, read_sequences
from spdrank.datasets.options import BuildOptions
from spdrank.datasets.sasrec_features import (
    SASREC_POLICY,
    SASRecScores,
    retrieval_counts,
    retriever_lists,
)
from spdrank.datasets.split import (
    EVAL_FILE,
    TRAIN_FILE,
    VALID_FILE,
    VALIDATION_POLICY,
    assign_splits,
    history_and_target,
    warn_small_eval,
)
from spdrank.datasets.titles import Titles, read_titles, render_history
from spdrank.rankers.sasrec_config import SASREC, SASREC_FIT

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"


@dataclass
class BuildResult:
    """Where a build wrote its files, and its manifest (the command's summary reads it)."""

    out_dir: Path
    train_path: Path
    eval_path: Path
    manifest_path: Path
    manifest: dict[str, Any]
    #: ``valid.jsonl``, when the build made a validation split.
    valid_path: Path | None = None
    #: ``extra_sequences.txt``, when users without a candidate list were counted.
    extra_path: Path | None = None

    @property
    def counts(self) -> dict[str, int]:
        return self.manifest["counts"]


def build_slates(
    log: InteractionLog,
    titles: Mapping[str, str],
    out_dir: str | os.PathLike[str],
    options: BuildOptions | None = None,
    candidate_lists: CandidateLists | None = None,
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
    command: str = "sequences",
    progress: bool | None = None,
) -> BuildResult:
    """Write ``train.jsonl``, ``eval.jsonl`` (``valid.jsonl``) and ``manifest.json`` into ``out_dir``.

    ``titles`` maps item ids to cleaned titles (``""`` for an item known to have none);
    ``inputs`` describes the input files for the manifest (``{"name": {"sha256": ...}}``);
    ``progress``: a tqdm bar on stderr always (True), never (False), or on a terminal and
    log lines elsewhere (None, :func:`spdrank.core.progress.track`).
    On any error nothing in ``out_dir`` changes: bad input raises :class:`SlateError` /
    :class:`ValueError` before writing, and files are renamed into place only at the end.
    With candidate lists, users without one make no slate but are counted like training
    users (``extra_sequences.txt``).
    """
    options = options or BuildOptions()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    retriever, candidate_lists, options = _retrieved_lists(log, candidate_lists, options)
    check_sampled(candidate_lists, options)
    title_of = Titles(titles)
    counts = _log_counts(log)

    # Which users make a slate, and the items they show: all checked before writing anything.
    users, extra, retrieved, sampler = slate_candidates(log, candidate_lists, options, counts)
    if not users:
        raise ValueError(_no_slates(log, candidate_lists))
    shown_items, untitled = _shown_items(log, retrieved, title_of, counts)
    shown = {i: title_of(i) for i in shown_items}  # every title a slate shows, resolved once
    split_of = assign_splits(users, options)
    features = fit_features(
        log, users, extra, split_of, shown_items, title_of, retriever, options
    )
    maker = _SlateMaker(options, shown, split_of, features, sampler, retrieved)

    files = {TRAIN_FILE: out / TRAIN_FILE, EVAL_FILE: out / EVAL_FILE}
    if options.validation:
        files[VALID_FILE] = out / VALID_FILE
    with ExitStack() as stack:
        # Entered first, so renamed into place last, once every slate file is.
        manifest_fh = stack.enter_context(atomic_writer(out / MANIFEST_FILE))
        handles = {name: stack.enter_context(atomic_writer(path)) for name, path in files.items()}
        extra_output = write_extra_sequences(stack, out, extra, options.history)
        outputs = _write_slates(users, maker, handles, progress)

        if candidate_lists is not None:
            counts.update(maker.list_stats)
        if options.retriever is not None and candidate_lists is not None:
            counts.update(retrieval_counts(users, candidate_lists, split_of))
        counts["train"] = outputs[TRAIN_FILE]["slates"]
        counts["eval"] = outputs[EVAL_FILE]["slates"]
        if options.validation:
            counts["valid"] = outputs[VALID_FILE]["slates"]
        parameters, policies = _settings(options, candidate_lists, features, bool(extra))
        manifest: dict[str, Any] = {
            "spdrank": __version__,
            "command": command,
            "parameters": parameters,
            "policies": policies,
            "inputs": {k: dict(v) for k, v in (inputs or {}).items()},
            "counts": counts,
            "untitled_examples": untitled[:20],
            "outputs": outputs | extra_output,
        }
        if features.sasrec is not None:
            # The fit's cache key: `spdrank eval --ranker sasrec` on these slates loads it.
            manifest[SASREC_FIT] = {"key": features.sasrec.model.key}
        manifest_fh.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if not extra:  # a previous build's, which the baselines beside train.jsonl would read
        (out / EXTRA_SEQUENCES_FILE).unlink(missing_ok=True)
    warn_inserted(maker.list_stats["targets_added"], len(users), options.candidates_are,
                  held=maker.targets_held, below_cut=maker.list_stats["targets_below_cut"],
                  size=options.candidates)
    warn_small_eval(counts["eval"], len(users), options.eval_fraction)
    return BuildResult(
        out_dir=out,
        train_path=files[TRAIN_FILE],
        eval_path=files[EVAL_FILE],
        manifest_path=out / MANIFEST_FILE,
        manifest=manifest,
        valid_path=files.get(VALID_FILE),
        extra_path=out / EXTRA_SEQUENCES_FILE if extra else None,
    )


def build_from_files(
    sequences: str | os.PathLike[str],
    titles: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: BuildOptions | None = None,
    candidate_file: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> BuildResult:
    """Read the sequences, titles (and candidate lists) files and :func:`build_slates`."""
    log = read_sequences(sequences)
    title_map = read_titles(titles, known_items=log.item_counts)
    _check_titles_match(log, title_map, titles)
    lists = read_candidate_lists(candidate_file) if candidate_file is not None else None
    inputs: dict[str, dict[str, Any]] = {
        "sequences": {"path": str(sequences), "sha256": sha256_file(sequences)},
        "titles": {"path": str(titles), "sha256": sha256_file(titles)},
    }
    if candidate_file is not None:
        inputs["candidate_file"] = {
            "path": str(candidate_file),
            "sha256": sha256_file(candidate_file),
        }
    return build_slates(
        log, title_map, out_dir, options, candidate_lists=lists, inputs=inputs,
        command="sequences", progress=progress,
    )


# -- before any slate: the retriever, the items shown -------------------------------------


def _retrieved_lists(
    log: InteractionLog, lists: CandidateLists | None, options: BuildOptions
) -> tuple[SASRecScores | None, CandidateLists | None, BuildOptions]:
    """With ``--retriever``: the retriever, its lists as the candidate lists, and the options
    without target insertion (its lists decide which users make a slate, so it runs first);
    otherwise no retriever and the lists and options as given."""
    if options.retriever is None:
        return None, lists, options
    if lists is not None:
        raise ValueError(
            f"--retriever {options.retriever} and --candidate-file exclude each other: "
            "choose one"
        )
    retriever, lists = retriever_lists(log, options)
    return retriever, lists, replace(options, insert_target=False)


def _check_titles_match(
    log: InteractionLog, titles: Mapping[str, str], path: str | os.PathLike[str]
) -> None:
    """Refuse a titles file that names none of the log's items (its columns swapped, or the
    ids spelled otherwise), which would show every item as 'Item <item_id>'; warn when it
    names fewer than half of them. A file of no title row is a log without titles (a
    features-only student reads none), shown as such."""
    items = log.item_counts
    named = sum(1 for i in items if i in titles)
    if not titles or not items or named * 2 >= len(items):
        return
    examples = (f"its first ids {', '.join(repr(t) for t in list(titles)[:3])}; the log's "
                f"first {', '.join(repr(i) for i in list(items)[:3])}")
    if not named:
        raise ValueError(
            f"{path} gives a title to none of the log's {len(items):,} items ({examples}): "
            "a titles file is item_id<TAB>title (or a RecBole .item file), ids spelled as in "
            "the log"
        )
    logger.warning(
        "%s gives a title to %s of the log's %s items (%s); the rest are shown as "
        "'Item <item_id>'", path, f"{named:,}", f"{len(items):,}", examples,
    )


def _no_slates(log: InteractionLog, lists: CandidateLists | None) -> str:
    """Why a build would write no slate: no user with a target and a history, or no such user
    with a candidate list (a list names users the log spells otherwise, say)."""
    if not log.users:
        return (
            f"{log.source}: no user has 2 or more items, so no slate can be built ({log.lines:,} "
            f"lines, {log.empty_lines:,} empty, {log.short_users:,} users with fewer than 2 "
            "items; a plain log's line is 'user item item ...', its fields separated by "
            "whitespace)"
        )
    assert lists is not None  # without lists every user with 2+ items makes a slate
    logged = {u for u, _ in log.users}
    listed = [u for u in lists.lists if u in logged]
    if not listed:
        return (
            f"{lists.source}: none of its {len(lists.lists):,} lists names a user of "
            f"{log.source} with 2 or more items (the lists' users "
            f"{', '.join(repr(u) for u in list(lists.lists)[:3]) or 'none'}; the log's "
            f"{', '.join(repr(u) for u, _ in log.users[:3])}), so no slate can be built"
        )
    return (
        f"{lists.source}: the lists of its {len(listed):,} users of {log.source} are empty, "
        "and without target insertion an empty list makes no slate"
    )


def _shown_items(
    log: InteractionLog,
    retrieved: Mapping[str, Retrieved],
    title_of: Titles,
    counts: dict[str, int],
) -> tuple[list[str], list[str]]:
    """Every item a slate may show (the log's, then the retrieved lists'), and the sorted
    untitled ones among them, counted and said."""
    shown_items: list[str] = list(log.item_counts)
    for got in retrieved.values():
        shown_items.extend(got.docids)
    untitled, unknown = title_of.untitled(shown_items)
    counts["untitled_items"] = len(untitled)
    counts["unknown_items"] = len(unknown)
    if untitled:
        logger.info(
            "%d items have no title (%d not in the titles at all); shown as 'Item <item_id>'",
            len(untitled), len(unknown),
        )
    return shown_items, untitled


# -- the slates -----------------------------------------------------------------------------


def _user_rng(seed: int, user: str) -> random.Random:
    return random.Random(f"{seed}\x00{user}")


class _SlateMaker:
    """Each user's slate: the target among negatives drawn for the user or the retrieved
    list, shuffled by the user's seed, with features; counts what the lists lacked."""

    def __init__(
        self,
        options: BuildOptions,
        shown: Mapping[str, str],
        split_of: Mapping[str, str],
        features: CandidateFeatures,
        sampler: NegativeSampler | None,
        retrieved: Mapping[str, Retrieved],
    ) -> None:
        self.options = options
        self.shown = shown
        self.split_of = split_of
        self.features = features
        self.sampler = sampler
        self.retrieved = retrieved
        self.list_stats = {
            "targets_added": 0, "targets_below_cut": 0, "lists_cut": 0, "short_lists": 0,
        }
        #: Lists that already held their user's target (kept where the list put it).
        self.targets_held = 0
        if not options.insert_target:
            self.list_stats["targets_not_retrieved"] = 0

    def __call__(self, user: str, items: list[str]) -> Slate:
        options = self.options
        history, target = history_and_target(items, options.history)
        rng = _user_rng(options.seed, user)
        got = None
        if self.sampler is not None:
            docids = [target, *self.sampler.draw(rng, options.candidates - 1, set(items))]
        else:
            got = self.retrieved[user]
            docids = list(got.docids)
            count_list(self.list_stats, got, options.candidates)
            self.targets_held += not got.inserted and not got.missed
        rng.shuffle(docids)
        slate = _slate(user, history, target, docids, self.shown, got)
        counted = self.split_of[user] == TRAIN_FILE
        self.features.add(slate, history, target, counted, self.shown)
        return slate


def _slate(
    user: str,
    history: list[str],
    target: str,
    docids: list[str],
    shown: Mapping[str, str],
    got: Retrieved | None,
) -> Slate:
    """One user's slate; a target the retriever missed is recorded as a click not retrieved."""
    scores = got.scores if got is not None else {}
    missed = got is not None and got.missed
    return Slate(
        query=Query(
            qid=user,
            text=render_history([shown[i] for i in history]),
            history=list(history),
        ),
        candidates=[
            Candidate(docid=d, doc={"title": shown[d]}, score=scores.get(d, 0.0)) for d in docids
        ],
        clicked=[] if missed else [target],
        extra={NOT_RETRIEVED: [target]} if missed else {},
    )


def _write_slates(
    users: list[tuple[str, list[str]]],
    maker: _SlateMaker,
    handles: Mapping[str, IO[str]],
    progress: bool | None,
) -> dict[str, dict[str, Any]]:
    """Write each user's slate to its split's file; per file, the manifest's entry: slates,
    candidates and the sha256 of what was written."""
    from spdrank.core.progress import track

    digests = {name: hashlib.sha256() for name in handles}
    written = {name: {"slates": 0, "candidates": 0} for name in handles}
    for user, items in track(users, "slates", unit="user", total=len(users), mode=progress):
        slate = maker(user, items)
        name = maker.split_of[user]
        line = dumps_slate(slate) + "\n"
        handles[name].write(line)
        digests[name].update(line.encode("utf-8"))
        written[name]["slates"] += 1
        written[name]["candidates"] += len(slate.candidates)
    return {name: {**written[name], "sha256": digests[name].hexdigest()} for name in handles}


# -- the manifest ---------------------------------------------------------------------------


def _log_counts(log: InteractionLog) -> dict[str, int]:
    """The manifest's counts of the interaction log, the first of its counts."""
    return {
        "lines": log.lines,
        "empty_lines": log.empty_lines,
        "short_users": log.short_users,
        "users": len(log.users),
        "items": len(log.item_counts),
        "interactions": log.interactions,
    }


def _settings(
    options: BuildOptions,
    lists: CandidateLists | None,
    features: CandidateFeatures,
    extra: bool,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The manifest's parameters and policies; a setting the build did not use adds nothing
    to them."""
    parameters: dict[str, Any] = {
        "history": options.history,
        "candidates": options.candidates,
        "negatives": "candidate-file" if lists is not None else options.negatives,
        "seed": options.seed,
        "eval_fraction": options.eval_fraction,
    }
    policies = {
        "untitled": "an item with an empty title or no title row is shown as "
        "'Item <item_id>'",
        "titles": "html.unescape, then whitespace collapsed to single spaces",
        "skipped": "empty lines and users with fewer than 2 items",
    }
    if options.features:
        parameters["features"] = list(options.features)
        if features.interactions is not None:
            policies["features"] = FEATURES_POLICY
    if options.retriever is not None:
        parameters["negatives"] = "retriever"
        parameters["retriever"] = options.retriever
    if features.sasrec is not None:
        parameters[SASREC] = options.sasrec.to_dict()
        policies[SASREC] = SASREC_POLICY
    if options.validation:
        parameters["validation"] = options.validation
        policies["validation"] = VALIDATION_POLICY
    _describe_lists(parameters, policies, lists, options, extra)
    return parameters, policies


def _describe_lists(
    parameters: dict[str, Any],
    policies: dict[str, str],
    lists: CandidateLists | None,
    options: BuildOptions,
    extra: bool,
) -> None:
    """The manifest's word on candidate lists, added only where a build used them so."""
    if lists is None:
        return
    if not options.insert_target:
        parameters["insert_target"] = False
    if options.candidates_are == "sampled":
        parameters["candidates_are"] = "sampled"
        policies["candidates_are"] = SAMPLED_POLICY
    if lists.scores is not None:
        policies["candidate_scores"] = CANDIDATE_SCORES_POLICY
    elif options.candidates_are != "sampled":
        policies["candidate_scores"] = RANK_SCORES_POLICY
    if extra:
        policies["extra_sequences"] = EXTRA_SEQUENCES_POLICY
