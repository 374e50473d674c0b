"""benchmarks/sasrec_latency.py runs end to end at toy size: its variants' processes, its
comparison of their rankings and its report."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_benchmark


@pytest.mark.slow  # four processes that each import torch
def test_the_benchmark_compares_two_revisions_and_reports(tmp_path, monkeypatch):
    module = load_benchmark("sasrec_latency", monkeypatch)
    out = tmp_path / "out"
    argv = ["--before", "HEAD", "--slates", "4", "--rounds", "2", "--batch", "2",
            "--items", "100", "--out", str(out)]
    assert module.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["rows"]) == ["before", "after"]
    assert results["rows"]["after"]["same_orders"] is True
    assert results["rows"]["after"]["summary"]["slates_timed"] == 8
    assert "sasrec_latency.py --before HEAD" in (out / "command.txt").read_text()
    report = (out / "report.md").read_text()
    assert "| before |" in report and "| after |" in report
