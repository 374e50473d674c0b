"""How close is the prefill to what this machine can do? The prefill against its own matrix
products, alone.

    .venv/bin/python benchmarks/prefill_limit.py [--backbone bundled | config:PATH] \\
        [--layers 2] [--sizes 20,50,150] [--history 10] [--dtypes float32,bfloat16] \\
        [--reps 20] [--threads 2] [--note "what else ran"] [--out DIR]

Nearly all of a slate's latency is the backbone's prefill, and nearly all of a prefill's
arithmetic is its matrix products: per layer the query, key, value and output projections
and the MLP's gate, up and down. Those products, run alone with the same torch and dtype at
the prefill's own shapes (``F.linear`` on random tensors of each layer's real weight shapes,
the prompt's T tokens as rows), are the limit the prefill can approach on this machine. The
script times, for each dtype and each slate size N (a 10-item history, candidates titled
from the bundled Amazon Beauty catalogue, prompts built by spdrank's ``PromptBuilder`` as
``spdrank train`` builds them by default):

- the prefill: the first ``--layers`` layers (0: all) of one prompt, batch 1, median wall ms;
- the products alone: every layer's projections in a row at the same shapes, median wall ms,
  and each kind's share;
- their ratio (the goal: at most 1.5x);
- the prefill under the other attention routes torch and transformers offer (SDPA's math
  backend, and transformers' eager attention), since the attention kernel is most of the rest;
- where the rest goes: one profiled prefill (``torch.profiler``), every op's own time put in
  a category by the module it ran in (attention's kernel, norms, rotary, copies and views,
  the embedding, the MLP's activation, residual adds, masks, the Python between ops) and the
  top ops by their own time.

Writes ``report.md``, ``results.json`` and ``command.txt`` to ``--out`` (default
``benchmarks/results/prefill-limit-cpu``) with the machine, the date, the commit and what
else ran (``--note``, and the load average before and after). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from serve_harness import ROOT, code_version, machine
from torch import nn

from spdrank.backbone import cpu
from spdrank.backbone.load import load_backbone, load_tokenizer
from spdrank.backbone.prompt import PromptBuilder, PromptSettings
from spdrank.backbone.settings import BUNDLED, BackboneConfig
from spdrank.backbone.split import last_hidden
from spdrank.datasets.beauty import load_titles
from spdrank.datasets.titles import render_history

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "prefill-limit-cpu"
#: The goal: a prefill within this factor of its matrix products alone.
GOAL = 1.5
#: The profile's op categories, in the report's order.
CATEGORIES = (
    "matrix products", "attention kernel", "norms", "rotary", "copies and views",
    "embedding", "activation and gating", "residual adds", "masks and positions",
    "other ops", "Python between ops",
)
#: Ops that move or re-view data rather than compute (their own time, wherever they run).
COPY_OPS = frozenset({
    "aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::permute",
    "aten::expand", "aten::_unsafe_view", "aten::empty", "aten::empty_strided",
    "aten::empty_like", "aten::as_strided", "aten::select", "aten::unsqueeze", "aten::squeeze",
    "aten::t", "aten::detach", "aten::alias", "aten::resize_", "aten::flatten", "aten::split",
    "aten::chunk", "aten::unflatten", "aten::lift_fresh", "aten::zeros", "aten::fill_",
})
#: The attention kernel: scores, softmax and the weighted values.
ATTENTION_OPS = ("scaled_dot_product", "softmax", "bmm", "baddbmm", "matmul", "flash", "sdpa")
SCOPE = "prefill_limit::"


# -- prompts -------------------------------------------------------------------------------


def prompts(tokenizer: Any, settings: PromptSettings, sizes: list[int], history: int,
            count: int, seed: int) -> dict[int, list[list[int]]]:
    """``count`` prompts' token ids per slate size: users with ``history`` items read and
    ``n`` candidates, all titled from the bundled Beauty catalogue (drawn with ``seed``)."""
    titles = sorted(t for t in load_titles().values() if t)
    builder = PromptBuilder(tokenizer, settings)
    rng = random.Random(seed)
    out: dict[int, list[list[int]]] = {}
    for n in sizes:
        out[n] = []
        for _ in range(count):
            drawn = rng.sample(titles, history + n)
            encoded = builder.encode(render_history(drawn[:history]), drawn[history:])
            out[n].append(encoded.input_ids)
    return out


# -- timing --------------------------------------------------------------------------------


def median_ms(fn: Callable[[], object], reps: int, warmup: int) -> dict[str, float]:
    """Median and min wall milliseconds of ``fn()`` over ``reps`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median": statistics.median(times), "min": min(times)}


def projections(backbone: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every linear layer of the transformer's layers, in order, named by its last part
    (``q_proj``, ``k_proj``, ..., ``down_proj``)."""
    return [(name.rsplit(".", 1)[-1], module) for name, module in backbone.named_modules()
            if isinstance(module, nn.Linear) and ".layers." in f".{name}"]


class Products:
    """The prefill's matrix products alone: for each of ``linears``, ``F.linear`` of a random
    [1, T, in] input by a random weight of its shape, in ``dtype``."""

    def __init__(self, linears: list[tuple[str, nn.Linear]], tokens: int,
                 dtype: torch.dtype, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)

        def randn(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=generator) * 0.02).to(dtype)

        inputs = {m.in_features: randn(1, tokens, m.in_features) for _, m in linears}
        self.products = [
            (kind, inputs[m.in_features], randn(m.out_features, m.in_features),
             None if m.bias is None else randn(m.out_features))
            for kind, m in linears
        ]

    def run(self, kind: str | None = None) -> None:
        for k, x, w, b in self.products:
            if kind is None or k == kind:
                F.linear(x, w, b)

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(k for k, *_ in self.products))


# -- the profile ---------------------------------------------------------------------------


def module_scope(module: nn.Module) -> str | None:
    """The category a module's own ops fall in, by what the module is (any architecture)."""
    name = type(module).__name__
    if isinstance(module, nn.Linear):
        return "matrix products"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if name.endswith("RMSNorm") or isinstance(module, nn.LayerNorm):
        return "norms"
    if "Rotary" in name:
        return "rotary"
    if name.endswith("Attention"):
        return "attention"
    if name.endswith("MLP"):
        return "mlp"
    if name.endswith("DecoderLayer"):
        return "layer"
    if name.endswith("Model"):
        return "model"
    return None


class Scopes:
    """Profiler ranges around each module's forward, named by :func:`module_scope`, so that
    every op of a profile can be put in the module it ran in."""

    def __init__(self, model: nn.Module) -> None:
        self.handles = []
        for module in model.modules():
            scope = module_scope(module)
            if scope is None:
                continue
            stack: list[Any] = []

            def enter(_module, _args, scope=scope, stack=stack):
                stack.append(torch.profiler.record_function(SCOPE + scope).__enter__())

            def leave(_module, _args, _output, stack=stack):
                stack.pop().__exit__(None, None, None)

            self.handles += [module.register_forward_pre_hook(enter),
                             module.register_forward_hook(leave)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def category(scope: str | None, op: str) -> str:
    """An op's category from the module it ran in and its name."""
    if scope == "matrix products":
        return scope
    if op in COPY_OPS or (op.startswith("aten::slice") and scope != "attention"):
        return "copies and views"
    if scope in ("embedding", "norms", "rotary"):
        return scope
    if scope == "attention":
        if any(k in op for k in ATTENTION_OPS):
            return "attention kernel"
        if op.startswith(("aten::mul", "aten::add", "aten::neg", "aten::cat", "aten::slice")):
            return "rotary"  # the cos/sin tables applied to queries and keys
        return "other ops"
    return {"mlp": "activation and gating", "layer": "residual adds",
            "model": "masks and positions"}.get(scope or "", "other ops")


def profile(backbone: nn.Module, ids: torch.Tensor, mask: torch.Tensor, reps: int,
            top: int) -> dict[str, Any]:
    """``reps`` prefills under ``torch.profiler``: each category's own ms a prefill, and the
    ``top`` ops by own time (ms a prefill, calls a prefill)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    scopes = Scopes(backbone)
    try:
        with torch.inference_mode(), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                last_hidden(backbone, ids, mask)
    finally:
        scopes.remove()
    spent: dict[str, float] = defaultdict(float)
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        own = event.self_cpu_time_total / 1e3 / reps
        if event.name.startswith(SCOPE):
            spent["Python between ops"] += own
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(SCOPE):
            parent = parent.cpu_parent
        scope = None if parent is None else parent.name.removeprefix(SCOPE)
        spent[category(scope, event.name)] += own
        ops[event.name][0] += own
        ops[event.name][1] += 1 / reps
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "total_ms": sum(spent.values()),
        "categories_ms": {c: spent.get(c, 0.0) for c in CATEGORIES},
        "top_ops": [{"op": op, "ms": ms, "calls": round(calls, 2)} for op, (ms, calls) in ranked],
    }


# -- the attention routes -------------------------------------------------------------------


#: The attention routes timed beside the default one (SDPA's choice: the flash kernel on CPU).
ROUTES = ("sdpa math", "eager")


@contextlib.contextmanager
def attention_route(backbone: nn.Module, route: str) -> Iterator[None]:
    """Run the body's prefills through ``route``: SDPA restricted to its math backend, or
    transformers' eager attention (its own matrix products and softmax); restored after."""
    if route == "sdpa math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            yield
        return
    model = getattr(backbone, "get_base_model", lambda: backbone)()
    before = model.config._attn_implementation
    model.set_attn_implementation(route)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


# -- one dtype, every size -----------------------------------------------------------------


def measure(backbone: nn.Module, dtype: str, ids_by_n: dict[int, list[list[int]]],
            args: argparse.Namespace) -> list[dict[str, Any]]:
    """The figures of one backbone (in ``dtype``) at each slate size."""
    linears = projections(backbone)
    if not linears:
        raise ValueError(f"{args.backbone}: no linear layers under .layers. to time")
    rows = []
    torch_dtype = next(backbone.parameters()).dtype
    for n, prompts_n in ids_by_n.items():
        ids = torch.tensor([prompts_n[0]])
        mask = torch.ones_like(ids)
        tokens = ids.shape[1]
        with torch.inference_mode():
            prefill = median_ms(functools.partial(last_hidden, backbone, ids, mask),
                                args.reps, args.warmup)
            products = Products(linears, tokens, torch_dtype, seed=args.seed)
            alone = median_ms(products.run, args.reps, args.warmup)
            kinds = {kind: median_ms(functools.partial(products.run, kind), args.reps,
                                     args.warmup)["median"] for kind in products.kinds()}
            routes = {}
            for route in ROUTES:
                with attention_route(backbone, route):
                    routes[route] = median_ms(functools.partial(last_hidden, backbone, ids, mask),
                                              args.route_reps, 1)["median"]
        del products
        prof = profile(backbone, ids, mask, args.profile_reps, args.top)
        row = {
            "dtype": dtype, "n": n, "tokens": tokens, "products": len(linears),
            "prefill_ms": prefill, "products_ms": alone, "products_by_kind_ms": kinds,
            "ratio": prefill["median"] / alone["median"],
            "rest_ms": prefill["median"] - alone["median"], "profile": prof,
            "routes_ms": routes,
        }
        rows.append(row)
        print(f"{dtype} N={n} T={tokens}: prefill {prefill['median']:.1f} ms, products alone "
              f"{alone['median']:.1f} ms, ratio {row['ratio']:.2f}x", flush=True)
    return rows


# -- the report ----------------------------------------------------------------------------


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def report(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The report's markdown: facts, the ratio table, where the rest goes, the top ops."""
    m = meta["machine"]
    layers = meta["layers"] or "all"
    lines = [
        "# The prefill against its matrix products alone", "",
        (f"Command: see [command.txt](command.txt). Backbone `{meta['backbone']}`, {layers} "
        f"layers ({meta['model_layers']} kept), batch 1; prompts from spdrank's PromptBuilder "
        f"({meta['item_tokens']} tokens a title, a {meta['history']}-item history, Beauty "
        "titles); the products are `F.linear` on random tensors of each layer's weight shapes "
        f"with the prompt's T tokens as rows. Median of {meta['reps']} calls after "
        f"{meta['warmup']}."), "",
        f"- date: {meta['date']}; commit: {meta['commit']}",
        (f"- machine: {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}), "
         f"{m.get('ram_gib', '?')} GiB RAM; torch {m.get('torch')}, {meta['threads']} threads; "
         f"CPU bfloat16 flags: {' '.join(meta['cpu_bf16_flags']) or 'none'}"),
        (f"- load average before / after: {meta['load_before']} / {meta['load_after']}"
         + (f"; also running: {meta['note']}" if meta["note"] else "")), "",
        (f"| dtype | N | tokens | prefill ms | products alone ms | prefill / products "
        f"(goal ≤ {GOAL:g}x) | rest ms |"),
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['n']} | {r['tokens']} | {r['prefill_ms']['median']:.1f} "
                     f"| {r['products_ms']['median']:.1f} | {r['ratio']:.2f}x | "
                     f"{r['rest_ms']:.1f} |")
    lines += ["", "## The products alone, by kind (ms, summed over the layers)", "",
              "| dtype | N | " + " | ".join(rows[0]["products_by_kind_ms"]) + " |",
              "|---|---|" + "---|" * len(rows[0]["products_by_kind_ms"])]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['n']} | "
                     + " | ".join(f"{v:.2f}" for v in r["products_by_kind_ms"].values()) + " |")
    lines += ["", "## The prefill through other attention routes (ms)", "",
              (f"The default is SDPA's own choice (its flash kernel on a CPU); median of "
              f"{meta.get('route_reps', '?')} calls after 1."), "",
              "| dtype | N | default | " + " | ".join(ROUTES) + " |",
              "|---|---|---|" + "---|" * len(ROUTES)]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['n']} | {r['prefill_ms']['median']:.1f} | "
                     + " | ".join(f"{r['routes_ms'][k]:.1f}" for k in ROUTES) + " |")
    lines += ["", "## Where a profiled prefill's time goes (ms of own time a prefill)", "",
              ("Each op's own time, put in the module it ran in; the profiler's own cost "
              "inflates the total over the timed prefill."), "",
              "| dtype | N | profiled ms | " + " | ".join(CATEGORIES) + " |",
              "|---|---|---|" + "---|" * len(CATEGORIES)]
    for r in rows:
        p = r["profile"]
        lines.append(f"| {r['dtype']} | {r['n']} | {p['total_ms']:.1f} | "
                     + " | ".join(f"{p['categories_ms'][c]:.2f}" for c in CATEGORIES) + " |")
    n = meta["profile_n"]
    for r in (r for r in rows if r["n"] == n):
        lines += ["", f"### Top ops, {r['dtype']}, N = {n} (own time)", "",
                  "| op | ms a prefill | calls a prefill |", "|---|---|---|"]
        lines += [f"| `{o['op']}` | {o['ms']:.2f} | {o['calls']:g} |"
                  for o in r["profile"]["top_ops"]]
    return "\n".join(lines) + "\n"


def python() -> str:
    """This interpreter as the command line would name it: relative to the checkout if in it."""
    exe = Path(sys.executable)
    return str(exe.relative_to(ROOT)) if exe.is_relative_to(ROOT) else str(exe)


def sizes_arg(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes sizes like 20,50,150, got {text!r}")
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes must be positive, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default=BUNDLED, help="bundled (SmolLM2), a model, or "
                   "config:PATH (random weights of a config's shape)")
    p.add_argument("--layers", type=int, default=2, help="layers kept (0: all; default 2)")
    p.add_argument("--sizes", type=sizes_arg, default=[20, 50, 150], help="slate sizes N")
    p.add_argument("--history", type=int, default=10, help="history items (default 10)")
    p.add_argument("--item-tokens", type=int, default=32, help="tokens a title (default 32)")
    p.add_argument("--no-history-items", action="store_true", help="the history as one text, "
                   "not one item a line (the paper's head's prompt)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes, comma-separated")
    p.add_argument("--reps", type=int, default=20, help="timed calls a figure (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    p.add_argument("--profile-reps", type=int, default=3, help="prefills profiled (default 3)")
    p.add_argument("--route-reps", type=int, default=5,
                   help="timed calls a figure for the other attention routes (default 5)")
    p.add_argument("--top", type=int, default=15, help="top ops listed (default 15)")
    p.add_argument("--threads", type=int, help="torch's threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--note", default="", help="what else ran on the machine, for the report")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the report's folder")
    args = p.parse_args(argv)
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= {"float32", "bfloat16", "float16"}:
        p.error(f"--dtypes takes float32, bfloat16 or float16, got {args.dtypes!r}")
    if args.layers < 0 or args.reps < 1 or args.history < 0 or args.profile_reps < 1 \
            or args.route_reps < 1:
        p.error("--layers, --history must be at least 0; --reps, --profile-reps, "
                "--route-reps at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = PromptSettings(max_item_tokens=args.item_tokens,
                              history_items=not args.no_history_items)
    try:
        tokenizer = load_tokenizer(args.backbone)
        ids_by_n = prompts(tokenizer, settings, args.sizes, args.history, 1, args.seed)
        meta: dict[str, Any] = {
            "machine": machine(), "threads": torch.get_num_threads(),
            "cpu_bf16_flags": sorted(cpu.cpuinfo_flags() & set(cpu.BF16_FLAGS)),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "commit": code_version(), "backbone": args.backbone, "layers": args.layers,
            "history": args.history, "item_tokens": args.item_tokens,
            "history_items": not args.no_history_items, "reps": args.reps,
            "warmup": args.warmup, "profile_reps": args.profile_reps, "note": args.note,
            "route_reps": args.route_reps,
            "profile_n": 50 if 50 in args.sizes else args.sizes[0],
            "load_before": load_average(),
        }
        rows = []
        for dtype in dtypes:
            config = BackboneConfig(name_or_path=args.backbone, layers=args.layers or None,
                                    dtype=dtype, lora=None)
            backbone = load_backbone(config, device="cpu")
            meta["model_layers"] = backbone.config.num_hidden_layers
            rows += measure(backbone, dtype, ids_by_n, args)
            del backbone
    except (ValueError, OSError) as e:
        print(f"prefill_limit: {e}", file=sys.stderr)
        return 2
    meta["load_after"] = load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2)
                                           + "\n")
    (args.out / "report.md").write_text(report(meta, rows))
    command = shlex.join([python(), "benchmarks/prefill_limit.py",
                          *(sys.argv[1:] if argv is None else argv)])
    (args.out / "command.txt").write_text(command + "\n")
    print(f"wrote {args.out}/report.md")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
