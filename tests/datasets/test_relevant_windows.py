"""``data windows --relevant-only``: the windows a relevance target can learn from, and a
``train --target relevance --cache-states`` that meets one it cannot names that flag, not
recommendation's ``--require-clicks``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import Slate, read_slates


def _judged(path: Path, n: int = 8) -> Path:
    """One labelled search slate whose only relevant passage is its best-ranked: the bottom
    window (windows of 4, stride 2, bottom-up) holds none."""
    slate = Slate.from_dict({
        "query": {"qid": "q1", "text": "argan oil"},
        "candidates": [{"docid": f"d{i}", "doc": {"text": f"passage {i}"}} for i in range(n)],
        "teacher": [f"d{i}" for i in range(n)],
        "relevance": {"d0": 2, "d7": 0},
    })
    path.write_text(json.dumps(slate.to_dict()) + "\n")
    return path


def _windows(tmp_path: Path, *extra: str) -> list[Slate]:
    out = tmp_path / "w.jsonl"
    assert main(["data", "windows", "--slates", str(_judged(tmp_path / "s.jsonl")),
                 "--window", "4", "--stride", "2", "--out", str(out), *extra]) == 0
    return list(read_slates(out))


def test_every_window_is_kept_by_default_and_the_unjudged_ones_counted(tmp_path, capsys):
    windows = _windows(tmp_path)
    assert len(windows) == 3
    assert sum(not any((w.relevance or {}).get(d, 0) > 0 for d in w.docids)
               for w in windows) == 2
    assert ("2 of 3 windows hold no passage graded above 0: `train --target relevance` cannot "
            "learn from them (--relevant-only leaves them out)") in capsys.readouterr().out


def test_relevant_only_keeps_the_windows_with_a_relevant_passage(tmp_path, capsys):
    windows = _windows(tmp_path, "--relevant-only")
    assert [sorted(w.docids) for w in windows] == [["d0", "d1", "d2", "d3"]]
    out = capsys.readouterr().out
    assert "wrote 1 windows" in out
    assert "left out 2 of 3 windows without a passage graded above 0 (--relevant-only)" in out


def test_a_cached_relevance_run_caches_and_trains_on_the_judged_windows(tmp_path, tiny_backbone,
                                                                       capsys):
    windows = tmp_path / "w.jsonl"
    assert main(["data", "windows", "--slates", str(_judged(tmp_path / "s.jsonl")),
                 "--window", "4", "--stride", "2", "--out", str(windows)]) == 0
    capsys.readouterr()
    code = main(["train", "--slates", str(windows), "--out", str(tmp_path / "run"),
                 "--backbone", tiny_backbone, "--target", "relevance", "--frozen",
                 "--cache-states", str(tmp_path / "cache"), "--positions", "4",
                 "--prompt", "search", "--max-steps", "2", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    key = json.loads((tmp_path / "cache" / "train" / "key.json").read_text())
    assert key["key"]["slates"]["count"] == 1  # the one window with a relevant passage
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["train_slates"] == 1 and summary["skipped_slates"] == 2


@pytest.mark.parametrize("flag", [[], ["--relevant-only"]])
def test_slates_without_judgements_are_not_counted_unless_asked(tmp_path, capsys, flag):
    slate = Slate.from_dict({
        "query": {"qid": "q1", "text": "q"},
        "candidates": [{"docid": f"d{i}", "doc": {"text": f"t{i}"}} for i in range(6)],
        "teacher": [f"d{i}" for i in range(6)],
    })
    (tmp_path / "s.jsonl").write_text(json.dumps(slate.to_dict()) + "\n")
    out = tmp_path / "w.jsonl"
    argv = ["data", "windows", "--slates", str(tmp_path / "s.jsonl"), "--window", "4",
            "--stride", "2", "--out", str(out), *flag]
    if flag:  # asked: none of a slate without judgements is a relevance target's, so nothing
        assert main(argv) == 2
        assert ("no window to write: none of its 1 slates' windows holds a passage graded "
                "above 0") in capsys.readouterr().err
        assert not out.exists()
    else:
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert "graded above 0" not in printed and len(list(read_slates(out))) == 2


def test_a_slate_within_one_window_is_said_to_be_kept_whole(tmp_path, capsys):
    assert main(["data", "windows", "--slates", str(_judged(tmp_path / "s.jsonl")), "--window",
                 "8", "--stride", "4", "--subsets", "5", "--out", str(tmp_path / "w.jsonl")]) == 0
    assert ("1 slates hold at most --window 8 candidates: each written whole, one window and no "
            "--subsets 5, e.g. ['q1']") in capsys.readouterr().out
