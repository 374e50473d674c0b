"""benchmarks/beauty_best_input_cpu.py: its commands parse, and each LLM student is paired with
a features-only student trained by the same recipe (the search experiments' files are held to
the same in test_run.py)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(script: str, tmp_path: Path) -> list[list[str]]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--dry-run", "--work",
         str(tmp_path / "w"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # A step whose output an earlier run left prints as done; its command is the same.
    return [shlex.split(line.split("spdrank ", 1)[1]) for line in done.stdout.splitlines()
            if line.startswith(("+ spdrank ", "= (done) spdrank "))]


@pytest.mark.parametrize("script", ["beauty_best_input_cpu.py"])
def test_every_command_parses_and_the_students_share_a_recipe(script, tmp_path):
    from spdrank.commands.cli import build_parser

    parser = build_parser()
    argvs = dry_run(script, tmp_path)
    for argv in argvs:
        parser.parse_args(argv)  # exits (fails the test) on an unknown flag or value
    trains = [argv for argv in argvs if argv[0] == "train"]
    assert trains and len(trains) % 2 == 0
    for argv in trains:  # chosen on validation slates, from the default anchor (best)
        assert "--eval-slates" in argv and argv[argv.index("--select") + 1] == "best"
        assert "--anchor" not in argv
    llm = [a for a in trains if "--features-only" not in a]
    features = [a for a in trains if "--features-only" in a]
    for a, b in zip(llm, features, strict=True):
        assert a[a.index("--features") + 1] == b[b.index("--features") + 1]
        assert a[a.index("--slates") + 1] == b[b.index("--slates") + 1]
        assert a[a.index("--epochs") + 1] == b[b.index("--epochs") + 1]
    evals = [argv for argv in argvs if argv[0] == "eval"]
    assert evals and all(sum(x == "--model" for x in argv) == 2 for argv in evals)
