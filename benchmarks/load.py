"""Bounded load test of ``spdrank serve`` on loopback: latency percentiles and throughput.

    .venv/bin/python benchmarks/load.py --model runs/beauty-clicks \\
        --slates data/beauty/eval.jsonl [--requests 2000] [--concurrency 1 8 32] \\
        [--documents 50] [--max-batch-size 8] [--name NAME]

For each server configuration (micro-batched with ``--max-batch-size``, then unbatched with
``--max-batch-size 1`` for comparison) it starts ``spdrank serve`` on a free loopback port,
sends ``--requests`` rerank requests at each ``--concurrency`` (N = ``--documents`` Beauty
titles per request, the query being the user's history), checks every answer (:func:`check`),
and records p50/p95/p99 latency and throughput. ``--url`` targets a running server instead (no
comparison then: the script cannot restart it). It always stops by itself: a fixed number of
requests, a per-request timeout and a total ``--time-limit`` after which no new request is
sent (the run is then marked incomplete). Writes ``benchmarks/results/<name>/report.md``,
``results.json``, the servers' logs and final /metrics (docs/serving.md, "Load test"). Exit
status 1 when any request failed or the time limit cut the run short.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from machine import ROOT, code_version, facts
from serve_harness import Server, latency_ms, model_info, report_head

from spdrank.serving.routes import HEALTH_PATH, RERANK_PATHS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = p.add_argument_group("target")
    target.add_argument(
        "--model", help="checkpoint to serve (started here, twice: batched and unbatched)"
    )
    target.add_argument("--url", help="use this running server instead of starting one")
    p.add_argument(
        "--slates", required=True, help="eval slates (JSONL): queries and candidate titles"
    )
    p.add_argument("--requests", type=int, default=2000, help="requests per concurrency level")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--documents", type=int, default=50, help="documents per request (N)")
    p.add_argument("--max-batch-size", type=int, default=8, help="the batched server's setting")
    p.add_argument("--batch-policy", default="auto",
                   help="the batched server's --batch-policy (auto: single on a CPU)")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--no-unbatched", action="store_true", help="skip the --max-batch-size 1 run")
    p.add_argument("--device", default="auto")
    p.add_argument("--warmup", type=int, default=10, help="unrecorded requests before each config")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds for the server to come up"
    )
    p.add_argument("--time-limit", type=float, default=1800.0, help="seconds for the whole run")
    p.add_argument("--name", help="results folder name (default: load-<model>-<date>)")
    p.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results"), help="parent of the results folder"
    )
    args = p.parse_args(argv)
    if (args.model is None) == (args.url is None):
        p.error("give exactly one of --model or --url")
    if args.requests < 1 or args.documents < 1 or min(args.concurrency) < 1:
        p.error("--requests, --documents and --concurrency must be positive")
    return args


def build_payloads(path: str, n_docs: int, limit: int) -> list[bytes]:
    """Rerank bodies from eval slates: the user's history as query, N candidate titles."""
    from spdrank.core.slates import read_slates

    payloads: list[bytes] = []
    for slate in read_slates(path):
        texts = slate.candidate_texts()
        if len(texts) < n_docs:
            continue
        body = {"query": slate.query.text, "documents": texts[:n_docs], "return_documents": False}
        payloads.append(json.dumps(body).encode())
        if len(payloads) >= limit:
            break
    if not payloads:
        raise SystemExit(f"no slate in {path} has {n_docs} candidates; lower --documents")
    return payloads


def check(body: dict[str, Any], n: int) -> str | None:
    """None if the answer is a valid ranking of the n documents, else what is wrong."""
    results = body.get("results")
    if not isinstance(results, list) or len(results) != n:
        return f"expected {n} results"
    if sorted(r.get("index") for r in results) != list(range(n)):
        return "indices are not a permutation"
    scores = [r.get("relevance_score") for r in results]
    if any(not a > b for a, b in itertools.pairwise(scores)):
        return "scores are not strictly decreasing"
    return None


async def load_level(
    url: str, payloads: list[bytes], args: argparse.Namespace, requests: int, concurrency: int,
    deadline: float,
) -> dict[str, Any]:  # fmt: skip
    """``requests`` requests, ``concurrency`` at a time: their latency, throughput, errors."""
    n_docs, timeout = args.documents, args.request_timeout
    latencies: list[float] = []
    metas: list[dict[str, Any]] = []
    errors: list[str] = []
    counter = itertools.count()
    sent = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def worker() -> None:
            nonlocal sent
            while True:
                i = next(counter)
                if i >= requests or time.monotonic() > deadline:
                    return
                sent += 1
                start = time.perf_counter()
                try:
                    r = await client.post(
                        RERANK_PATHS[0], content=payloads[i % len(payloads)], headers=headers
                    )
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                seconds = time.perf_counter() - start
                if r.status_code != 200:
                    errors.append(f"HTTP {r.status_code}: {r.text[:300]}")
                    continue
                body = r.json()
                problem = check(body, n_docs)
                if problem:
                    errors.append(problem)
                    continue
                latencies.append(seconds)
                metas.append(body.get("meta", {}))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start

    def mean(key: str) -> float | None:
        values = [m[key] for m in metas if key in m]
        return round(sum(values) / len(values), 3) if values else None

    ms = [x * 1e3 for x in latencies]
    return {
        "concurrency": concurrency,
        "requests": requests,
        "sent": sent,
        "ok": len(latencies),
        "errors": len(errors),
        "error_samples": errors[:5],
        "incomplete": sent < requests,
        "wall_s": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 3) if wall > 0 else None,
        "latency_ms": latency_ms(ms, (50, 95, 99), 3),
        "server_mean": {
            k: mean(k) for k in ("collected", "batch_size", "queue_ms", "inference_ms")
        },
    }


def run_config(
    label: str, url: str, args: argparse.Namespace, payloads: list[bytes], deadline: float
) -> list[dict[str, Any]]:
    warm = asyncio.run(load_level(url, payloads, args, args.warmup, 1, deadline))
    if warm["errors"]:
        print(f"[{label}] warm-up failed: {warm['error_samples']}", file=sys.stderr)
    levels = []
    for c in args.concurrency:
        level = asyncio.run(load_level(url, payloads, args, args.requests, c, deadline))
        level["config"] = label
        lat = level["latency_ms"]
        print(
            f"[{label}] concurrency {c:>3}: {level['ok']}/{level['requests']} ok, {level['errors']} errors, "
            f"p50 {lat['p50']:.1f} ms, p95 {lat['p95']:.1f} ms, p99 {lat['p99']:.1f} ms, "
            f"{level['throughput_rps']} req/s, mean batch {level['server_mean']['batch_size']}",
            flush=True,
        )
        levels.append(level)
    return levels


def write_report(out: Path, record: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    m = record["model"]
    lines = [
        *report_head(f"Load test: {record['name']}", record),
        f"- model: {json.dumps(m) if m else record.get('url')}",
        f"- served as: {json.dumps(record.get('health', {}))}",
        (
            f"- load: {record['requests']} requests per level, N = {record['documents']} Beauty "
            f"titles per request (query: the user's history), concurrency "
            f"{record['concurrency']}, loopback; client and server share the machine"
        ),
        "",
        "| config | concurrency | ok | errors | p50 ms | p95 ms | p99 ms | req/s | mean collected | mean per prefill | mean queue ms | mean inference ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for lv in record["levels"]:
        lat, sm = lv["latency_ms"], lv["server_mean"]
        lines.append(
            f"| {lv['config']} | {lv['concurrency']} | {lv['ok']}{' (cut)' if lv['incomplete'] else ''} | "
            f"{lv['errors']} | {lat['p50']} | {lat['p95']} | {lat['p99']} | {lv['throughput_rps']} | "
            f"{sm.get('collected')} | {sm['batch_size']} | {sm['queue_ms']} | "
            f"{sm['inference_ms']} |"
        )
    if record.get("speedup"):
        lines += ["", "Throughput, batched / unbatched: " + ", ".join(
            f"concurrency {c}: {s}x" for c, s in record["speedup"].items()
        )]  # fmt: skip
    errors = [e for lv in record["levels"] for e in lv["error_samples"]]
    lines += ["", f"Verdict: {record['verdict']}"]
    if errors:
        lines += ["", "Error samples:", *(f"- `{e}`" for e in errors[:10])]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.time_limit
    now = dt.datetime.now(dt.timezone.utc)
    name = args.name or f"load-{Path(args.model or 'remote').resolve().name}-{now:%Y%m%d-%H%M}"
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    payloads = build_payloads(args.slates, args.documents, limit=max(args.requests, args.warmup))
    record: dict[str, Any] = {
        "name": name,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": now.strftime("%Y-%m-%dT%H:%MZ"),
        "code": code_version(),
        "machine": facts(),
        "model": model_info(args.model),
        "url": args.url,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "documents": args.documents,
        "time_limit_s": args.time_limit,
        "levels": [],
    }
    configs = [(f"batched (max batch {args.max_batch_size}, policy {args.batch_policy})",
                args.max_batch_size)]
    if args.model and not args.no_unbatched and args.max_batch_size != 1:
        configs.append(("unbatched (max batch 1)", 1))
    record["servers"] = []
    try:
        if args.url:
            record["health"] = httpx.get(f"{args.url}{HEALTH_PATH}", timeout=10).json()
            record["levels"] += run_config("remote", args.url, args, payloads, deadline)
        for label, batch in configs if args.model else []:
            tag = f"batch{batch}"
            flags = [
                "--device", args.device, "--max-batch-size", str(batch),
                *(["--batch-policy", args.batch_policy] if batch > 1 else []),
                "--max-wait-ms", str(args.max_wait_ms), "--max-queue", str(args.max_queue),
            ]  # fmt: skip
            server = Server(args.model, flags, out / f"server-{tag}.log")
            record["servers"].append({"config": label, "command": shlex.join(server.command)})
            try:
                remaining = max(1.0, min(args.startup_timeout, deadline - time.monotonic()))
                record["health"] = health = server.wait_ready(remaining)
                if args.documents > health["max_documents"]:
                    raise SystemExit(
                        f"--documents {args.documents} is over the model's K ({health['max_documents']})"
                    )
                record["levels"] += run_config(label, server.url, args, payloads, deadline)
                (out / f"metrics-{tag}.txt").write_text(
                    httpx.get(f"{server.url}/metrics", timeout=10).text
                )
            finally:
                server.stop()
    finally:
        levels = record["levels"]
        by = {(lv["config"], lv["concurrency"]): lv for lv in levels}
        if len(configs) == 2:  # batched over unbatched throughput, where both ran
            rps = {c: [by.get((label, c), {}).get("throughput_rps") for label, _ in configs]
                   for c in args.concurrency}
            record["speedup"] = {c: round(a / b, 2) for c, (a, b) in rps.items()
                                 if a is not None and b}
        failed = sum(lv["errors"] for lv in levels)
        cut = any(lv["incomplete"] for lv in levels)
        expected = len(args.concurrency) * (1 if args.url else len(configs))
        record["elapsed_s"] = round(time.monotonic() - started, 1)
        record["verdict"] = (
            "PASS: every request answered with a valid ranking"
            if levels and len(levels) == expected and not failed and not cut
            else f"FAIL: {failed} errors"
            + (", time limit reached" if cut else "")
            + ("" if len(levels) == expected else f", {len(levels)}/{expected} levels ran")
        )
        write_report(out, record)
        print(f"{record['verdict']}\nreport: {out / 'report.md'}")
    return 0 if record["verdict"].startswith("PASS") else 1


if __name__ == "__main__":
    sys.exit(main())
