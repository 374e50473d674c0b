"""A pipe as ``spdrank train --slates`` is refused before anything reads it, whatever the
target: the prompt-template check of teacher labels read its first slate and consumed it."""

from __future__ import annotations

import os
import threading

import pytest

from spdrank.commands.cli import main


@pytest.mark.parametrize("target", ["teacher", "clicks"])
def test_a_pipe_is_refused_first_whatever_the_target(tmp_path, capsys, target):
    fifo = tmp_path / "slates.jsonl"
    os.mkfifo(fifo)

    def feed() -> None:  # were the pipe read, the run would see this line, not hang
        with open(fifo, "w") as pipe:
            pipe.write('{"query": {"qid": "q"}}{"extra": 1}\n')

    threading.Thread(target=feed, daemon=True).start()
    rc = main(["train", "--slates", str(fifo), "--target", target, "--features-only",
               "--features", "popularity", "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 2
    assert (f"{fifo} is a pipe: a slate file is read more than once, so it must be a "
            "regular file") in capsys.readouterr().err
