"""benchmarks/soak.py: a few seconds of it against a real ``spdrank serve``, and its RSS rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.fixture
def soak(monkeypatch):
    """benchmarks/soak.py as a module (it imports serve_harness from its own folder)."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("soak")


def test_rss_rule_compares_quarters_after_warm_up(soak):
    flat = [(t, 300.0 + (50.0 if t < 10 else 0.0) + t % 3) for t in range(100)]
    assert soak.rss_growth(flat, warmup=0.2, tolerance=0.1)["ok"]  # the warm-up peak ignored
    growing = [(t, 300.0 + 2 * t) for t in range(100)]
    verdict = soak.rss_growth(growing, warmup=0.2, tolerance=0.1)
    assert not verdict["ok"] and verdict["growth"] > 0.1 and verdict["verdict"].startswith("GREW")
    assert not soak.rss_growth([], warmup=0.2, tolerance=0.1)["ok"]


@pytest.mark.slow  # launches `spdrank serve` and soaks it
def test_a_short_soak_answers_everything_and_reports(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "0.05",
           "--requests", "200", "--out", str(tmp_path), "--name", "soak-test"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    out = tmp_path / "soak-test"
    record = json.loads((out / "results.json").read_text())
    assert record["five_xx"] == 0 and record["problems"] == {}, record["problem_samples"]
    assert record["server_alive"] and record["answered"] == record["sent"] <= 200
    statuses = record["statuses"]
    assert set(statuses["valid"]) == {"200"} and statuses["hostile"]  # JSON keys are strings
    assert all(400 <= int(s) < 500 for s in statuses["hostile"])
    assert record["latency_ms"]["all"]["p50"] > 0 and record["requests_per_s"] > 0
    assert record["rss_samples"] and "verdict" in record["rss"]
    assert record["command"].endswith("--name soak-test") and record["code"] and record["date"]
    assert "feature_far_outside_training" in record["hostile_kinds"]
    # A short run's RSS may still be settling: the exit status must follow the verdict.
    assert (done.returncode == 0) == record["passed"] == record["rss"]["ok"], done.stdout
    report = (out / "report.md").read_text()
    assert "# Soak test: soak-test" in report and record["verdict"] in report
