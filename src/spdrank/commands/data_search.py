"""``spdrank data search``: search slates from a first-stage run and its judgements.

    spdrank data search --retrieved retrieve_results.json --qrels qrels.txt --out dl19.jsonl
    spdrank data search --run bm25.trec --topics queries.tsv --corpus corpus.jsonl \\
        --qrels qrels.txt --out dl19.jsonl
    spdrank data windows --slates labelled.jsonl --window 20 --stride 10 --out train.jsonl

One slate a query, in the run's order, with its graded judgements as ``relevance``
(:mod:`spdrank.datasets.search`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from spdrank.commands.argtypes import int_at_least, positive_int
from spdrank.core.defaults import MAX_SUBSETS
from spdrank.eval.judged import DEFAULT_REL_LEVEL

if TYPE_CHECKING:
    from spdrank.core.slates import Slate

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "search",
        help="search slates from a retrieve-results JSON or a TREC run, with qrels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--retrieved", metavar="FILE",
                   help="retrieve results with passage texts: the JSON list pyserini, RankGPT "
                        "and rank_llm write ({query, hits: [{qid, docid, content, rank, "
                        "score}]}), or JSONL of such objects")
    p.add_argument("--run", metavar="FILE",
                   help="a TREC run (qid Q0 docid rank score tag); needs --topics and --corpus")
    p.add_argument("--topics", metavar="FILE",
                   help="query texts: TSV (qid<TAB>text) or JSONL (BEIR's _id/text, or "
                        "qid/query)")
    p.add_argument("--corpus", metavar="FILE",
                   help="passages: JSONL (BEIR's _id/title/text, pyserini's id/contents, MS "
                        "MARCO v2's docid/title/segment) or TSV (docid<TAB>[title<TAB>]text)")
    p.add_argument("--qrels", metavar="FILE",
                   help="graded judgements: TREC qrels (qid iter docid grade), BEIR's "
                        "qrels TSV (query-id corpus-id score) or JSON {qid: {docid: grade}}; "
                        "every judgement of a query goes into its slate, judged passages "
                        "outside the run included")
    p.add_argument("--depth", type=positive_int, metavar="N",
                   help="keep each query's first N hits (default: all)")
    p.add_argument("--rel-level", type=int_at_least(1), default=DEFAULT_REL_LEVEL, metavar="L",
                   help="the grade from which a passage counts as relevant, for the summary "
                        f"of queries without one (default {DEFAULT_REL_LEVEL}, as trec_eval)")
    p.add_argument("--out", required=True, metavar="FILE", help="the slates (JSONL, .gz too)")
    p.set_defaults(func=run)

    w = sub.add_parser(
        "windows",
        help="cut labelled slates into windows a student of K candidates trains on",
        description="Cut each slate into the sliding windows a student ranks it by (bottom-up "
        "over its order, RankGPT's scheme) plus random subsets, each with its teacher ranking, "
        "scores and clicks restricted to it and its judgements kept: training slates for a "
        "model whose K is the window.",
    )
    w.add_argument("--slates", required=True, metavar="FILE", help="labelled slates (JSONL)")
    w.add_argument("--window", type=int_at_least(2), default=20, metavar="W",
                   help="candidates a window (default 20, RankGPT's)")
    w.add_argument("--stride", type=positive_int, default=10, metavar="S",
                   help="how far each window moves up (default 10)")
    w.add_argument("--subsets", type=int_at_least(0), default=0, metavar="N",
                   help="also N random subsets of W candidates a slate, none twice and none a "
                        "sliding window (all there are when a slate has fewer; at most "
                        f"{MAX_SUBSETS:,}; default 0)")
    w.add_argument("--seed", type=int, default=0, help="seed of the subsets (default 0)")
    w.add_argument("--relevant-only", action="store_true",
                   help="write only the windows that hold a passage graded above 0 in the "
                        "slate's judgements, the windows `train --target relevance` (and "
                        "teacher+relevance) can learn from (default: every window, as --target "
                        "teacher trains on each; the count of those without one is said)")
    w.add_argument("--out", required=True, metavar="FILE", help="the windows (JSONL, .gz too)")
    w.set_defaults(func=run_windows)


def run_windows(args: argparse.Namespace) -> int:
    from spdrank.core.files import check_outputs
    from spdrank.core.slates import read_unique_slates, write_slates
    from spdrank.datasets.search import subsets_allowed, training_windows
    from spdrank.training.targets import has_relevant_candidate

    check_outputs({"--slates": args.slates}, {"--out": args.out})
    if args.stride > args.window:
        raise ValueError(f"--stride ({args.stride}) must not exceed --window ({args.window})")
    if args.subsets > MAX_SUBSETS:
        raise ValueError(f"--subsets {args.subsets:,} is over {MAX_SUBSETS:,}, the most one "
                         "slate is cut into")
    fewer: list[str] = []  # slates with fewer distinct subsets than asked
    whole: list[str] = []  # slates within one window, kept whole
    unjudged = [0, 0]  # windows without a passage graded above 0; of how many judged ones

    def windows() -> Iterator[Slate]:
        """Each slate's windows, streamed to the output as they are cut; with
        ``--relevant-only``, those a relevance target can learn from. Nothing to write is
        refused here, inside the writer, so no empty file replaces anything."""
        written = slates = 0
        for slate in read_unique_slates(args.slates):
            slates += 1
            n = len(slate)
            if n <= args.window:
                whole.append(slate.query.qid)
            elif subsets_allowed(n, args.window, args.stride) < args.subsets:
                fewer.append(slate.query.qid)
            judged = slate.relevance is not None or args.relevant_only
            for window in training_windows(slate, args.window, args.stride, args.subsets,
                                           args.seed):
                unjudged[1] += judged  # a slate without judgements is no relevance target's
                if judged and not has_relevant_candidate(window):
                    unjudged[0] += 1
                    if args.relevant_only:
                        continue
                written += 1
                yield window
        if not written:
            why = (f"none of its {slates:,} slates' windows holds a passage graded above 0 "
                   "(--relevant-only: do the slates carry judgements, 'relevance'?)"
                   if slates else "it holds no slate")
            raise ValueError(f"{args.slates}: no window to write: {why}")

    n = write_slates(args.out, windows())
    print(f"wrote {n} windows -> {args.out}")
    without, cut = unjudged
    if args.relevant_only:
        print(f"left out {without} of {cut} windows without a passage graded above 0 "
              "(--relevant-only)")
    elif without:
        print(f"{without} of {cut} windows hold no passage graded above 0: `train --target "
              "relevance` cannot learn from them (--relevant-only leaves them out)")
    if whole:
        subsets = f" and no --subsets {args.subsets}" if args.subsets else ""
        print(f"{len(whole)} slates hold at most --window {args.window} candidates: each "
              f"written whole, one window{subsets}, e.g. {whole[:3]}")
    if fewer:
        print(f"{len(fewer)} slates have fewer than --subsets {args.subsets} subsets of "
              f"{args.window} besides their windows, and gave all they have, e.g. {fewer[:3]}")
    return 0


def check_search_flags(args: argparse.Namespace) -> None:
    """Refuse the flags this build would not read, saying what would make them count: texts
    come with --retrieved's hits, and grades only from --qrels."""
    if args.retrieved and (args.topics or args.corpus):
        given = [f for f, v in (("--topics", args.topics), ("--corpus", args.corpus)) if v]
        raise ValueError(f"{' and '.join(given)}: texts for --run's ids, and --retrieved's hits "
                         f"carry their own; drop {'it' if len(given) == 1 else 'them'}")
    if args.rel_level != DEFAULT_REL_LEVEL and not args.qrels:
        raise ValueError(f"--rel-level {args.rel_level} counts the queries --qrels judges with "
                         "no relevant passage, and no --qrels is given; add it or drop "
                         "--rel-level")


def run(args: argparse.Namespace) -> int:
    from spdrank.core.files import check_outputs
    from spdrank.core.slates import write_slates
    from spdrank.core.trec import read_qrels
    from spdrank.datasets.search import slates_from_retrieve_results, slates_from_run, summarize
    from spdrank.eval.judged import unused_judgements

    check_outputs(
        {f"--{name}": getattr(args, name)
         for name in ("retrieved", "run", "topics", "corpus", "qrels") if getattr(args, name)},
        {"--out": args.out},
    )
    if bool(args.retrieved) == bool(args.run):
        raise ValueError("give one of --retrieved FILE or --run FILE (with --topics, --corpus)")
    if args.run and not (args.topics and args.corpus):
        raise ValueError("--run names passages by id only: pass --topics and --corpus too")
    check_search_flags(args)
    qrels = read_qrels(args.qrels) if args.qrels else None
    if args.retrieved:
        slates = list(slates_from_retrieve_results(args.retrieved, qrels, args.depth))
    else:
        slates = list(slates_from_run(args.run, args.topics, args.corpus, qrels, args.depth))
    if not slates:
        raise ValueError(f"{args.retrieved or args.run} holds no query: nothing to write")
    write_slates(args.out, slates)
    build = summarize(slates, args.rel_level)
    print(f"wrote {build.queries} slates ({build.candidates} candidates) -> {args.out}")
    if qrels is not None:
        print(f"judged: {build.judged_queries} of {build.queries} queries")
        for line in unused_judgements(qrels, [s.query.qid for s in slates],
                                      f"--qrels {args.qrels}"):
            log.warning(line)
        if build.no_relevant:
            print(f"  judged with no passage of grade >= {args.rel_level} (they score 0, as "
                  f"in trec_eval): {len(build.no_relevant)}, e.g. {build.no_relevant[:3]}")
        if build.none_retrieved:
            print(f"  with no passage of grade >= {args.rel_level} among their candidates (they "
                  f"score 0 whatever the ranking): {len(build.none_retrieved)}, e.g. "
                  f"{build.none_retrieved[:3]}")
        if build.judged_queries and len(build.none_judged_retrieved) == build.judged_queries:
            log.warning(f"--qrels {args.qrels}: not one judged passage of the "
                        f"{build.judged_queries} judged queries is among their candidates: are "
                        "the docids spelled as in the run?")
    return 0
