"""``spdrank rank``: rank slates with a trained SPD model."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from tqdm.auto import tqdm


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rank", help="rank slates with a trained model", description=__doc__)
    p.add_argument("--model", required=True, help="checkpoint directory (or a training run's OUT)")
    p.add_argument("--input", required=True, help="slates to rank (JSONL, .gz too)")
    p.add_argument("--output", required=True, help="ranked results (JSONL, rank_llm style)")
    p.add_argument("--trec", help="also write a TREC run file here")
    p.add_argument("--tag", default="spdrank", help="run tag for the TREC file")
    p.add_argument("--batch-size", type=int, default=1, help="slates per prefill")
    p.add_argument("--decoder", help="override the model's decoder (hungarian, greedy, ...)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from spdrank.backbone import resolve_device
    from spdrank.model import SPDRanker
    from spdrank.results import result_record, write_trec_lines
    from spdrank.slates import atomic_writer, batched, read_slates

    if args.batch_size < 1:
        raise ValueError("--batch-size must be at least 1")
    model = SPDRanker.from_pretrained(args.model, device=resolve_device(args.device))
    n = 0
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_writer(args.output))
        trec = stack.enter_context(atomic_writer(args.trec)) if args.trec else None
        bar = stack.enter_context(tqdm(desc="rank", unit="slate", file=sys.stderr))
        for batch in batched(read_slates(args.input), args.batch_size):
            for slate, ranking in zip(batch, model.rank_batch(batch, decoder=args.decoder)):
                out.write(json.dumps(result_record(slate, ranking), ensure_ascii=False) + "\n")
                if trec is not None:
                    write_trec_lines(trec, slate, ranking, args.tag)
                n += 1
            bar.update(len(batch))
    print(f"ranked {n} slates -> {args.output}" + (f" (TREC run: {args.trec})" if args.trec else ""))
    return 0
