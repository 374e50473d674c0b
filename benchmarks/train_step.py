"""One training step's time: `spdrank train`'s own step, timed step by step.

    .venv/bin/python benchmarks/train_step.py --warmup 2 --steps 10 --json step.json -- \\
        --slates data-out/beauty-uniform/train.jsonl --out runs/step --target clicks \\
        --positions 150 --batch-size 8 --device cuda --dtype bfloat16 --no-progress

Everything after ``--`` is `spdrank train`'s arguments, read by its own parser (so LoRA, the
head, the backbone, ``--backbone config:PATH`` included, are exactly what `spdrank train`
would build); ``--max-steps`` becomes ``--warmup`` + ``--steps``. Each step
(:meth:`spdrank.training.train.Trainer.train_step`: forward, backward, clipping, the optimizer)
is timed alone, the device synchronized around it, after ``--warmup`` untimed steps (kernel
selection, the allocator's first growth). The run then finishes as `spdrank train`
finishes it (``OUT/model``, ``OUT/train.json``), so the same call also leaves a checkpoint to
time inference on.

The first warm-up step runs under torch's FLOP counter (``torch.utils.flop_counter``: the
matrix products and attention of the forward and backward), so the timings come with the
step's FLOPs and its model FLOPs utilisation: those FLOPs over the median step's time over the
device's stated dense bf16 peak (``--peak-tflops``; on a GPU that benchmarks/gpu_estimate.py
lists, its figure). With ``--warmup 0`` nothing is counted. Peak memory is torch's peak
allocated memory on a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's options, and the `spdrank train` arguments after ``--``."""
    import spdrank.commands.cli

    if "--" not in argv:
        raise SystemExit("usage: train_step.py [--warmup W] [--steps S] [--json FILE] -- TRAIN ARGS")
    split = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--json", metavar="FILE", help="write the timings here as JSON")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense bf16 peak in TFLOP/s, for the MFU (default: "
                        "benchmarks/gpu_estimate.py's figure for the GPU it runs on)")
    own = p.parse_args(argv[:split])
    if own.warmup < 0 or own.steps < 1:
        p.error("--warmup must be at least 0 and --steps at least 1")
    train = spdrank.commands.cli.build_parser().parse_args(["train", *argv[split + 1 :]])
    return own, train


def stated_peak_tflops(device: Any) -> float | None:
    """The dense bf16 peak benchmarks/gpu_estimate.py states for this CUDA device (its key a
    word of the device's name: "NVIDIA H200" is h200); None on a CPU or a GPU it does not list."""
    if device.type != "cuda":
        return None
    import torch
    from gpu_estimate import DEVICES

    name = torch.cuda.get_device_name(device).lower()
    for key, stated in DEVICES.items():
        if re.search(rf"\b{key}\b", name):
            return stated.bf16_tflops
    return None


def time_steps(trainer: Any, warmup: int, steps: int) -> tuple[list[float], float | None]:
    """Milliseconds of each of ``steps`` training steps, after ``warmup`` untimed ones, and the
    FLOPs of one step, counted over the first warm-up step (None without one)."""
    from torch.utils.flop_counter import FlopCounterMode

    trainer.open_caches()
    trainer.model.train()
    flops = None
    for i in range(warmup):
        if i == 0:
            counter = FlopCounterMode(display=False)
            with counter:
                trainer.train_step()
            flops = float(counter.get_total_flops())
        else:
            trainer.train_step()
    times = []
    for _ in range(steps):
        trainer.spd.synchronize()
        t0 = time.perf_counter()
        trainer.train_step()
        trainer.spd.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, flops


def summary(trainer: Any, times: list[float], warmup: int, flops: float | None = None,
            peak_tflops: float | None = None) -> dict[str, Any]:
    """What the timings are of: the step's batch, backbone, adaptation and device, and the
    step's FLOPs and MFU when they are known."""
    import torch

    cfg = trainer.cfg
    spd = trainer.spd
    device = trainer.accelerator.device
    backbone = spd.config.backbone
    trainable = sum(p.numel() for p in spd.parameters() if p.requires_grad)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    median_s = statistics.median(times) / 1e3
    achieved = None if flops is None else flops / median_s / 1e12
    return {
        "step_ms": {
            "median": statistics.median(times),
            "min": min(times),
            "mean": statistics.fmean(times),
            "all": times,
        },
        "warmup_steps": warmup,
        "batch_size": cfg.batch_size,
        "slates_per_s": cfg.batch_size * 1e3 / statistics.median(times),
        "backbone": backbone.name_or_path,
        "random_weights": backbone.random_weights,
        "layers": backbone.layers,
        "lora_r": None if backbone.lora is None else backbone.lora.r,
        "trainable_params": trainable,
        "head": cfg.head,
        "positions": spd.config.head.positions,
        "device": str(device),
        "dtype": str(next(spd.backbone.parameters()).dtype).removeprefix("torch."),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "peak_memory_mb": peak,
        "flops_per_step": flops,
        "tflops": achieved,
        "peak_tflops": peak_tflops,
        "mfu": None if achieved is None or not peak_tflops else achieved / peak_tflops,
    }


def main(argv: list[str] | None = None) -> int:
    own, args = parse(sys.argv[1:] if argv is None else argv)
    from spdrank.commands.train import config_from_args
    from spdrank.training.train import Trainer

    cfg = config_from_args(args)
    cfg.max_steps = own.warmup + own.steps
    trainer = Trainer(cfg)
    started = time.perf_counter()
    times, flops = time_steps(trainer, own.warmup, own.steps)
    peak_tflops = own.peak_tflops or stated_peak_tflops(trainer.accelerator.device)
    result = summary(trainer, times, own.warmup, flops, peak_tflops)
    trainer.finish(time.perf_counter() - started)
    trainer.accelerator.end_training()
    text = json.dumps(result, indent=2)
    if own.json:
        Path(own.json).parent.mkdir(parents=True, exist_ok=True)
        Path(own.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
