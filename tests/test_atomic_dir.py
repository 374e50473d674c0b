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
