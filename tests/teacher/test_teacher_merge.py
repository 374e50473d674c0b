"""``spdrank teacher merge``: the label files it joins are one teacher's, and a stream ``--out``
names where its labelled slates go."""

import json
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import load_slates, write_slates
from tests.helpers import make_slates, records


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_slates(tmp_path / "train.jsonl", make_slates(40, seed=1, prefix="t"))
    write_slates(tmp_path / "slates.jsonl", make_slates(12, seed=2))
    return tmp_path


def teacher(data: Path, backend: str, out: str, *extra: str) -> None:
    assert main(["teacher", "--slates", str(data / "slates.jsonl"), "--out", str(data / out),
                 "--backend", backend, "--no-progress", *extra]) == 0


def merge(data: Path, *labels: str, out: str = "m.jsonl", extra: tuple[str, ...] = ()) -> int:
    return main(["teacher", "merge", "--slates", str(data / "slates.jsonl"),
                 "--out", out if out.startswith("/") else str(data / out),
                 "--labels", *(str(data / name) for name in labels), *extra])


def write_records(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_shards_of_two_teachers_are_refused_naming_both_files_and_backends(data, capsys):
    teacher(data, "ranker:popularity", "a.jsonl", "--shard", "0/2")
    teacher(data, "ranker:cooccurrence", "b.jsonl", "--shard", "1/2")
    assert merge(data, "a.jsonl", "b.jsonl") == 2
    err = capsys.readouterr().err
    assert f"{data / 'b.jsonl'}:1" in err and f"{data / 'a.jsonl'}:1" in err
    assert "ranker:popularity" in err and "ranker:cooccurrence" in err
    assert "share no teacher" in err
    assert not (data / "m.jsonl").exists() and not (data / "m.slates.jsonl").exists()


@pytest.mark.parametrize("field,value", [("backend", "ranker:popularity"), ("mode", "reasoning")])
def test_a_duplicate_of_another_teacher_is_refused_though_its_ranking_is_equal(
        data, capsys, field, value):
    teacher(data, "ranker:cooccurrence", "full.jsonl")
    full = records(data / "full.jsonl")
    # A second file that shares the teacher (u0's label) and gives u1 another teacher's copy
    # of the same ranking, with scores: the copy that would have won as "the one with scores".
    other = dict(full[1], **{field: value})
    other["scores"] = [float(len(other["ranking"]) - i) for i in range(len(other["ranking"]))]
    write_records(data / "dup.jsonl", [full[0], other])
    assert merge(data, "full.jsonl", "dup.jsonl") == 2
    err = capsys.readouterr().err
    assert f"{data / 'dup.jsonl'}:2" in err and f"{data / 'full.jsonl'}:2" in err
    assert "one slate's labels must be one teacher's" in err and value in err
    assert not (data / "m.slates.jsonl").exists()


def test_files_that_share_their_teacher_merge_and_a_mix_is_said(data, capsys, caplog):
    teacher(data, "ranker:cooccurrence", "a.jsonl", "--shard", "0/2")
    teacher(data, "ranker:cooccurrence", "b.jsonl", "--shard", "1/2")
    assert merge(data, "a.jsonl", "b.jsonl") == 0
    assert "mix teachers" not in caplog.text
    # A file a run left mixed (it resumed it under another backend, and warned): merged, said.
    b = records(data / "b.jsonl")
    write_records(data / "b.jsonl", b[:5] + [dict(b[5], backend="ranker:popularity")])
    assert merge(data, "a.jsonl", "b.jsonl") == 0
    assert "the label files mix teachers: 11 by ranker:cooccurrence" in caplog.text
    assert "1 by ranker:popularity (direct mode, recommendation prompt) (" + str(
        data / "b.jsonl") + ")" in caplog.text
    capsys.readouterr()


def test_a_stream_out_needs_slates_out_and_gets_the_labels_alone(data, capfd):
    teacher(data, "ranker:cooccurrence", "full.jsonl")
    assert merge(data, "full.jsonl", out="/dev/stdout") == 2
    err = capfd.readouterr().err
    assert "--out /dev/stdout is a stream" in err and "--slates-out FILE" in err
    assert not Path("/dev/stdout.slates.jsonl").exists()
    assert merge(data, "full.jsonl", out="/dev/null") == 2
    assert "--slates-out" in capfd.readouterr().err
    assert not Path("/dev/null.slates.jsonl").exists()

    assert merge(data, "full.jsonl", out="/dev/stdout",
                 extra=("--slates-out", str(data / "m.slates.jsonl"))) == 0
    out, err = capfd.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == records(data / "full.jsonl")
    assert "labelled slates: " + str(data / "m.slates.jsonl") in err
    assert load_slates(data / "m.slates.jsonl") == load_slates(data / "full.slates.jsonl")
