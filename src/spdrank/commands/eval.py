"""``spdrank eval``: run rankers over the same slates and print one results table.

    spdrank eval --slates eval.jsonl [--train train.jsonl] --ranker random --ranker popularity \\
        --ranker cooccurrence --ranker title_similarity [--limit N] [--k 1,5,10,20] \\
        [--json out.json] [--per-slate rows.jsonl]

Rankers that learn statistics (popularity, co-occurrence) are fitted on ``--train``, which
defaults to ``train.jsonl`` (or ``train.jsonl.gz``) beside the ``--slates`` file, and on the
sequences of users who make no slate (``extra_sequences.txt`` beside it); a feature
ranker (``title_similarity``, ``feature:NAME``) reads the slates' own features and needs no
training file. No torch is imported here: model-backed rankers are built inside
:func:`build_rankers` on demand.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spdrank.baselines import (
    BASELINES,
    FEATURE_PREFIX,
    baseline_factory,
    baseline_names,
    make_baseline,
)
from spdrank.ranking import Ranker

if TYPE_CHECKING:
    from spdrank.slates import Slate

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate rankers on slates (quality, validity, latency)",
        description="Run every ranker on the same slates; print a table of AUC, Recall@k, "
        "NDCG@k, MRR, validity, agreement with the teacher ranking (when present) and "
        "per-slate latency.",
    )
    add_ranker_arguments(p)
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON (atomically)")
    p.add_argument(
        "--per-slate", metavar="FILE", help="also write every per-slate value as JSONL"
    )
    p.add_argument("--decoder", help="decoder for --model rankers (default: the model's own)")
    p.add_argument(
        "--k",
        type=cutoffs,
        default=DEFAULT_KS,
        metavar="K,K,...",
        help="the cut-offs of Recall@k, NDCG@k and MRR@k, comma-separated "
        f"(default: {','.join(map(str, DEFAULT_KS))}); MRR uncut is always reported",
    )
    p.add_argument(
        "--extra-sequences",
        metavar="FILE",
        help="more interaction sequences ('user item item ...') for the rankers that count "
        "(popularity, co-occurrence), beside the training slates: users who make no slate "
        "(default: extra_sequences.txt beside --train, which `spdrank data --candidate-file` "
        "writes for users without a list)",
    )
    p.set_defaults(func=run)


#: The default cut-offs of ``spdrank eval``'s Recall@k, NDCG@k and MRR@k.
DEFAULT_KS = (1, 5, 10, 20)


def cutoffs(text: str) -> tuple[int, ...]:
    """``--k``'s type: ``"1,5,10"`` -> (1, 5, 10); each a positive integer, none repeated."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers such as 1,5,10,20, got {text!r}"
        )
    ks = tuple(int(part) for part in parts)
    if len(set(ks)) != len(ks):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a cut-off")
    return ks


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
        help=f"a baseline to evaluate: {', '.join(baseline_names())}, or {FEATURE_PREFIX}NAME "
        "(rank by that candidate feature of the slates, e.g. feature:score); title_similarity "
        "is feature:title_similarity (`spdrank data ... --features`); repeat for several "
        f"(default: {', '.join(BASELINES)})",
    )
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N slates")
    p.add_argument("--seed", type=int, default=0, help="seed of the random ranker (default 0)")
    p.add_argument(
        "--warmup",
        type=int,
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
    p.add_argument("--device", default="auto", help="device for --model rankers: cpu, cuda, auto")
    p.add_argument(
        "--dtype",
        help="backbone dtype for --model rankers: float32, bfloat16, float16 or auto "
        "(default: the checkpoint's own)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def baseline_name(text: str) -> str:
    """``--ranker``'s type: a name :func:`spdrank.baselines.make_baseline` knows."""
    try:
        baseline_factory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def default_train_path(slates: str | Path) -> Path:
    """``train.jsonl`` beside the evaluation slates (``train.jsonl.gz`` if only that exists)."""
    base = Path(slates).parent
    plain = base / "train.jsonl"
    gz = base / "train.jsonl.gz"
    return gz if not plain.exists() and gz.exists() else plain


# -- rankers --------------------------------------------------------------------------------


def build_rankers(args: argparse.Namespace) -> list[Ranker]:
    """The rankers the command line asks for, unfitted, in the order given.

    This is the one place that maps arguments to rankers: a model-backed ranker (e.g. a
    ``--model DIR`` option) is added here, importing its heavy modules inside the branch.
    """
    others = getattr(args, "model", None) or getattr(args, "labels", None)
    names = args.ranker or ([] if others else list(BASELINES))
    rankers: list[Ranker] = []
    for name in dict.fromkeys(names):  # a repeated --ranker counts once
        kwargs: dict[str, Any] = {"seed": args.seed} if name == "random" else {}
        rankers.append(make_baseline(name, **kwargs))
    for spec in getattr(args, "labels", None) or []:
        from spdrank.teacher.replay import LabelReplayRanker

        name, path = split_named(spec)
        rankers.append(LabelReplayRanker(path, name=name))
    models = getattr(args, "model", None) or []
    if models:
        from spdrank.backbone import resolve_device
        from spdrank.decode import get_decoder
        from spdrank.model import SPDRanker

        for spec in models:
            name, path = split_named(spec)
            model = SPDRanker.from_pretrained(
                path, device=resolve_device(args.device), dtype=getattr(args, "dtype", None)
            )
            if getattr(args, "decoder", None):
                get_decoder(args.decoder)  # an unknown name fails before any ranking
                model.config.decoder = args.decoder
            if name:
                model.name = name
            elif len(models) > 1:
                model.name = f"spd:{Path(path).name}"
            rankers.append(model)
    return rankers


def split_named(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (even one holding '=') -> (None, PATH)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or "/" in name or Path(spec).exists():
        return None, spec
    return name, path


def fit_rankers(
    rankers: list[Ranker],
    train: Path | None,
    progress: bool | None = None,
    extra: Path | None = None,
) -> dict[str, float]:
    """Fit every ranker that needs training data, one streamed pass each; seconds per ranker.

    Rankers that count sequences (popularity, co-occurrence) also count ``extra``, the
    sequences of users who make no slate (default: ``extra_sequences.txt`` beside ``train``).
    """
    from spdrank.baselines import training_sequence
    from spdrank.datasets.sequences import default_extra_sequences, iter_extra_sequences
    from spdrank.progress import track
    from spdrank.slates import read_slates

    needing = [r for r in rankers if getattr(r, "needs_train", False)]
    if not needing:
        return {}
    if train is None or not train.exists():
        raise FileNotFoundError(
            f"ranker(s) {', '.join(r.name for r in needing)} need training slates, but "
            f"{train} does not exist; pass --train FILE"
        )
    extra = extra or default_extra_sequences(train)
    if extra is not None and not extra.is_file():
        raise FileNotFoundError(f"no such extra sequences file: {extra}")
    seconds: dict[str, float] = {}
    for ranker in needing:
        t0 = time.perf_counter()
        stream = track(read_slates(train), f"fit {ranker.name}", unit="slate", mode=progress)
        counts_extra = extra is not None and hasattr(ranker, "fit_sequences")
        if counts_extra:
            ranker.fit_sequences(  # type: ignore[attr-defined]
                chain(map(training_sequence, stream), iter_extra_sequences(extra))
            )
        else:
            ranker.fit(stream)
        seconds[ranker.name] = time.perf_counter() - t0
        also = f" and {extra}" if counts_extra else ""
        log.info("fitted %s on %s%s in %.1f s", ranker.name, train, also, seconds[ranker.name])
    return seconds


# -- command --------------------------------------------------------------------------------


def checked_inputs(args: argparse.Namespace) -> tuple[Path, Path, bool | None]:
    """The slate file (which must exist), the training file and the progress-bar mode."""
    from spdrank.slates import SlateError

    slates_path = Path(args.slates)
    if not slates_path.exists():
        raise SlateError(f"no such slate file: {slates_path}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    train = Path(args.train) if args.train else default_train_path(slates_path)
    progress = False if args.no_progress else None  # None: a bar on a terminal only
    return slates_path, train, progress


def checked_slates(path: Path, rankers: list[Ranker]) -> Iterator[Slate]:
    """The file's slates, a repeated qid refused, each checked with its ``file:line`` against
    every SPD model's limits (K, features): the checks ``spdrank rank`` and the server make."""
    from spdrank.slates import iter_slates, unique_qids
    from spdrank.validation import check_fits_model

    # An SPD model is recognised by its config (importing its class would import torch).
    limits = [
        (r.config.head.positions, r.features)  # type: ignore[attr-defined]
        for r in rankers
        if hasattr(getattr(r, "config", None), "head")
    ]
    for where, slate in unique_qids(iter_slates(path), allow_blank=True):
        for positions, features in limits:
            check_fits_model(slate, positions, features, where)
        yield slate


def run(args: argparse.Namespace) -> int:
    from spdrank.evaluate import evaluate, format_table, write_per_slate
    from spdrank.files import atomic_writer
    from spdrank.slates import SlateError

    slates_path, train, progress = checked_inputs(args)

    rankers = build_rankers(args)
    if not rankers:
        raise ValueError("no rankers: pass --ranker NAME (repeatable)")
    extra = Path(args.extra_sequences) if args.extra_sequences else None
    fit_s = fit_rankers(rankers, train, progress, extra)

    stream = checked_slates(slates_path, rankers)
    if args.limit is not None:
        stream = islice(stream, args.limit)
    t0 = time.perf_counter()
    results = evaluate(
        rankers, stream, ks=args.k, mrr_ks=args.k, warmup=args.warmup, progress=progress,
        total=args.limit,
    )
    results.meta.update(
        {
            "slates": str(slates_path),
            "train": str(train) if fit_s else None,
            "limit": args.limit,
            "fit_s": fit_s,
            "eval_s": time.perf_counter() - t0,
        }
    )
    if results.n_slates == 0:
        raise SlateError(f"{slates_path} holds no slates")

    print(format_table(results))
    if args.json:
        with atomic_writer(args.json) as fh:
            json.dump(results.to_dict(), fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        log.info("wrote %s", args.json)
    if args.per_slate:
        n = write_per_slate(results, args.per_slate)
        log.info("wrote %d per-slate rows to %s", n, args.per_slate)
    return 0
