"""Ids: one rule (spdrank.core.validation.id_problem) held where a slate is read and where a
TREC run line is written, so no slate that was read holds an id a run line cannot carry."""

from __future__ import annotations

import json

import pytest

from spdrank.commands.cli import main
from spdrank.core.outputs import check_trec_ids
from spdrank.core.slates import Candidate, Query, Slate, SlateError, read_slates
from spdrank.core.validation import id_problem

UNFIT = {
    "empty": "",
    "space": "a b",
    "tab": "a\tb",
    "newline": "a\nb",
    "no_break_space": "a\u00a0b",
    "nul": "a\x00b",
    "escape": "\x1b[31m",
    "right_to_left_override": "doc\u202e1",
    "zero_width_space": "a\u200bb",
    "byte_order_mark": "\ufeffa",
}
FIT = ["a", "7", "-3", "🙂", "e\u0301", "<|im_end|>", '"},{"docid":', "D1234567#p2"]


def slate_with_docid(docid: object) -> dict:
    return {"query": {"qid": "q", "text": "fleas"},
            "candidates": [{"docid": docid, "doc": {"text": "cats carry fleas"}}]}


@pytest.mark.parametrize("case", list(UNFIT))
def test_the_gate_and_trec_output_refuse_the_same_ids(case):
    docid = UNFIT[case]
    with pytest.raises(SlateError) as info:
        Slate.from_dict(slate_with_docid(docid))
    assert info.value.field == "candidates[0].docid" and id_problem(docid) in str(info.value)
    # A slate built in Python passes no gate: the run writer holds the same rule.
    built = Slate(Query("q", "fleas"), [Candidate(docid, {"text": "cats"})])
    with pytest.raises(SlateError, match="TREC run line cannot carry"):
        check_trec_ids(built)


@pytest.mark.parametrize("docid", FIT)
def test_visible_ids_pass_both(docid):
    slate = Slate.from_dict(slate_with_docid(docid))
    check_trec_ids(slate)
    assert slate.docids == [docid]


def test_every_id_field_is_held_to_the_rule():
    base = slate_with_docid("a")
    cases = {
        "query.qid": {**base, "query": {"qid": "q 1", "text": "t"}},
        "query.history[1]": {**base, "query": {"qid": "q", "text": "t", "history": ["i", ""]}},
        "relevance": {**base, "relevance": {"a": 1, "b\u202e": 2}},
        "clicked_not_retrieved[0]": {**base, "clicked_not_retrieved": ["x\x00"]},
    }
    for field, data in cases.items():
        with pytest.raises(SlateError) as info:
            Slate.from_dict(data, where="s.jsonl:3")
        message = str(info.value)
        assert message.startswith("s.jsonl:3: ") and field in message, message


def test_a_qid_may_be_left_out_and_integer_ids_read_as_their_text():
    slate = Slate.from_dict({"query": {"qid": "", "text": "t", "history": [12, "i3"]},
                             "candidates": [{"docid": 7, "doc": {"text": "x"}}]})
    assert slate.query.qid == "" and slate.query.history == ["12", "i3"]
    assert slate.docids == ["7"]
    assert Slate.from_dict({"query": "bare", "candidates": [{"docid": 7, "doc": {"text": "x"}}]})


@pytest.mark.parametrize("docid,kind", [(None, "NoneType"), ({"a": 1}, "dict"), (True, "bool")])
def test_retrieve_results_refuse_docids_that_are_not_ids(tmp_path, capsys, docid, kind):
    retrieved = tmp_path / "r.json"
    retrieved.write_text(json.dumps([{"query": {"qid": "q1", "text": "fleas"}, "hits": [
        {"docid": "p1", "content": "Fleas live on cats.", "rank": 1, "score": 2.0},
        {"docid": docid, "content": "Cats carry fleas.", "rank": 2, "score": 1.0},
    ]}]))
    out = tmp_path / "s.jsonl"
    assert main(["data", "search", "--retrieved", str(retrieved), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{retrieved}:" in err and f"docid must be a string, got {kind}" in err, err
    assert not out.exists()


def test_retrieve_results_read_an_integer_docid_as_its_text(tmp_path):
    retrieved = tmp_path / "r.json"
    retrieved.write_text(json.dumps([{"query": {"qid": "q1", "text": "fleas"}, "hits": [
        {"docid": 8841823, "content": "Fleas live on cats.", "rank": 1, "score": 2.0}]}]))
    out = tmp_path / "s.jsonl"
    assert main(["data", "search", "--retrieved", str(retrieved), "--out", str(out)]) == 0
    assert [s.docids for s in read_slates(out)] == [["8841823"]]
