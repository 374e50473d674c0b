"""The first forward at a new prompt length against the second, per dtype, on one thread.

    .venv/bin/python benchmarks/first_call_cpu.py --model runs/overhead-cpu/spd-k160 \\
        [--dtypes float32,bfloat16] [--lengths 410:450:2]

A backbone's forward at each length, twice in a row (random token ids: the time does not
depend on them), after one warm-up forward at another length. Prints the median thread CPU
time of the first and of the second forward per dtype: what a prompt of a length not seen
before costs over one seen before (oneDNN builds its bfloat16 kernels per shape).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from spdrank.model import SPDRanker


def forward_ms(model: SPDRanker, length: int) -> float:
    ids = torch.randint(0, 1000, (1, length))
    mask = torch.ones(1, length, dtype=torch.long)
    start = time.thread_time()
    model.backbone(input_ids=ids, attention_mask=mask)
    return (time.thread_time() - start) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--lengths", default="410:450:2", help="START:STOP:STEP token counts")
    args = p.parse_args()
    torch.set_num_threads(1)
    start, stop, step = (int(x) for x in args.lengths.split(":"))
    for dtype in args.dtypes.split(","):
        model = SPDRanker.from_pretrained(args.model, device="cpu", dtype=dtype)
        with torch.inference_mode():
            forward_ms(model, start - 10)
            pairs = [(forward_ms(model, n), forward_ms(model, n)) for n in range(start, stop, step)]
        first = statistics.median(a for a, _ in pairs)
        second = statistics.median(b for _, b in pairs)
        print(f"{dtype}: first forward at a new length {first:.1f} ms, second {second:.1f} ms "
              f"(thread CPU, medians over {len(pairs)} lengths)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
