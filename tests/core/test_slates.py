"""The slate model: validation errors name file:line and the problem; files round-trip."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
from pathlib import Path

import pytest

from spdrank.core.files import atomic_writer
from spdrank.core.slates import (
    Candidate,
    Query,
    Slate,
    SlateError,
    dumps_slate,
    load_slates,
    read_slates,
    write_slates,
)

GOOD: dict = {
    "query": {"qid": "u1", "text": "1. Lipstick"},
    "candidates": [
        {"docid": "a", "doc": {"title": "Mascara"}, "score": 0.0},
        {"docid": "b", "doc": {"title": "Shampoo"}, "score": 0.0},
        {"docid": "c", "doc": {"title": "Soap"}, "score": 0.0},
    ],
    "clicked": ["a"],
    "teacher": ["b", "a", "c"],
}


def _good() -> dict:
    return copy.deepcopy(GOOD)


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _error_for(tmp_path: Path, bad_line: str) -> str:
    """The SlateError message for a file whose line 2 is ``bad_line`` (line 1 is good)."""
    path = _write_lines(tmp_path / "slates.jsonl", [json.dumps(GOOD), bad_line])
    with pytest.raises(SlateError) as info:
        list(read_slates(path))
    message = str(info.value)
    assert message.startswith(f"{path}:2: "), message
    assert info.value.where == f"{path}:2"
    return message


def _error_for_slate(tmp_path: Path, slate: dict) -> str:
    return _error_for(tmp_path, json.dumps(slate))


# -- one test per validation case -----------------------------------------------------------


def test_invalid_json(tmp_path):
    message = _error_for(tmp_path, '{"query": {"qid": "u1", "text": "x"}, "candidates": [')
    assert "invalid JSON" in message


def test_not_an_object(tmp_path):
    assert "must be a JSON object" in _error_for(tmp_path, "[1, 2]")


def test_missing_query(tmp_path):
    slate = _good()
    del slate["query"]
    assert "missing field 'query'" in _error_for_slate(tmp_path, slate)


def test_missing_query_text(tmp_path):
    slate = _good()
    del slate["query"]["text"]
    assert "missing field 'query.text'" in _error_for_slate(tmp_path, slate)


def test_missing_candidates(tmp_path):
    slate = _good()
    del slate["candidates"]
    assert "missing field 'candidates'" in _error_for_slate(tmp_path, slate)


def test_empty_candidates(tmp_path):
    slate = _good()
    slate["candidates"] = []
    assert "'candidates' is empty" in _error_for_slate(tmp_path, slate)


def test_duplicate_docids(tmp_path):
    slate = _good()
    slate["candidates"][2]["docid"] = "a"
    slate.pop("teacher")
    assert "duplicate docid 'a' at candidates[2]" in _error_for_slate(tmp_path, slate)


def test_candidate_without_text(tmp_path):
    slate = _good()
    slate["candidates"][1]["doc"] = {"brand": "Acme"}
    message = _error_for_slate(tmp_path, slate)
    assert "candidates[1]" in message and "'b'" in message and "has no text" in message


def test_candidate_without_doc(tmp_path):
    slate = _good()
    del slate["candidates"][0]["doc"]
    message = _error_for_slate(tmp_path, slate)
    assert "candidates[0]" in message and "no 'doc' object" in message


def test_clicked_not_candidates(tmp_path):
    slate = _good()
    slate["clicked"] = ["a", "zzz"]
    message = _error_for_slate(tmp_path, slate)
    assert "'clicked' names docids that are not candidates" in message and "zzz" in message


def test_teacher_not_candidates(tmp_path):
    slate = _good()
    slate["teacher"] = ["b", "a", "zzz"]
    message = _error_for_slate(tmp_path, slate)
    assert "'teacher' names docids that are not candidates" in message and "zzz" in message


def test_teacher_missing_candidates(tmp_path):
    slate = _good()
    slate["teacher"] = ["b", "a"]
    message = _error_for_slate(tmp_path, slate)
    assert "'teacher' is not a full permutation of the 3 candidates" in message
    assert "missing ['c']" in message


def test_teacher_repeats_candidate(tmp_path):
    slate = _good()
    slate["teacher"] = ["b", "a", "b"]
    assert "'teacher' repeats docid 'b'" in _error_for_slate(tmp_path, slate)


def test_candidate_text_not_a_string(tmp_path):
    slate = _good()
    slate["candidates"][2]["doc"]["title"] = 42
    message = _error_for_slate(tmp_path, slate)
    assert "candidates[2].doc.title" in message and "must be a string, got int" in message


def test_query_text_not_a_string(tmp_path):
    slate = _good()
    slate["query"]["text"] = ["1. Lipstick"]
    assert "'query.text' must be a string, got list" in _error_for_slate(tmp_path, slate)


def test_error_line_counts_blank_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n\nnot json\n", encoding="utf-8")
    with pytest.raises(SlateError, match=rf"^{re.escape(str(path))}:4: invalid JSON"):
        list(read_slates(path))


def test_text_that_is_not_utf8_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"query": "caf\xe9"}\n')
    with pytest.raises(SlateError, match=rf"^{re.escape(str(path))}:2: not UTF-8 text \(byte 15 "):
        list(read_slates(path))


def test_missing_file(tmp_path):
    with pytest.raises(SlateError, match="no such slate file"):
        list(read_slates(tmp_path / "nope.jsonl"))


# -- round trips ----------------------------------------------------------------------------


def _rich_slate() -> dict:
    slate = _good()
    slate["query"]["history"] = ["h1", "h2"]
    slate["query"]["lang"] = "en"
    slate["candidates"][0]["rank"] = 3
    slate["candidates"][1]["doc"]["brand"] = "Acme"
    slate["split"] = "eval"
    slate["meta"] = {"source": "bm25", "k": [1, 2]}
    return slate


def test_round_trip_keeps_extra_fields(tmp_path):
    data = _rich_slate()
    path = _write_lines(tmp_path / "in.jsonl", [json.dumps(data)])
    slates = load_slates(path)
    assert slates[0].extra == {"split": "eval", "meta": {"source": "bm25", "k": [1, 2]}}
    assert slates[0].query.extra == {"lang": "en"}
    assert slates[0].query.history == ["h1", "h2"]
    assert slates[0].candidates[0].extra == {"rank": 3}
    out = tmp_path / "out.jsonl"
    assert write_slates(out, slates) == 1
    assert json.loads(out.read_text(encoding="utf-8")) == data
    # and a second round trip gives the same bytes
    out2 = tmp_path / "out2.jsonl"
    write_slates(out2, load_slates(out))
    assert out2.read_bytes() == out.read_bytes()


def test_non_ascii_is_kept_as_utf8(tmp_path):
    slate = Slate(Query("u", "1. Crème ★"), [Candidate("a", {"title": "Séraphine ★"})])
    out = tmp_path / "s.jsonl"
    write_slates(out, [slate])
    assert "Séraphine ★" in out.read_text(encoding="utf-8")
    assert load_slates(out)[0].candidates[0].doc["title"] == "Séraphine ★"
    assert dumps_slate(slate) == out.read_text(encoding="utf-8").rstrip("\n")


def test_gzip_round_trip(tmp_path):
    slates = [Slate.from_dict(_rich_slate()), Slate.from_dict(_good())]
    path = tmp_path / "s.jsonl.gz"
    assert write_slates(path, slates) == 2
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert [json.loads(line) for line in lines] == [_rich_slate(), _good()]
    assert [s.to_dict() for s in load_slates(path)] == [_rich_slate(), _good()]


def test_gzip_write_is_deterministic(tmp_path, monkeypatch):
    slates = [Slate.from_dict(_rich_slate())]
    write_slates(tmp_path / "a.jsonl.gz", slates)
    monkeypatch.setattr("time.time", lambda: 2_000_000_000.0)  # a different clock
    write_slates(tmp_path / "b.jsonl.gz", slates)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_write_gets_the_umask_mode(tmp_path):
    path = tmp_path / "s.jsonl"
    write_slates(path, [Slate.from_dict(_good())])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_load_limit_reads_no_further(tmp_path):
    path = _write_lines(tmp_path / "s.jsonl", [json.dumps(GOOD), json.dumps(GOOD), "broken"])
    assert len(load_slates(path, limit=2)) == 2
    assert load_slates(path, limit=0) == []
    with pytest.raises(SlateError, match=":3: invalid JSON"):
        load_slates(path)


# -- atomic writes --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_failed_write_leaves_previous_file(tmp_path, name):
    path = tmp_path / name
    write_slates(path, [Slate.from_dict(_good())])
    before = path.read_bytes()

    def slates_then_crash():
        yield Slate.from_dict(_rich_slate())
        yield Slate.from_dict(_rich_slate())
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_slates(path, slates_then_crash())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary left behind


def test_failed_first_write_leaves_nothing(tmp_path):
    path = tmp_path / "new" / "s.jsonl"
    with pytest.raises(ValueError), atomic_writer(path) as fh:
        fh.write("partial")
        raise ValueError("stop")
    assert not path.exists()
    assert list(path.parent.iterdir()) == []


def test_atomic_writer_replaces_on_success(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old", encoding="utf-8")
    with atomic_writer(path) as fh:
        fh.write("new")
        assert path.read_text(encoding="utf-8") == "old"  # not visible until done
    assert path.read_text(encoding="utf-8") == "new"


# -- upstream features ----------------------------------------------------------------------


def test_features_round_trip_and_score_is_a_feature(tmp_path):
    data = _good()
    data["candidates"][0]["features"] = {"popularity": 2.5, "bm25": 11}
    data["candidates"][0]["score"] = 0.75
    data["candidates"][1]["features"] = {}
    path = _write_lines(tmp_path / "in.jsonl", [json.dumps(data)])
    slate = load_slates(path)[0]
    first, second, third = slate.candidates
    assert first.features == {"popularity": 2.5, "bm25": 11.0} and first.extra == {}
    assert (first.feature("bm25"), first.feature("score"), first.feature("nope")) == (11.0, 0.75, None)
    assert second.features == {} and third.features is None and third.feature("popularity") is None
    out = tmp_path / "out.jsonl"
    write_slates(out, [slate])
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["candidates"][0]["features"] == {"popularity": 2.5, "bm25": 11.0}
    assert written["candidates"][1]["features"] == {}
    assert "features" not in written["candidates"][2]  # a slate without features is unchanged
    assert load_slates(out)[0] == slate


def test_a_score_left_out_or_null_is_not_given_and_stays_out_when_written(tmp_path):
    """rank_llm's format may leave a candidate's score out: it still orders as 0 (the listed
    order), but the feature 'score' is missing, and a rewritten file keeps it missing."""
    data = _good()
    del data["candidates"][0]["score"]
    data["candidates"][1]["score"] = None
    data["candidates"][2]["score"] = 0
    path = _write_lines(tmp_path / "in.jsonl", [json.dumps(data)])
    slate = load_slates(path)[0]
    left_out, null, zero = slate.candidates
    assert [c.score for c in slate.candidates] == [0.0, 0.0, 0.0]
    assert [c.scored for c in slate.candidates] == [False, False, True]
    assert (left_out.feature("score"), null.feature("score"), zero.feature("score")) == (
        None, None, 0.0)
    out = tmp_path / "out.jsonl"
    write_slates(out, [slate])
    written = json.loads(out.read_text(encoding="utf-8"))
    assert ["score" in c for c in written["candidates"]] == [False, False, True]
    assert load_slates(out)[0] == slate
    again = tmp_path / "again.jsonl"
    write_slates(again, load_slates(out))
    assert again.read_bytes() == out.read_bytes()


def test_a_candidate_built_with_a_score_or_none_writes_as_it_was_built():
    scored = Candidate("a", {"title": "Mascara"}, score=0.5)
    unscored = Candidate("b", {"title": "Soap"}, scored=False)
    line = json.loads(dumps_slate(Slate(Query("u", "q"), [scored, unscored])))
    assert line["candidates"] == [{"docid": "a", "doc": {"title": "Mascara"}, "score": 0.5},
                                  {"docid": "b", "doc": {"title": "Soap"}}]


@pytest.mark.parametrize(
    "features,problem",
    [
        ([1.0], "'features' must be an object {name: number}, got list"),
        ({"popularity": "high"}, "features.popularity must be a number, got str"),
        ({"popularity": True}, "features.popularity must be a number, got bool"),
        ({"popularity": None}, "features.popularity must be a number, got NoneType"),
        ({"score": 1.0}, "features.score is not allowed: 'score' is the candidate's own"),
    ],
)
def test_bad_features_name_file_line_candidate_and_feature(tmp_path, features, problem):
    slate = _good()
    slate["candidates"][2]["features"] = features
    message = _error_for(tmp_path, json.dumps(slate))
    assert f"candidates[2] (docid 'c'): {problem}" in message


# -- teacher scores -------------------------------------------------------------------------


def test_teacher_scores_round_trip_and_files_without_them_are_unchanged(tmp_path):
    data = _good()
    data["teacher_scores"] = [0.5, 0, 0]
    path = _write_lines(tmp_path / "in.jsonl", [json.dumps(data)])
    slate = load_slates(path)[0]
    assert slate.teacher_scores == [0.5, 0.0, 0.0] and slate.extra == {}
    assert all(isinstance(x, float) for x in slate.teacher_scores)
    out = tmp_path / "out.jsonl"
    write_slates(out, [slate])
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["teacher_scores"] == [0.5, 0.0, 0.0]
    assert list(written) == ["query", "candidates", "clicked", "teacher", "teacher_scores"]
    assert load_slates(out)[0] == slate
    out2 = tmp_path / "out2.jsonl"
    write_slates(out2, load_slates(out))
    assert out2.read_bytes() == out.read_bytes()

    plain = _write_lines(tmp_path / "plain.jsonl", [dumps_slate(Slate.from_dict(_good()))])
    again = tmp_path / "again.jsonl"
    write_slates(again, load_slates(plain))
    assert again.read_bytes() == plain.read_bytes()
    assert "teacher_scores" not in again.read_text(encoding="utf-8")
    assert load_slates(again)[0].teacher_scores is None


@pytest.mark.parametrize(
    "change,problem",
    [
        ([1.0, 0.5], "'teacher_scores' has 2 scores for the 3 items of 'teacher'"),
        (1.0, "'teacher_scores' must be a list of numbers, got float"),
        ([1.0, "x", 0.0], "teacher_scores[1] (docid 'a') must be a number, got str"),
        ([1.0, True, 0.0], "teacher_scores[1] (docid 'a') must be a number, got bool"),
        (
            [0.0, 0.5, 0.0],
            (
                "'teacher_scores' must be non-increasing along 'teacher': teacher_scores[1] "
                "(docid 'a') = 0.5 is above the 0.0 before it"
            ),
        ),
        ("no teacher", "'teacher_scores' needs a 'teacher' ranking to align with"),
    ],
)
def test_bad_teacher_scores_name_file_line_and_problem(tmp_path, change, problem):
    slate = _good()
    if change == "no teacher":
        del slate["teacher"]
        change = [1.0, 0.5, 0.0]
    slate["teacher_scores"] = change
    message = _error_for_slate(tmp_path, slate)
    assert problem in message
