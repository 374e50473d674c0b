"""``spdrank serve``: an HTTP reranking server for a trained model.

    spdrank serve --model runs/beauty-clicks [--host 127.0.0.1 --port 8000]
        [--max-batch-size 8] [--max-wait-ms 5] [--max-queue 64] [--max-body-bytes 1000000]
        [--batch-policy auto|padded|bucketed|single] [--max-padding 0.1]
        [--header-timeout 10] [--body-timeout 30] [--keep-alive-timeout 5]
        [--api-key-file PATH]   (or the key in $SPDRANK_API_KEY)

``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``) speaks the Cohere / vLLM / Jina rerank
API; ``POST /v1/rank`` takes one spdrank slate. Concurrent requests are micro-batched; the
batch policy decides how a batch shares prefills (auto: one per slate on a CPU, length-bucketed
on an accelerator). ``GET /healthz``, ``GET /metrics`` (Prometheus), ``GET /docs`` (OpenAPI).
See docs/serving.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

# Plain Python, imported when the command line is parsed (spdrank.serving loads its app,
# FastAPI and torch only when asked for them): the settings are the one source of the
# server's flags, their defaults, choices and help.
from spdrank.commands.rank import add_prompt_argument, check_prompt
from spdrank.core.flags import range_problem
from spdrank.serving.auth import ENV_VAR, load_api_key
from spdrank.serving.settings import ServeSettings

_TYPES = {"int": int, "float": float, "str": str}


def register(sub: Any) -> None:
    from spdrank.commands.argtypes import add_dtype_argument, add_trust_remote_code, model_name

    p = sub.add_parser(
        "serve",
        help="serve a trained model over HTTP (rerank API, micro-batched)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="checkpoint directory (or a training run's OUT)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        type=model_name,
        help="name clients may pass as 'model' (default: the --model directory's name)",
    )
    for f in dataclasses.fields(ServeSettings):
        p.add_argument(
            _flag(f.name),
            type=_TYPES[str(f.type)],
            # None tells a flag left out from one given, which a flag that needs another may not be.
            default=None if f.metadata.get("needs") else f.default,
            choices=f.metadata.get("choices"),
            help=f"{f.metadata['help']} (default: {f.default})",
        )
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    add_dtype_argument(p)
    add_prompt_argument(p)
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="require 'Authorization: Bearer <key>' with the key in this file (or in "
        f"${ENV_VAR}; never on the command line, where the process list shows it); "
        "health, metrics and docs stay open",
    )
    # Named so that argparse does not read "--api-key KEY" as an abbreviated --api-key-file.
    p.add_argument("--api-key", nargs="?", action=_RefuseKeyOnCommandLine, help=argparse.SUPPRESS)
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_trust_remote_code(p)
    p.set_defaults(func=run)


class _RefuseKeyOnCommandLine(argparse.Action):
    """``--api-key``: refused, since a key on the command line is in the process list."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        parser.error(
            f"--api-key: the key is never taken on the command line; put it in ${ENV_VAR} "
            "or in a file given to --api-key-file"
        )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """The settings parsed ``spdrank serve`` arguments describe; a value below its field's
    minimum or above its maximum, a number that is not finite, and a flag given without the one it needs
    (``--max-documents`` without ``--window``) are refused naming the flag."""
    values = {}
    for f in dataclasses.fields(ServeSettings):
        value, needs = getattr(args, f.name), f.metadata.get("needs")
        if needs and value is not None and not getattr(args, needs):
            raise ValueError(f"{_flag(f.name)} applies with {_flag(needs)} only: add "
                             f"{_flag(needs)}, or leave {_flag(f.name)} out")
        values[f.name] = f.default if value is None else value
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{_flag(f.name)} must be a finite number, got {value}")
        problem = None if value is None else range_problem(
            value, low=f.metadata.get("minimum"), high=f.metadata.get("maximum"))
        if problem is not None:
            raise ValueError(f"{_flag(f.name)} {problem}")
    return ServeSettings(**values)


def check_address(host: str, port: int) -> None:
    """Refuse a port out of TCP's range or a host that names no address, before the model
    loads (uvicorn would find out only after it)."""
    import socket

    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--host {host!r} names no address to listen on ({exc})") from None


def check_window(model: str, settings: ServeSettings) -> None:
    """Refuse ``--window`` over the checkpoint's K from its config, before the model loads."""
    if not settings.window:
        return
    from spdrank.model.checkpoint import CONFIG_NAME, checkpoint_dir, read_config
    from spdrank.rankers.windows import check_window as check_fits

    check_fits(settings.window, read_config(checkpoint_dir(model) / CONFIG_NAME).head.positions)


def run(args: argparse.Namespace) -> int:
    check_address(args.host, args.port)
    settings = settings_from_args(args)
    api_key = load_api_key(args.api_key_file)

    try:
        import uvicorn

        from spdrank.serving import create_app
        from spdrank.serving.deadlines import uvicorn_options
    except ImportError as exc:
        raise ValueError(
            f"spdrank serve needs FastAPI and uvicorn ({exc}): pip install 'spdrank[serve]'"
        ) from None
    from spdrank.backbone.load import resolve_device
    from spdrank.core.slates import SCORE_FEATURE, Candidate, Query, Slate
    from spdrank.model.ranker import SPDRanker
    from spdrank.serving.routes import DOCS_PATH

    check_prompt(args.model, args.prompt)
    check_window(args.model, settings)
    model = SPDRanker.from_pretrained(
        args.model, device=resolve_device(args.device), dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
    )
    name = args.served_model_name or Path(args.model).resolve().name
    # One ranking before the port opens: lazy initialisation (kernels, allocator) is paid
    # here rather than by the first client, and a broken checkpoint fails before serving.
    names = model.features.names if model.features is not None else ()
    features = {n: 0.0 for n in names if n != SCORE_FEATURE} if names else None
    model.rank(Slate(Query("", "warm-up"), [
        Candidate(str(i), {"text": text}, features=features)
        for i, text in enumerate(("first candidate", "second candidate"))
    ]))
    app = create_app(model, settings, name=name, api_key=api_key)
    print(f"spdrank serve: {name} on http://{args.host}:{args.port} (docs: {DOCS_PATH})", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        workers=1,
        **uvicorn_options(settings),
    )
    return 0
