"""``spdrank eval --reference ROW``: every other row paired with ROW slate by slate, with the
interval ``spdrank bench`` computes (``eval/paired.py``'s ``difference_of``, its resamples and
seed), printed under the table and written to ``--json``; a name that is no row refused
before anything is ranked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import write_slates
from spdrank.eval.paired import RESAMPLES, difference_of
from tests.helpers import make_slates


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write_slates(tmp_path / "train.jsonl", make_slates(40, seed=1, prefix="t"))
    write_slates(tmp_path / "eval.jsonl", make_slates(30, seed=2))
    return tmp_path


def _eval(files: Path, *extra: str) -> int:
    return main(["eval", "--slates", str(files / "eval.jsonl"), "--ranker", "random",
                 "--ranker", "popularity", "--no-progress", *extra])


def test_every_row_is_paired_with_the_reference_as_bench_pairs_it(files, capsys):
    out, rows = files / "out.json", files / "rows.jsonl"
    assert _eval(files, "--reference", "random", "--json", str(out), "--per-slate",
                 str(rows)) == 0
    printed = capsys.readouterr().out
    paired = json.loads(out.read_text())["paired"]
    assert paired["reference"] == "random" and list(paired["rows"]) == ["popularity"]
    assert paired["resamples"] == RESAMPLES and paired["seed"] == 0
    assert "NDCG@10" in paired["metrics"] and "AUC" in paired["metrics"]

    # The same numbers from the per-slate rows, through the function bench's compare uses.
    per_slate = [json.loads(line) for line in rows.read_text().splitlines()]
    mine = {r["index"]: r for r in per_slate if r["ranker"] == "popularity"}
    for metric in paired["metrics"]:
        diffs = np.asarray([
            mine[r["index"]][metric] - r[metric] for r in per_slate
            if r["ranker"] == "random" and r[metric] is not None
            and mine[r["index"]][metric] is not None
        ])
        assert paired["rows"]["popularity"][metric] == difference_of(diffs).to_dict(), metric

    # Under the table: a heading naming the reference, a line a metric with its interval.
    assert "paired vs random: mean over slates of (row - random)" in printed
    d = paired["rows"]["popularity"]["NDCG@10"]
    line = next(t for t in printed.splitlines() if t.startswith("NDCG@10 "))
    assert f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" in line
    assert line.split()[1] == str(d["n"])


def test_a_reference_that_names_no_row_is_one_line_before_any_ranking(files, capsys):
    assert _eval(files, "--reference", "bm25", "--json", str(files / "out.json")) == 2
    captured = capsys.readouterr()
    assert "--reference 'bm25' names no row; rows: random, popularity" in captured.err
    assert captured.out == "" and not (files / "out.json").exists()


def test_bootstrap_without_a_reference_is_refused(files, capsys):
    assert _eval(files, "--bootstrap", "100") == 2
    assert "--bootstrap" in capsys.readouterr().err


def test_without_a_reference_nothing_is_paired(files, capsys):
    out = files / "out.json"
    assert _eval(files, "--json", str(out)) == 0
    assert "paired vs" not in capsys.readouterr().out
    assert "paired" not in json.loads(out.read_text())
