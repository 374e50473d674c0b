"""``spdrank data queries``: training slates from a corpus alone, through synthetic queries.

    spdrank data queries --corpus corpus.jsonl --passages 5000 --out synth.jsonl
    spdrank data queries --corpus corpus.jsonl --passages 5000 --out synth.jsonl \\
        --generator openai --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-7B-Instruct

An LLM writes one query for each of N sampled passages (InPars' few-shot prompt); queries
whose passage BM25 does not find again in its top --keep-top over the whole corpus are
dropped, with the empty, cut-off and repeated ones; each kept query becomes a slate of BM25's
top --depth with its passage as the one judged relevant. The queries are journalled in
NAME.queries.jsonl beside --out as they are written, so a rerun resumes where a run stopped
(:mod:`spdrank.datasets.synthetic_queries`).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from spdrank.commands.argtypes import (
    add_trust_remote_code,
    int_at_least,
    positive_int,
    wait_seconds,
)
from spdrank.datasets.synthetic_queries import DROP_REASONS, QueryOptions

log = logging.getLogger(__name__)

GENERATORS = ("bundled", "hf", "openai")


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not 0.0 <= value <= 10.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be within [0, 10], got {text}")
    return value


def register(sub: Any) -> None:
    defaults = QueryOptions()
    p = sub.add_parser(
        "queries",
        help="training slates from a corpus alone: an LLM writes a query a passage (InPars)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--corpus", required=True, metavar="FILE",
                   help="passages: JSONL (BEIR's _id/title/text, pyserini's id/contents, MS "
                        "MARCO v2's docid/title/segment), TSV (docid<TAB>[title<TAB>]text), or a "
                        "retrieve-results JSON list (pyserini, rank_llm): its distinct passages")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the slates (JSONL, .gz too); the queries are journalled beside it in "
                        "NAME.queries.jsonl")
    p.add_argument("--passages", type=positive_int, default=defaults.passages, metavar="N",
                   help=f"passages to write a query for, a seeded sample (default "
                        f"{defaults.passages}; all when the corpus holds fewer); a larger N "
                        "later extends the same sample")
    p.add_argument("--seed", type=int, default=defaults.seed,
                   help="seed of the sample and of sampled decoding (default 0)")
    p.add_argument("--keep-top", type=positive_int, default=defaults.keep_top, metavar="K",
                   help="keep a query only when BM25 over the corpus ranks its passage in the "
                        f"top K (default {defaults.keep_top})")
    p.add_argument("--depth", type=positive_int, default=defaults.depth, metavar="N",
                   help=f"candidates a slate: BM25's top N (default {defaults.depth})")
    p.add_argument("--max-query-words", type=positive_int, default=defaults.max_query_words,
                   metavar="N", help="drop a query of more words (default "
                                     f"{defaults.max_query_words})")
    p.add_argument("--max-passage-words", type=positive_int,
                   default=defaults.max_passage_words, metavar="N",
                   help="a passage's first N words go into the prompt (default "
                        f"{defaults.max_passage_words})")
    p.add_argument("--max-failures", type=int_at_least(0), default=defaults.max_failures,
                   metavar="N", help="stop after N passages whose writer failed (0: never; "
                                     f"default {defaults.max_failures})")
    g = p.add_argument_group("the query writer")
    g.add_argument("--generator", choices=GENERATORS, default="bundled",
                   help="bundled: SmolLM2-135M-Instruct in-process (default); hf: any HF model "
                        "(--model); openai: an OpenAI-compatible server (--base-url, --model)")
    g.add_argument("--model", metavar="NAME",
                   help="hf: a model id or path; openai: the model the server is asked for")
    g.add_argument("--prompt", metavar="FILE",
                   help="few-shot examples as JSON: {name, instruction, examples: [{document, "
                        "query}]} (default: InPars' three MS MARCO examples, "
                        "spdrank/data/queries/inpars.json)")
    g.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N",
                   help="tokens a query may take; an answer cut there is dropped (default 32)")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                   help="0: greedy, as InPars (default); above 0: sampled, seeded by --seed")
    g.add_argument("--batch-size", type=positive_int, default=8, metavar="N",
                   help="bundled/hf: passages a generate call (default 8)")
    g.add_argument("--device", default="auto", metavar="D", help="bundled/hf: cpu, cuda or auto")
    g.add_argument("--dtype", default="auto", metavar="T",
                   help="bundled/hf: float32, bfloat16, float16 or auto")
    add_trust_remote_code(g)
    g.add_argument("--base-url", metavar="URL", action="append",
                   help="openai: the server's URL up to /v1; repeat for many servers")
    g.add_argument("--api-key", metavar="KEY", default=os.environ.get("OPENAI_API_KEY", "none"),
                   help="openai: the API key (default $OPENAI_API_KEY, else 'none')")
    g.add_argument("--concurrency", type=positive_int, default=8, metavar="N",
                   help="openai: requests in flight a server (default 8)")
    g.add_argument("--timeout", type=wait_seconds, default=120.0, metavar="S",
                   help="openai: seconds a request attempt, all of it (default 120)")
    g.add_argument("--retries", type=int_at_least(0), default=4, metavar="N",
                   help="openai: retries a request (default 4)")
    p.set_defaults(func=run)


def check_writer_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that only another writer reads (``--batch-size`` or ``--device`` with a
    server, ``--timeout`` with a local model), through the one table of unread flags
    (:func:`spdrank.core.unread.check_unread`), as ``spdrank teacher`` refuses its backends'."""
    from spdrank.commands.argtypes import flag_defaults
    from spdrank.core.unread import Unread, check_unread

    server = args.generator == "openai"
    local_only = "it applies to the local writers, --generator bundled and hf"
    server_only = "it applies to --generator openai"
    rows = (
        *(Unread(name, not server, local_only)
          for name in ("batch_size", "device", "dtype", "trust_remote_code")),
        *(Unread(name, server, server_only, shown=name != "api_key")
          for name in ("base_url", "api_key", "concurrency", "timeout", "retries")),
    )
    parsers = argparse.ArgumentParser().add_subparsers()
    register(parsers)
    check_unread(args, flag_defaults(parsers.choices["queries"], [r.name for r in rows]), rows,
                 log)


def make_writer(args: argparse.Namespace) -> Any:
    """The query writer the flags name; a flag of another writer is refused, by name
    (:func:`check_writer_flags`)."""
    check_writer_flags(args)
    if args.generator == "openai":
        if not args.base_url:
            raise ValueError("--generator openai needs --base-url URL (the server, up to /v1)")
        if not args.model:
            raise ValueError("--generator openai needs --model NAME (the model to ask for)")
        from spdrank.teacher.query_writers import OpenAIQueryWriter
        from spdrank.teacher.servers import collect_base_urls

        return OpenAIQueryWriter(
            collect_base_urls(args.base_url, None), args.model, args.api_key,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
            concurrency=args.concurrency, timeout_s=args.timeout, retries=args.retries,
        )
    if args.generator == "bundled" and args.model not in (None, "bundled"):
        raise ValueError(f"--model {args.model} needs --generator hf (bundled is SmolLM2)")
    if args.generator == "hf" and not args.model:
        raise ValueError("--generator hf needs --model (an HF model id or path)")
    from spdrank.teacher.query_writers import HFQueryWriter

    return HFQueryWriter(
        args.model or "bundled", batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, seed=args.seed, device=args.device, dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
    )


def run(args: argparse.Namespace) -> int:
    from spdrank.core.files import check_outputs, output_target
    from spdrank.core.progress import duration
    from spdrank.datasets.synthetic_queries import build_synthetic, journal_path, load_prompt

    # The journal's path is derived from --out's: beside a stream (/dev/stdout) it would be a
    # new file in /dev, and the next run, on another stream, would not find it.
    if output_target(args.out).stream:
        raise ValueError(f"--out {args.out}: the queries are journalled beside it as they are "
                         f"written ({journal_path(args.out).name}), so it must be a file, not "
                         "a stream")
    check_outputs({"--corpus": args.corpus, **({"--prompt": args.prompt} if args.prompt else {})},
                  {"--out": args.out, "--out's queries journal": journal_path(args.out)},
                  models={"--model": args.model if args.generator == "hf" else None})
    options = QueryOptions(
        passages=args.passages, seed=args.seed, keep_top=args.keep_top, depth=args.depth,
        max_query_words=args.max_query_words, max_passage_words=args.max_passage_words,
        max_failures=args.max_failures,
    )
    options.check()
    prompt = load_prompt(args.prompt)
    writer = make_writer(args)
    try:
        build = build_synthetic(args.corpus, args.out, writer, options, prompt)
    finally:
        writer.close()
    print(f"passages: {build.sampled} sampled of {build.corpus}")
    speed = (f" ({build.write_s / build.written:.2f} s a query, {duration(build.write_s)} in "
             f"all, {writer.name})" if build.written else "")
    print(f"queries: {build.written} written now{speed}, {build.reused} read from "
          f"{journal_path(args.out)}" + (f", {build.failed} failed" if build.failed else ""))
    if build.missing:
        print(f"{build.missing} sampled passages have no query yet"
              + (f" (first failure: {build.errors[0]})" if build.errors else "")
              + "; run the command again to write them: the slates are written once every "
                "sampled passage has its query")
        return 1
    answered = build.kept + sum(build.dropped.values())
    print(f"kept {build.kept} of {answered} queries ({build.kept / max(1, answered):.0%}); "
          "dropped: " + ", ".join(f"{r} {build.dropped.get(r, 0)}" for r in DROP_REASONS))
    print(f"wrote {build.slates} slates ({build.candidates} candidates, BM25's top "
          f"{args.depth}, the source passage judged relevant) -> {args.out}")
    for docid, query in build.examples[:3]:
        print(f"  e.g. {docid}: {query}")
    return 0
