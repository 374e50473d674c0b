"""``--smoke``: benchmarks/gpu.sh runs every step on a CPU at toy scale, with the real run's
commands (only the sizes, the backbone and the device differ), so a command a lent GPU would
run has run before it is lent."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, tiny_qwen3

SCRIPT = ROOT / "benchmarks" / "gpu.sh"
#: The flags whose values are sizes (or say them: a report's title), which the smoke run
#: shrinks; every other argument of every command is the real run's.
SIZE_FLAGS = frozenset({
    "--candidates", "--validation", "--limit", "--max-new-tokens", "--batch-size",
    "--positions", "--lora-r", "--lora-alpha", "--latency-sizes", "--latency-slates",
    "--latency-batch", "--eval-limit", "--epochs", "--warmup", "--steps", "--title",
})
#: The same for an experiment's settings (``benchmarks/run.py --set NAME=VALUE``).
SIZE_SETTINGS = frozenset({"epochs"})
#: Where the smoke run writes (both runs are given the same data, work and output folders).
SMOKE_DIR = "/smoke"
#: What the smoke run's backbones and cut data stand for in the real run, in the order they
#: are replaced.
BACKBONES = (
    (f"{SMOKE_DIR}/tiny-qwen3", "bundled"),
    (f"shared={SMOKE_DIR}/trec", "shared=/shared"),
)


def dry_run(smoke: bool) -> list[list[str]]:
    """The commands ``bash benchmarks/gpu.sh [--smoke] --dry-run`` prints, each as its argv;
    both runs read and write the same folders, so paths differ only where sizes name them."""
    env = {**os.environ, "BIN": "/bin-dir", "SMOKE_DIR": SMOKE_DIR, "DATA": "/data",
           "FDATA": "/fdata", "WORK": "/work", "OUT": "/out", "SHARED": "/shared"}
    for name in ("BACKBONE", "DEVICE", "DTYPE", "SEARCH_BACKBONE"):
        env.pop(name, None)
    done = subprocess.run(
        ["bash", str(SCRIPT), *(["--smoke"] if smoke else []), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    return [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("/bin-dir/")]


def normalised(argv: list[str]) -> list[str]:
    """``argv`` with every size replaced by ``N``, the device by ``DEVICE`` and the smoke
    run's backbones and data by the real run's."""
    out = []
    for i, arg in enumerate(argv):
        before = argv[i - 1] if i else ""
        name = arg.partition("=")[0] if before == "--set" else None
        if before in SIZE_FLAGS or name in SIZE_SETTINGS:
            arg = "N" if name is None else f"{name}=N"
        elif before == "--device" or name == "device":
            arg = "DEVICE" if name is None else "device=DEVICE"
        for smoke, real in BACKBONES:
            arg = arg.replace(smoke, real)
        out.append(re.sub(r"eval-ar\d+", "eval-arN", arg))  # the AR slates' file names their count
    return out


def test_the_smoke_run_runs_the_real_runs_commands():
    real, smoke = dry_run(smoke=False), dry_run(smoke=True)
    # The smoke run's own first step: the tiny model folder every backbone stands for.
    made = [argv for argv in smoke if argv[1:2] == ["benchmarks/tiny_backbone.py"]]
    assert len(made) == 1 and made[0][-1] == f"{SMOKE_DIR}/tiny-qwen3"
    smoke = [argv for argv in smoke if argv not in made]
    assert len(smoke) == len(real) >= 5
    for a, b in zip(real, smoke):
        assert normalised(a) == normalised(b), f"\nreal:  {shlex.join(a)}\nsmoke: {shlex.join(b)}"
    # ... and they are the small ones, on the CPU.
    every = [arg for argv in smoke for arg in argv]
    assert "cuda" not in every and every.count("--device") >= 4
    assert "8" in [b for a, b in itertools.pairwise(every) if a == "--candidates"]


def test_a_smoke_run_keeps_a_few_slates_of_each_split(tmp_path):
    """smoke_cut: the first $SLATES slates of each file, in place; a real run leaves them."""
    for name in ("train", "eval"):
        (tmp_path / f"{name}.jsonl").write_text("".join(f"{name}{i}\n" for i in range(5)))
    for smoke, kept in ((0, 5), (1, 3)):
        cut = f". benchmarks/lib.sh; DRY=0 SMOKE={smoke} SLATES=3 smoke_cut {tmp_path}"
        subprocess.run(["bash", "-c", cut], cwd=ROOT, check=True, timeout=30)
        for name in ("train", "eval"):
            lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
            assert lines == [f"{name}{i}" for i in range(kept)]


def test_an_unknown_argument_is_a_usage_error():
    done = subprocess.run(["bash", str(SCRIPT), "--smok"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "usage: bash benchmarks/gpu.sh [--smoke] [--dry-run]" \
        in done.stderr


def run_smoke(tmp_path: Path, timeout: int, **settings: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BIN": str(Path(sys.executable).parent),
           "SMOKE_DIR": str(tmp_path / "smoke"), "OMP_NUM_THREADS": "1"}
    for name in ("DATA", "FDATA", "WORK", "OUT", "BACKBONE", "DEVICE", "DTYPE"):
        env.pop(name, None)
    env.update(settings)
    done = subprocess.run(["bash", str(SCRIPT), "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


def steps_run(tmp_path: Path) -> list[str]:
    timings = (tmp_path / "smoke" / "out" / "timings.tsv").read_text().splitlines()
    return [line.split("\t")[0] for line in timings]


#: The GPU run's steps, in order (the search steps need the shared TREC DL files).
GPU_STEPS = [
    "data", "cooccurrence-train", "cooccurrence-eval", "train-step", "step-latency", "train-attn",
    "bench-all",
    "teacher-direct", "teacher-reasoning", "bench-teachers", "data-features",
    *(f"{teacher}-{split}" for split in ("train", "valid", "eval")
      for teacher in ("lexical", "likelihood")),
    "fidelity-lexical", "fidelity-bench-lexical", "fidelity-likelihood",
    "fidelity-bench-likelihood", "fidelity-clicks-3f", "fidelity-clicks-llm",
    "fidelity-bench-clicks",
]
SHARED = ROOT.parent / "shared" / "data"
SEARCH_FILES = [SHARED / f"trec-{s}" / f"retrieve_results_{s}.json" for s in ("dl19", "dl21", "dl22")]


@pytest.mark.slow  # every step of the GPU run: minutes on 2 cores
def test_gpu_smoke_runs_every_step(tmp_path):
    done = run_smoke(tmp_path, timeout=1800)
    report = (tmp_path / "smoke" / "out" / "report.md").read_text()
    assert "**smoke run**" in report and "tiny-qwen3" in report
    if all(path.is_file() for path in SEARCH_FILES):
        assert steps_run(tmp_path) == [*GPU_STEPS, "search"]
        report = (tmp_path / "smoke" / "out" / "search" / "report.md").read_text()
        assert "--set 'layers=[]'" in report and "## DL19 (8 queries" in report
    else:  # a clone without the shared files: the search steps are skipped, and said to be
        assert steps_run(tmp_path) == GPU_STEPS
        assert "the search step skipped" in done.stdout


def test_a_run_of_some_steps_passes_over_the_others(tmp_path):
    """ONLY: the script runs through with the named steps alone; what sits between steps does
    not assume the others ran (a short run runs what tells most first). The smoke backbone's
    folder is there already (no step here reads it), so the script keeps it."""
    tiny_qwen3(tmp_path / "smoke" / "tiny-qwen3")
    done = run_smoke(tmp_path, timeout=600, ONLY="data")
    assert steps_run(tmp_path) == ["data"]
    assert "== data-features: not in ONLY, left for a later run" in done.stdout
    assert "== search: not in ONLY" in done.stdout or "the search step skipped" in done.stdout


#: The offline bundle's preflight (benchmarks/offline_bundle.sh): the first steps, which say
#: in a minute whether the host's torch runs spdrank's training and ranking.
FIRST_STEPS = "data cooccurrence-train cooccurrence-eval train-step step-latency"


@pytest.mark.slow  # trains a step and benchmarks its checkpoint: a minute on 2 cores
def test_the_first_steps_time_a_config_backbones_shape(tmp_path):
    """The training step and the ranking latency of a backbone built from its config alone
    (random weights: how a larger model's shape is timed, benchmarks/configs/qwen3-0.6b.json
    at full scale), as the offline bundle's preflight runs them."""
    backbone = f"config:{tmp_path}/smoke/tiny-qwen3"
    run_smoke(tmp_path, timeout=900, ONLY=FIRST_STEPS, BACKBONE=backbone)
    assert steps_run(tmp_path) == FIRST_STEPS.split()
    out = tmp_path / "smoke" / "out"
    assert json.loads((out / "train-step.json").read_text())["random_weights"]
    assert "## Latency decomposition" in (out / "step-latency" / "report.md").read_text()
