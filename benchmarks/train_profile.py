"""Where a LoRA training step's time goes, and how far the step is from its matrix-product floor.

    .venv/bin/python benchmarks/train_profile.py --slates data-out/beauty/train.jsonl \\
        [--settings 2x50,2x150,6x50] [--dtypes float32,bfloat16] [--variants before,after] \\
        [--batch-size 4] [--steps 3] [--backbone bundled] [--note "what else ran"] [--out DIR]

For each setting (layers x K x dtype; LoRA r = 64 on every linear module, the attn head, the
permutation loss against clicks) the script builds `spdrank train`'s own Trainer, takes one
untimed step, times ``--steps`` steps (:meth:`Trainer.train_step`, as benchmarks/train_step.py
times it), then profiles one more under ``torch.profiler`` and puts each op's own time in a kind
of work (:data:`KINDS`), in forward or backward: an op under autograd's ``evaluate_function``
is put in the module of the forward op that made its node, by the autograd sequence number.

The floor is the step's matrix products timed alone: every ``mm``/``addmm``/``bmm`` the profile
recorded, by shape, re-run on random tensors in the step's dtype (the fastest of the layouts
a linear layer uses), plus each fused attention call's forward and backward alone under the
causal mask, no padding mask. The step's time over that floor is what the work around the
products costs.

Writes ``report.md``, ``results.json`` and ``command.txt`` to ``--out`` (default
``benchmarks/results/train-profile-cpu``). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from machine import ROOT, fmt, machine, run_quiet
from torch import nn

OUT = ROOT / "benchmarks" / "results" / "train-profile-cpu"
SCOPE = "scope:"
#: The kinds of work a step's time is put in, in the report's order.
KINDS = (
    "backbone matmuls", "adapters", "attention kernel", "norms", "rotary",
    "activation and gating", "residual adds", "embedding", "masks and positions",
    "copies and casts", "readout", "head", "Sinkhorn loss", "optimizer", "gradient clipping",
    "data", "host syncs", "other",
)
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
COPIES = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
          "aten::empty_like", "aten::cat", "aten::index_select", "aten::gather")
SYNCS = ("aten::item", "aten::_local_scalar_dense")
BACKWARD = "autograd::engine::evaluate_function"
TOP_OPS = 15


def module_kind(name: str, module: nn.Module) -> str | None:
    """The kind of work of a module's own ops, by its name and class (any decoder family)."""
    cls = type(module).__name__
    parts = name.split(".")
    if "lora_A" in parts or "lora_B" in parts or "lora_dropout" in parts:
        return "adapters"
    if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
        return "adapters"  # peft's wrapper: the input cast, the scaling and the sum
    if isinstance(module, nn.Linear) or cls == "Conv1D":
        return "backbone matmuls"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if cls.endswith("RMSNorm") or isinstance(module, nn.LayerNorm):
        return "norms"
    if "Rotary" in cls:
        return "rotary"
    if cls.endswith("Attention"):
        return "attention"
    if cls.endswith("MLP"):
        return "activation and gating"
    if cls.endswith("DecoderLayer"):
        return "residual adds"
    if cls.endswith("Model"):
        return "masks and positions"
    return None


class Scopes(contextlib.ExitStack):
    """Profiler ranges named by kind around each module's forward (and around the trainer's
    own parts: data, readout, loss, clipping), removed on exit."""

    def modules(self, model: nn.Module, override: str | None = None) -> None:
        for name, module in model.named_modules():
            kind = override or module_kind(name, module)
            if kind is None:
                continue
            stack: list[Any] = []

            def enter(_m, _a, kind=kind, stack=stack):
                stack.append(torch.profiler.record_function(SCOPE + kind).__enter__())

            def leave(_m, _a, _o, stack=stack):
                stack.pop().__exit__(None, None, None)

            self.callback(module.register_forward_pre_hook(enter).remove)
            self.callback(module.register_forward_hook(leave).remove)

    def wrap(self, owner: Any, attribute: str, kind: str) -> None:
        """Run ``owner.attribute`` (a callable) inside a range named ``kind``."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(SCOPE + kind):
                return original(*args, **kwargs)

        self.enter_context(mock.patch.object(owner, attribute, scoped))


def scope_of(event: Any) -> str | None:
    """The innermost scope an event ran in (the optimizer's own ranges included), or None."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(SCOPE):
            return parent.name.removeprefix(SCOPE)
        if parent.name.startswith("Optimizer."):
            return "optimizer"
        parent = parent.cpu_parent
    return None


def backward_node(event: Any) -> Any | None:
    """The autograd ``evaluate_function`` event an op is or ran under, or None in forward."""
    parent = event
    while parent is not None:
        if parent.name.startswith(BACKWARD):
            return parent
        parent = parent.cpu_parent
    return None


def kind_of(op: str, scope: str | None) -> str:
    """An op's kind of work from its name and the scope it ran in."""
    if op in SYNCS:
        return "host syncs"
    if scope in ("head", "Sinkhorn loss", "data", "readout", "gradient clipping", "optimizer"):
        return scope
    if op.startswith(("Optimizer.", "aten::_foreach")):
        return "optimizer"
    if scope == "adapters":
        return "adapters"
    if op in COPIES:
        return "copies and casts"
    if scope == "backbone matmuls":
        return scope
    if scope == "attention":
        if "attention" in op or op in MATMULS or "softmax" in op:
            return "attention kernel"
        return "rotary" if op.startswith(("aten::mul", "aten::add", "aten::neg",
                                          "aten::slice")) else "other"
    if scope in KINDS:
        return scope
    return "other"


def profile_step(trainer: Any) -> tuple[dict[str, dict[str, float]], list[tuple[str, list, int]],
                                       list[dict[str, Any]]]:
    """One profiled step: each kind's own ms in forward and in backward (the optimizer and
    the rest in forward), the matrix products and attention calls by shape, and the ops that
    took the most time."""
    from torch.profiler import ProfilerActivity, profile

    spd = trainer.spd
    with Scopes() as scopes:
        scopes.modules(spd.backbone)
        scopes.modules(spd.head, override="head")
        scopes.wrap(trainer, "batch", "data")
        scopes.wrap(spd, "read", "readout")
        scopes.wrap(spd.method, "loss", "Sinkhorn loss")
        scopes.wrap(trainer.accelerator, "clip_grad_norm_", "gradient clipping")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            trainer.train_step()
    events = prof.events()
    forward_scope: dict[int, str | None] = {}
    for event in events:
        if event.sequence_nr >= 0 and backward_node(event) is None:
            forward_scope.setdefault(event.sequence_nr, scope_of(event))
    spent: dict[str, dict[str, float]] = {"forward": defaultdict(float),
                                          "backward": defaultdict(float)}
    products: dict[tuple[str, str], int] = defaultdict(int)
    ops: dict[tuple[str, str, str], float] = defaultdict(float)
    for event in events:
        if event.name.startswith(SCOPE):
            continue
        node = backward_node(event)
        scope = scope_of(event)
        if node is not None and event is not node:
            scope = forward_scope.get(node.sequence_nr) or scope
        elif node is not None:
            scope = forward_scope.get(event.sequence_nr) or scope
        phase = "backward" if node is not None else "forward"
        kind = kind_of(event.name, scope)
        if phase == "backward" and event.name.startswith(BACKWARD):
            kind = "other"  # the engine's own bookkeeping around a node
        spent[phase][kind] += event.self_cpu_time_total / 1e3
        ops[(phase, kind, event.name)] += event.self_cpu_time_total / 1e3
        if event.name in MATMULS or is_fused_attention(event.name):
            products[(event.name, json.dumps(event.input_shapes))] += 1
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:TOP_OPS]
    return ({p: dict(k) for p, k in spent.items()},
            [(op, json.loads(shapes), n) for (op, shapes), n in products.items()],
            [{"phase": p, "kind": k, "op": op, "ms": ms} for (p, k, op), ms in top])


def is_fused_attention(op: str) -> bool:
    """Whether ``op`` is a fused attention kernel (forward or backward), whose products run
    inside it; SDPA's math route calls ``bmm`` itself, which the products count."""
    return op.startswith("aten::_scaled_dot_product") and ("flash" in op or "efficient" in op)


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def product_ms(op: str, shapes: list[list[int]], dtype: torch.dtype, reps: int) -> float | None:
    """One call's floor: the product alone on random tensors of the recorded shapes, in the
    fastest of the layouts a linear layer's forward and backward use (a dtype's kernels differ
    by layout); for a fused attention call, the kernel's forward and backward alone under the
    causal mask (its backward's own call then counts nothing: it is in its forward's)."""
    if op in ("aten::mm", "aten::addmm"):
        a, b = (shapes[0], shapes[1]) if op == "aten::mm" else (shapes[1], shapes[2])
        if len(a) != 2 or len(b) != 2:
            return None
        x, y = torch.randn(a, dtype=dtype), torch.randn(b, dtype=dtype)
        xt, yt = torch.randn(a[::-1], dtype=dtype).t(), torch.randn(b[::-1], dtype=dtype).t()
        return min(median_ms(lambda u=u, v=v: torch.mm(u, v), reps)
                   for u, v in ((x, y), (x, yt), (xt, y)))
    if op in ("aten::bmm", "aten::baddbmm"):
        a, b = (shapes[0], shapes[1]) if op == "aten::bmm" else (shapes[1], shapes[2])
        x, y = torch.randn(a, dtype=dtype), torch.randn(b, dtype=dtype)
        return median_ms(lambda: torch.bmm(x, y), reps)
    if is_fused_attention(op) and len(shapes) >= 3 and len(shapes[0]) == 4:
        if "backward" in op:
            return 0.0
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for shape in shapes[:3])
        grouped = q.size(1) != k.size(1)

        def both() -> None:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=grouped)
            out.backward(torch.ones_like(out))

        return median_ms(both, reps)
    return None


def floor_ms(products: list[tuple[str, list, int]], dtype: torch.dtype, reps: int) -> dict[str, float]:
    """The step's products timed alone: ms by op, and their sum."""
    found: dict[str, float] = defaultdict(float)
    for op, shapes, calls in products:
        ms = product_ms(op, shapes, dtype, reps)
        if ms is not None:
            key = "attention products" if is_fused_attention(op) else "matrix products"
            found[key] += ms * calls
    found["total"] = sum(found.values())
    return dict(found)


@contextlib.contextmanager
def trainer_for(args: argparse.Namespace, layers: int, positions: int, dtype: str,
                steps: int) -> Iterator[Any]:
    """`spdrank train`'s Trainer for one setting, in a scratch folder."""
    import spdrank.commands.cli
    from spdrank.commands.train import config_from_args
    from spdrank.training.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", "--slates", str(args.slates), "--out", tmp, "--backbone",
                args.backbone, "--layers", str(layers), "--positions", str(positions),
                "--head", "attn", "--target", "clicks", "--lora-r", "64", "--lora-alpha", "64",
                "--lora-modules", "all-linear", "--batch-size", str(args.batch_size),
                "--dtype", dtype, "--limit", str(args.batch_size * (steps + 2)),
                "--max-steps", str(steps), "--seed", "0", "--no-progress", *args.train_args]
        cfg = config_from_args(spdrank.commands.cli.build_parser().parse_args(argv))
        trainer = Trainer(cfg)
        trainer.open_caches()
        trainer.model.train()
        yield trainer


def before() -> contextlib.AbstractContextManager[Any]:
    """The step as it was when issue 59 was filed (commit e1dfc09): the prefill passes its
    padding mask to the backbone."""
    from spdrank.backbone import readout
    from spdrank.backbone.split import last_hidden, upper_hidden

    def masked(model: nn.Module, prompt: Any) -> torch.Tensor:
        if prompt.lower is not None:
            return upper_hidden(model, prompt.lower, prompt.attention_mask, prompt.lower_layer)
        return last_hidden(model, prompt.input_ids, prompt.attention_mask)

    return mock.patch.object(readout, "prompt_hidden", masked)


def compiled() -> contextlib.AbstractContextManager[Any]:
    """The step as it is now, its transformer stack under ``torch.compile`` (dynamic shapes,
    so that rows of every length share one compiled graph, forward and backward)."""
    from spdrank.backbone import split

    original = split.decoder_of
    graphs: dict[int, nn.Module] = {}

    def decoder_of(model: nn.Module) -> nn.Module:
        decoder = original(model)
        if id(decoder) not in graphs:
            graphs[id(decoder)] = torch.compile(decoder, dynamic=True)
        return graphs[id(decoder)]

    return mock.patch.object(split, "decoder_of", decoder_of)


#: The code each variant runs: as filed, as it is now, and as it is now compiled.
VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "before": before, "after": contextlib.nullcontext, "compiled": compiled}


def run_setting(args: argparse.Namespace, layers: int, positions: int, dtype: str) -> dict[str, Any]:
    """One setting's steps, the variants taking turns on the same trainer (so that the load
    of the machine falls on each alike), then one profiled step of each. Every step trains on
    the run's first batch, whence the floor's products too: slates differ in length."""
    variants = [v for v in args.variants.split(",") if v]
    with trainer_for(args, layers, positions, dtype, (args.steps + 2) * len(variants)) as trainer:
        times: dict[str, list[float]] = {v: [] for v in variants}
        for turn in range(args.steps + 1):
            for variant in variants:
                with VARIANTS[variant]():
                    trainer.step = 0
                    t0 = time.perf_counter()
                    trainer.train_step()
                    if turn:  # the first turn warms each variant up
                        times[variant].append((time.perf_counter() - t0) * 1e3)
        found: dict[str, Any] = {}
        products: list[Any] = []
        for variant in variants:
            found[variant] = {"step_ms": statistics.median(times[variant]),
                              "steps_ms": times[variant]}
            if variant == "compiled":  # one fused graph: its ops belong to no module
                continue
            with VARIANTS[variant]():
                trainer.step = 0
                spent, products, top = profile_step(trainer)
            found[variant].update(
                spent_ms=spent, profiled_ms=sum(sum(k.values()) for k in spent.values()),
                top_ops=top)
        floor = floor_ms(products, getattr(torch, dtype), args.reps)
    measured = found.get("after", found[variants[-1]])
    return {"layers": layers, "positions": positions, "dtype": dtype,
            "batch_size": args.batch_size, "variants": found, "floor_ms": floor,
            "over_floor": measured["step_ms"] / floor["total"] if floor.get("total") else None,
            "speedup": (found["before"]["step_ms"] / found["after"]["step_ms"]
                        if {"before", "after"} <= set(found) else None)}


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Where a LoRA training step's time goes (CPU)",
        "",
        (f"Written by `benchmarks/train_profile.py` ({meta['date']}, commit {meta['commit']}, "
         f"{meta['machine']}, torch {meta['torch']}, {meta['threads']} threads; "
         f"{meta['note']}). `spdrank train`'s own step: the bundled SmolLM2-135M cut to the "
         "first L layers, LoRA r = 64 on every linear module, the attn head with K positions, "
         f"the permutation loss against clicks, batches of {meta['batch_size']} Beauty slates "
         "(50 candidates, a 10-item history). `before` is the step as issue 59 found it, "
         "`after` as it is now, `compiled` as it is now with its transformer stack under "
         "torch.compile (timed only: its fused graph's ops belong to no module), taking turns "
         "on one trainer, every step on the same batch; "
         f"each step ms is the median of {meta['steps']} timed steps after one untimed. The floor is the step's matrix "
         "products timed alone (see the script's docstring). The command is in command.txt."),
        "",
        ("| layers | K | dtype | step ms before | step ms after | step ms compiled | "
         "before / after | floor ms | after / floor |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        v = r["variants"]
        lines.append(
            f"| {r['layers']} | {r['positions']} | {r['dtype']} | "
            f"{fmt(v.get('before', {}).get('step_ms'), '.0f')} | "
            f"{fmt(v.get('after', {}).get('step_ms'), '.0f')} | "
            f"{fmt(v.get('compiled', {}).get('step_ms'), '.0f')} | "
            f"{fmt(r['speedup'], '.2f')} | {fmt(r['floor_ms'].get('total'), '.0f')} | "
            f"{fmt(r['over_floor'], '.2f')} |")
    for r in results:
        names = [name for name, v in r["variants"].items() if "spent_ms" in v]
        lines += ["", (f"{r['layers']} layers, K = {r['positions']}, {r['dtype']}: each kind's "
                       "own ms in one profiled step, forward / backward"), "",
                  "| kind | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for kind in KINDS:
            cells = [f"{r['variants'][name]['spent_ms']['forward'].get(kind, 0.0):.0f} / "
                     f"{r['variants'][name]['spent_ms']['backward'].get(kind, 0.0):.0f}"
                     for name in names]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        lines.append("| profiled step | " + " | ".join(
            f"{r['variants'][name]['profiled_ms']:.0f}" for name in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slates", type=Path, required=True,
                        help="training slates (spdrank data beauty's train.jsonl)")
    parser.add_argument("--backbone", default="bundled")
    parser.add_argument("--settings", default="2x50,2x150,6x50",
                        help="LAYERSxK, comma-separated: the kept layers and the head's positions")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--variants", default="before,after",
                        help="before: the step as issue 59 found it; after: as it is now; compiled: as it "
                        "is now, its transformer stack under torch.compile (timed, not profiled)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps a setting")
    parser.add_argument("--reps", type=int, default=5, help="timings of each product")
    parser.add_argument("--note", default="nothing else running")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("train_args", nargs="*", help="more `spdrank train` options, after --")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    results = []
    for setting in args.settings.split(","):
        layers, positions = (int(x) for x in setting.split("x"))
        for dtype in args.dtypes.split(","):
            found = run_setting(args, layers, positions, dtype)
            print(json.dumps({k: v for k, v in found.items() if k != "variants"}), flush=True)
            results.append(found)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": run_quiet(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip(),
            "machine": machine(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "note": args.note,
            "batch_size": args.batch_size, "steps": args.steps}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "command.txt").write_text(
        ".venv/bin/python benchmarks/train_profile.py " + shlex.join(argv) + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "settings": results}, indent=2) + "\n")
    (args.out / "report.md").write_text(report(results, meta))
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
