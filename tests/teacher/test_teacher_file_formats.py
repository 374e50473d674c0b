"""``teacher --backend file:PATH`` reads the rankings the field writes: TREC runs, rank_llm's
and RankGPT's results, and spdrank's own ``rank`` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spdrank.core.outputs import result_record
from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError
from spdrank.teacher.backends import FileBackend, Job, read_rankings

SLATE = Slate.from_dict({
    "query": {"qid": "7", "text": "fleas"},
    "candidates": [{"docid": d, "doc": {"text": d}} for d in ("a", "b", "c")],
})


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_trec_run(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.trec", "7 Q0 a 3 1.0 x\n7 Q0 c 1 5.0 x\n7 Q0 b 2 2.0 x\n")
    assert read_rankings(path) == {"7": ["c", "b", "a"]}  # by score, as trec_eval reads it


def test_rank_llm_and_spdrank_results(tmp_path: Path) -> None:
    result = SLATE.to_dict() | {"candidates": [
        {"docid": "b", "doc": {"text": "b"}, "score": 0.9},
        {"docid": "a", "doc": {"text": "a"}, "score": 0.5},
        {"docid": "c", "doc": {"text": "c"}, "score": 0.1},
    ]}
    jsonl = _write(tmp_path / "ranked.jsonl", json.dumps(result) + "\n")
    assert read_rankings(jsonl) == {"7": ["b", "a", "c"]}
    rankgpt = [{"query": "fleas", "hits": [{"qid": 7, "docid": "c"}, {"qid": 7, "docid": "a"},
                                           {"qid": 7, "docid": "b"}]}]
    listed = _write(tmp_path / "rerank.json", json.dumps(rankgpt) + "\n")
    assert read_rankings(listed) == {"7": ["c", "a", "b"]}


def test_rank_output_gives_the_models_ranking_not_the_teacher_it_carried(tmp_path: Path) -> None:
    # What spdrank rank writes (core/outputs.py's result_record): the slate, its label kept,
    # candidates in the model's order, and the timings.
    labelled = Slate.from_dict(SLATE.to_dict() | {"teacher": ["c", "a", "b"]})
    ranking = Ranking(["b", "a", "c"], scores=[0.9, 0.5, 0.1], timings={"head": 1.0})
    ranked = _write(tmp_path / "ranked.jsonl", json.dumps(result_record(labelled, ranking)) + "\n")
    assert read_rankings(ranked) == {"7": ["b", "a", "c"]}
    # A labelled slate, candidates in their original order: its teacher, as before.
    teach = _write(tmp_path / "labels.slates.jsonl", json.dumps(labelled.to_dict()) + "\n")
    assert read_rankings(teach) == {"7": ["c", "a", "b"]}


def test_the_backend_labels_from_a_run(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.trec", "7 Q0 b 1 2.0 x\n7 Q0 a 2 1.0 x\n7 Q0 c 3 0.5 x\n")
    (outcome,) = FileBackend(path).generate([Job(SLATE)])
    assert outcome.error is None and outcome.generation.ids == [2, 1, 3]


def test_an_unknown_shape_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", '{"query": {"qid": "7"}, "candidates": [1, 2]}\n')
    with pytest.raises(SlateError, match=r"x.jsonl:1: every item of 'candidates'"):
        read_rankings(path)
