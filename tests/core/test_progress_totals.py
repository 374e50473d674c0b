"""Long steps say up front how much work they have, and their progress lines off a terminal
carry the total, what is running and the time left: ``spdrank eval`` (its slate count, its
rankers) and the state cache (its slates and shards)."""

from __future__ import annotations

import gzip
import io
import logging

import pytest

import spdrank.core.progress
from spdrank.commands.cli import main
from spdrank.commands.eval import slate_total
from spdrank.core.progress import Progress, duration
from spdrank.core.slates import write_slates
from tests.helpers import make_slates


def test_a_line_with_a_total_says_the_time_left(caplog):
    ticks = iter(range(0, 1000, 30))  # 30 s an update
    with caplog.at_level(logging.INFO, logger="spdrank.core.progress"):
        bar = Progress("eval (spd)", unit="slate", total=100, every_s=10,
                       clock=lambda: next(ticks), file=io.StringIO())
        bar.update(10)
        bar.close()
    first = caplog.records[0].getMessage()
    assert first == "eval (spd): 10/100 slates, 0.3 slates/s, about 4 min 30 s left"
    assert [duration(s) for s in (42, 185, 8040)] == ["42 s", "3 min 5 s", "2 h 14 min"]


@pytest.fixture
def eval_files(tmp_path):
    write_slates(tmp_path / "train.jsonl", make_slates(10, seed=1, prefix="t"))
    write_slates(tmp_path / "eval.jsonl", make_slates(6, seed=2, prefix="e"))
    return tmp_path


def test_eval_says_its_slates_and_rankers_and_counts_down_off_a_terminal(
    eval_files, monkeypatch, caplog
):
    monkeypatch.setattr(spdrank.core.progress, "EVERY_S", 0.0)
    with caplog.at_level(logging.INFO):
        assert main(["eval", "--slates", str(eval_files / "eval.jsonl"), "--ranker", "random",
                     "--ranker", "popularity"]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert "eval: 6 slates, 2 rankers (random, popularity)" in lines
    progress = [line for line in lines if line.startswith("eval (random, popularity): ")]
    assert progress[0].startswith("eval (random, popularity): 1/6 slates, ")
    assert "left" in progress[0]
    assert progress[-1].startswith("eval (random, popularity): 6/6 slates, ")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["eval", "--slates", str(eval_files / "eval.jsonl"), "--ranker", "random",
                     "--limit", "4"]) == 0
    assert "eval: 4 slates, 1 ranker (random)" in [r.getMessage() for r in caplog.records]


def test_the_slate_count_is_the_files_lines_or_the_limit(tmp_path):
    plain = tmp_path / "s.jsonl"
    write_slates(plain, make_slates(5))
    plain.write_text(plain.read_text() + "\n\n", encoding="utf-8")  # blank lines: no slates
    assert (slate_total(plain, None), slate_total(plain, 3), slate_total(plain, 9)) == (5, 3, 5)
    zipped = tmp_path / "s.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    assert (slate_total(zipped, None), slate_total(zipped, 3)) == (None, 3)


def test_the_state_cache_says_what_it_will_compute_before_it_starts(
    tmp_path, tiny_backbone, caplog
):
    import torch

    from spdrank.model.ranker import SPDRanker
    from spdrank.model.state_cache import open_state_cache
    from tests.helpers import tiny_config

    write_slates(tmp_path / "train.jsonl", make_slates(7))
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone, frozen=True)).eval()
    with caplog.at_level(logging.INFO, logger="spdrank.model.state_cache"):
        open_state_cache(tmp_path / "c", model, tmp_path / "train.jsonl", 7, storage="float32",
                         batch_size=2, shard_size=3, progress=False)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said == (f"cache states: 7 of 7 slates to compute (0 already cached) into 3 shards "
                    f"of 3 in {tmp_path / 'c'}, prefills of 2 slates")
