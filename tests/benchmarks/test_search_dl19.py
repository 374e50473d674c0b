"""benchmarks/search_dl19_cpu.py: its folds, its constrained run and its commands."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "search_dl19_cpu.py"


def _module():
    spec = importlib.util.spec_from_file_location("search_dl19_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_folds_partition_the_queries_and_are_seeded() -> None:
    bench = _module()
    qids = [f"q{i}" for i in range(43)]
    folds = bench.folds_of(qids, 5)
    assert sorted(q for f in folds for q in f) == sorted(qids)
    assert sorted(len(f) for f in folds) == [8, 8, 9, 9, 9]
    assert folds == bench.folds_of(list(reversed(qids)), 5)


def test_the_constrained_run_keeps_its_head_and_bm25s_tail(tmp_path: Path) -> None:
    bench = _module()
    top = tmp_path / "top.jsonl"
    top.write_text(json.dumps({"query": {"qid": "1"}, "teacher": ["c", "a"]}) + "\n")
    full = tmp_path / "full.jsonl"
    full.write_text(json.dumps({"query": {"qid": "1"}, "candidates": [
        {"docid": d} for d in ("a", "c", "b", "d")]}) + "\n")
    bench.constrained_run(top, top, full, tmp_path / "run.trec")
    lines = [line.split() for line in (tmp_path / "run.trec").read_text().splitlines()]
    assert [x[2] for x in lines] == ["c", "a", "b", "d"]
    assert [float(x[4]) for x in lines] == sorted((float(x[4]) for x in lines), reverse=True)


def test_the_dry_run_names_every_step() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # Every step, whether it would run ("+") or is reused from an earlier run ("= (done)").
    steps = [line.split("spdrank ", 1)[1].split()[0] for line in done.stdout.splitlines()
             if line.startswith(("+ spdrank ", "= (done) spdrank "))]
    assert steps.count("train") == 10 and steps.count("eval") >= 5
    assert "teacher" in steps
