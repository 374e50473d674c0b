"""``spdrank bench``: the paper's Tables 2-5 side by side, from one process on the same slates.

    spdrank bench --slates eval.jsonl --ranker popularity --ranker cooccurrence \\
        --labels direct=direct.labels.jsonl --labels reasoning=reasoning.labels.jsonl \\
        --model spd=runs/spd --model scalar=runs/scalar --decoders hungarian,greedy \\
        --latency --name beauty      # -> benchmarks/results/beauty/

Rankers are chosen with the flags of ``spdrank eval`` (the same helpers build them). Every SPD
checkpoint becomes one row per decoder (``NAME:DECODER``), all sharing one forward pass per
slate; FIRST and scalar checkpoints sort their scores and keep one row. ``--labels`` rows are
the teachers the speed-ups are measured against. ``--latency`` adds the latency decomposition
of each SPD checkpoint at the ``--latency-sizes``.

Every row is also compared with one reference row, slate by slate (``--reference``, by default
the first SPD decoder row): the mean paired difference per metric with a bootstrap 95%
interval (:mod:`spdrank.eval.paired`). So one checkpoint under four decoders is the paper's decoder
ablation, and checkpoints trained differently are the other ablations (benchmarks/ablation_*.sh).

The folder gets ``report.md``, ``results.json`` (the evaluation's JSON plus ``teachers``,
``speedup``, ``latency`` and ``paired``), ``table.txt`` and PNG plots.
"""

from __future__ import annotations

import argparse
import logging
import time
from itertools import islice
from pathlib import Path
from typing import Any

from spdrank.commands.argtypes import model_folders, positive_int
from spdrank.commands.ranker_args import add_paired_arguments, add_ranker_arguments
from spdrank.core.defaults import LATENCY_SIZES

log = logging.getLogger(__name__)

RESULTS_ROOT = Path("benchmarks/results")

#: Slates timed per size by the latency decomposition, unless ``--latency-slates`` says.
LATENCY_SLATES = 100
#: Slates per timed call, one row each, unless ``--latency-batch`` says: rank() one by one.
LATENCY_BATCHES = (1,)
#: The batch size of the throughput measurement, unless ``--batch-size`` says.
THROUGHPUT_BATCH = 8


def _names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return names


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers (20,50,150), got {text!r}") from None
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError("every value must be at least 1")
    return sizes


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark rankers side by side: report, JSON and plots",
        description="Run baselines, replayed teachers, FIRST, scalar and SPD (under every "
        "decoder) on the same slates in one process; write report.md, results.json and "
        "plots (quality vs latency, latency stages), and with --latency the latency "
        "decomposition of each SPD checkpoint.",
    )
    add_ranker_arguments(p)
    p.add_argument(
        "--decoders",
        type=_names,
        metavar="LIST",
        help="decoders for SPD checkpoints, comma-separated, one row each "
        "(default: every registered decoder)",
    )
    p.add_argument(
        "--name", default="bench", help=f"results folder under {RESULTS_ROOT}/ (default: bench)"
    )
    p.add_argument("--out", metavar="DIR", help="results folder (overrides --name)")
    p.add_argument("--title", help="the report's title (default: spdrank bench: NAME)")
    p.add_argument(
        "--preamble",
        metavar="FILE",
        help="markdown put under the report's title: how the rows were made (the scale and "
        "commands of a script that trained them)",
    )
    add_paired_arguments(
        p, "default: the first SPD decoder row, e.g. spd:hungarian; without one, the first row"
    )
    lat = p.add_argument_group("latency decomposition")
    lat.add_argument(
        "--latency",
        action="store_true",
        help="also decompose each SPD checkpoint's latency (with --warmup untimed calls per "
        "size; extra candidates for large N drawn with --seed)",
    )
    lat.add_argument(
        "--latency-sizes",
        type=_sizes,
        default=list(LATENCY_SIZES),
        metavar="LIST",
        help="slate sizes N, comma-separated (default: "
        f"{','.join(map(str, LATENCY_SIZES))})",
    )
    lat.add_argument(
        "--latency-slates",
        type=positive_int,
        default=LATENCY_SLATES,
        metavar="N",
        help=f"slates timed per size, the first N of --slates (default {LATENCY_SLATES})",
    )
    lat.add_argument(
        "--latency-batch",
        type=_sizes,
        default=list(LATENCY_BATCHES),
        metavar="LIST",
        help="slates per timed call, comma-separated, one row each: 1 times rank() slate by "
        "slate; B > 1 times rank_batch on B slates at once, B at a time through the "
        "--latency-slates (default: 1)",
    )
    lat.add_argument(
        "--batch-size",
        type=positive_int,
        default=THROUGHPUT_BATCH,
        metavar="B",
        help=f"batch size of the throughput measurement (default {THROUGHPUT_BATCH})",
    )
    p.set_defaults(func=run)


def check_latency_flags(args: argparse.Namespace) -> None:
    """Refuse the latency decomposition's flags without ``--latency``: nothing else reads
    them, and a flag silently ignored leaves its user believing it took effect."""
    if args.latency:
        return
    defaults = {"latency_sizes": list(LATENCY_SIZES), "latency_slates": LATENCY_SLATES,
                "latency_batch": list(LATENCY_BATCHES), "batch_size": THROUGHPUT_BATCH}
    given = ["--" + name.replace("_", "-") for name, default in defaults.items()
             if getattr(args, name) != default]
    if given:
        raise ValueError(f"{', '.join(given)}: for the latency decomposition, and no --latency "
                         f"is given; add --latency or drop {'it' if len(given) == 1 else 'them'}")


def run(args: argparse.Namespace) -> int:
    from spdrank.commands.named_rankers import fit_rankers, note_trained_on
    from spdrank.commands.ranker_args import (
        checked_inputs,
        coverage_notes,
        named_files,
        rankers_from_args,
    )
    from spdrank.compare.plots import require_matplotlib
    from spdrank.compare.report import (
        DECOMPOSITION_PLOT,
        QUALITY_PLOT,
        STAGES_PLOT,
        environment,
        table_metrics,
        write_report,
    )
    from spdrank.core.defaults import MAX_SETTINGS_BYTES
    from spdrank.core.files import check_outputs
    from spdrank.core.inputs import read_text
    from spdrank.core.slates import Placed, SlateError, iter_slates, load_slates, unique_qids
    from spdrank.eval.evaluate import evaluate, format_table
    from spdrank.eval.paired import compare

    slates_path, train, progress = checked_inputs(args)
    check_latency_flags(args)
    require_matplotlib()
    preamble = (read_text(args.preamble, "preamble", MAX_SETTINGS_BYTES) if args.preamble
                else None)
    out = Path(args.out) if args.out else RESULTS_ROOT / args.name
    check_outputs(
        {"--slates": slates_path, "--train": train, "--preamble": args.preamble,
         "--labels": named_files(args, "labels"), "--run": named_files(args, "run"),
         "--choose-on": args.choose_on},
        {"--out": [out / name for name in ("report.md", "results.json", "table.txt",
                                            QUALITY_PLOT, STAGES_PLOT, DECOMPOSITION_PLOT)]},
        models={"--model": model_folders(args.model)},
    )

    rankers = rankers_from_args(args)
    if not rankers:
        raise ValueError("no rankers: pass --ranker, --labels or --model")
    rows, spd_models = _decoder_rows(rankers, args.decoders)
    teachers = _teacher_names(rankers)
    timed_models = latency_models(spd_models, args.latency_sizes) if args.latency else []
    reference = _reference(rows, args.reference)
    note_trained_on(args.model, slates_path)
    fit_s = fit_rankers(rows, train, progress, scored=slates_path)

    # A qid twice would count its slate twice and narrow the paired intervals: refused, as eval does.
    placed = Placed(unique_qids(iter_slates(slates_path), allow_blank=True))
    stream = placed if args.limit is None else islice(placed, args.limit)
    t0 = time.perf_counter()
    with placed.naming():
        results = evaluate(rows, stream, warmup=args.warmup, progress=progress, total=args.limit)
    if results.n_slates == 0:
        raise SlateError(f"{slates_path} holds no slates")
    eval_s = time.perf_counter() - t0
    print(format_table(results))
    for line in coverage_notes(rows):
        log.warning(line)

    quality, fidelity = table_metrics(results)
    paired = (
        compare(results, reference, quality + fidelity, args.bootstrap, seed=args.seed)
        if reference is not None
        else None
    )

    latency = []
    t0 = time.perf_counter()
    if args.latency:
        from spdrank.compare.latency import decompose

        timed = load_slates(slates_path, limit=args.latency_slates)
        for model, sizes in timed_models:
            latency += decompose(
                model,
                timed,
                sizes,
                batch_size=args.batch_size,
                latency_batches=args.latency_batch,
                seed=args.seed,
                warmup=args.warmup,
                progress=progress,
            )
    results.meta.update(
        {
            "slates": str(slates_path),
            "train": str(train) if fit_s else None,
            "fit_s": fit_s,
            "eval_s": eval_s,
            "latency_s": time.perf_counter() - t0 if args.latency else None,
            "environment": environment(),
            "settings": {k: v for k, v in vars(args).items() if k not in ("func", "command")},
        }
    )
    report = write_report(
        out,
        results,
        teachers,
        latency,
        title=args.title or f"spdrank bench: {out.name}",
        paired=paired,
        preamble=preamble,
    )
    print(f"report: {report}")
    return 0


def latency_models(spd_models: list, sizes: list[int]) -> list[tuple[Any, list[int]]]:
    """The checkpoints ``--latency`` decomposes, each with the sizes it is timed at, checked
    before anything runs: those with a backbone (a features-only head has no prefill to
    decompose), at each size up to their K. A size no checkpoint can rank is an error, so a
    benchmark never ends without the figure it was asked for; one checkpoint's K below it
    only leaves that checkpoint out there (a K=64 student next to a K=160 one, or FIRST,
    whose single-letter identifiers stop at 52)."""
    from spdrank.compare.latency import check_sizes

    timed = []
    for model in spd_models:
        if model.config.features_only:
            log.info("%s reads features only: no prefill to decompose, left out of --latency", model.name)
            continue
        fits = [n for n in sizes if n <= model.config.head.positions]
        if fits != sizes:
            log.info(
                "%s ranks at most K=%d candidates: timed at N=%s only",
                model.name, model.config.head.positions, ",".join(map(str, fits)) or "none",
            )
        if fits:
            timed.append((model, fits))
    if not timed:
        raise ValueError("--latency decomposes SPD checkpoints that run a backbone: pass --model DIR")
    for n in sizes:
        if not any(n in fits for _, fits in timed):
            check_sizes(max((m for m, _ in timed), key=lambda m: m.config.head.positions), [n])
    return timed


def _decoder_rows(rankers: list[Any], decoders: list[str] | None) -> tuple[list[Any], list[Any]]:
    """The rankers with each SPD checkpoint replaced by its decoder rows (those named, else
    every decoder its method offers); and those checkpoints.

    Baselines, teachers and the sorting peers (FIRST, scalar) have no score matrix: one row each.
    """
    spd = [r for r in rankers if getattr(getattr(r, "method", None), "matrix", False)]
    if not spd:
        return list(rankers), []
    from spdrank.compare.decoders import decoder_rows

    rows: list[Any] = []
    for ranker in rankers:
        if any(ranker is m for m in spd):
            rows += decoder_rows(ranker, decoders or ranker.method.decoders())
        else:
            rows.append(ranker)
    return rows, spd


def _reference(rows: list[Any], requested: str | None) -> str | None:
    """The row the others are compared with: ``requested``, checked before anything is measured;
    by default the first SPD decoder row, else the first row; None when there is one row only."""
    from spdrank.commands.ranker_args import check_reference
    from spdrank.compare.decoders import DecodedRanker

    names = [r.name for r in rows]
    if requested is not None:
        return check_reference(names, requested)
    if len(rows) < 2:
        return None
    return next((r.name for r in rows if isinstance(r, DecodedRanker)), names[0])


def _teacher_names(rankers: list[Any]) -> list[str]:
    """The rows the speed-ups are measured against: the replayed teachers' label files."""
    from spdrank.teacher.replay import LabelReplayRanker

    return [r.name for r in rankers if isinstance(r, LabelReplayRanker)]
