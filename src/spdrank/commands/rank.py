"""``spdrank rank``: rank slates with a trained SPD model."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from spdrank.core.features import FeatureDrift
    from spdrank.core.ranking import Ranking
    from spdrank.core.slates import Slate
    from spdrank.model.ranker import SPDRanker
    from spdrank.rankers.windows import WindowedRanker

#: The tag of a TREC run ``--trec`` writes, unless ``--tag`` names another.
DEFAULT_TAG = "spdrank"


def register(sub: argparse._SubParsersAction) -> None:
    from spdrank.commands.argtypes import (
        add_dtype_argument,
        add_trust_remote_code,
        add_window_arguments,
    )

    p = sub.add_parser("rank", help="rank slates with a trained model", description=__doc__)
    p.add_argument("--model", required=True, help="checkpoint directory (or a training run's OUT)")
    p.add_argument("--input", required=True, help="slates to rank (JSONL, .gz too)")
    p.add_argument("--output", required=True, help="ranked results (JSONL, rank_llm style)")
    p.add_argument("--trec", help="also write a TREC run file here")
    p.add_argument("--tag", help=f"with --trec: the run's tag (default: {DEFAULT_TAG})")
    p.add_argument("--batch-size", type=int, default=1, help="slates per prefill")
    p.add_argument("--decoder", help="override the model's decoder (hungarian, greedy, ...)")
    add_dtype_argument(p)
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    add_window_arguments(p)
    add_prompt_argument(p)
    add_trust_remote_code(p)
    p.set_defaults(func=run)


def add_prompt_argument(p: argparse.ArgumentParser) -> None:
    """``--prompt`` where a checkpoint ranks (rank, eval, serve): a check, never a choice."""
    from spdrank.backbone.templates import MODEL_PROMPT_HELP

    p.add_argument("--prompt", metavar="NAME|FILE", help=MODEL_PROMPT_HELP)


def check_prompt(model: str, asked: str | None) -> None:
    """Refuse ``--prompt`` naming another template than the checkpoint ``model``'s, before
    the model loads: a model always ranks with the template it was trained on."""
    if asked is None:
        return
    from spdrank.backbone.templates import check_model_template
    from spdrank.model.checkpoint import CONFIG_NAME, checkpoint_dir, read_config

    config = read_config(checkpoint_dir(model) / CONFIG_NAME)
    check_model_template(config.prompt.template, asked, model)


def run(args: argparse.Namespace) -> int:
    from spdrank.backbone.load import resolve_device
    from spdrank.commands.argtypes import model_folders, prompt_file, windows_from_args
    from spdrank.core.features import FeatureDrift
    from spdrank.core.files import atomic_writer, check_outputs, output_target
    from spdrank.core.outputs import result_record, write_trec_lines
    from spdrank.core.progress import Progress
    from spdrank.core.slates import SlateError, batched
    from spdrank.model.ranker import SPDRanker

    if args.batch_size < 1:
        raise ValueError("--batch-size must be at least 1")
    check_unread(args)
    windows = windows_from_args(args)
    check_outputs({"--input": args.input, "--prompt": prompt_file(args.prompt)},
                  {"--output": args.output, "--trec": args.trec},
                  models={"--model": model_folders(args.model)})
    check_prompt(args.model, args.prompt)
    model = SPDRanker.from_pretrained(
        args.model, device=resolve_device(args.device), dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
    )
    windowed = None
    if windows is not None:
        from spdrank.rankers.windows import WindowedRanker

        windowed = WindowedRanker(model, windows, args.decoder)
    n = 0
    drift = FeatureDrift()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_writer(args.output))
        trec = stack.enter_context(atomic_writer(args.trec)) if args.trec else None
        bar = Progress("rank", unit="slate")
        stack.callback(bar.close)
        located = checked_slates(args, model, windows is not None, drift)
        for checked in batched(located, args.batch_size):
            batch = [slate for slate, _ in checked]
            rankings = rank_checked(model, windowed, checked, args.decoder)
            for slate, ranking in zip(batch, rankings):
                record = result_record(slate, ranking)
                out.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
                if trec is not None:
                    write_trec_lines(trec, slate, ranking, args.tag or DEFAULT_TAG)
                n += 1
            bar.update(len(batch))
        if n == 0:  # raised inside the writers, so no empty output replaces anything
            raise SlateError(f"{args.input} holds no slates: nothing to rank")
    # Beside results sent to a stream (/dev/stdout), the summary goes to stderr: a pipe reading
    # the results gets JSONL only.
    streamed = any(output_target(p).stream for p in (args.output, args.trec) if p)
    print(f"ranked {n} slates -> {args.output}" + (f" (TREC run: {args.trec})" if args.trec else ""),
          file=sys.stderr if streamed else sys.stdout)
    # What a user must know: the candidates cut to the token budget (the model counts them as
    # it encodes; a features-only model reads no text, so there is nothing to cut) and, with
    # windows, the prefills spent (a candidate in several windows counts once per window it
    # was cut in).
    notes = [] if model.config.features_only else [
        model.cuts.summary(model.config.prompt.max_item_tokens)]
    if windowed is not None:
        notes.append(windowed.summary())
    if drift.summary():
        notes.append(drift.summary())
    if notes:
        print("; ".join(notes), file=sys.stderr if streamed else sys.stdout)
    return 0


def check_unread(args: argparse.Namespace) -> None:
    """Refuse a flag this run would not read, saying what would make it count: a flag given
    and silently ignored leaves its user believing it took effect."""
    if args.tag is not None and not args.trec:
        raise ValueError("--tag names the run --trec writes, and no --trec is given: add "
                         "--trec FILE or drop --tag")
    if args.batch_size > 1 and args.window is not None:
        raise ValueError(f"--batch-size {args.batch_size} has no effect with --window: each "
                         "window is ranked in a prefill of its own; drop --batch-size")


def checked_slates(
    args: argparse.Namespace, model: Any, windowed: bool = False,
    drift: FeatureDrift | None = None,
) -> Iterator[tuple[Slate, Any]]:
    """The input's slates, each checked, with its ``file:line``, against what the model ranks
    (the server's checks: K unless ranked by windows, features) and, with ``--trec``, what a
    run line can carry; each with the normalised features its check returned.

    A repeated qid is refused (the outputs are keyed by it); slates without a qid are not.
    """
    from spdrank.core.outputs import check_trec_ids
    from spdrank.core.slates import iter_slates, unique_qids

    located = unique_qids(iter_slates(args.input, model.config.text_fields), allow_blank=True)
    for where, slate in located:
        features = checked_features(model, slate, where, windowed)
        if drift is not None:
            drift.add(model.features, features, slate, where)
        if args.trec:
            check_trec_ids(slate, where)
        yield slate, features


def checked_features(
    model: SPDRanker, slate: Slate, where: str | None, windowed: bool = False
) -> np.ndarray | None:
    """The model's check of ``slate`` (``where`` names its line), K waived when it is ranked by
    windows (they take a slate of any size): the slate's normalised features, which its
    ranking then takes as they are rather than normalising them again."""
    return model.check(slate, where, len(slate) if windowed else None)


def rank_checked(
    model: SPDRanker,
    windowed: WindowedRanker | None,
    checked: Sequence[tuple[Slate, np.ndarray | None]],
    decoder: str | None = None,
) -> list[Ranking]:
    """Each checked slate ranked with the features its check returned: together in one
    prefill, or one by one over ``windowed``'s windows when given."""
    if windowed is None:
        slates = [slate for slate, _ in checked]
        return model.rank_batch(slates, decoder=decoder, features=[f for _, f in checked])
    return [windowed.rank(slate, features=features) for slate, features in checked]
