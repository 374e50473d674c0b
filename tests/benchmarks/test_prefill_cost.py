"""benchmarks/prefill_cost.py: the prefill's cost against N for both prompt kinds, and sliding
windows against one prefill, on a tiny config backbone at tiny sizes."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.benchmarks.test_search_walkthrough import write_example
from tests.helpers import ROOT, tiny_qwen3


@pytest.fixture
def cost(monkeypatch):
    """The script as a module (it imports its neighbours from its own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("prefill_cost")


def test_the_curve_and_the_windows(cost, tmp_path, one_torch_thread):
    backbone = f"config:{tiny_qwen3(tmp_path / 'qwen3')}"
    write_example(tmp_path / "dl19")
    out = tmp_path / "out"
    argv = ["--backbone", backbone, "--layers", "0", "--sizes", "4,12", "--window", "8",
            "--stride", "4", "--reps", "1", "--warmup", "0", "--threads", "1",
            "--passages", str(tmp_path / "dl19" / "retrieve_results_dl19.json"),
            "--note", "nothing", "--out", str(out)]
    assert cost.main(argv) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["dtype"], r["prompt"], r["n"]) for r in rows] == [
        (d, p, n) for d in ("float32", "bfloat16") for p in ("recommendation", "search")
        for n in (4, 12)]
    for r in rows:
        assert r["prefill_ms"] > 0 and r["attention_ms"] > 0 and r["products_ms"] > 0
    search = [r for r in rows if r["prompt"] == "search"]
    assert search[0]["tokens"] < search[1]["tokens"]
    assert "windows" not in search[0] and search[1]["windows"] == 2  # spans (4,12), (0,8)
    text = (out / "report.md").read_text()
    assert "## Where attention starts to dominate" in text and "| float32 | search | 12 |" in text
    assert (out / "command.txt").read_text().startswith(".venv/bin/python benchmarks/prefill_cost.py")
