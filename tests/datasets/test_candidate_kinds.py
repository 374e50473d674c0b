"""A candidate file says what it holds (``--candidates-are``): a retriever's lists, where a
missed target is the retriever's miss (inserted with a warning, or left out), or negatives
sampled per user, beside which the target always goes, as the sampled-negative protocol
(LLMRank, RecBole) has it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import read_slates
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions

#: The module that says how many targets were inserted.
LOGGER = "spdrank.datasets.candidates"


def write_inputs(folder: Path, lists: list[str]) -> dict[str, Path]:
    """Five users' sequences (targets c, d, c, c, c), titles, and their candidate lists."""
    files = {"seq": folder / "seq.txt", "titles": folder / "titles.tsv", "cands": folder / "c.txt"}
    files["seq"].write_text("u1 a b c\nu2 a b d\nu3 b c\nu4 a c\nu5 x y c\n", encoding="utf-8")
    titles = "".join(f"{i}\tTitle {i}\n" for i in "abcdefxy")
    files["titles"].write_text("item_id\ttitle\n" + titles, encoding="utf-8")
    files["cands"].write_text("".join(line + "\n" for line in lists), encoding="utf-8")
    return files


def build(folder: Path, lists: list[str], **options):
    files = write_inputs(folder, lists)
    return build_from_files(
        files["seq"], files["titles"], folder / "out",
        BuildOptions(candidates=3, eval_fraction=0.0, **options),
        candidate_file=files["cands"], progress=False,
    )


NEGATIVES = ["u1 e f", "u2 e a", "u3 a e", "u4 e f", "u5 e f"]  # no target among them


def test_sampled_negatives_always_get_their_target_and_no_retriever_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = build(tmp_path, NEGATIVES, candidates_are="sampled")
    slates = {s.query.qid: s for s in read_slates(result.train_path)}
    assert {qid: s.clicked for qid, s in slates.items()} == {
        "u1": ["c"], "u2": ["d"], "u3": ["c"], "u4": ["c"], "u5": ["c"],
    }
    assert {qid: sorted(s.docids) for qid, s in slates.items()} == {
        "u1": ["c", "e", "f"], "u2": ["a", "d", "e"], "u3": ["a", "c", "e"],
        "u4": ["c", "e", "f"], "u5": ["c", "e", "f"],
    }
    assert result.manifest["counts"]["targets_added"] == 5
    assert result.manifest["parameters"]["candidates_are"] == "sampled"
    assert "sampled" in result.manifest["policies"]["candidates_are"]
    messages = [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "inserted" in
                r.getMessage()]
    assert not any("--no-insert-target" in m for m in messages)
    assert "5 of 5 targets inserted beside their sampled negatives" in " ".join(messages)


def test_sampled_lists_that_already_hold_their_target_are_said_in_the_same_line(
    tmp_path, caplog
):
    """u2's and u4's "negatives" hold their targets (d, c): kept where the list put them, not
    inserted twice, and counted beside the inserted ones rather than passed over."""
    lists = ["u1 e f", "u2 d a", "u3 a e", "u4 e c", "u5 e f"]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = build(tmp_path, lists, candidates_are="sampled")
    slates = {s.query.qid: s for s in read_slates(result.train_path)}
    assert sorted(slates["u2"].docids) == ["a", "d"] and sorted(slates["u4"].docids) == ["c", "e"]
    assert result.manifest["counts"]["targets_added"] == 3
    (line,) = [r.getMessage() for r in caplog.records if "sampled negatives" in r.getMessage()]
    assert line == ("3 of 5 targets inserted beside their sampled negatives (the sampled-negative "
                    "protocol); 2 lists already held their user's target, kept where the list "
                    "put it and not inserted again")


def test_a_retrievers_lists_keep_their_warning_which_names_the_sampled_kind(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = build(tmp_path, NEGATIVES)
    assert result.manifest["counts"]["targets_added"] == 5
    assert "candidates_are" not in result.manifest["parameters"]  # a retriever's: as before
    (warned,) = [r.getMessage() for r in caplog.records if "inserted" in r.getMessage()]
    assert warned.startswith("5 of 5 targets were not among the retriever's top 3 candidates")
    assert "--no-insert-target" in warned and "--candidates-are sampled" in warned
    missed = build(tmp_path, NEGATIVES, insert_target=False, candidates_are="retrieved")
    assert missed.manifest["counts"]["targets_not_retrieved"] == 5


def test_sampled_negatives_refuse_what_contradicts_them(tmp_path):
    with pytest.raises(ValueError, match="--no-insert-target contradicts --candidates-are"):
        BuildOptions(candidates_are="sampled", insert_target=False)
    with pytest.raises(ValueError, match=r"c.txt: --candidates-are sampled, but the candidates "
                       r"carry scores"):
        build(tmp_path, ["u1 e:0.5 f:0.2"], candidates_are="sampled")
    with pytest.raises(ValueError, match="candidates_are must be one of"):
        BuildOptions(candidates_are="negatives")


def test_the_cli_flag_picks_the_kind_and_the_summary_says_it(tmp_path, capsys):
    files = write_inputs(tmp_path, NEGATIVES)
    argv = ["data", "sequences", "--sequences", str(files["seq"]), "--titles",
            str(files["titles"]), "--candidates", "3", "--eval-fraction", "0", "--no-progress"]
    assert main([*argv, "--candidate-file", str(files["cands"]), "--candidates-are", "sampled",
                 "--out", str(tmp_path / "cli")]) == 0
    assert "candidate lists (sampled negatives): 5 targets added" in capsys.readouterr().out
    assert main([*argv, "--candidates-are", "sampled", "--out", str(tmp_path / "none")]) == 2
    assert "--candidates-are sampled describes a --candidate-file" in capsys.readouterr().err
    assert main([*argv, "--candidate-file", str(files["cands"]), "--candidates-are", "sampled",
                 "--no-insert-target", "--out", str(tmp_path / "both")]) == 2
    assert "contradicts" in capsys.readouterr().err


def test_a_list_of_nothing_to_rank_the_target_against_makes_no_slate(tmp_path):
    """A bare user, or a list of the target alone, would be a slate of one candidate: ranked
    first by any ranker, a hit counted for nothing."""
    result = build(tmp_path, ["u1 e f", "u2", "u3 c", "u4 e c", "u5 e f"],
                   candidates_are="sampled")
    slates = {s.query.qid for s in read_slates(result.train_path)}
    assert slates == {"u1", "u4", "u5"}
    assert result.manifest["counts"]["users_without_candidate_list"] == 2


def test_sampled_lists_that_hold_the_users_own_items_are_said(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        build(tmp_path, ["u1 a e", "u2 e f", "u3 e f", "u4 e f", "u5 e f"],
              candidates_are="sampled")
    (said,) = [r.getMessage() for r in caplog.records if "own history" in r.getMessage()]
    assert said.startswith("1 of the 5 sampled lists of") and "(e.g. user 'u1')" in said
