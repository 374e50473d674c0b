"""benchmarks/train_profile.py on a tiny model: both steps, the step as issue 59 found it and
as it is now, are timed and profiled on the same batch, each kind of work gets its time, and
the floor comes from the profiled step's own products."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from spdrank.core.slates import write_slates
from tests.helpers import load_benchmark, make_slate


def profile_tiny(tiny_backbone: str, tmp_path: Path, monkeypatch, *options: str) -> Path:
    """The script over 8 small slates on the tiny model (1 layer, K = 8, one timed step a
    variant), with ``options``; its output folder."""
    profile = load_benchmark("train_profile", monkeypatch)
    rng = random.Random(0)
    slates = tmp_path / "train.jsonl"
    write_slates(slates, [make_slate(rng, rng.randint(4, 8), f"t{i}") for i in range(8)])
    out = tmp_path / "out"
    argv = ["--slates", str(slates), "--backbone", tiny_backbone, "--settings", "1x8",
            *options, "--steps", "1", "--reps", "1", "--batch-size", "2", "--out", str(out),
            "--", "--max-item-tokens", "8"]
    assert profile.main(argv) == 0
    return out


def test_the_profile_times_both_steps_against_one_floor(tiny_backbone, tmp_path, monkeypatch):
    out = profile_tiny(tiny_backbone, tmp_path, monkeypatch)

    setting, = json.loads((out / "results.json").read_text())["settings"]
    assert set(setting["variants"]) == {"before", "after"}
    for variant in setting["variants"].values():
        assert variant["step_ms"] > 0 and len(variant["steps_ms"]) == 1
        spent = variant["spent_ms"]
        assert spent["forward"]["backbone matmuls"] > 0 and spent["backward"]["adapters"] > 0
        assert spent["forward"]["Sinkhorn loss"] > 0 and spent["forward"]["optimizer"] > 0
    floor = setting["floor_ms"]
    assert floor["matrix products"] > 0 and floor["attention products"] > 0
    assert setting["over_floor"] == setting["variants"]["after"]["step_ms"] / floor["total"]
    report = (out / "report.md").read_text()
    assert "| 1 | 8 | float32 |" in report and "| Sinkhorn loss |" in report
    assert (out / "command.txt").read_text().startswith(
        ".venv/bin/python benchmarks/train_profile.py --slates ")


@pytest.mark.slow  # torch.compile builds the stack's graphs: about 40 s
def test_a_compiled_step_is_timed_and_the_floor_kept_from_the_profiled_one(
    tiny_backbone, tmp_path, monkeypatch
):
    out = profile_tiny(tiny_backbone, tmp_path, monkeypatch, "--variants", "after,compiled")

    setting, = json.loads((out / "results.json").read_text())["settings"]
    after, compiled = setting["variants"]["after"], setting["variants"]["compiled"]
    assert compiled["step_ms"] > 0 and "spent_ms" not in compiled  # timed, not profiled
    assert setting["over_floor"] == after["step_ms"] / setting["floor_ms"]["total"]
    assert setting["speedup"] is None  # no step as found to compare with
    report = (out / "report.md").read_text()
    assert f"| {after['step_ms']:.0f} | {compiled['step_ms']:.0f} |" in report
    assert "| kind | after |" in report  # the profile's table holds the profiled step alone
