"""Print the ``spdrank train`` command that trains a finished run again, into another directory.

    python benchmarks/retrain_command.py RUN_DIR NEW_DIR [--flag value ...]

Every setting comes from ``RUN_DIR/train.json`` (the config the run saved), so the new run
differs from the old one only by the flags given after NEW_DIR, which come last and win
(e.g. ``--positions 160``: the same student with more rank positions).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from spdrank.commands.train import config_argv
from spdrank.training.config import TrainConfig


def command(run_dir: Path, out: Path, overrides: list[str]) -> list[str]:
    config = json.loads((run_dir / "train.json").read_text(encoding="utf-8"))["config"]
    cfg = TrainConfig(**{**config, "out": str(out)})
    return [".venv/bin/spdrank", "train", *config_argv(cfg), *overrides]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(shlex.join(command(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])))
