"""What ``spdrank eval`` says around its table: a count every ranker shares said once, default
baselines without a training file skipped with a note (a named one still refused)."""

from __future__ import annotations

import logging

from spdrank.commands.cli import main
from spdrank.core.slates import write_slates
from spdrank.eval.evaluate import evaluate, format_table
from tests.helpers import Fixed, item_slate, make_slates


def test_a_count_every_ranker_shares_is_one_line():
    tied = item_slate("t", [], list("abcd"), clicked=["a"], teacher=list("abcd"))
    tied.teacher_scores = [0.0] * 4  # a teacher that orders no pair: no tau for any ranker
    ordered = item_slate("o", [], list("abcd"), clicked=["b"], teacher=list("abcd"))
    rankers = [Fixed("same", lambda s: s.docids), Fixed("reversed", lambda s: s.docids[::-1])]
    table = format_table(evaluate(rankers, [tied, ordered], warmup=0))
    assert "tau over 1 of 2 slates (every ranker)" in table.splitlines()
    assert "same: tau" not in table and "reversed: tau" not in table
    # One ranker: its name, as before.
    alone = format_table(evaluate(rankers[:1], [tied, ordered], warmup=0))
    assert "same: tau over 1 of 2 slates" in alone.splitlines()


def test_default_baselines_without_a_training_file_are_skipped_with_a_note(
    tmp_path, caplog, capsys
):
    write_slates(tmp_path / "eval.jsonl", make_slates(4))  # no train.jsonl beside it
    with caplog.at_level(logging.WARNING):
        assert main(["eval", "--slates", str(tmp_path / "eval.jsonl"), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "random" in table and "popularity" not in table and "cooccurrence" not in table
    (note,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    assert note.startswith("skipped popularity, cooccurrence: they fit on training slates")
    assert "--train FILE" in note
    # Named, a ranker that needs the file still needs it; so does a --train that is missing.
    assert main(["eval", "--slates", str(tmp_path / "eval.jsonl"), "--ranker", "popularity",
                 "--no-progress"]) == 2
    assert "need training slates" in capsys.readouterr().err
    assert main(["eval", "--slates", str(tmp_path / "eval.jsonl"), "--train",
                 str(tmp_path / "nope.jsonl"), "--no-progress"]) == 2
    assert "need training slates" in capsys.readouterr().err
