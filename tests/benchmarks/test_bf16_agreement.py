"""benchmarks/bf16_agreement.py: one checkpoint ranked in float32 and bfloat16, on tiny ones."""

from __future__ import annotations

import importlib
import json
import random

import pytest

from spdrank.core.ranking import Ranking
from spdrank.core.slates import write_slates
from spdrank.model.ranker import SPDRanker
from tests.helpers import ROOT, make_slate, tiny_config


@pytest.fixture
def agreement(monkeypatch):
    """The script as a module (it imports machine.py from its own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bf16_agreement")


def test_agreement_is_tau_and_top1_against_the_float32_ranking(agreement):
    ref = Ranking(docids=["a", "b", "c", "d"], scores=[0.9, 0.5, 0.5, 0.1])
    assert agreement.agreement(ref, Ranking(docids=["a", "b", "c", "d"])) == (1.0, 1.0)
    assert agreement.agreement(ref, Ranking(docids=["d", "c", "b", "a"])) == (-1.0, 0.0)
    # b and c tie in the reference: their order is no disagreement
    assert agreement.agreement(ref, Ranking(docids=["a", "c", "b", "d"])) == (1.0, 1.0)
    # scores that rise along the ranking are no ties to read: every pair counts
    rising = Ranking(docids=["a", "b", "c"], scores=[0.1, 0.2, 0.3])
    assert agreement.agreement(rising, Ranking(docids=["b", "a", "c"]))[0] == pytest.approx(1 / 3)


def test_summary_reads_mean_and_min_tau_against_the_bar(agreement, tmp_path, tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone, frozen=True))
    model.save_pretrained(tmp_path / "m")
    row = agreement.SlateRow
    rows = [row("a", 5, 1.0, 1.0, 10.0, 4.0), row("b", 5, 0.98, 1.0, 12.0, 6.0),
            row("c", 1, None, None, 8.0, 5.0)]
    s = agreement.summary("m", tmp_path / "m", model, rows, min_tau=0.99)
    assert s["tau_mean"] == pytest.approx(0.99) and s["tau_min"] == 0.98
    assert s["slates"] == 3 and s["slates_with_tau"] == 2 and s["tau_at_least_min"] == 0.5
    assert s["p50_ms"] == {"float32": 10.0, "bfloat16": 5.0} and s["speedup"] == 2.0
    assert s["agrees"] and s["head"] == "attn"
    assert not agreement.summary("m", tmp_path / "m", model, rows, min_tau=0.995)["agrees"]


@pytest.mark.parametrize("kind", ["attn", "history"])
def test_the_script_ranks_each_slate_in_both_dtypes_and_writes_its_report(
    agreement, tmp_path, tiny_backbone, kind, capsys
):
    config = tiny_config(tiny_backbone, kind=kind, frozen=True)
    config.prompt.history_items = kind == "history"
    SPDRanker.build(config).save_pretrained(tmp_path / "m")
    rng = random.Random(0)
    write_slates(tmp_path / "eval.jsonl", [
        make_slate(rng, rng.randint(1, 8), qid=f"q{i}", catalogue=20, history=3)
        for i in range(6)
    ])
    out = tmp_path / "out"
    argv = ["--model", f"{kind}={tmp_path / 'm'}", "--slates", str(tmp_path / "eval.jsonl"),
            "--limit", "5", "--warmup", "1", "--threads", "1", "--min-tau", "-1",
            "--note", "nothing else", "--out", str(out)]
    assert agreement.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    (row,) = results["models"]
    assert row["name"] == kind and row["head"] == kind and row["slates"] == 5
    assert row["saved_dtype"] == "auto"  # what the checkpoint says, not the dtype loaded last
    assert -1 <= row["tau_min"] <= row["tau_mean"] <= 1 and 0 <= row["top1"] <= 1
    assert row["p50_ms"]["float32"] > 0 and row["p50_ms"]["bfloat16"] > 0
    assert len(results["per_slate"][kind]) == 5
    meta = results["meta"]
    assert meta["threads"] == 1 and meta["note"] == "nothing else" and meta["commit"]
    assert meta["auto_ranks_in"] == "float32"  # the tests' own answer (SPDRANK_CPU_BF16=0)
    text = (out / "report.md").read_text()
    assert f"| {kind} | {kind} | 5 |" in text and "also running: nothing else" in text
    assert "Every checkpoint agrees" in text
    command = (out / "command.txt").read_text()
    assert command.startswith(".venv/bin/python benchmarks/bf16_agreement.py --model ")
    # a bar no ranking reaches: the report is written, and the exit says so
    assert agreement.main([*argv[:-2], "--min-tau", "1.01", "--out", str(tmp_path / "o2")]) == 1
    assert "Short of mean tau 1.01" in (tmp_path / "o2" / "report.md").read_text()


def test_a_slate_past_the_models_k_is_one_line(agreement, tmp_path, tiny_backbone, capsys):
    SPDRanker.build(tiny_config(tiny_backbone, frozen=True, positions=4)).save_pretrained(
        tmp_path / "m")
    write_slates(tmp_path / "eval.jsonl", [make_slate(random.Random(0), 6, qid="big")])
    code = agreement.main(["--model", f"m={tmp_path / 'm'}", "--slates",
                           str(tmp_path / "eval.jsonl"), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "slate 'big' has 6 candidates" in err
    assert not (tmp_path / "o").exists()
