"""A cache folder filled once: whole or absent, never half-filled, the first fill kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from spdrank.core.atomic_dir import filled_once


def test_filled_once_fills_then_reuses(tmp_path: Path) -> None:
    calls = []

    def fill(folder: Path) -> None:
        calls.append(folder)
        (folder / "config.json").write_text("{}")

    target = tmp_path / "cache" / "model"
    assert filled_once(target, fill) == target and (target / "config.json").is_file()
    assert filled_once(target, fill) == target
    assert len(calls) == 1 and not calls[0].exists()  # filled beside it, then moved in


def test_a_failed_fill_leaves_nothing(tmp_path: Path) -> None:
    def fill(folder: Path) -> None:
        (folder / "part").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        filled_once(tmp_path / "model", fill)
    assert list(tmp_path.iterdir()) == []


def test_a_fill_finished_by_another_process_first_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def racing(folder: Path) -> None:
        target.mkdir()
        (target / "config.json").write_text("theirs")
        (folder / "config.json").write_text("ours")

    filled_once(target, racing)
    assert (target / "config.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


# -- temporaries a killed process left -------------------------------------------------------


def _ended_pid() -> int:
    """The pid of a process that has ended (and, so soon after, not been reused)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_killed_processs_temporary_is_swept_by_the_next_fill(tmp_path: Path) -> None:
    import os

    from spdrank.core.atomic_dir import _host, atomic_directory

    target = tmp_path / "built"
    dead = tmp_path / f".built.{_host()}-{_ended_pid()}.abcd1234.tmp"
    live = tmp_path / f".built.{_host()}-{os.getpid()}.efgh5678.tmp"
    elsewhere = tmp_path / f".built.otherhost-{_ended_pid()}.ijkl9012.tmp"
    other_target = tmp_path / f".model.{_host()}-{_ended_pid()}.mnop3456.tmp"
    for folder in (dead, live, elsewhere, other_target):
        folder.mkdir()
        (folder / "half.jsonl").write_text("half\n")
    with atomic_directory(target) as tmp:
        assert tmp.name.startswith(f".built.{_host()}-{os.getpid()}.")
        (tmp / "train.jsonl").write_text("whole\n")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["built", live.name, elsewhere.name, other_target.name])


def test_a_data_build_killed_mid_fill_leaves_nothing_after_the_next(tmp_path: Path) -> None:
    """SIGKILL while ``data sequences`` fills its folder (its input a FIFO that stalls): the
    rerun builds and removes what the killed one left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from spdrank.commands.cli import main
    from tests.helpers import subprocess_env

    items = [f"i{n}" for n in range(10)]
    lines = "".join(f"u{u} " + " ".join(items[(u + k) % 10] for k in range(4)) + "\n"
                    for u in range(20))
    titles = tmp_path / "titles.tsv"
    titles.write_text("item_id\ttitle\n" + "".join(f"{i}\ttitle of {i}\n" for i in items))
    fifo = tmp_path / "seq.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "built"
    argv = ["data", "sequences", "--titles", str(titles), "--out", str(out), "--candidates", "3",
            "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "spdrank", *argv, "--sequences", str(fifo)],
                            env=subprocess_env() | {"OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in tmp_path.iterdir() if p.name.startswith(".built.")]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the build never made its temporary folder"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".built.")]  # left by the kill
    seqs = tmp_path / "seq.txt"
    seqs.write_text(lines)
    assert main([*argv, "--sequences", str(seqs)]) == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert (out / "train.jsonl").is_file()
