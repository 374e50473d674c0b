"""``spdrank eval``: run rankers over the same slates and print one results table.

    spdrank eval --slates eval.jsonl [--train train.jsonl] --ranker random --ranker popularity \\
        --ranker cooccurrence --ranker title_similarity [--limit N] [--k 1,5,10,20] \\
        [--reference popularity] [--json out.json] [--per-slate rows.jsonl]

Rankers that learn statistics (popularity, co-occurrence) are fitted on ``--train``, which
defaults to ``train.jsonl`` (or ``train.jsonl.gz``) beside the ``--slates`` file, and on the
sequences of users who make no slate (``extra_sequences.txt`` beside it); a feature
ranker (``title_similarity``, ``feature:NAME``) reads the slates' own features and needs no
training file. No torch is imported here: model-backed rankers are built inside
:func:`spdrank.commands.named_rankers.build_rankers` on demand.

``--reference ROW`` pairs every other row with that one slate by slate, on every metric the
table shows: the mean difference and its 95% bootstrap interval, computed by
:func:`spdrank.eval.paired.compare` as ``spdrank bench`` computes them, printed under the table
and written to ``--json`` under ``paired``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spdrank.commands.argtypes import int_at_least
from spdrank.commands.rank import add_prompt_argument
from spdrank.commands.ranker_args import (
    add_paired_arguments,
    add_ranker_arguments,
    check_reference,
    check_seed,
    checked_inputs,
    coverage_notes,
    named_files,
    rankers_from_args,
)
from spdrank.core.ranking import Ranker, Ranking
from spdrank.eval.judged import DEFAULT_REL_LEVEL
from spdrank.eval.paired import RESAMPLES

if TYPE_CHECKING:
    import numpy as np

    from spdrank.core.slates import Slate
    from spdrank.eval.evaluate import Results
    from spdrank.eval.paired import PairedComparison
    from spdrank.model.ranker import SPDRanker
    from spdrank.rankers.windows import WindowedRanker

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
    add_paired_arguments(
        p, "printed under the table and written to --json under 'paired', as `spdrank bench` "
        "computes them; ROW is a row's name as the table shows it (a --ranker, a --model, "
        "--run or --labels NAME); without it, none",
    )
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
        "--qrels",
        metavar="FILE",
        help="graded judgements (TREC qrels 'qid iter docid grade', BEIR's 'query-id corpus-id "
        "score' TSV, or JSON {qid: {docid: grade}}) to score against, by qid, in place of the "
        "slates' own relevance; a slate whose qid they lack is not judged",
    )
    p.add_argument(
        "--trec-dir",
        metavar="DIR",
        help="also write each ranker's ranking as a TREC run, DIR/<ranker>.trec (scores "
        "strictly decreasing along the ranking, so trec_eval reads its order)",
    )
    p.add_argument(
        "--rel-level",
        type=int_at_least(1),
        default=DEFAULT_REL_LEVEL,
        metavar="L",
        help="for slates with graded judgements (relevance): the grade from which a document "
        "counts as relevant in AP, R@k, RR and P@k, as trec_eval's -l (default "
        f"{DEFAULT_REL_LEVEL}; TREC DL's passage task uses 2); nDCG@k reads the grades",
    )
    p.add_argument(
        "--extra-sequences",
        metavar="FILE",
        help="more interaction sequences ('user item item ...') for the rankers that count "
        "(popularity, co-occurrence), beside the training slates: users who make no slate "
        "(default: extra_sequences.txt beside --train, which `spdrank data --candidate-file` "
        "writes for users without a list)",
    )
    add_prompt_argument(p)
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


# -- command --------------------------------------------------------------------------------


def is_trained(ranker: Ranker) -> bool:
    """Whether the ranker is a trained checkpoint (run over sliding windows or not), known by
    its config, so that no torch is imported to tell."""
    return hasattr(getattr(getattr(ranker, "inner", ranker), "config", None), "head")


def trained_models(rankers: list[Ranker]) -> list[Ranker]:
    """The trained checkpoints among the rankers."""
    return [r for r in rankers if is_trained(r)]


class CheckedModel:
    """A trained model's row: it checks each slate before it is ranked, as ``spdrank rank``
    does, and ranks that slate with the features its check normalised, so that they are
    normalised once rather than again by every ``rank`` call (warm-up ones too).

    ``ranker`` is the model, or the :class:`~spdrank.rankers.windows.WindowedRanker` that runs
    it over sliding windows; the row keeps its name.
    """

    needs_train = False

    def __init__(self, ranker: Ranker) -> None:
        self.name = ranker.name
        self.model: SPDRanker = getattr(ranker, "inner", ranker)
        self.windowed: WindowedRanker | None = ranker if hasattr(ranker, "windows") else None
        #: The slate last checked, and the normalised features its check returned.
        self.checked: tuple[Slate, np.ndarray | None] | None = None
        from spdrank.core.features import FeatureDrift

        #: The slates checked whose features lie beyond every training value.
        self.drift = FeatureDrift()

    def fit(self, train: object) -> None:
        """Nothing to learn: the model is trained."""

    def check(self, slate: Slate, where: str) -> None:
        """Refuse a slate the model cannot rank (naming ``where``), keeping its features."""
        from spdrank.commands.rank import checked_features

        features = checked_features(self.model, slate, where, self.windowed is not None)
        self.drift.add(self.model.features, features, slate, where)
        self.checked = (slate, features)

    def forget_warmup(self) -> None:
        """Forget what the untimed warm-up ranks cut, so the cuts said count each slate of
        the evaluation once."""
        from spdrank.backbone.prompt import Cuts

        self.model.cuts = Cuts()

    def rank(self, slate: Slate) -> Ranking:
        """``slate`` ranked with the features its check returned; a slate not checked here
        is ranked as the model ranks any, normalising its own."""
        from spdrank.commands.rank import rank_checked

        features = self.checked[1] if self.checked and self.checked[0] is slate else None
        return rank_checked(self.model, self.windowed, [(slate, features)])[0]


def checked_models(rankers: list[Ranker]) -> list[Ranker]:
    """The rankers, each trained model's row a :class:`CheckedModel` of it, in their order."""
    return [CheckedModel(r) if is_trained(r) else r for r in rankers]


def checked_slates(path: Path, rankers: list[Ranker]) -> Iterator[tuple[str, Slate]]:
    """The file's ``(file:line, slate)``, a repeated qid refused, each slate checked with its
    place by every :class:`CheckedModel` among ``rankers`` (K, features: the checks ``spdrank
    rank`` and the server make), which keeps the slate's features for ranking it next."""
    from spdrank.core.outputs import RANKED_MARK
    from spdrank.core.slates import iter_slates, unique_qids

    models = [r for r in rankers if isinstance(r, CheckedModel)]
    said = False
    for where, slate in unique_qids(iter_slates(path), allow_blank=True):
        if not said and RANKED_MARK in slate.extra:
            said = True
            log.warning("%s holds spdrank rank's output (timings_ms): each candidate's score is "
                        "the ranking model's, not the first stage's, so what reads the feature "
                        "score (retriever, feature:score, a model trained on it) reads that "
                        "model's ranking; score the slates rank read, with --model", where)
        for model in models:
            model.check(slate, where)
        yield where, slate


def with_first_stage(rankers: list[Ranker]) -> list[Ranker]:
    """The rankers, plus the candidates' given order when a model reranks a first stage's
    list (it is anchored to that order, or reads search prompts) and no row stands for that
    stage: a reranker is judged against the order it was given."""
    from spdrank.eval.first_stage import FIRST_STAGE, GivenOrder

    if any(r.name in FIRST_STAGE for r in rankers):
        return rankers
    for ranker in trained_models(rankers):
        if getattr(ranker, "inner", ranker).config.reranks_first_stage:
            log.info("eval: the candidates' given order (%s) added as the first stage's row",
                     GivenOrder.name)
            return [*rankers, GivenOrder()]
    return rankers


def read_inputs(ranker: Ranker) -> list[str]:
    """The rows of the rankers a trained model reads: ``feature:NAME`` for each feature."""
    config = getattr(getattr(ranker, "inner", ranker), "config", None)
    features = getattr(config, "features", None)
    return [f"feature:{name}" for name in features.names] if features is not None else []


def with_inputs(rankers: list[Ranker]) -> list[Ranker]:
    """The rankers, plus a ``feature:NAME`` row for each feature a trained model reads that
    no row ranks by yet: a student is judged beside every ranker it reads, since a team that
    hands it a dense cosine already runs that ranker."""
    from spdrank.rankers.baselines import FeatureRanker

    have = {r.name for r in rankers}
    added = []
    for ranker in trained_models(rankers):
        for name in read_inputs(ranker):
            if name not in have:
                have.add(name)
                added.append(FeatureRanker(name.split(":", 1)[1]))
    if added:
        log.info("eval: %s added, the rankers the students read",
                 ", ".join(r.name for r in added))
    return [*rankers, *added]


def without_training(rankers: list[Ranker], train: Path) -> list[Ranker]:
    """The default rankers that need no training file, when ``train`` (the default one,
    beside the slates) does not exist: those that do are left out with a note, as a default
    set should run on what it is given. A ranker the user named still needs its file."""
    if train.exists():
        return rankers
    skipped = [r.name for r in rankers if getattr(r, "needs_train", False)]
    if skipped:
        log.warning("skipped %s: they fit on training slates and %s does not exist (pass "
                    "--train FILE)", ", ".join(skipped), train)
    return [r for r in rankers if not getattr(r, "needs_train", False)]


def slate_total(path: Path, limit: int | None) -> int | None:
    """How many slates the evaluation ranks, for its progress and time left: a plain file's
    non-blank lines (read without parsing, a fraction of the evaluation's own read), or
    ``limit`` for a gzipped one, whose count would cost a decompression."""
    from spdrank.core.files import gzipped, iter_lines

    if gzipped(path):
        return limit
    count = sum(1 for _ in iter_lines(path, "slate file"))
    return count if limit is None else min(count, limit)


def with_judgements(stream: Iterable[Slate], qrels: dict[str, dict[str, int]]) -> Iterator[Slate]:
    """The slates, each judged by the qrels of its qid (none when they lack it)."""
    for slate in stream:
        slate.relevance = qrels.get(slate.query.qid)
        yield slate


def unused_notes(
    args: argparse.Namespace,
    rankers: list[Ranker],
    results: Results,
    qrels: dict[str, dict[str, int]] | None,
    fitted: bool,
) -> list[str]:
    """One line for each input or flag the evaluation did not use: the ``--qrels`` queries
    and slates that did not meet, the candidates a ``--run`` did not rank, a ``--train`` (or
    ``--extra-sequences``) no ranker fitted on, a ``--rel-level`` with no judgement to read.
    A gap that goes unsaid reads as a result: a run of another collection scores as the
    candidates' given order."""
    from spdrank.eval.judged import unused_judgements

    lines = []
    if qrels is not None:
        qids = [record.qid for record in results.rankers[0].records]
        lines += unused_judgements(qrels, qids, f"--qrels {args.qrels}")
    lines += coverage_notes(rankers)
    given = [f"{flag} {value}" for flag, value in (
        ("--train", args.train), ("--extra-sequences", args.extra_sequences)) if value]
    if given and not fitted:
        lines.append(f"{' and '.join(given)}: not read, as no ranker here fits on training "
                     "slates")
    if args.rel_level != DEFAULT_REL_LEVEL and not results.n_judged:
        lines.append(f"--rel-level {args.rel_level}: not read, as no slate evaluated has "
                     "judgements (--qrels, or the slates' 'relevance')")
    return lines


def compare_rows(
    results: Results, reference: str | None, resamples: int, seed: int
) -> PairedComparison | None:
    """``--reference``: every other row against it on every metric the table shows, paired by
    slate, as ``spdrank bench`` pairs its rows (:func:`spdrank.eval.paired.compare`, the same
    resamples and seed); None without a reference."""
    from spdrank.eval.evaluate import shown_metrics
    from spdrank.eval.paired import compare

    if reference is None:
        return None
    return compare(results, reference, shown_metrics(results), resamples, seed=seed)


def run_tag(name: str) -> str:
    """A ranker's name as a TREC run's tag and file name: what neither can hold becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def trec_paths(folder: str | Path, names: Iterable[str]) -> dict[str, Path]:
    """Each ranker's run file, ``folder/<tag>.trec`` by name. Two names with one tag (``a b``
    and ``a_b``), or tags that differ in case alone (one file where names fold case), would
    write one file twice, as would one name given twice: refused, naming both."""
    paths: dict[str, Path] = {}
    owners: dict[str, str] = {}
    for name in names:
        tag = run_tag(name)
        if tag.casefold() in owners:
            other = owners[tag.casefold()]
            raise ValueError(
                f"--trec-dir: rankers {other!r} and {name!r} would both write "
                f"{Path(folder) / (tag + '.trec')}; name one otherwise (NAME=...)"
            )
        owners[tag.casefold()] = name
        paths[name] = Path(folder) / f"{tag}.trec"
    return paths


def trec_writers(
    stack: contextlib.ExitStack, paths: dict[str, Path]
) -> Callable[[Ranker, Slate, Ranking], None]:
    """One TREC run file a ranker, at the path :func:`trec_paths` gave it (written atomically,
    so a failed evaluation replaces none), and the callback that writes each ranking to it."""
    from spdrank.core.files import atomic_writer
    from spdrank.core.outputs import write_trec_lines

    files = {
        name: (stack.enter_context(atomic_writer(path)), run_tag(name))
        for name, path in paths.items()
    }

    def write(ranker: Ranker, slate: Slate, ranking: Ranking) -> None:
        fh, tag = files[ranker.name]
        write_trec_lines(fh, slate, ranking, tag)

    return write


def run(args: argparse.Namespace) -> int:
    from spdrank.commands.argtypes import model_folders, prompt_file
    from spdrank.commands.named_rankers import fit_rankers, note_trained_on, split_named
    from spdrank.commands.rank import check_prompt
    from spdrank.core.files import atomic_writer, check_outputs
    from spdrank.core.slates import Placed, SlateError
    from spdrank.core.trec import read_qrels
    from spdrank.eval.evaluate import evaluate, format_table, write_per_slate
    from spdrank.eval.paired import format_paired

    slates_path, train, progress = checked_inputs(args)
    inputs = {
        "--slates": slates_path, "--train": train, "--extra-sequences": args.extra_sequences,
        "--labels": named_files(args, "labels"), "--run": named_files(args, "run"),
        "--qrels": args.qrels, "--prompt": prompt_file(args.prompt), "--choose-on": args.choose_on,
    }
    outputs = {"--json": args.json, "--per-slate": args.per_slate}
    models = {"--model": model_folders(args.model)}
    check_outputs(inputs, outputs, models=models)

    for spec in args.model or ():  # before any model loads
        check_prompt(split_named(spec)[1], args.prompt)
    rankers = rankers_from_args(args)
    if not args.ranker and not args.train:
        rankers = without_training(rankers, train)
    if not rankers:
        raise ValueError("no rankers: pass --ranker NAME (repeatable)")
    rankers = with_inputs(with_first_stage(rankers))
    check_seed(args, [r.name for r in rankers])
    if args.reference is not None:
        check_reference([r.name for r in rankers], args.reference)
    elif args.bootstrap != RESAMPLES:
        raise ValueError("--bootstrap: resamples of the paired intervals, and no --reference "
                         "is given; add --reference ROW or drop it")
    # A run file a ranker, named once the rankers are: each checked as the other outputs were.
    run_files = trec_paths(args.trec_dir, [r.name for r in rankers]) if args.trec_dir else {}
    check_outputs(inputs, {**outputs, "--trec-dir": list(run_files.values())}, models=models)
    extra = Path(args.extra_sequences) if args.extra_sequences else None
    note_trained_on(args.model, slates_path)
    fit_s = fit_rankers(rankers, train, progress, extra, scored=slates_path)

    rows = checked_models(rankers)
    placed = Placed(checked_slates(slates_path, rows))
    stream: Iterator[Slate] = placed
    qrels = read_qrels(args.qrels) if args.qrels else None
    if qrels is not None:
        stream = with_judgements(stream, qrels)
    if args.limit is not None:
        stream = islice(stream, args.limit)
    total = slate_total(slates_path, args.limit)
    log.info("eval: %s slates, %d ranker%s (%s)", f"{total:,}" if total is not None else "the",
             len(rankers), "" if len(rankers) == 1 else "s", ", ".join(r.name for r in rankers))
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        runs = trec_writers(stack, run_files) if run_files else None
        stack.enter_context(placed.naming())
        results = evaluate(
            rows, stream, ks=args.k, mrr_ks=args.k, warmup=args.warmup, progress=progress,
            total=total, rel=args.rel_level, observe=runs,
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
    paired = compare_rows(results, args.reference, args.bootstrap, args.seed)
    if paired is not None:
        print()
        print(format_paired(paired))
    for line in unused_notes(args, rankers, results, qrels, bool(fit_s)):
        log.warning(line)
    from spdrank.eval.first_stage import input_verdicts, results_verdicts

    verdicts = results_verdicts(results, [r.name for r in trained_models(rankers)])
    for found in verdicts:
        print(found.line())
    results.meta["first_stage"] = [found.__dict__ | {"below": found.below} for found in verdicts]
    beside = [found for r in trained_models(rankers)
              for found in input_verdicts(results, r.name, read_inputs(r))]
    for found in beside:
        print(found.line())
    results.meta["inputs"] = [found.__dict__ | {"below": found.below} for found in beside]
    for ranker in rankers:
        model = getattr(ranker, "inner", ranker)
        cuts = getattr(model, "cuts", None)
        if cuts is not None and cuts.queries:
            print(f"{ranker.name}: {cuts.summary(model.config.prompt.max_item_tokens)}")
    for row in rows:
        drift = getattr(row, "drift", None)
        if drift is not None and drift.summary():
            log.warning("%s: %s", row.name, drift.summary())
    if args.json:
        with atomic_writer(args.json) as fh:
            out = results.to_dict()
            if paired is not None:
                out["paired"] = paired.to_dict()
            json.dump(out, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        log.info("wrote %s", args.json)
    if args.per_slate:
        n = write_per_slate(results, args.per_slate)
        log.info("wrote %d per-slate rows to %s", n, args.per_slate)
    return 0
