"""The evidence that benchmarks/gpu_estimate.py's shapes are right, measured on a CPU.

    nice .venv/bin/python benchmarks/gpu_estimate_calibrate.py [--threads 2] [--note "..."] \\
        [--out benchmarks/results/gpu-estimate]

No GPU is needed: what the estimator gets from the device (peak throughput, efficiency) is
taken from this machine instead, and what it computes from the config (FLOPs, saved bytes,
tokens) is checked against what torch really does with SmolLM2-135M's shape (random weights:
cost does not depend on them):

1. this CPU's "stated" throughput: the median FLOP/s of a 2048^3 matrix product per dtype;
2. FLOPs: torch's FlopCounterMode over one SmolLM2 prefill against the estimator's count;
3. the efficiency: the SmolLM2 prefill at N = 50 (all 30 layers, batch 1) timed, its achieved
   FLOP/s over the matrix product's being this machine's MFU; with that one number, the
   estimator's predicted time of the prefill at N = 20 and 150 and of one LoRA training step
   (r = 64 on every linear module, forward and backward, on the first 8 layers) against the
   measured ones;
4. activations: the bytes autograd saves during a LoRA training forward (every saved tensor's
   storage, once) against ``saved_bytes_per_token``, for SmolLM2's and Qwen3-0.6B's shapes;
5. the per-operation cost: a 2-layer, 32-wide model's forward, which does almost no
   arithmetic, timed and divided by the operations the estimator assumes;
6. tokens: the estimator's prompt lengths against those the prefill benchmarks measured with
   spdrank's own prompts (benchmarks/results/prefill-cost-cpu and prefill-limit-cpu).

Writes report.md, results.json and command.txt to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from gpu_estimate import (
    OPS_PER_ADAPTER,
    OPS_PER_LAYER,
    ROOT,
    Device,
    Shape,
    Work,
    layer_flops_per_token,
    read_shape,
    rec_tokens,
    saved_bytes_per_token,
    search_tokens,
    work_cost,
)
from machine import cpu_name

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu-estimate"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: The layers of the timed LoRA step: enough to be the model's shape, few enough for 2 cores.
TRAIN_LAYERS = 8


def median_seconds(fn: Any, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_flops(dtype: torch.dtype, size: int = 2048, reps: int = 5) -> float:
    """FLOP/s of one large square matrix product: the CPU's own 'stated' peak."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return 2 * size**3 / median_seconds(lambda: a @ b, reps)


def build(shape_config: dict[str, Any], layers: int, dtype: torch.dtype, lora_r: int | None) -> Any:
    """A random-weight causal LM of ``shape_config``'s shape, cut to ``layers``, LoRA-wrapped
    as spdrank wraps it (peft, every linear module, no dropout) when ``lora_r``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    keep = {k: v for k, v in shape_config.items()
            if k not in ("architectures", "_model_name_or_path", "transformers_version", "dtype", "torch_dtype")}
    config = AutoConfig.for_model(**{**keep, "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if lora_r is not None:
        from peft import LoraConfig, get_peft_model

        for p in model.parameters():
            p.requires_grad_(False)
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_r, lora_dropout=0.0,
                                                 target_modules="all-linear", bias="none"))
    return model


def decoder(model: Any) -> Any:
    """The decoder stack (no LM head), as SPD runs it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.base_model


def prefill(model: Any, tokens: int, grad: bool = False) -> Any:
    ids = torch.randint(0, 1000, (1, tokens))
    with torch.set_grad_enabled(grad):
        return decoder(model)(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def prefill_seconds(model: Any, sizes: tuple[int, ...], reps: int) -> dict[int, float]:
    """The median seconds of ``model``'s prefill of a recommendation prompt of each N."""
    return {n: median_seconds(lambda n=n: prefill(model, rec_tokens(n)), reps) for n in sizes}


def saved_bytes(model: Any, tokens: int) -> int:
    """Bytes of every tensor autograd saves in a training forward (each storage once, the
    model's own weights and buffers left out)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        prefill(model, tokens, grad=True)
    return sum(seen.values())


def counted_flops(model: Any, tokens: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        prefill(model, tokens)
    return float(counter.get_total_flops())


def smollm2_config() -> dict[str, Any]:
    from gpu_estimate import BUNDLED_CACHE_NAME, BUNDLED_CONFIG, cache_dir

    cached = cache_dir() / "backbones" / BUNDLED_CACHE_NAME / "config.json"
    return json.loads(cached.read_text()) if cached.is_file() else dict(BUNDLED_CONFIG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--note", default="nothing else ran", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite --out's report.md from its results.json, measuring nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        (args.out / "report.md").write_text(report(json.loads((args.out / "results.json").read_text())))
        return 0
    torch.set_num_threads(args.threads)
    started = datetime.now(timezone.utc)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results: dict[str, Any] = {}

    # 1. the CPU's peak, per dtype
    peak = {name: matmul_flops(dtype) for name, dtype in DTYPES.items()}
    results["matmul_tflops"] = {k: v / 1e12 for k, v in peak.items()}

    smol_config = smollm2_config()
    smol = read_shape("bundled")
    qwen_config = json.loads((ROOT / "benchmarks/configs/qwen3-0.6b.json").read_text())
    qwen = Shape.from_config(qwen_config)

    # 2. FLOPs counted against estimated (FlopCounterMode counts SDPA's whole T x T, causal or
    # not, so the estimate is compared with its attention at the full context)
    flops_rows = []
    for n in (20, 50, 150):
        t = rec_tokens(n)
        model = build(smol_config, 2, torch.float32, None)
        counted = counted_flops(model, t) / 2 * smol.layers  # per layer, times 30
        estimated = t * layer_flops_per_token(smol, t) * smol.layers
        flops_rows.append({"n": n, "tokens": t, "counted": counted, "estimated": estimated})
        del model
    results["flops"] = flops_rows

    # 5. the per-operation cost (before the big models, on a quiet allocator)
    tiny = {"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 1000}
    tiny_model = build(tiny, 2, torch.float32, None)
    op_s = median_seconds(lambda: prefill(tiny_model, 16), 50, warmup=5) / (2 * OPS_PER_LAYER)
    tiny_lora = build(tiny, 2, torch.float32, 4)
    n_lin = len(Shape.from_config(tiny).linears())
    op_s_lora = median_seconds(lambda: prefill(tiny_lora, 16), 50, warmup=5) / (
        2 * (OPS_PER_LAYER + OPS_PER_ADAPTER * n_lin))
    results["op_seconds"] = {"plain": op_s, "lora": op_s_lora}

    # 3. the efficiency, fitted at N = 50, and the predictions it makes
    timing_rows = []
    for dtype_name in ("bfloat16", "float32"):
        dtype, b = DTYPES[dtype_name], 2 if dtype_name == "bfloat16" else 4
        measured = prefill_seconds(build(smol_config, smol.layers, dtype, None), (20, 50, 150), args.reps)
        cpu = Device(f"this CPU ({dtype_name} matmul)", 1e9, peak[dtype_name] / 1e12, 0.05)
        probe = work_cost(Work("prefill", 1, rec_tokens(50)), smol, cpu, b, 64, mfu=1.0, op_seconds=0.0)
        mfu = probe.flops / measured[50] / peak[dtype_name]
        lora = build(smol_config, TRAIN_LAYERS, dtype, 64)

        def step(model: Any = lora) -> None:
            ids = torch.randint(0, 1000, (2, rec_tokens(50)))
            decoder(model)(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.float().sum().backward()

        measured_train = median_seconds(step, max(1, args.reps - 1))
        del lora
        for n, secs in measured.items():
            est = work_cost(Work("prefill", 1, rec_tokens(n)), smol, cpu, b, 64, mfu=mfu, op_seconds=op_s)
            timing_rows.append({"dtype": dtype_name, "what": f"prefill N={n}", "tokens": rec_tokens(n),
                                "measured_s": secs, "predicted_s": est.seconds, "fitted": n == 50})
        est = work_cost(Work("train", 2, rec_tokens(50), batch=2, train=True, adapted=TRAIN_LAYERS,
                             layers=TRAIN_LAYERS), smol, cpu, b, 64, mfu=mfu, op_seconds=op_s_lora)
        timing_rows.append({"dtype": dtype_name, "what": f"LoRA step, {TRAIN_LAYERS} layers, batch 2, N=50", "tokens": rec_tokens(50),
                            "measured_s": measured_train, "predicted_s": est.seconds, "fitted": False})
        results.setdefault("cpu_mfu", {})[dtype_name] = mfu
    results["timings"] = timing_rows

    # 4. activations saved for the backward
    act_rows = []
    for name, config, shape in (("SmolLM2-135M", smol_config, smol), ("Qwen3-0.6B shape", qwen_config, qwen)):
        for dtype_name in ("bfloat16",):
            t = 256
            two, four = (saved_bytes(build(config, k, DTYPES[dtype_name], 64), t) for k in (2, 4))
            act_rows.append({"backbone": name, "dtype": dtype_name, "measured": (four - two) / 2 / t,
                             "estimated": saved_bytes_per_token(shape, 2, 64)})
    results["saved_bytes_per_token_layer"] = act_rows

    # 6. tokens
    token_rows = []
    for source in ("prefill-cost-cpu", "prefill-limit-cpu"):
        path = ROOT / "benchmarks" / "results" / source / "results.json"
        if not path.is_file():
            continue
        for row in json.loads(path.read_text())["rows"]:
            if row.get("dtype") != "bfloat16":
                continue
            prompt = row.get("prompt", "recommendation")
            est = rec_tokens(row["n"]) if prompt == "recommendation" else search_tokens(row["n"])
            token_rows.append({"source": source, "prompt": prompt, "n": row["n"],
                               "measured": row["tokens"], "estimated": est})
    results["tokens"] = token_rows

    load_after = Path("/proc/loadavg").read_text().split()[:3]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    command = shlex.join([".venv/bin/python", "benchmarks/gpu_estimate_calibrate.py", *(argv or sys.argv[1:])])
    meta = {"date": started.strftime("%Y-%m-%dT%H:%MZ"), "commit": commit, "cpu": cpu_name(),
            "threads": args.threads, "torch": torch.__version__, "load_before": load_before,
            "load_after": load_after, "note": args.note, "command": command}
    results["meta"] = meta
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "command.txt").write_text(command + "\n")
    (args.out / "report.md").write_text(report(results))
    print(report(results))
    return 0


def linear_flops(tokens: int) -> float:
    """The estimate's linear term for SmolLM2's whole prefill: 2 FLOPs a weight a token."""
    shape = read_shape("bundled")
    return tokens * 2 * sum(a * b for a, b in shape.linears()) * shape.layers


def report(r: dict[str, Any]) -> str:
    m = r["meta"]
    lines = [
        "# benchmarks/gpu_estimate.py against a CPU: are its shapes right?",
        "",
        f"Command: `{m['command']}`",
        "",
        f"- date: {m['date']}; commit: {m['commit']}",
        f"- machine: {m['cpu']}, torch {m['torch']}, {m['threads']} threads",
        f"- load average before / after: {' '.join(m['load_before'])} / {' '.join(m['load_after'])}; also running: {m['note']}",
        "",
        "The device's part of the estimate (its stated throughput and the efficiency reached) is",
        "this CPU's here; what the estimator derives from config.json (FLOPs, bytes saved for the",
        "backward, tokens) is what is being checked. SmolLM2-135M's shape, random weights.",
        "",
        "## This CPU's peak: a 2048^3 matrix product",
        "",
        "| dtype | TFLOP/s |",
        "| --- | --- |",
        *(f"| {k} | {v:.3f} |" for k, v in r["matmul_tflops"].items()),
        "",
        "## FLOPs of a prefill: torch's FlopCounterMode against the estimate",
        "",
        "30 layers (2 counted, times 15), batch 1. FlopCounterMode has no formula for the CPU's fused SDPA kernel, so what it counts is the matrix products alone: the estimate's linear term is set beside it, and its attention term (4 * q_dim * T^2 a layer, the full T x T; the time estimate uses the causal half) beside that.",
        "",
        "| N | tokens | counted GFLOP | estimated linear GFLOP | linear / counted | estimated attention GFLOP |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {x['n']} | {x['tokens']} | {x['counted'] / 1e9:.1f} | {linear_flops(x['tokens']) / 1e9:.1f} | "
          f"{linear_flops(x['tokens']) / x['counted']:.3f} | {(x['estimated'] - linear_flops(x['tokens'])) / 1e9:.1f} |"
          for x in r["flops"]),
        "",
        "## Time: one efficiency fitted at N = 50, the rest predicted",
        "",
        "This CPU's efficiency (achieved FLOP/s of the N = 50 prefill over the matrix product's; the cores were shared, see the load average): "
        + ", ".join(f"{k} {v:.1%}" for k, v in r["cpu_mfu"].items())
        + f"; per-operation cost from a 2-layer 32-wide model: {r['op_seconds']['plain'] * 1e6:.1f} us "
        f"({r['op_seconds']['lora'] * 1e6:.1f} us with LoRA). Medians; the LoRA step is a forward and backward of the decoder (r = 64, every linear module) on 2 slates.",
        "",
        "| dtype | what | tokens | measured s | predicted s | predicted / measured |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {x['dtype']} | {x['what']}{' (fitted)' if x['fitted'] else ''} | {x['tokens']} | {x['measured_s']:.3f} | {x['predicted_s']:.3f} | {x['predicted_s'] / x['measured_s']:.2f}x |"
          for x in r["timings"]),
        "",
        "## Bytes saved for the backward, per token and layer (LoRA r = 64, every linear module)",
        "",
        "Measured: every tensor autograd saves in a training forward (each storage once, weights left out), 4 layers minus 2, T = 256.",
        "",
        "| backbone | dtype | measured | estimated | estimated / measured |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {x['backbone']} | {x['dtype']} | {x['measured']:.0f} | {x['estimated']} | {x['estimated'] / x['measured']:.3f} |"
          for x in r["saved_bytes_per_token_layer"]),
        "",
        "## Tokens: the estimator's prompt lengths against spdrank's measured prompts",
        "",
        "| source | prompt | N | measured tokens | estimated | estimated / measured |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {x['source']} | {x['prompt']} | {x['n']} | {x['measured']} | {x['estimated']} | {x['estimated'] / x['measured']:.2f} |"
          for x in r["tokens"]),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
