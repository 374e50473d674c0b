"""Data-parallel training: two CPU processes (gloo) train as one process does on the same batches."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spdrank.commands.cli import main
from spdrank.commands.train import config_argv
from spdrank.core.slates import load_slates
from spdrank.methods.spd.loss import log_sinkhorn
from spdrank.model.ranker import SPDRanker
from spdrank.training.train import TrainConfig, share, train
from tests.helpers import subprocess_env
from tests.helpers import train_config as config


def test_shares_split_each_global_batch_into_near_equal_contiguous_parts():
    for start, stop, processes in [(0, 8, 2), (8, 11, 2), (4, 5, 2), (0, 12, 4), (12, 14, 4)]:
        parts = [share(start, stop, p, processes) for p in range(processes)]
        assert [i for part in parts for i in part] == list(range(start, stop))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tmp_path, train_file, capsys):
    code = main(["train", "--slates", str(train_file), "--out", str(tmp_path / "r"),
                 "--batch-size", "3", "--num-processes", "2", "--no-progress"])
    assert code == 2
    assert "--batch-size 3 does not split evenly over 2 processes" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_launched_process_leaves_without_finalizing_but_loses_nothing_it_printed():
    """``exit_launched`` skips finalization (where gloo's threads can abort the process) yet
    flushes what was printed to a pipe and logged, and exits with the command's code."""
    script = (
        "import atexit, logging\n"
        "from spdrank.training.launch import exit_launched\n"
        "logging.basicConfig()\n"
        "atexit.register(print, 'finalized')\n"
        "print('summary', end='')\n"
        "logging.getLogger('spdrank').warning('logged')\n"
        "exit_launched(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3
    assert done.stdout == "summary"
    assert "logged" in done.stderr


def launch(cfg: TrainConfig, processes: int = 2) -> subprocess.CompletedProcess:
    """``spdrank train --num-processes N`` in a fresh interpreter, on this checkout's spdrank."""
    argv = ["train", f"--num-processes={processes}", *config_argv(cfg)]
    done = subprocess.run([sys.executable, "-m", "spdrank", *argv], env=subprocess_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def assignments(run: Path, tau: float) -> list[torch.Tensor]:
    """The soft assignment (Sinkhorn of the score matrix) the trained model gives each slate."""
    model = SPDRanker.from_pretrained(run)
    return [
        log_sinkhorn(torch.from_numpy(model.score_matrix(s))[None], torch.tensor([len(s)]), tau=tau).exp()[0]
        for s in load_slates(run.parent / "train.jsonl")
    ]


def log_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


@pytest.mark.multiprocess
def test_two_processes_train_like_one_and_only_the_main_one_writes(tmp_path, tiny_backbone, train_file):
    """Two gloo processes, stopped and resumed halfway, against one process on the same batches.

    5 slates in batches of 4: each epoch has a full batch (2 + 2 slates per process) and one of
    a single slate (1 + 0: the idle process joins the gradient all-reduce with a zero-weighted
    pass). No dropout, so only float rounding separates the runs.

    Compared is what the model computes, each slate's soft assignment S, within 1e-5 (and the
    logged losses within a relative 1e-5). Both runs compute the same sums in another order:
    the all-reduce adds two partial gradients, and each process pads its batch to its own
    longest prompt. That moves float32 results by ~1e-7 (1.8e-7 in S measured); a real
    fault, such as each process averaging its own share, moves S by ~1e-2 (8e-3 measured).
    The raw weights are not compared: parameters the output is invariant to (a bias added to
    every entry of a column of M, which Sinkhorn removes; the key bias of attention) have a
    true gradient of zero, and Adam scales their rounding noise up to steps of size lr.
    """
    settings = {"max_steps": 4, "limit": 5, "head_dropout": 0.0, "lr": 1e-2, "head_lr": 1e-2,
                "device": "cpu"}
    train(config(tmp_path, tiny_backbone, out="one", stop_after=2, **settings))
    train(config(tmp_path, tiny_backbone, out="one", **settings))

    two = config(tmp_path, tiny_backbone, out="two", stop_after=2, **settings)
    first = launch(two)
    assert first.stdout.count('"finished"') == 1 and "stopped at step 2/4" in first.stdout
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["log.jsonl", "state"]
    with pytest.raises(ValueError, match="on 2 processes, not 1"):
        train(config(tmp_path, tiny_backbone, out="two", **settings))
    second = launch(dataclasses.replace(two, stop_after=None))
    assert second.stdout.count('"finished"') == 1 and '"processes": 2' in second.stdout
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["log.jsonl", "model", "train.json"]

    one, both = log_lines(tmp_path / "one"), log_lines(tmp_path / "two")
    assert [e["step"] for e in both] == [e["step"] for e in one] == [2, 4]  # each line once
    for a, b in zip(one, both):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for s_one, s_two in zip(assignments(tmp_path / "one", 1.0), assignments(tmp_path / "two", 1.0)):
        torch.testing.assert_close(s_two, s_one, atol=1e-5, rtol=0)
