"""Does torch.compile make a checkpoint's head cheaper? Its inference path against compiled heads.

    .venv/bin/python benchmarks/compiled_head.py --model runs/overhead-cpu/spd-k160 \\
        --slates data-out/v-uniform/eval.jsonl [--sizes 50,150] [--reps 300] [--out FILE]

At a slate's size the head's cost is mostly the fixed cost of its ~25 tensor operations, which
one compiled kernel per layer would remove. This script times, on one thread, interleaved call
by call over the same slates (so a shared machine's load falls on every variant alike):

- ``eager``: the head as ``rank()`` runs it (its functional inference path, the matrix
  products in bfloat16 with oneDNN-packed weights);
- ``inductor``: the head's modules in bfloat16, compiled by torch.compile's Inductor with
  its weights frozen into the graph (``freezing``), for the slate's fixed shape;
- ``inductor-cpp-gemm``: the same with max-autotune choosing between ATen's products and
  Inductor's C++ GEMM template for each product.

Reports each variant's minimum and median ms per head call, its compile time and its largest
difference from ``eager``'s scores. With ``--after-prefill`` each timed call follows the
backbone's forward of its slate, as in ``rank()``: after other work each distinct operation's
first call is slower (``first_touch.py``), and a compiled head runs fewer of them. The
paper's head (``--head attn``) only: the compiled variants run the head's module forward
(its reference path), which for the history head would time a different algorithm than
``rank()`` runs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config as inductor_config

sys.path.insert(0, str(Path(__file__).parent))

from overhead_micro import write_figures

from spdrank.backbone import last_hidden
from spdrank.bench.latency import resize_slates
from spdrank.model import SPDRanker
from spdrank.slates import load_slates

VARIANTS = ("eager", "inductor", "inductor-cpp-gemm")


def compiled(head: torch.nn.Module, cpp_gemm: bool) -> torch.nn.Module:
    """A bfloat16 copy of ``head`` whose forward is compiled by Inductor, weights frozen."""
    inductor_config.freezing = True
    inductor_config.max_autotune = cpp_gemm
    if cpp_gemm:
        inductor_config.max_autotune_gemm_backends = "CPP,ATEN"
    head._cast.reset()  # its cached oneDNN weights cannot be copied; the next call rebuilds them
    module = copy.deepcopy(head).to(torch.bfloat16).eval()
    return torch.compile(module.reference, dynamic=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--sizes", default="50,150")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--slates-per-size", type=int, default=10)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--after-prefill", action="store_true",
                   help="time each call right after the backbone's forward of its slate")
    p.add_argument("--out", help="also write the figures here as JSON, the table beside it")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = SPDRanker.from_pretrained(args.model, device="cpu", dtype="bfloat16").eval()
    if type(model.head).__name__ != "SelfAttentionHead":
        p.error(f"{args.model} has a {type(model.head).__name__}: this compares the paper's "
                "head (--head attn) only")
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}: choose from {list(VARIANTS)}")
    slates = load_slates(args.slates, limit=100)
    header = (f"{'N':>4} {'variant':<18} {'min ms':>8} {'median ms':>10} "
              f"{'compile s':>10} {'max |diff|':>11}")
    rows, lines = [], [header]
    print(lines[0], flush=True)
    for n in (int(x) for x in args.sizes.split(",")):
        batches = [model.collate([model.encode(s)])
                   for s in resize_slates(slates, n, 0)[: args.slates_per_size]]
        with torch.inference_mode():
            inputs = [model.read(b) for b in batches]
        # What the compiled bfloat16 modules read: the same states and features, cast once.
        args_of = [(x.items.to(torch.bfloat16), b.item_mask,
                    None if b.features is None else b.features.to(torch.bfloat16))
                   for x, b in zip(inputs, batches)]
        calls, compile_s, diff = {}, {}, {}
        with torch.no_grad():
            reference = [model.score(x, b) for x, b in zip(inputs, batches)]
            for name in variants:
                if name == "eager":
                    calls[name] = lambda i, x=inputs, b=batches: model.score(x[i], b[i])
                    compile_s[name], diff[name] = 0.0, 0.0
                    continue
                fn = compiled(model.head, cpp_gemm=name == "inductor-cpp-gemm")
                start = time.perf_counter()
                out = [fn(*a) for a in args_of]
                compile_s[name] = time.perf_counter() - start
                diff[name] = max(float((o.float() - r).abs().max())
                                 for o, r in zip(out, reference))
                calls[name] = lambda i, fn=fn, a=args_of: fn(*a[i])
            for call in calls.values():
                for i in range(len(batches)):
                    call(i)
            wall: dict[str, list[float]] = {name: [] for name in calls}
            for r in range(args.reps):
                for name, call in calls.items():
                    if args.after_prefill:
                        b = batches[r % len(batches)]
                        last_hidden(model.backbone, b.input_ids, b.attention_mask)
                    t0 = time.perf_counter()
                    call(r % len(batches))
                    wall[name].append((time.perf_counter() - t0) * 1e3)
        for name in calls:
            row = {"n": n, "variant": name, "min": min(wall[name]),
                   "median": statistics.median(wall[name]), "compile_s": compile_s[name],
                   "max_abs_diff": diff[name]}
            rows.append(row)
            lines.append(f"{n:>4} {name:<18} {row['min']:>8.3f} {row['median']:>10.3f} "
                         f"{row['compile_s']:>10.1f} {row['max_abs_diff']:>11.4f}")
            print(lines[-1], flush=True)
    if args.out:
        write_figures(args.out, {"model": args.model, "reps": args.reps,
                                 "after_prefill": args.after_prefill}, rows, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
