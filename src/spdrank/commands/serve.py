"""``spdrank serve``: an HTTP reranking server for a trained model.

    spdrank serve --model runs/beauty-clicks [--host 127.0.0.1 --port 8000]
        [--max-batch-size 8] [--max-wait-ms 5] [--max-queue 64] [--max-body-bytes 1000000]
        [--batch-policy auto|padded|bucketed|single] [--max-padding 0.1]

``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``) speaks the Cohere / vLLM / Jina rerank
API; ``POST /v1/rank`` takes one spdrank slate. Concurrent requests are micro-batched; the
batch policy decides how a batch shares prefills (auto: one per slate on a CPU, length-bucketed
on an accelerator). ``GET /healthz``, ``GET /metrics`` (Prometheus), ``GET /docs`` (OpenAPI).
See docs/serving.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# Plain Python, imported when the command line is parsed (spdrank.serving loads its app,
# FastAPI and torch only when asked for them): the policy's one source of names and defaults.
from spdrank.commands.rank import DTYPES
from spdrank.serving.policy import BATCH_POLICIES, DEFAULT_BATCH_POLICY, DEFAULT_MAX_PADDING


def register(sub: Any) -> None:
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
        help="name clients may pass as 'model' (default: the --model directory's name)",
    )
    p.add_argument(
        "--max-batch-size", type=int, default=8, help="slates per prefill (1 = no batching)"
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="how long the oldest waiting request may wait for others to join its batch",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests waiting for a batch before new ones get 503 + Retry-After",
    )
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger bodies get 413")
    p.add_argument(
        "--batch-policy",
        default=DEFAULT_BATCH_POLICY,
        choices=BATCH_POLICIES,
        help="how a collected batch shares prefills: padded (one prefill), bucketed (by prompt "
        "length, padding within --max-padding), single (one prefill per slate) or auto "
        "(single on a CPU, where batching saves nothing; bucketed on an accelerator). "
        f"Default: {DEFAULT_BATCH_POLICY}",
    )
    p.add_argument(
        "--max-padding",
        type=float,
        default=DEFAULT_MAX_PADDING,
        help="bucketed: padded positions a prefill may hold, as a share of its real tokens "
        f"(default {DEFAULT_MAX_PADDING})",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="the backbone's dtype: float32, bfloat16, float16 or auto (default: the "
        "checkpoint's own); in bfloat16 on a CPU the head's products run in it too",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for flag in ("max_batch_size", "max_queue", "max_body_bytes", "port"):
        if getattr(args, flag) < (0 if flag == "port" else 1):
            raise ValueError(f"--{flag.replace('_', '-')} must be positive")
    if args.max_wait_ms < 0:
        raise ValueError("--max-wait-ms must be >= 0")
    if args.max_padding < 0:
        raise ValueError("--max-padding must be >= 0")

    try:
        import uvicorn

        from spdrank.serving import ServeSettings, create_app
    except ImportError as exc:
        raise ValueError(
            f"spdrank serve needs FastAPI and uvicorn ({exc}): pip install 'spdrank[serve]'"
        ) from None
    from spdrank.backbone import resolve_device
    from spdrank.model import SPDRanker
    from spdrank.slates import SCORE_FEATURE, Candidate, Query, Slate

    model = SPDRanker.from_pretrained(
        args.model, device=resolve_device(args.device), dtype=args.dtype
    )
    name = args.served_model_name or Path(args.model).resolve().name
    settings = ServeSettings(
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        batch_policy=args.batch_policy,
        max_padding=args.max_padding,
    )
    # One ranking before the port opens: lazy initialisation (kernels, allocator) is paid
    # here rather than by the first client, and a broken checkpoint fails before serving.
    names = model.features.names if model.features is not None else ()
    features = {n: 0.0 for n in names if n != SCORE_FEATURE} if names else None
    model.rank(Slate(Query("", "warm-up"), [
        Candidate(str(i), {"text": text}, features=features)
        for i, text in enumerate(("first candidate", "second candidate"))
    ]))
    app = create_app(model, settings, name=name)
    print(f"spdrank serve: {name} on http://{args.host}:{args.port} (docs: /docs)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, workers=1)
    return 0
