"""``spdrank data``: build slates (JSONL) from an interaction log, or the bundled Beauty."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spdrank.commands.argtypes import int_at_least
from spdrank.datasets.build import BuildResult
from spdrank.datasets.options import (
    ALL_FEATURES,
    CANDIDATE_KINDS,
    NEGATIVES,
    RETRIEVERS,
    BuildOptions,
)
from spdrank.rankers.sasrec_config import LOSSES, SASRecConfig


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {value}")
    return value


def _feature_list(text: str) -> tuple[str, ...]:
    """``--features LIST``: comma-separated names of :data:`ALL_FEATURES`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_FEATURES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown features {unknown or [text]}: choose from {', '.join(ALL_FEATURES)}"
        )
    return tuple(names)


def _add_common(p: argparse.ArgumentParser, negatives_default: str | None) -> None:
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: train.jsonl, eval.jsonl (valid.jsonl), manifest.json; "
                        "built beside it and swapped in whole once complete")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty --out whole (without it, one is refused), so no "
                        "file of an earlier build stays beside the new one")
    p.add_argument("--history", type=int_at_least(0), default=10, metavar="N",
                   help="most recent items before the target kept as history (default 10)")
    p.add_argument("--candidates", type=int_at_least(2), default=50, metavar="N",
                   help="candidates per slate, the target included (default 50)")
    p.add_argument("--negatives", choices=NEGATIVES, default=negatives_default,
                   help="how negatives are drawn from items the user never interacted with: "
                        "uniform, or popularity (proportional to interaction count); "
                        "default uniform")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--eval-fraction", type=_fraction, default=0.05, metavar="F",
                   help="share of users in eval.jsonl: floor(n_users * F) (default 0.05)")
    p.add_argument("--validation", type=int_at_least(0), default=0, metavar="N",
                   help="hold out N training users (a seeded sample): their slates go to "
                        "valid.jsonl instead of train.jsonl, for model selection, and their "
                        "sequences are not counted in --features (default 0: no valid.jsonl)")
    p.add_argument("--features", nargs="?", const=True, default=False, type=_feature_list,
                   metavar="LIST",
                   help="add per-candidate features: popularity, cooccurrence and transition "
                        "(log1p counts over the training slates, the slate's own user left out) "
                        "and title_similarity (TF-IDF cosine with the history's titles); for "
                        "e.g. `spdrank train --features popularity,cooccurrence,transition`. "
                        "LIST picks some, comma-separated, and may add sasrec (SASRec's score "
                        "after the history, from a model that never saw a slate's target; "
                        "fitting it takes minutes, cached by its inputs)")
    p.add_argument("--retriever", choices=RETRIEVERS,
                   help="take each slate's candidates from this retriever's top --candidates "
                        "(its score in each candidate's score) instead of drawing negatives; "
                        "the target is never inserted: a slate whose target was not retrieved "
                        "has no clicked item and counts as a miss in eval")
    p.add_argument("--sasrec-epochs", type=int_at_least(1), default=SASRecConfig.epochs,
                   metavar="N",
                   help="training epochs of the SASRec a sasrec feature or retriever fits "
                        f"(default {SASRecConfig.epochs})")
    p.add_argument("--sasrec-loss", choices=LOSSES, default=SASRecConfig.loss,
                   help="what that SASRec is trained with: ce, a softmax over the catalogue "
                        "as RecBole trains it, or bce, the paper's one negative a position "
                        f"(default {SASRecConfig.loss})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "data",
        help="build slates from an interaction log, or search slates from a run and qrels "
        "or from a corpus alone (synthetic queries)",
        description="Build leave-one-out next-item slates (JSONL): history -> query.text, "
        "target + negatives -> candidates, clicked = [target].",
    )
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="SOURCE")

    seq = sub.add_parser(
        "sequences",
        help="any log: 'user item item ...' lines + a titles TSV",
        description="Build slates from a sequences file (one user a line, 'user item item ...' "
        "in time order) and a titles TSV ('item_id<TAB>title' with a header line).",
    )
    seq.add_argument("--sequences", required=True, metavar="FILE",
                     help="one user a line: 'user item item ...', oldest first; or a RecBole "
                     ".inter file (user_id, item_id and optionally timestamp columns under its "
                     "name:type header line)")
    seq.add_argument("--titles", required=True, metavar="FILE",
                     help="TSV 'item_id<TAB>title' with a header line; or a RecBole .item "
                     "file (item_id and title columns)")
    seq.add_argument("--candidate-file", metavar="FILE",
                     help="upstream retriever lists instead of negatives: 'user cand cand ...' "
                     "best first, or 'user cand:score cand:score ...' to keep the retriever's "
                     "score (each candidate's score; `spdrank train --features score`); users "
                     "without a list make no slate but still count in features and baselines")
    seq.add_argument("--no-insert-target", dest="insert_target", action="store_false",
                     help="with --candidate-file: when the retriever did not return a user's "
                     "target, keep the slate as retrieved (no target; it counts as a miss in "
                     "eval) instead of inserting the target, which a ranker can learn to spot "
                     "(an item with no real retriever score); evaluate on slates built so")
    seq.add_argument("--candidates-are", choices=CANDIDATE_KINDS, metavar="KIND",
                     help="what --candidate-file holds: retrieved (a retriever's lists, best "
                     "first, scores optional; a target it missed is inserted with a warning, "
                     "or left out with --no-insert-target) or sampled (negatives sampled for "
                     "each user, unscored, as LLMRank's and RecBole's sampled evaluation: the "
                     "target is always inserted beside them) (default: retrieved)")
    _add_common(seq, negatives_default=None)
    seq.set_defaults(func=run_sequences)

    beauty = sub.add_parser(
        "beauty",
        help="the bundled Amazon Beauty 2014 (the paper's setup)",
        description="Build the SPD paper's Amazon Beauty 2014 slates from the bundled files "
        "(21,245 train + 1,118 eval with the defaults).",
    )
    _add_common(beauty, negatives_default=None)
    beauty.set_defaults(func=run_beauty)

    from spdrank.commands import data_features, data_queries, data_search

    data_search.register(sub)
    data_queries.register(sub)
    data_features.register(sub)


def _options(args: argparse.Namespace) -> BuildOptions:
    return BuildOptions(
        history=args.history,
        candidates=args.candidates,
        negatives=args.negatives or "uniform",
        seed=args.seed,
        eval_fraction=args.eval_fraction,
        features=args.features,
        validation=args.validation,
        insert_target=getattr(args, "insert_target", True),
        candidates_are=getattr(args, "candidates_are", None) or "retrieved",
        retriever=args.retriever,
        sasrec=SASRecConfig(epochs=args.sasrec_epochs, loss=args.sasrec_loss),
    )


def _check_retriever(args: argparse.Namespace) -> None:
    """A retriever chooses the candidates, so nothing else may."""
    if args.retriever and args.negatives:
        raise ValueError(f"--negatives and --retriever {args.retriever} exclude each other")
    if args.retriever and getattr(args, "candidate_file", None):
        raise ValueError(f"--candidate-file and --retriever {args.retriever} exclude each other")


def run_sequences(args: argparse.Namespace) -> int:
    from spdrank.datasets.build import build_from_files

    if args.candidate_file and args.negatives:
        raise ValueError("--negatives and --candidate-file exclude each other: choose one")
    _check_retriever(args)
    if args.candidates_are and not args.candidate_file:
        raise ValueError(f"--candidates-are {args.candidates_are} describes a --candidate-file: "
                         "give one")
    if not args.insert_target and not args.candidate_file:
        raise ValueError("--no-insert-target applies to --candidate-file: drawn negatives "
                         "always sit beside the target")
    inputs = {"--sequences": args.sequences, "--titles": args.titles,
              "--candidate-file": args.candidate_file}
    result = build_fresh(args, inputs, lambda out: build_from_files(
        args.sequences,
        args.titles,
        out,
        _options(args),
        candidate_file=args.candidate_file,
        progress=False if args.no_progress else None,
    ))
    print_summary(result)
    return 0


def run_beauty(args: argparse.Namespace) -> int:
    from spdrank.datasets.beauty import build_beauty

    _check_retriever(args)
    result = build_fresh(args, {}, lambda out: build_beauty(
        out, _options(args), progress=False if args.no_progress else None
    ))
    print_summary(result)
    return 0


def build_fresh(
    args: argparse.Namespace, inputs: Mapping[str, Any], build: Callable[[Path], BuildResult]
) -> BuildResult:
    """Run ``build`` into a new directory that replaces ``--out`` whole once it is complete, so
    no file of an earlier build (a ``valid.jsonl`` whose users are now in ``train.jsonl``) is
    left beside the new ones, and a failed build leaves ``--out`` as it was.

    A non-empty ``--out`` is refused without ``--overwrite``, and so is one that holds an input
    or the working directory (replacing it would delete them).
    """
    from spdrank.core.atomic_dir import atomic_directory
    from spdrank.core.files import check_outputs

    out = Path(args.out)
    check_outputs(inputs, {}, folders={"--out": out})
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise ValueError(
            f"--out {out} is not empty: pass --overwrite to replace it whole, or choose "
            "another --out"
        )
    with atomic_directory(out) as tmp:
        result = build(tmp)

    def moved(path: Path | None) -> Path | None:
        return None if path is None else out / path.relative_to(tmp)

    return dataclasses.replace(
        result, out_dir=out, train_path=out / result.train_path.relative_to(tmp),
        eval_path=out / result.eval_path.relative_to(tmp),
        manifest_path=out / result.manifest_path.relative_to(tmp),
        valid_path=moved(result.valid_path), extra_path=moved(result.extra_path),
    )


def print_summary(result: BuildResult) -> None:
    m = result.manifest
    c = m["counts"]
    p = m["parameters"]
    outs = m["outputs"]
    n_slates = c["train"] + c["eval"] + c.get("valid", 0)
    n_cands = sum(o.get("candidates", 0) for o in outs.values())
    per_slate = f"{n_cands / n_slates:.1f}" if n_slates else "0"
    source = (
        "from the candidate file" if p["negatives"] == "candidate-file"
        else f"the {p['retriever']} retriever's top {p['candidates']}" if "retriever" in p
        else f"{p['negatives']} negatives"
    )
    skipped = (
        f"{c['empty_lines']:,} empty lines, {c['short_users']:,} users with fewer than 2 items"
    )
    valid = f"{c['valid']:,} valid + " if "valid" in c else ""
    lines = [
        (
            f"{c['train']:,} train + {valid}{c['eval']:,} eval slates, {per_slate} candidates per "
            f"slate ({source}, history {p['history']}, seed {p['seed']})"
        ),
        (
            f"  log: {c['users']:,} users with 2+ items, {c['items']:,} items, "
            f"{c['interactions']:,} interactions"
        ),
        f"  skipped: {skipped}",
        (
            f"  untitled items: {c['untitled_items']:,} ({c['unknown_items']:,} not in the "
            "titles), shown as 'Item <item_id>'"
        ),
    ]
    lines += _list_lines(c, p)
    lines += _recall_lines(c, p)
    lines += [
        f"  wrote {result.train_path}",
        f"        {result.eval_path}",
        *([f"        {result.valid_path}"] if result.valid_path else []),
        *([f"        {result.extra_path}"] if result.extra_path else []),
        f"        {result.manifest_path}",
    ]
    print("\n".join(lines))


def _list_lines(c: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """The summary's lines on candidate lists: what was done to them, who had none."""
    if "targets_added" not in c:
        return []
    below = c.get("targets_below_cut", 0)
    listed = f"{below:,} of them listed below the top {p['candidates']}" if below else ""
    if "targets_not_retrieved" in c:
        target = (f"{c['targets_not_retrieved']:,} targets not retrieved (kept without, counted "
                  f"as misses{'; ' + listed if listed else ''})")
    else:
        target = f"{c['targets_added']:,} targets added" + (f" ({listed})" if listed else "")
    kind = " (sampled negatives)" if p.get("candidates_are") == "sampled" else ""
    lines = [
        (
            f"  candidate lists{kind}: {target}, {c['lists_cut']:,} cut, "
            f"{c['short_lists']:,} shorter than {p['candidates']}"
        )
    ]
    if c["unused_candidate_lists"]:
        lines.append(
            f"  {c['unused_candidate_lists']:,} candidate lists unused: their users are not in "
            "the log, or have fewer than 2 items"
        )
    if c["repeated_candidates_dropped"]:
        lines.append(
            f"  {c['repeated_candidates_dropped']:,} candidates dropped for repeating one "
            "earlier in their list"
        )
    if c["users_without_candidate_list"]:
        lines.append(
            f"  {c['users_without_candidate_list']:,} users without a candidate list: no "
            "slate, their sequences counted (features, baselines) from extra_sequences.txt"
        )
    return lines


def _recall_lines(c: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """The retriever's Recall@N against the whole catalogue, per split (``--retriever``)."""
    splits = [
        (name, c[f"targets_retrieved_{name}"], c[name])
        for name in ("train", "valid", "eval")
        if f"targets_retrieved_{name}" in c and c.get(name)
    ]
    if not splits:
        return []
    cells = ", ".join(f"{name} {hit / n:.4f} ({hit:,} of {n:,})" for name, hit, n in splits)
    return [f"  {p['retriever']} retriever: targets retrieved (Recall@{p['candidates']}) {cells}"]
