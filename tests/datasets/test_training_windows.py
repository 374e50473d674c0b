"""``spdrank data windows --subsets``: random subsets bounded by what a slate has, none twice
and none a sliding window, and a count past the most one slate is cut into refused before
anything is read."""

from __future__ import annotations

import json
import random
from math import comb
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.defaults import MAX_SUBSETS
from spdrank.core.slates import Slate, read_slates
from spdrank.datasets.search import random_subsets, subsets_allowed, training_windows


def _slate(n: int, qid: str = "q") -> Slate:
    return Slate.from_dict({
        "query": {"qid": qid, "text": "q"},
        "candidates": [{"docid": f"d{i}", "doc": {"text": f"t{i}"}} for i in range(n)],
        "teacher": [f"d{i}" for i in range(n)],
    })


@pytest.mark.parametrize(("n", "window", "stride"), [(21, 20, 10), (6, 4, 2), (9, 3, 3)])
def test_a_slate_gives_every_subset_it_has_once(n, window, stride):
    from spdrank.rankers.windows import Windows

    windows = training_windows(_slate(n), window, stride, subsets=MAX_SUBSETS)
    full = [frozenset(w.docids) for w in windows if len(w) == window]
    assert len(full) == len(set(full)) == comb(n, window)  # every subset, a window's once
    spans = len(Windows(window, stride).spans(n))
    assert len(windows) - spans == subsets_allowed(n, window, stride)


def test_subsets_are_distinct_and_reproducible():
    taken = {tuple(range(5))}
    drawn = random_subsets(30, 5, 200, taken, random.Random(0))
    assert len(drawn) == len(set(drawn)) == 200 and not set(drawn) & taken
    assert drawn == random_subsets(30, 5, 200, taken, random.Random(0))
    # Past half of all subsets taken: listed and sampled, still none twice.
    few = random_subsets(7, 5, 30, taken, random.Random(0))
    assert len(few) == comb(7, 5) - 1 and len(set(few)) == len(few)


def _labelled(path: Path, n: int) -> Path:
    path.write_text(json.dumps(_slate(n, "q1").to_dict()) + "\n")
    return path


def test_data_windows_subsets_are_bounded_by_the_slate(tmp_path, capsys):
    """A slate of 21 candidates has 21 subsets of 20, one of them a sliding window: asking
    for thousands gives the 20 others, once each, and says so."""
    out = tmp_path / "w.jsonl"
    code = main(["data", "windows", "--slates", str(_labelled(tmp_path / "s.jsonl", 21)),
                 "--window", "20", "--stride", "10", "--subsets", "5000", "--out", str(out)])
    assert code == 0
    windows = list(read_slates(out))
    subsets = [frozenset(w.docids) for w in windows[2:]]
    assert len(windows) == 2 + 20 and len(set(subsets)) == 20
    assert frozenset(windows[0].docids) not in subsets
    assert "1 slates have fewer than --subsets 5000" in capsys.readouterr().out


def test_data_windows_refuses_more_subsets_than_a_slate_is_cut_into(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    code = main(["data", "windows", "--slates", str(_labelled(tmp_path / "s.jsonl", 30)),
                 "--subsets", "10000000", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--subsets 10,000,000" in err
    assert not out.exists()
