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

import json
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from tests.helpers import save_features_only_model

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
