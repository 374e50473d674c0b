"""One rule for a TREC run that ranks part of a slate (``rankers/run_ranker.py``'s
``run_ranking``), applied alike by ``eval --run`` and the teacher's ``file:RUN.trec``: the
candidates it ranks first, the others after them in the slate's order as a tie; the same
validity and metrics either way, the same line on the slates it ranks little of, and a
teacher label whose unranked candidates share their positions in training."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import Candidate, Query, Slate, read_slates, write_slates
from spdrank.rankers.run_ranker import RunRanker, run_ranking
from spdrank.training.targets import target_matrix

N = 10


def _slates() -> list[Slate]:
    """Four search slates of N passages; a judged-relevant passage in each."""
    return [
        Slate(Query(f"q{q}", f"query {q}"),
              [Candidate(f"q{q}p{i}", {"text": f"passage {i} of {q}"}) for i in range(N)],
              relevance={f"q{q}p{N - 1}": 2, f"q{q}p3": 1})
        for q in range(4)
    ]


def _run(path: Path) -> Path:
    """A run of a deeper first stage: for q0-q2 it ranks one candidate (the slate's last)
    among docids no slate holds; for q3 every candidate, in reverse."""
    lines = []
    for q in range(3):
        ranked = [f"other{q}-{j}" for j in range(30)]
        ranked.insert(5, f"q{q}p{N - 1}")
        lines += [f"q{q} Q0 {d} {r + 1} {100 - r}.0 run\n" for r, d in enumerate(ranked)]
    lines += [f"q3 Q0 q3p{i} {N - i} {float(i)} run\n" for i in range(N)]
    path.write_text("".join(lines))
    return path


def test_the_rule_puts_unranked_candidates_after_the_ranked_as_a_tie() -> None:
    slate = _slates()[0]
    ranking, ranked = run_ranking(slate, [("x", 9.0), ("q0p7", 5.0), ("q0p2", 5.0), ("y", 1.0)])
    assert ranked == 2
    rest = [d for d in slate.docids if d not in ("q0p7", "q0p2")]
    assert ranking.docids == ["q0p7", "q0p2", *rest]
    tail = ranking.scores[2:]
    assert len(set(tail)) == 1 and tail[0] < 5.0  # tied among themselves, below the ranked
    none, zero = run_ranking(slate, [("x", 1.0)])
    assert zero == 0 and none.docids == slate.docids and set(none.scores) == {0.0}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    slates = tmp_path / "slates.jsonl"
    write_slates(slates, _slates())
    return slates, _run(tmp_path / "first.trec")


def _eval(slates: Path, out: Path, *args: str) -> dict:
    assert main(["eval", "--slates", str(slates), "--k", "10", "--json", str(out),
                 "--no-progress", *args]) == 0
    return json.loads(out.read_text())["rankers"]


def test_eval_run_and_a_file_teacher_of_the_run_give_one_verdict(files, tmp_path, caplog, capsys):
    slates, run = files
    with caplog.at_level(logging.WARNING):
        as_run = _eval(slates, tmp_path / "run.json", "--run", f"r={run}")["r"]
    thin = ("ranks less than 50% of the candidates of 3 of 4 slates ('q0', 'q1', 'q2'): their "
            "unranked candidates follow in the slate's given order, tied below the ranked ones")
    assert f"r: {run} {thin}" in caplog.text

    caplog.clear()
    labels = tmp_path / "labels.jsonl"
    with caplog.at_level(logging.WARNING):
        assert main(["teacher", "--slates", str(slates), "--backend", f"file:{run}",
                     "--out", str(labels), "--prompt", "search", "--no-progress"]) == 0
    summary = capsys.readouterr().out
    assert f"teacher: {run} {thin}" in caplog.text  # the same line, when the teacher ends
    records = [json.loads(line) for line in labels.read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * 4  # no out_of_range: the rule, not a parse
    assert [r["ranked"] for r in records] == [1, 1, 1, N]
    assert [line.split() for line in summary.splitlines() if line.startswith(("ok ", "out_"))] \
        == [["ok", "4", "100.0%"], ["out_of_range", "0", "0.0%"]]

    as_labels = _eval(slates, tmp_path / "labels.json", "--labels", f"t={labels}")["t"]
    assert as_labels["valid_pct"] == as_run["valid_pct"] == 100.0
    for metric in ("nDCG@10", "AP", "RR"):
        assert as_labels["metrics"][metric] == as_run["metrics"][metric], metric
    assert f"t: {labels} {thin}" in caplog.text


def test_training_shares_the_positions_of_the_candidates_a_run_left_unranked(files, tmp_path):
    slates, run = files
    labels = tmp_path / "labels.jsonl"
    assert main(["teacher", "--slates", str(slates), "--backend", f"file:{run}",
                 "--out", str(labels), "--prompt", "search", "--no-progress"]) == 0
    first = next(iter(read_slates(tmp_path / "labels.slates.jsonl")))
    assert first.teacher[0] == f"q0p{N - 1}"
    target = target_matrix(first, "teacher")
    ranked = first.docids.index(f"q0p{N - 1}")
    assert target[ranked, 0] == 1.0  # the one candidate the run ranked: first
    rest = [i for i in range(N) if i != ranked]
    # The others share positions 2..N alike: the run gave no order among them.
    np.testing.assert_allclose(target[rest, 1:], 1.0 / (N - 1))


def test_a_run_ranker_counts_what_it_ranked_once_per_slate(files) -> None:
    slates, run = files
    ranker = RunRanker(run)
    for slate in list(read_slates(slates)) * 2:  # a warm-up ranks a slate twice
        ranker.rank(slate)
    assert ranker.ranked == {"q0": (1, N), "q1": (1, N), "q2": (1, N), "q3": (N, N)}


def _other_ids(path: Path) -> Path:
    """A run over the same queries in another id space: no docid is a slate's."""
    path.write_text("".join(f"q{q} Q0 doc{q}-{j} {j + 1} {10 - j}.0 run\n"
                            for q in range(4) for j in range(5)))
    return path


def test_a_fusion_component_of_another_id_space_is_said_as_eval_run_says_it(files, tmp_path,
                                                                            caplog):
    slates, _ = files
    other = _other_ids(tmp_path / "other.trec")
    spec = f"fusion:rrf:random+run:{other}"
    with caplog.at_level(logging.WARNING):
        _eval(slates, tmp_path / "fused.json", "--ranker", spec)
    assert (f"{spec}: run:{other}: {other} ranks none of the candidates of 4 slates "
            "('q0', 'q1', 'q2' and 1 more), which keep their given order: are its docids the "
            "slates'?") in caplog.text


def test_a_teacher_ranker_fusing_a_run_of_another_id_space_says_so(files, tmp_path, caplog):
    slates, _ = files
    other = _other_ids(tmp_path / "other.trec")
    with caplog.at_level(logging.WARNING):
        assert main(["teacher", "--slates", str(slates), "--out", str(tmp_path / "l.jsonl"),
                     "--backend", f"ranker:fusion:rrf:random+run:{other}", "--prompt", "search",
                     "--no-progress"]) == 0
    assert f"{other} ranks none of the candidates of 4 slates" in caplog.text


def test_a_fusion_component_that_is_no_regular_file_says_what_it_is(files, capsys):
    slates, _ = files
    with pytest.raises(SystemExit):  # a usage error of --ranker
        main(["eval", "--slates", str(slates), "--ranker", "fusion:rrf:random+run:/dev/zero",
              "--no-progress"])
    err = capsys.readouterr().err
    assert "/dev/zero is a character device: a TREC run file must be a regular file" in err, err
    assert "no such" not in err


@pytest.mark.parametrize("fields", [5, 7])
def test_a_teacher_file_with_trec_lines_of_other_widths_says_so(files, tmp_path, fields, capsys):
    slates, _ = files
    run = tmp_path / "run.trec"
    line = " ".join(["q0", "Q0", "q0p1", "1", "2.0", "tag", "extra"][:fields])
    run.write_text(line + "\n")
    assert main(["teacher", "--slates", str(slates), "--out", str(tmp_path / "l.jsonl"),
                 "--backend", f"file:{run}", "--prompt", "search", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert f"{run}:1: neither JSON" in err and f"it has {fields} fields" in err, err
    assert "invalid JSON" not in err


def test_a_teacher_file_that_lacks_qids_does_not_ask_for_the_same_rerun(files, tmp_path, capsys):
    slates, _ = files
    run = tmp_path / "part.trec"
    run.write_text("".join(f"q0 Q0 q0p{i} {i + 1} {10 - i}.0 run\n" for i in range(N)))
    main(["teacher", "--slates", str(slates), "--out", str(tmp_path / "l.jsonl"),
          "--backend", f"file:{run}", "--prompt", "search", "--no-progress",
          "--max-failures", "0"])
    out = capsys.readouterr().out
    assert f"3 selected slates have no label: {run} has no ranking for them" in out, out
    assert "rerun the same command" not in out
