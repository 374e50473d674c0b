"""``spdrank teacher``: label slates with an autoregressive listwise teacher, resumably.

    spdrank teacher --slates train.jsonl --out labels.jsonl --backend hf [--model bundled] \\
        [--constrained]
    spdrank teacher --slates train.jsonl --out labels.jsonl --backend likelihood [--layers L]
    spdrank teacher --slates dl19.jsonl --out labels.jsonl --backend likelihood --prompt search
    spdrank teacher --slates train.jsonl --out labels.jsonl --backend openai \\
        --base-url http://localhost:8000/v1 [--model-name M] [--concurrency 32] \\
        [--constrained [--guided llama|vllm]]
    spdrank teacher --slates train.jsonl --out labels.jsonl --backend ranker:cooccurrence
    spdrank teacher --slates train.jsonl --out labels.jsonl --backend ranker:title_similarity
    spdrank teacher --slates dl19.jsonl --out labels.jsonl --backend ranker:fusion:rrf:dense+retriever
    spdrank teacher --slates train.jsonl --out labels.jsonl \\
        --backend ranker:fusion:best:feature:dense+retriever --choose-on valid.jsonl
    spdrank teacher --slates train.jsonl --out labels.jsonl --backend file:rankings.jsonl
    spdrank teacher merge --labels a.jsonl b.jsonl --slates train.jsonl --out merged.jsonl

Writes one record per slate to ``--out`` as it goes (a rerun skips labelled qids), then the
selected slates with ``teacher`` filled to ``--slates-out`` (default ``<stem>.slates.jsonl``
beside ``--out``), with ``teacher_scores`` when the teacher ranks by a score alone
(ranker:popularity, ranker:title_similarity, ranker:feature:NAME, ranker:fusion:...), so its
ties stay ties.
``--shard i/n`` labels the slates whose index (0-based, counting slates) is i modulo n;
``teacher merge`` joins the shards. Exit status 1 when slates are left unlabelled (failed
requests: rerun to retry), 2 on bad input.

On a cluster, two patterns, which combine:

  one process, many servers: repeat --base-url (or list them in --base-urls-file); each
    server gets --concurrency requests at a time, the least-loaded first. A failing server
    is left out for --server-backoff seconds (doubled while it keeps failing) and its slates
    go to the others; every record names its "server".
        spdrank teacher ... --backend openai --base-urls-file servers.txt --concurrency 32

  one process per shard: each labels its own part into its own file, against its own
    server(s); then merge (a shard's rerun resumes it; shards never touch one file).
        spdrank teacher ... --backend openai --shard 3/8 --out labels.3.jsonl \\
            --base-url http://gpu3:8000/v1
        spdrank teacher merge --labels labels.?.jsonl --slates train.jsonl --out labels.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spdrank.backbone.templates import PROMPT_HELP
from spdrank.commands.argtypes import (
    MAX_WAIT_SECONDS,
    add_trust_remote_code,
    float_in,
    int_at_least,
    positive_int,
    wait_seconds,
)
from spdrank.rankers.fusion import SYNTAX as FUSION_SYNTAX
from spdrank.rankers.fusion import component_files
from spdrank.rankers.fusion_choice import is_chosen
from spdrank.teacher.grammar import GUIDED

if TYPE_CHECKING:
    from spdrank.core.slates import Slate
    from spdrank.teacher.prompt import TeacherPromptSettings

log = logging.getLogger(__name__)

BACKEND_HELP = (
    "hf (local transformers model, --model), likelihood (the local --model scores each "
    "title: log p(title | history) - log p(title), no decoding), openai (an OpenAI-compatible "
    "server, --base-url), ranker:NAME (a built-in baseline: random, popularity, cooccurrence, "
    "title_similarity, slate_bm25, dense, retriever, feature:NAME to rank by a feature the slates "
    "carry, or several fused: ranker:" + FUSION_SYNTAX + "; ranker:fusion:best:... is "
    "chosen on --choose-on's slates), "
    "file:PATH (rankings computed elsewhere: {qid, ranking} lines or slates with teacher)"
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "teacher",
        help="label slates with an autoregressive listwise teacher (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="spdrank teacher --slates FILE --out FILE --backend SPEC [options]\n"
        "       spdrank teacher merge --labels FILE [FILE ...] --slates FILE --out FILE",
    )
    p.add_argument("--slates", metavar="FILE", help="slates to label (JSONL, .gz too)")
    p.add_argument("--out", metavar="FILE", help="label records (JSONL, appended; resumable)")
    p.add_argument("--backend", metavar="SPEC", help=BACKEND_HELP)
    p.add_argument("--slates-out", metavar="FILE",
                   help="the slates with teacher filled (default: <stem>.slates.jsonl beside --out)")
    p.add_argument("--mode", choices=("direct", "reasoning"), default="direct",
                   help="direct: answer the ranking only; reasoning: think, ranking on the last line")
    p.add_argument("--prompt", default="recommendation", metavar="NAME|FILE", help=PROMPT_HELP)
    p.add_argument("--limit", type=positive_int, metavar="N",
                   help="only the first N selected slates (after --shard)")
    p.add_argument("--shard", metavar="i/n",
                   help="only slates whose 0-based index is i modulo n (e.g. 0/4)")
    p.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                   help="generation cap (default 6*N+16 direct, 6*N+1024 reasoning)")
    p.add_argument("--max-item-tokens", type=positive_int, metavar="N",
                   help="tokens kept of each candidate's text (default: 32 with the "
                   "recommendation template, as the student; otherwise what lets each slate's "
                   "candidates and the query fit the teacher model's positions, 8,192 assumed "
                   "for a server's; the likelihood teacher reads each passage alone)")
    p.add_argument("--max-query-tokens", type=positive_int, default=512, metavar="N",
                   help="tokens kept of the user context, its end (default 512)")
    p.add_argument("--max-failures", type=int_at_least(0), default=10, metavar="N",
                   help="stop after N slates failed (default 10; 0: never stop)")
    p.add_argument("--json", metavar="FILE", help="also write the run summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    hf = p.add_argument_group("hf and likelihood backends")
    hf.add_argument("--model", default="bundled",
                    help="HF model id or path, or 'bundled' (SmolLM2-135M-Instruct; default)")
    hf.add_argument("--layers", type=positive_int, metavar="L",
                    help="keep only the model's first L layers (default: all)")
    hf.add_argument("--constrained", action="store_true",
                    help="constrained decoding, direct mode only. hf: the model may emit only "
                    "tokens that continue a valid ranking, so every answer names each "
                    "candidate once (the backend's name gets '+constrained'); openai: the "
                    "server constrains the format, see --guided")
    hf.add_argument("--batch-size", type=positive_int, default=4, metavar="N",
                    help="slates per generate call (default 4)")
    hf.add_argument("--device", default="auto", metavar="D", help="cpu, cuda or auto")
    hf.add_argument("--dtype", default="auto", metavar="T", help="float32, bfloat16, float16 or auto")
    add_trust_remote_code(hf)
    oa = p.add_argument_group("openai backend")
    oa.add_argument("--base-url", metavar="URL", action="append",
                    help="server URL up to /v1; repeat for many servers "
                    "(default $OPENAI_BASE_URL or http://localhost:8000/v1)")
    oa.add_argument("--base-urls-file", metavar="FILE",
                    help="more server URLs, one a line ('#' comments, blank lines ok)")
    oa.add_argument("--model-name", metavar="NAME", help="model to ask for (default: the server's first model)")
    oa.add_argument("--api-key", metavar="KEY", default=os.environ.get("OPENAI_API_KEY", "none"),
                    help="API key (default $OPENAI_API_KEY, else 'none')")
    oa.add_argument("--concurrency", type=positive_int, default=8, metavar="N",
                    help="requests in flight per server (default 8)")
    oa.add_argument("--timeout", type=wait_seconds, default=120.0, metavar="S",
                    help="seconds per request attempt, all of it: connect to the answer's "
                    "last byte (default 120)")
    oa.add_argument("--retries", type=int_at_least(0), default=4, metavar="N", help="retries per request (default 4)")
    oa.add_argument("--retry-backoff", type=float_in(0, MAX_WAIT_SECONDS), default=1.0, metavar="S",
                    help="first retry delay in seconds, doubled each retry, or the answer's "
                    "Retry-After when longer, up to 120 (default 1)")
    oa.add_argument("--server-backoff", type=float_in(0, MAX_WAIT_SECONDS), default=30.0, metavar="S",
                    help="seconds a server whose request failed all retries stays out of "
                    "rotation, doubled while it keeps failing (default 30)")
    oa.add_argument("--extra-body", metavar="JSON",
                    help="extra request fields, e.g. '{\"chat_template_kwargs\": "
                    "{\"enable_thinking\": false}}' for vLLM + Qwen3")
    oa.add_argument("--guided", choices=GUIDED,
                    help="with --constrained, the request field that constrains each answer to "
                    "the ranking format with exactly N ids in 1..N (repeats stay possible; the "
                    "repair handles them): llama (llama.cpp's 'grammar', GBNF; default), vllm "
                    "('structured_outputs' regex), vllm-legacy ('guided_regex', vLLM before "
                    "0.12)")
    oa.add_argument("--tokenizer", metavar="NAME",
                    help="HF tokenizer (or 'bundled') for the token budgets "
                    "(default: a character budget, 4 per token)")
    rk = p.add_argument_group("ranker backend")
    rk.add_argument("--train", metavar="FILE",
                    help="training slates to fit the ranker (default: train.jsonl beside --slates)")
    rk.add_argument("--seed", type=int, default=0, help="seed of ranker:random (default 0)")
    rk.add_argument("--choose-on", metavar="FILE",
                    help="validation slates on which ranker:fusion:best:A+B[+C[+D]] chooses "
                    "its fusion (each component alone, rrf, zscore and minmax over a grid of "
                    "weights), judged by graded relevance (nDCG@10), else clicks; the choice "
                    "and its score are printed and recorded in each label ('chosen')")
    # Testing only: sleep this long before each slate (ranker/file backends), to kill mid-run.
    p.add_argument("--debug-delay", type=float_in(0, MAX_WAIT_SECONDS), default=0.0,
                   help=argparse.SUPPRESS)
    p.set_defaults(func=run)

    sub = p.add_subparsers(dest="teacher_command", metavar="{merge}")
    m = sub.add_parser("merge", help="join sharded label files",
                       description="Join label files (e.g. one per --shard) over one slates file.")
    m.add_argument("--labels", nargs="+", required=True, metavar="FILE", help="label files")
    m.add_argument("--slates", required=True, metavar="FILE", help="the slates they label")
    m.add_argument("--out", required=True, metavar="FILE", help="merged labels (JSONL)")
    m.add_argument("--slates-out", metavar="FILE",
                   help="labelled slates (default: <stem>.slates.jsonl beside --out; "
                   "needed when --out is a stream such as /dev/stdout)")
    m.add_argument("--allow-missing", action="store_true",
                   help="write the merge even when some slates have no label")
    m.add_argument("--json", metavar="FILE", help="also write the merge summary as JSON")
    m.set_defaults(func=run_merge)


def teacher_prompt(args: argparse.Namespace, template: Any) -> TeacherPromptSettings:
    """The teacher's prompt settings; without --max-item-tokens, recommendation's 32 tokens a
    title, else a budget fitted to each slate's N in the teacher model's context."""
    from spdrank.core.defaults import DEFAULT_ITEM_TOKENS
    from spdrank.teacher.prompt import TeacherPromptSettings

    budget = args.max_item_tokens
    if budget is None and template.name == "recommendation":
        budget = DEFAULT_ITEM_TOKENS
    local = args.backend in ("hf", "likelihood")
    context = model_context(args.model) if budget is None and local else SERVER_CONTEXT
    return TeacherPromptSettings(mode=args.mode, max_item_tokens=budget,
                                 max_query_tokens=args.max_query_tokens, template=template,
                                 context=context)


#: The positions assumed of a teacher behind a server, whose own are not known here.
SERVER_CONTEXT = 8192


def model_context(model: str) -> int:
    """A local teacher model's positions, from its config (no weights read)."""
    from spdrank.backbone.locate import resolve_path
    from spdrank.backbone.settings import read_json

    config = read_json(Path(resolve_path(model)) / "config.json")
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else SERVER_CONTEXT


def own_sequences(
    ranker: Any, name: str, train: Path, slates: Path
) -> Callable[[Slate], list[str] | None] | None:
    """For a ranker fitted on ``train`` that labels slates whose users are in that fit: each
    labelled slate's own fitted sequence, to leave out of the counts, so that no label counts
    its slate's own target (a co-occurrence teacher fitted on the training slates would
    otherwise put each one's target first); as ``spdrank data features`` does. None when the
    ranker fits on nothing or no slate's user is in its fit. A ranker that cannot leave a user
    out (SASRec, a fusion) is refused there, pointing to ``data features``, which can or
    refuses it itself."""
    from spdrank.commands.data_features import feature_name
    from spdrank.core.slates import iter_slates
    from spdrank.datasets.extra_sequences import default_extra_sequences
    from spdrank.datasets.fitted_users import fitted_users

    if not getattr(ranker, "needs_train", False) or not train.is_file():
        return None
    users = fitted_users(train, default_extra_sequences(train))
    where = {slate.query.qid: place for place, slate in iter_slates(slates)
             if slate.query.qid in users}
    if not where:
        return None
    if hasattr(ranker, "fit_build") and ranker.fit_build(train):
        return None  # the build's own fit (SASRec's), which holds no slate's target
    if not getattr(ranker, "leaves_one_out", False):
        user, place = next(iter(where.items()))
        raise ValueError(
            f"--backend ranker:{name}: it is fitted on {train}, which holds the users of "
            f"--slates (user {user!r}, {place}) and their targets, and it cannot leave a user "
            f"out; add it as a feature, `spdrank data features --slates {slates} --add "
            f"'{name}' --out FILE`, which gives no slate its own target, and label FILE with "
            f"--backend ranker:feature:{feature_name(name)}")
    return lambda slate: users.sequence(slate, where.get(slate.query.qid, str(slates)))


def build_backend(args: argparse.Namespace, slates: Path) -> Any:
    """The backend ``--backend`` names, ready to label (a ranker is fitted here)."""
    spec: str = args.backend
    if spec == "hf":
        from spdrank.teacher.hf import HFBackend

        return HFBackend(args.model, mode=args.mode, batch_size=args.batch_size,
                         max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                         constrained=args.constrained, layers=args.layers,
                         trust_remote_code=args.trust_remote_code)
    if spec == "likelihood":
        from spdrank.backbone.prompt import fitted_item_tokens
        from spdrank.backbone.templates import load_template
        from spdrank.teacher.likelihood import LikelihoodBackend

        # Each passage is read alone: its budget is the context less the query's.
        template = load_template(args.prompt)
        budget = teacher_prompt(args, template).max_item_tokens or fitted_item_tokens(
            model_context(args.model), 1, args.max_query_tokens)
        return LikelihoodBackend(args.model, layers=args.layers, device=args.device,
                                 dtype=args.dtype, max_item_tokens=budget,
                                 max_query_tokens=args.max_query_tokens, template=template,
                                 trust_remote_code=args.trust_remote_code)
    if spec == "openai":
        from spdrank.teacher.openai_api import OpenAIBackend

        tokenizer = None
        if args.tokenizer:
            from spdrank.backbone.load import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer, args.trust_remote_code)  # 'bundled' too
        return OpenAIBackend(
            server_urls(args), args.model_name, api_key=args.api_key, mode=args.mode,
            concurrency=args.concurrency, timeout_s=args.timeout, retries=args.retries,
            backoff_s=args.retry_backoff, server_backoff_s=args.server_backoff,
            max_new_tokens=args.max_new_tokens,
            extra_body=json.loads(args.extra_body) if args.extra_body else None,
            tokenizer=tokenizer,
            guided=(args.guided or "llama") if args.constrained else None,
        )
    if spec.startswith("ranker:"):
        from spdrank.commands.named_rankers import default_train_path, fit_rankers, make_ranker
        from spdrank.teacher.backends import RankerBackend

        name = spec.split(":", 1)[1]
        ranker = make_ranker(name, seed=args.seed, choose_on=args.choose_on)
        train = Path(args.train) if args.train else default_train_path(slates)
        leave_out = own_sequences(ranker, name, train, slates)
        fit_rankers([ranker], train, False if args.no_progress else None)
        return RankerBackend(ranker, delay_s=args.debug_delay, leave_out=leave_out)
    if spec.startswith("file:"):
        from spdrank.teacher.backends import FileBackend

        return FileBackend(spec.split(":", 1)[1], delay_s=args.debug_delay)
    raise ValueError(f"unknown --backend {spec!r}: {BACKEND_HELP}")


def recorded_backend(args: argparse.Namespace) -> str | None:
    """The ``backend`` the labels of ``--backend`` record, known without building it (which
    loads a model, fits a ranker or asks servers), so that a run with nothing left to label
    can tell whether the file's labels are the ones asked for. None where only the built
    backend knows: a server's model when ``--model-name`` names none, the fusion that a
    ``ranker:fusion:best:...`` chooses."""
    from spdrank.teacher.backends import model_backend_name, server_backend_name

    spec: str = args.backend
    if spec in ("hf", "likelihood"):
        return model_backend_name(spec, args.model, args.layers, args.constrained)
    if spec == "openai":
        guided = (args.guided or "llama") if args.constrained else None
        return server_backend_name([args.model_name], guided) if args.model_name else None
    if spec.startswith("ranker:"):
        from spdrank.commands.named_rankers import make_ranker
        from spdrank.teacher.backends import RankerBackend

        name = spec.split(":", 1)[1]
        if is_chosen(name):
            return None
        return RankerBackend(make_ranker(name, seed=args.seed)).name  # built, not fitted
    if spec.startswith("file:"):
        return spec  # FileBackend's name is its spec
    return None


def backend_files(spec: str) -> list[str]:
    """The files ``--backend`` reads: ``file:PATH``'s, or a fusion's ``run:`` and ``labels:``
    components'."""
    if spec.startswith("file:"):
        return [spec[len("file:"):]]
    if spec.startswith("ranker:"):
        return component_files(spec[len("ranker:"):])
    return []


def server_urls(args: argparse.Namespace) -> list[str]:
    """The openai backend's servers: ``--base-url`` values, ``--base-urls-file``, else the default."""
    from spdrank.teacher.servers import check_base_url, collect_base_urls

    if args.base_url or args.base_urls_file:
        return collect_base_urls(args.base_url or (), args.base_urls_file)
    env = os.environ.get("OPENAI_BASE_URL")
    return [check_base_url(env, "$OPENAI_BASE_URL") if env else "http://localhost:8000/v1"]


def _write_json(path: str, data: dict[str, Any]) -> None:
    from spdrank.core.files import atomic_writer

    with atomic_writer(path) as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


def run(args: argparse.Namespace) -> int:
    from spdrank.backbone.templates import load_template
    from spdrank.commands.argtypes import prompt_file
    from spdrank.core.files import check_outputs
    from spdrank.teacher.run import (
        RunOptions,
        Shard,
        default_slates_out,
        format_summary,
        run_teacher,
    )

    missing = [f"--{name}" for name in ("slates", "out", "backend") if not getattr(args, name)]
    if missing:
        raise ValueError(f"the following arguments are required: {', '.join(missing)}")
    if args.constrained and args.backend not in ("hf", "openai"):
        raise ValueError("--constrained applies to the hf and openai backends only")
    if args.guided and not args.constrained:
        raise ValueError("--guided says how the openai backend constrains: add --constrained")
    if args.constrained and args.mode != "direct":
        raise ValueError("--constrained decodes the ranking alone: it needs --mode direct")
    check_backend_flags(args)
    if args.backend.startswith("ranker:"):
        from spdrank.commands.named_rankers import check_choose_on, make_ranker

        name = args.backend.split(":", 1)[1]
        check_choose_on([name], args.choose_on)
        if is_chosen(name) and not args.choose_on:
            make_ranker(name)  # refused: it says what it needs
    if args.extra_body:
        json.loads(args.extra_body)  # fail before any work
    if args.backend == "openai":
        server_urls(args)  # likewise
    slates = Path(args.slates)
    if not slates.exists():
        raise FileNotFoundError(f"no such slate file: {slates}")
    check_outputs(
        {"--slates": slates, "--train": args.train, "--base-urls-file": args.base_urls_file,
         "--backend": backend_files(args.backend), "--choose-on": args.choose_on,
         "--prompt": prompt_file(args.prompt)},
        {"--out": args.out, "--slates-out": args.slates_out or default_slates_out(args.out),
         "--json": args.json},
        models={"--model": args.model if args.backend in ("hf", "likelihood") else None},
    )
    options = RunOptions(
        slates=slates,
        out=Path(args.out),
        slates_out=Path(args.slates_out) if args.slates_out else None,
        prompt=teacher_prompt(args, load_template(args.prompt)),  # a bad file fails first
        limit=args.limit,
        shard=Shard.parse(args.shard) if args.shard else None,
        max_failures=max(0, args.max_failures),
        progress=False if args.no_progress else None,
    )
    built: list[Any] = []
    summary = run_teacher(options, lambda: keep(built, build_backend(args, slates)),
                          lambda: recorded_backend(args))
    print(format_summary(summary))
    for backend in built:  # a ranker's word on the slates it ranked (counts of other items)
        note = getattr(getattr(backend, "ranker", None), "coverage_note", None)
        if note is not None and (line := note()):
            log.warning(line)
    if args.json:
        _write_json(args.json, summary.to_dict())
    return 1 if summary.unlabelled else 0


def keep(built: list[Any], backend: Any) -> Any:
    """``backend``, appended to ``built``: the run builds it only when a slate needs a label,
    and the command reads its notes once the run is done."""
    built.append(backend)
    return backend


def check_backend_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that only another backend reads (``--timeout`` for a ranker, ``--layers``
    for a server, ``--seed`` for anything but ``ranker:random``), through the one table of
    unread flags (:func:`spdrank.core.unread.check_unread`); ``--batch-size`` with the
    likelihood teacher, which shares the hf teacher's flags, is said in one line."""
    from spdrank.commands.argtypes import flag_defaults
    from spdrank.core.unread import Unread, check_unread

    backend = args.backend
    local = backend in ("hf", "likelihood")
    generates = backend in ("hf", "openai")
    server = backend == "openai"
    ranker = backend.startswith("ranker:")
    hf_only = "it applies to --backend hf"
    local_only = "it applies to the local models of --backend hf and likelihood"
    decoding = "it applies to the teachers that generate, --backend hf and openai"
    server_only = "it applies to --backend openai"
    rows = (
        Unread("model", local, f"{local_only} (a server's is --model-name)"),
        Unread("layers", local, local_only),
        # The local backends share their flags' group, so one recipe may run both: said.
        Unread("batch_size", backend == "hf", hf_only, refused=not local),
        Unread("device", local, local_only),
        Unread("dtype", local, local_only),
        Unread("trust_remote_code", local or (server and bool(args.tokenizer)),
               "it lets a local model's (or --tokenizer's) own code run"),
        Unread("mode", generates, decoding),
        Unread("max_new_tokens", generates, decoding),
        *(Unread(name, server, server_only, shown=name != "api_key") for name in (
            "base_url", "base_urls_file", "model_name", "api_key", "concurrency", "timeout",
            "retries", "retry_backoff", "server_backoff", "extra_body", "tokenizer")),
        Unread("train", ranker, "it fits the baseline of --backend ranker:NAME"),
        Unread("seed", backend == "ranker:random", "it seeds --backend ranker:random alone"),
        Unread("choose_on", ranker and is_chosen(backend[len("ranker:"):]),
               "it chooses the fusion of --backend ranker:fusion:best:..."),
    )
    parsers = argparse.ArgumentParser().add_subparsers()
    register(parsers)
    check_unread(args, flag_defaults(parsers.choices["teacher"], [r.name for r in rows]), rows,
                 log)


def merge_slates_out(args: argparse.Namespace) -> str:
    """Where ``teacher merge`` writes the labelled slates: ``--slates-out``, else beside a file
    ``--out``. A stream's (``/dev/stdout``) sibling would be a new file in ``/dev``, so a
    stream ``--out`` needs ``--slates-out``."""
    from spdrank.core.files import output_target
    from spdrank.teacher.run import default_slates_out

    if args.slates_out:
        return str(args.slates_out)
    if output_target(args.out).stream:
        raise ValueError(f"--out {args.out} is a stream, with no folder to write the labelled "
                         "slates beside it: name their file with --slates-out FILE")
    return str(default_slates_out(args.out))


def run_merge(args: argparse.Namespace) -> int:
    import sys

    from spdrank.core.files import check_outputs, output_target
    from spdrank.teacher.merge import format_merge, merge_labels

    slates_out = merge_slates_out(args)
    check_outputs(
        {"--labels": args.labels, "--slates": args.slates},
        {"--out": args.out, "--slates-out": slates_out, "--json": args.json},
    )
    summary = merge_labels(args.labels, args.slates, args.out, slates_out, args.allow_missing)
    # Beside labels sent to a stream (/dev/stdout), the summary goes to stderr: a pipe reading
    # them gets JSONL only.
    streamed = any(output_target(path).stream for path in (args.out, slates_out))
    print(format_merge(summary), file=sys.stderr if streamed else sys.stdout)
    if args.json:
        _write_json(args.json, summary.to_dict())
    return 0 if summary.written and not summary.missing else (0 if args.allow_missing else 1)
