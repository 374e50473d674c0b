"""The journal (core/journal.py): records survive a torn last write, and nothing else is
guessed at: a bad line before good ones, a repeated key or a refused record names file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spdrank.core.journal import Journal, read_journal
from spdrank.core.validation import SlateError


def test_appended_records_are_read_back_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, "id") as journal:
        journal.append({"id": "a", "v": 1})
        journal.append({"id": "b", "v": 2})
        with pytest.raises(SlateError, match="id 'a' is already in the journal"):
            journal.append({"id": "a", "v": 3})
    with open(path, "a") as fh:
        fh.write('{"id": "c", "v"')
    assert set(read_journal(path, "id")) == {"a", "b"}  # skipped, the file untouched
    assert path.read_text().endswith('"v"')
    with Journal(path, "id") as journal:  # opened for writing: cut away
        assert journal.entries["b"].where == f"{path}:2"
        journal.append({"id": "c", "v": 3})
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_damage_before_the_last_line_and_repeats_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(SlateError, match=r"j.jsonl:2: corrupt record"):
        read_journal(path, "id")
    path.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(SlateError, match=r"j.jsonl:2: id 'a' appears twice \(first at .*:1\)"):
        read_journal(path, "id")
    path.write_text('{"id": 3}\n')
    with pytest.raises(SlateError, match=r"j.jsonl:1: a record must be a JSON object with a "
                                         r"string 'id'"):
        read_journal(path, "id")

    def check(record: dict) -> None:
        if "v" not in record:
            raise SlateError("a record needs 'v'")

    path.write_text('{"id": "a", "v": 1}\n{"id": "b"}\n')
    with pytest.raises(SlateError, match=r"j.jsonl:2: a record needs 'v'"):
        Journal(path, "id", check)


def test_two_runs_cannot_append_to_one_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, "id"), pytest.raises(ValueError, match="being written by another run"):
        Journal(path, "id")
    with pytest.raises(ValueError, match="cannot be gzip"):
        Journal(tmp_path / "j.jsonl.gz", "id")
