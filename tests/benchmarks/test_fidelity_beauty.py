"""benchmarks/fidelity_beauty_cpu.py --backbone: another backbone's students train with
``--backbone`` in their own run folders and report beside the main report; the teachers'
labels stay shared; the default dry run is what it was."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.helpers import load_benchmark

MAIN_OUT = Path("benchmarks/results/fidelity-beauty-cpu")


def dry_run(monkeypatch, capsys, *argv: str) -> tuple[object, list[list[str]]]:
    """The module after ``main(--dry-run, *argv)`` and the spdrank commands it printed."""
    module = load_benchmark("fidelity_beauty_cpu", monkeypatch)
    # Nothing on this machine (no data, no labels) decides which commands are printed.
    monkeypatch.setattr(module, "DATA", Path("/nonexistent/data"))
    monkeypatch.setattr(module, "WORK", Path("/nonexistent/fidelity"))
    assert module.main(["--dry-run", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    return module, [shlex.split(line) for line in lines if line.startswith(".venv/bin/spdrank ")]


def test_backbone_dry_run(monkeypatch, capsys):
    module, commands = dry_run(monkeypatch, capsys, "--backbone", "gemma3-270m")
    trains = [argv for argv in commands if argv[1] == "train"]
    assert len(trains) == len(module.rows())
    work = "/nonexistent/fidelity-gemma3-270m"  # WORK's sibling, named after the backbone
    assert str(module.WORK) == work and module.OUT == MAIN_OUT / "gemma3-270m"
    for argv in trains:
        assert argv[2:4] == ["--backbone", "gemma3-270m"]
        assert argv[argv.index("--out") + 1].startswith(f"{work}/runs/")
        if "--cache-states" in argv:
            assert argv[argv.index("--cache-states") + 1].startswith(f"{work}/states-")
        if "--init-from" in argv:
            assert argv[argv.index("--init-from") + 1].startswith(f"{work}/runs/")
        # The same teachers' labels as the bundled students learn.
        for flag in ("--slates", "--eval-slates"):
            assert argv[argv.index(flag) + 1].startswith("/nonexistent/fidelity/")
    # The teachers read no student backbone: theirs stay as they are.
    for argv in commands:
        if argv[1] == "teacher":
            assert "--backbone" not in argv
            assert argv[argv.index("--out") + 1].startswith("/nonexistent/fidelity/")
    bench = [argv for argv in commands if argv[1] == "bench"]
    assert bench and all(
        argv[argv.index("--out") + 1].startswith(f"{MAIN_OUT}/gemma3-270m/") for argv in bench)


def test_default_dry_run_unchanged(monkeypatch, capsys):
    module, commands = dry_run(monkeypatch, capsys)
    _, explicit = dry_run(monkeypatch, capsys, "--backbone", "bundled")
    assert explicit == commands
    assert module.OUT == MAIN_OUT and module.BACKBONE == "bundled"
    assert not any("--backbone" in argv for argv in commands)
    trains = [argv for argv in commands if argv[1] == "train"]
    assert len(trains) == len(module.rows())
    for argv in trains:
        assert argv[argv.index("--out") + 1].startswith("/nonexistent/fidelity/runs/")
        if "--cache-states" in argv:
            assert argv[argv.index("--cache-states") + 1].startswith("/nonexistent/fidelity/states-")
    bench = [argv for argv in commands if argv[1] == "bench"]
    assert bench and all(
        argv[argv.index("--out") + 1].startswith(f"{MAIN_OUT}/teachers-") for argv in bench)
    # The report's preamble names the backbone only when it is not the bundled one.
    assert module.preamble() == module.PREAMBLE


def test_preamble_names_the_backbone(monkeypatch, capsys):
    module, _ = dry_run(monkeypatch, capsys, "--backbone", "gemma3-270m")
    text = module.preamble()
    assert "Gemma 3 270M" in text and "--backbone gemma3-270m" in text
    assert "Scale: frozen first L layers" in text and "SmolLM2-135M" not in text
    assert module.model_name() == "Gemma 3 270M"
