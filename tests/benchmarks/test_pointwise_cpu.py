"""benchmarks/pointwise_cpu.py: SPD, the pointwise peer and FIRST trained, benched, timed and
reported end to end, on a tiny backbone at tiny sizes."""

from __future__ import annotations

import json
import random

import pytest

from spdrank.core.slates import write_slates
from tests.helpers import load_benchmark, make_slate


@pytest.mark.slow  # the whole script end to end: trains, benchmarks and reports (about a minute)
def test_train_bench_time_and_report(tmp_path, tiny_backbone, monkeypatch, one_torch_thread):
    script = load_benchmark("pointwise_cpu", monkeypatch)
    rng = random.Random(0)
    labels = tmp_path / "labels"
    labels.mkdir()
    for split, count in (("train", 8), ("eval", 4)):
        slates = [make_slate(rng, 6, qid=f"{split}{i}", catalogue=30, history=1)
                  for i in range(count)]
        write_slates(labels / f"{split}.labels.slates.jsonl", slates)
    out = tmp_path / "out"
    argv = ["--backbone", tiny_backbone, "--labels", str(labels), "--work", str(tmp_path / "w"),
            "--out", str(out), "--train-slates", "8", "--epochs", "1", "--eval-slates", "4",
            "--sizes", "4,8", "--history", "1", "--latency-slates", "2", "--teacher-slates", "1",
            "--note", "nothing else"]
    assert script.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    latency = results["latency"]
    assert [(r["n"], r["model"]) for r in latency] == [
        (n, m) for n in (4, 8) for m in ("spd", "pointwise", "spd-history", "first")]
    by = {(r["n"], r["model"]): r for r in latency}
    for n in (4, 8):
        # The pointwise peer reads the context once a candidate: more tokens than one prompt.
        assert by[n, "pointwise"]["tokens_mean"] > by[n, "spd"]["tokens_mean"]
        assert all(by[n, m]["p50_ms"] > 0 for m in ("spd", "pointwise", "first"))
    assert by[4, "spd"]["over_spd_per_slate"] == 1.0
    assert [t["n"] for t in results["teacher"]] == [4, 8]
    assert all(t["decode_passes"][0] > 1 for t in results["teacher"])
    bench = json.loads((out / "fidelity" / "results.json").read_text())
    assert set(bench["rankers"]) == {"spd:expected_rank", "pointwise",
                                     "spd-history:expected_rank", "first"}
    report = (out / "report.md").read_text()
    assert "| 8 | pointwise |" in report and "What else ran: nothing else" in report
    assert "| pointwise |" in report.split("## Fidelity after the same training")[1]
