"""--holdout: queries (with all their windows) set aside as a run's eval slates."""

from __future__ import annotations

import json
import random

import pytest

from spdrank.core.slates import load_slates, write_slates
from spdrank.training.holdout import hold_out
from tests.methods.test_anchor import search_slate


def windows_file(tmp_path, queries: int = 10, windows: int = 3):
    rng = random.Random(0)
    slates = []
    for q in range(queries):
        for j in range(windows):
            slate = search_slate(rng, f"q{q}", 6)
            slate.query.qid = f"q{q}#{j}"
            slates.append(slate)
    write_slates(tmp_path / "all.jsonl", slates)
    return tmp_path / "all.jsonl"


def test_a_query_is_held_out_with_all_its_windows_and_the_draw_is_seeded(tmp_path):
    source = windows_file(tmp_path)
    train, valid = hold_out(source, 3, tmp_path / "a", seed=0)
    held = {s.query.qid for s in load_slates(valid)}
    kept = {s.query.qid for s in load_slates(train)}
    assert len(held) == 9 and len(kept) == 21 and not held & kept
    assert len({qid.split("#")[0] for qid in held}) == 3
    again, _ = hold_out(source, 3, tmp_path / "b", seed=0)
    assert again.read_bytes() == train.read_bytes()
    other, _ = hold_out(source, 3, tmp_path / "c", seed=1)
    assert other.read_bytes() != train.read_bytes()


def test_holding_out_from_a_held_out_part_is_refused(tmp_path):
    """A run given its own held-out training part: writing the part would destroy it."""
    train, _ = hold_out(windows_file(tmp_path), 3, tmp_path / "run" / "holdout", seed=0)
    before = train.read_bytes()
    with pytest.raises(ValueError, match=r"--out .*train.jsonl is the same file as --slates"):
        hold_out(train, 2, tmp_path / "run" / "holdout", seed=0)
    assert train.read_bytes() == before


def test_holding_out_every_query_is_refused(tmp_path):
    with pytest.raises(ValueError, match="would leave none"):
        hold_out(windows_file(tmp_path, queries=2), 2, tmp_path / "h", seed=0)


def test_train_with_holdout_selects_on_the_held_out_queries(tmp_path, capsys):
    from spdrank.commands.cli import main

    source = windows_file(tmp_path, queries=12, windows=1)
    out = tmp_path / "run"
    args = ["train", "--slates", str(source), "--out", str(out), "--holdout", "4",
            "--target", "relevance", "--features", "score", "--features-only", "--head",
            "attn", "--prompt", "search", "--positions", "8", "--head-width", "16",
            "--epochs", "2", "--batch-size", "4", "--no-progress"]
    assert main(args) == 0
    summary = json.loads((out / "train.json").read_text())
    assert summary["eval_slates"] == 4 and summary["train_slates"] == 8
    assert summary["selected"]["metric"] == "nDCG@10"
    assert "on its 4 eval slates" in capsys.readouterr().out
    assert main([*args[:7], "--eval-slates", str(source), *args[7:]]) == 2
    assert "drop --eval-slates" in capsys.readouterr().err


def test_a_share_holds_out_that_share_of_the_queries(tmp_path):
    from spdrank.training.holdout import held_out_count

    assert held_out_count(0.2, 43) == 9 and held_out_count(0.01, 43) == 1
    assert held_out_count(3, 43) == 3
    with pytest.raises(ValueError, match="share below 1"):
        held_out_count(2.5, 43)
    _, valid = hold_out(windows_file(tmp_path), 0.3, tmp_path / "h", seed=0)
    assert len({s.query.qid.split("#")[0] for s in load_slates(valid)}) == 3
