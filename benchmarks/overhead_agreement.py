"""Does bfloat16 rank as float32 does? One checkpoint's rankings of the same slates, compared.

    .venv/bin/python benchmarks/overhead_agreement.py --model runs/overhead-cpu/spd-k160 \\
        --slates data-out/v-uniform/eval.jsonl [--limit 100] [--sizes 20,50] [--out FILE]

For each slate size, the checkpoint ranks the slates three ways: float32 throughout (the
reference), the backbone in bfloat16 with the head's products in float32, and both in
bfloat16 (what ``--dtype bfloat16`` runs on a CPU). Reported per way: the share of slates
ranked exactly as the reference, the same top 1 and top 10, the mean Kendall tau with the
reference, and the largest difference of a score matrix's entries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from spdrank.bench.latency import resize_slates
from spdrank.model import SPDRanker
from spdrank.slates import load_slates


def rankings(model: SPDRanker, slates: list) -> tuple[list[list[str]], list[np.ndarray]]:
    """Each slate's ranking (docids, best first) and score matrix, from one forward."""
    matrices = [model.score_matrix(s) for s in slates]
    orders = [[s.docids[i] for i in model.order(m)] for s, m in zip(slates, matrices)]
    return orders, matrices


def compare(ref: tuple, got: tuple) -> dict[str, float]:
    (ref_orders, ref_m), (orders, m) = ref, got
    taus = []
    for a, b in zip(ref_orders, orders):
        position = {d: i for i, d in enumerate(b)}
        taus.append(kendalltau(range(len(a)), [position[d] for d in a]).statistic)
    return {
        "identical": float(np.mean([a == b for a, b in zip(ref_orders, orders)])),
        "same_top1": float(np.mean([a[0] == b[0] for a, b in zip(ref_orders, orders)])),
        "same_top10": float(np.mean([a[:10] == b[:10] for a, b in zip(ref_orders, orders)])),
        "mean_tau": float(np.mean(taus)),
        "max_abs_score_diff": float(max(np.abs(x - y).max() for x, y in zip(ref_m, m))),
        "score_scale": float(max(np.abs(x).max() for x in ref_m)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--sizes", default="20,50")
    p.add_argument("--out")
    args = p.parse_args()
    slates = load_slates(args.slates, limit=args.limit)
    exact = SPDRanker.from_pretrained(args.model, device="cpu", dtype="float32")
    low = SPDRanker.from_pretrained(args.model, device="cpu", dtype="bfloat16")
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        sized = resize_slates(slates, n, 0)
        ref = rankings(exact, sized)
        low.head.compute_dtype = None
        backbone_only = compare(ref, rankings(low, sized))
        low.head.compute_dtype = torch.bfloat16
        both = compare(ref, rankings(low, sized))
        for way, row in (("bf16 backbone, f32 head", backbone_only), ("bf16 both", both)):
            rows.append({"n": n, "way": way, "slates": len(sized), **row})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
