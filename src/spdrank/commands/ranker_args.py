"""The flags that pick the slates and the rankers, shared by ``spdrank eval`` and ``spdrank
bench``, and the rankers and input files they name."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path

from spdrank.commands.argtypes import (
    add_dtype_argument,
    add_trust_remote_code,
    add_window_arguments,
    int_at_least,
    windows_from_args,
)
from spdrank.commands.named_rankers import build_rankers, default_train_path, is_search
from spdrank.core.ranking import Ranker
from spdrank.eval.paired import MAX_RESAMPLES, RESAMPLES
from spdrank.rankers.baselines import BASELINES, FEATURE_PREFIX, baseline_factory, baseline_names
from spdrank.rankers.fusion import SYNTAX as FUSION_SYNTAX

log = logging.getLogger(__name__)


def add_ranker_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that pick the slates and the rankers, shared by ``eval`` and ``bench``."""
    p.add_argument("--slates", required=True, metavar="FILE", help="evaluation slates (JSONL)")
    p.add_argument(
        "--train",
        metavar="FILE",
        help="training slates for rankers that learn statistics "
        "(default: train.jsonl beside --slates)",
    )
    p.add_argument(
        "--ranker",
        action="append",
        type=baseline_name,
        metavar="NAME",
        help=f"a baseline to evaluate: {', '.join(baseline_names())}, {FEATURE_PREFIX}NAME "
        "(rank by that candidate feature of the slates, e.g. feature:score; title_similarity "
        "is feature:title_similarity, `spdrank data ... --features`), or several fused: "
        f"{FUSION_SYNTAX}; repeat for several (default: {', '.join(BASELINES)})",
    )
    p.add_argument(
        "--choose-on",
        metavar="FILE",
        help="validation slates on which each --ranker fusion:best:A+B[+C[+D]] chooses its "
        "fusion (each component alone, rrf, zscore and minmax over a grid of weights): graded "
        "relevance judges them (nDCG@10), else clicks; keep them apart from --slates",
    )
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N slates")
    p.add_argument("--seed", type=int, default=0, help="seed of the random ranker (default 0)")
    p.add_argument(
        "--warmup",
        type=int_at_least(0),
        default=1,
        metavar="N",
        help="untimed rank() calls per ranker on the first slate (default 1)",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]DIR",
        help="a trained SPD checkpoint (or training run directory), named NAME in the "
        "table; repeatable",
    )
    p.add_argument(
        "--labels",
        action="append",
        metavar="[NAME=]FILE",
        help="a teacher's label file (from `spdrank teacher`) replayed as a ranker: its own "
        "answers, decode passes and recorded latency; repeatable",
    )
    p.add_argument(
        "--run",
        action="append",
        metavar="[NAME=]FILE",
        help="a TREC run (qid Q0 docid rank score tag) replayed as a ranker, in trec_eval's "
        "order (score descending, ties by docid descending); candidates it does not rank "
        "follow in slate order; repeatable",
    )
    add_window_arguments(p)
    p.add_argument("--device", default="auto", help="device for --model rankers: cpu, cuda, auto")
    add_dtype_argument(p, "the --model rankers' backbone")
    add_trust_remote_code(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_paired_arguments(p: argparse.ArgumentParser, reference_help: str) -> None:
    """``--reference`` and ``--bootstrap``, shared by ``eval`` and ``bench``: both compare rows
    with :func:`spdrank.eval.paired.compare`, seeded with ``--seed``, so one pair of flags
    means one computation in either command. ``reference_help`` says what each does without
    ``--reference``."""
    paired = p.add_argument_group("paired differences")
    paired.add_argument(
        "--reference",
        metavar="ROW",
        help="the row every other row is compared with, slate by slate: the mean of "
        f"(row - ROW) per metric and its 95%% bootstrap interval over slates; {reference_help}",
    )
    paired.add_argument(
        "--bootstrap",
        type=int_at_least(1, MAX_RESAMPLES),
        default=RESAMPLES,
        metavar="N",
        help=f"bootstrap resamples of the slates for the 95%% intervals, seeded with --seed "
        f"(default {RESAMPLES}, at most {MAX_RESAMPLES:,})",
    )


def check_reference(names: list[str], requested: str) -> str:
    """``--reference``'s row, checked against the rows' names before anything is ranked, so a
    misspelt name costs no evaluation; ``ValueError`` naming every row otherwise."""
    if requested not in names:
        raise ValueError(f"--reference {requested!r} names no row; rows: {', '.join(names)}")
    return requested


def baseline_name(text: str) -> str:
    """``--ranker``'s type: a name :func:`spdrank.rankers.baselines.make_baseline` knows."""
    try:
        baseline_factory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def rankers_from_args(args: argparse.Namespace) -> list[Ranker]:
    """The rankers the command line asks for, unfitted, in the order given
    (:func:`spdrank.commands.named_rankers.build_rankers`); a command without a flag passes none of it."""
    check_model_flags(args)
    return build_rankers(
        args.ranker,
        seed=args.seed,
        labels=getattr(args, "labels", None) or (),
        runs=getattr(args, "run", None) or (),
        models=getattr(args, "model", None) or (),
        device=args.device,
        dtype=getattr(args, "dtype", None),
        decoder=getattr(args, "decoder", None),
        trust_remote_code=getattr(args, "trust_remote_code", False),
        search=is_search(args.slates),
        windows=windows_from_args(args),
        choose_on=getattr(args, "choose_on", None),
    )


def check_model_flags(args: argparse.Namespace) -> None:
    """Refuse the flags that load or run ``--model`` checkpoints when no ``--model`` is given:
    no other ranker reads them, and a flag silently ignored leaves its user believing it
    took effect."""
    if getattr(args, "model", None):
        return
    device = getattr(args, "device", "auto")
    given = [flag for flag, value in (
        ("--decoder", getattr(args, "decoder", None)),
        ("--decoders", getattr(args, "decoders", None)),
        ("--device", None if device == "auto" else device),
        ("--dtype", getattr(args, "dtype", None)),
        ("--trust-remote-code", getattr(args, "trust_remote_code", False) or None),
        ("--window", getattr(args, "window", None)),
        ("--prompt", getattr(args, "prompt", None)),
    ) if value is not None]
    if given:
        them = "it" if len(given) == 1 else "them"
        raise ValueError(f"{', '.join(given)}: for --model checkpoints only, and no --model is "
                         f"given; add --model DIR or drop {them}")


def coverage_notes(rankers: list[Ranker]) -> list[str]:
    """The lines rankers have on what of the slates they did not rank (a replayed run that
    ranks none of a slate's candidates: :meth:`spdrank.rankers.run_ranker.RunRanker.coverage_note`),
    once every slate is ranked."""
    notes = (getattr(ranker, "coverage_note", None) for ranker in rankers)
    return [line for note in notes if note is not None and (line := note())]


def named_files(args: argparse.Namespace, option: str) -> list[str]:
    """The files a ``--labels`` or ``--run`` option (``[NAME=]FILE``, repeatable) names:
    inputs, which no output may overwrite."""
    from spdrank.commands.named_rankers import split_named

    return [split_named(spec)[1] for spec in getattr(args, option, None) or ()]


def checked_inputs(args: argparse.Namespace) -> tuple[Path, Path, bool | None]:
    """The slate file (which must exist, and be a regular file: its first slate tells the
    rankers' kind and its lines are counted before it is ranked), the training file and the
    progress-bar mode."""
    from spdrank.core.inputs import check_rereadable

    slates_path = Path(args.slates)
    check_rereadable(slates_path, "slate file")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    train = Path(args.train) if args.train else default_train_path(slates_path)
    progress = False if args.no_progress else None  # None: a bar on a terminal only
    return slates_path, train, progress


def check_seed(args: argparse.Namespace, names: Iterable[str]) -> None:
    """Refuse ``--seed`` when nothing this evaluation runs is random: no ``random`` ranker
    among ``names`` and no ``--reference`` (whose bootstrap it seeds), through the one table
    of unread flags (:func:`spdrank.core.unread.check_unread`)."""
    from spdrank.commands.argtypes import flag_defaults
    from spdrank.core.unread import Unread, check_unread

    reads = "random" in names or getattr(args, "reference", None) is not None
    rows = [Unread("seed", reads, "it seeds the random ranker and --reference's bootstrap, "
                                  "and neither runs")]
    parser = argparse.ArgumentParser()
    add_ranker_arguments(parser)
    check_unread(args, flag_defaults(parser, ["seed"]), rows, log)
