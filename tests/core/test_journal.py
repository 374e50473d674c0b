"""The journal (core/journal.py): records survive a torn last write, and nothing else is
guessed at: a bad line before good ones, a repeated key or a refused record names file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spdrank.core.journal import Entry, Journal, Kind, read_journal
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


def test_a_kind_names_its_own_error_entries_and_words(tmp_path: Path) -> None:
    """A module keeping its own journal (the label file) keeps its own messages and types."""

    class OwnError(SlateError):
        pass

    class OwnEntry(Entry):
        pass

    kind = Kind(error=OwnError, entry=OwnEntry, file="the own file", record="an own record",
                twice="{key} {value!r} twice, first {first}", again="{key} {value!r} again")
    path = tmp_path / "j.jsonl"
    with Journal(path, "id", kind=kind) as journal:
        journal.append({"id": "a"})
        assert isinstance(journal.entries["a"], OwnEntry)
        with pytest.raises(OwnError, match="id 'a' again"):
            journal.append({"id": "a"})
    assert isinstance(read_journal(path, "id", kind=kind)["a"], OwnEntry)
    path.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(OwnError, match=r"j.jsonl:2: id 'a' twice, first .*j.jsonl:1$"):
        read_journal(path, "id", kind=kind)
    path.write_text("[1]\n")
    with pytest.raises(OwnError, match="an own record must be a JSON object"):
        read_journal(path, "id", kind=kind)
    with pytest.raises(ValueError, match="the own file is appended to; it cannot be gzip"):
        Journal(tmp_path / "j.jsonl.gz", "id", kind=kind)


def test_a_file_no_journal_wrote_is_refused_not_cut(tmp_path: Path) -> None:
    """A journal's record starts with its key (``append`` puts it first), so a crash leaves
    the start of one; a one-line config named by mistake is refused, byte for byte kept."""
    path = tmp_path / "j.jsonl"
    with Journal(path, "id") as journal:
        journal.append({"v": 1, "id": "a"})
    assert path.read_text() == '{"id":"a","v":1}\n'
    config = tmp_path / "config.json"
    config.write_text('{"model": "x", "lr": 0.1}')
    with pytest.raises(SlateError, match=r"config.json:1: not written by this command: its last "
                       r"line \(no trailing newline\) follows no record"):
        Journal(config, "id")
    assert config.read_text() == '{"model": "x", "lr": 0.1}'
    for torn in ('{"id":"b","v"', '{"i', "\x00\x00"):  # what a crash leaves: cut
        path.write_text(torn)
        with Journal(path, "id") as journal:
            assert not journal.entries
        assert path.read_text() == ""
