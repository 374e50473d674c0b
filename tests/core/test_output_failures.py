"""Outputs that would harm what a command reads, and writes the system refuses.

An output inside a model folder a command reads (``--model``, ``--init-from``, a teacher's or
a query writer's local model, a ``--backbone`` folder) is refused before any work: ``rank
--model ckpt --output ckpt/head.safetensors`` overwrote the head it ranks with. A write the
file system refuses (a full disk, a read-only folder, no permission) is one line naming the
output and the OS's reason, with a non-zero exit, and leaves the previous output whole and
no temporary behind.

The model is features-only (no backbone), so each command runs in milliseconds.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from spdrank.commands.cli import main
from tests.helpers import save_features_only_model

if TYPE_CHECKING:
    from typing import Self

K = 4


def _slate(qid: str) -> dict:
    return {"query": {"qid": qid, "text": "1. rose shampoo"},
            "candidates": [{"docid": d, "doc": {"title": d}, "score": s, "features": {"pop": p}}
                           for d, s, p in (("a", 0.9, 3), ("b", 0.1, 0))]}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return save_features_only_model(tmp_path / "ckpt", K)


@pytest.fixture
def slates_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(_slate(q)) + "\n" for q in ("u1", "u2")))
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


# -- an output inside a model folder --------------------------------------------------------


@pytest.mark.parametrize("inside", ["head.safetensors", "model.safetensors", "sub/ranked.jsonl"])
@pytest.mark.parametrize("flag", ["--output", "--trec"])
def test_rank_refuses_an_output_inside_its_model(
    tmp_path, checkpoint, slates_file, capsys, inside, flag
):
    before = _files(checkpoint)
    output = ["--output", str(tmp_path / "ranked.jsonl")] if flag == "--trec" else []
    code = main(["rank", "--model", str(checkpoint), "--input", str(slates_file), *output,
                 flag, str(checkpoint / inside)])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"{flag} {checkpoint / inside} is inside --model {checkpoint}" in line
    assert _files(checkpoint) == before


def test_a_training_runs_checkpoint_is_its_model_folder(tmp_path, slates_file, capsys):
    """``--model RUN`` reads ``RUN/model``: an output there is refused, one beside it is not."""
    run = tmp_path / "run"
    save_features_only_model(run / "model", K)
    code = main(["rank", "--model", str(run), "--input", str(slates_file), "--output",
                 str(run / "model" / "config.json")])
    assert code == 2 and "is inside --model" in one_error_line(capsys.readouterr().err)
    assert main(["rank", "--model", str(run), "--input", str(slates_file), "--output",
                 str(run / "ranked.jsonl")]) == 0


def test_eval_refuses_outputs_inside_a_model(tmp_path, checkpoint, slates_file, capsys):
    before = _files(checkpoint)
    base = ["eval", "--slates", str(slates_file), "--model", f"m={checkpoint}", "--ranker",
            "random", "--no-progress"]
    assert main([*base, "--json", str(checkpoint / "config.json")]) == 2
    assert "--json" in one_error_line(capsys.readouterr().err)
    assert main([*base, "--trec-dir", str(checkpoint / "runs")]) == 2
    assert "--trec-dir" in one_error_line(capsys.readouterr().err)
    assert _files(checkpoint) == before


def test_teacher_refuses_labels_inside_its_local_model(tmp_path, slates_file, capsys):
    model = tmp_path / "teacher-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code = main(["teacher", "--slates", str(slates_file), "--backend", "hf", "--model",
                 str(model), "--out", str(model / "labels.jsonl")])
    assert code == 2 and "--out" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_train_refuses_an_out_over_the_checkpoint_it_starts_from(tmp_path, capsys):
    run = tmp_path / "run"
    save_features_only_model(run / "model", K)
    before = _files(run)
    (tmp_path / "train.jsonl").write_text(json.dumps(_slate("u1") | {"teacher": ["a", "b"]})
                                          + "\n")
    code = main(["train", "--slates", str(tmp_path / "train.jsonl"), "--init-from", str(run),
                 "--out", str(run), "--features-only", "--features", "pop,score"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"--out {run / 'model'} is inside --init-from {run / 'model'}" in line
    assert _files(run) == before


# -- writes the file system refuses ---------------------------------------------------------


def _refused(err: int) -> OSError:
    return OSError(err, os.strerror(err))


@pytest.mark.parametrize("command", ["rank", "eval"])
def test_a_full_device_is_one_line_naming_the_output(
    tmp_path, checkpoint, slates_file, capsys, command
):
    # Both printed a traceback ending in "OSError: [Errno 28] No space left on device".
    argv = (["rank", "--model", str(checkpoint), "--input", str(slates_file), "--output"]
            if command == "rank" else
            ["eval", "--slates", str(slates_file), "--ranker", "random", "--no-progress",
             "--json"])
    assert main([*argv, "/dev/full"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"spdrank {command}: error: cannot write /dev/full: No space left on device")


class _FillingUp:
    """A file that takes ``room`` characters, then fails as a full disk does."""

    def __init__(self, fh: IO[str], room: int) -> None:
        self._fh, self._room = fh, room

    def write(self, text: str) -> int:
        if len(text) > self._room:
            self._fh.write(text[:self._room])
            self._fh.flush()
            raise _refused(errno.ENOSPC)
        self._room -= len(text)
        return self._fh.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def test_a_disk_filling_up_mid_write_keeps_the_previous_output(
    tmp_path, checkpoint, slates_file, capsys, monkeypatch
):
    from spdrank.core import files

    out = tmp_path / "ranked.jsonl"
    out.write_text("the previous ranking\n")
    opened = files._open_for_writing
    monkeypatch.setattr(files, "_open_for_writing",
                        lambda *a, **k: _FillingUp(opened(*a, **k), room=100))
    code = main(["rank", "--model", str(checkpoint), "--input", str(slates_file), "--output",
                 str(out)])
    assert code == 1 and one_error_line(capsys.readouterr().err) == (
        f"spdrank rank: error: cannot write {out}: No space left on device")
    assert out.read_text() == "the previous ranking\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "in.jsonl", "ranked.jsonl"]


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_a_folder_that_refuses_new_files_is_one_line(
    tmp_path, checkpoint, slates_file, capsys, monkeypatch, err
):
    """A read-only file system, or a folder without write permission (which root ignores, so
    the OS's answer is simulated where files are made)."""
    real_open = os.open
    made = os.O_CREAT | getattr(os, "O_TMPFILE", 0)

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & made and str(path).startswith(str(tmp_path / "out")):
            raise _refused(err)
        return real_open(path, flags, *args, **kwargs)

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(os, "open", refusing)
    out = tmp_path / "out" / "ranked.jsonl"
    code = main(["rank", "--model", str(checkpoint), "--input", str(slates_file), "--output",
                 str(out)])
    assert code == 1 and one_error_line(capsys.readouterr().err) == (
        f"spdrank rank: error: cannot write {out}: {os.strerror(err)}")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_full_disk_while_labelling_keeps_the_label_file_whole(
    tmp_path, slates_file, capsys, monkeypatch
):
    labels = tmp_path / "labels.jsonl"
    base = ["teacher", "--slates", str(slates_file), "--out", str(labels), "--backend",
            "ranker:random", "--no-progress"]
    assert main([*base, "--limit", "1"]) == 0
    whole = labels.read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(labels):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise _refused(errno.ENOSPC)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    code = main(base)
    assert code == 1 and one_error_line(capsys.readouterr().err).endswith(
        f"cannot write {labels}: No space left on device")
    monkeypatch.undo()
    assert labels.read_bytes() == whole  # the torn half line cut back off
    assert main(base) == 0 and len(labels.read_text().splitlines()) == 2


def test_a_directory_the_disk_cannot_hold_is_a_write_error_naming_it(tmp_path):
    from spdrank.core.atomic_dir import atomic_directory
    from spdrank.core.files import WriteError

    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "config.json").write_text("{}")
    with pytest.raises(WriteError, match=rf"cannot write {target}: No space left on device"), \
            atomic_directory(target) as tmp:
        (tmp / "config.json").write_text("{}")
        raise _refused(errno.ENOSPC)
    assert _files(target) == {"config.json": b"{}"}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
