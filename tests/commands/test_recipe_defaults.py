"""The README's "Your own data and teacher" commands, run as written on a small generated log,
reach the settings of the students the README reports (the LLM and features-only students of
benchmarks/experiments/beauty-best-input.toml), so the recipe shown is the one measured.

Only what this machine and this log lack is substituted: the tiny backbone for the bundled one
(``--backbone`` added to each ``train``) and 8 validation users for the 1,000 a real log
spares.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shlex
from pathlib import Path

from spdrank.commands.cli import main
from tests.helpers import ROOT, WORDS

README = ROOT / "README.md"
#: Settings of a run that are its data, paths or bookkeeping, not its recipe.
NOT_RECIPE = {
    "slates", "out", "eval_slates", "cache_states", "limit", "eval_every", "eval_limit",
    "save_every", "seed", "progress", "extra", "backbone", "init_from", "stop_after",
    "max_item_tokens", "warmup_steps",
}


def readme_commands() -> list[list[str]]:
    """The argv of each command in the README's own-data block, continuations joined."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Your own data and teacher", 1)[1]
    block = re.search(r"^```bash\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)
    assert block is not None, "README.md's own-data section has no bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def write_log(folder: Path, users: int = 40, items: int = 60) -> None:
    """``seq.txt`` and ``titles.tsv``: a seeded log of short sequences over ``items`` items."""
    rng = random.Random(0)
    titles = ["item_id\ttitle"] + [
        f"i{i}\t{WORDS[i % len(WORDS)].title()} {WORDS[(i * 7 + 3) % len(WORDS)]} {i}"
        for i in range(items)
    ]
    (folder / "titles.tsv").write_text("\n".join(titles) + "\n", encoding="utf-8")
    lines = [
        " ".join([f"u{u}", *(f"i{j}" for j in rng.sample(range(items), rng.randint(3, 6)))])
        for u in range(users)
    ]
    (folder / "seq.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def substituted(argv: list[str], backbone: str) -> list[str]:
    """``argv`` with the tiny backbone for the bundled one and a validation split the small
    log can spare."""
    argv = list(argv)
    if "--validation" in argv:
        argv[argv.index("--validation") + 1] = "8"
    if argv[:2] == ["spdrank", "train"]:
        argv += ["--backbone", backbone]
    return argv + ["--no-progress"]


def benchmark_configs(work: Path) -> dict[str, object]:
    """The TrainConfig of each student benchmarks/experiments/beauty-best-input.toml trains on
    its uniform slates, by name, parsed as ``spdrank train`` parses its command."""
    import subprocess
    import sys

    from spdrank.commands.cli import build_parser
    from spdrank.commands.train import config_from_args

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"),
         str(ROOT / "benchmarks" / "experiments" / "beauty-best-input.toml"), "--dry-run",
         "--set", f"work={work}"],
        capture_output=True, text=True, timeout=120, check=True)
    trains = [shlex.split(line.split(" ", 1)[1])[1:] for line in done.stdout.splitlines()
              if line.startswith("+ spdrank train") and "/uniform/" in line]
    parser = build_parser()
    return {Path(argv[argv.index("--out") + 1]).name: config_from_args(parser.parse_args(argv))
            for argv in trains}


def recipe(cfg) -> dict:
    """The settings that make the recipe: everything but data, paths and bookkeeping, with the
    title budget as the run reads it and a default warm-up as the 20 steps it is."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in NOT_RECIPE}
    out["item_tokens"] = cfg.item_tokens()
    out["warmup"] = 20 if cfg.warmup_steps is None else cfg.warmup_steps
    return out


def test_the_readme_commands_reach_the_reported_recipe(
    tmp_path, monkeypatch, capsys, tiny_backbone, one_torch_thread
):
    from spdrank.training.config import TrainConfig

    commands = readme_commands()
    assert [argv[:2] for argv in commands] == [
        ["spdrank", "data"], ["spdrank", "train"], ["spdrank", "train"], ["spdrank", "eval"],
    ]
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path)
    for argv in commands:
        assert main(substituted(argv, tiny_backbone)[1:]) == 0, argv
    printed = capsys.readouterr().out
    assert "\nsasrec " in printed and "paired vs features" in printed  # SASRec beside, paired

    def ran(command: list[str]) -> TrainConfig:
        out = Path(command[command.index("--out") + 1])
        summary = json.loads((out / "train.json").read_text(encoding="utf-8"))
        assert summary["finished"] and summary["anchor"]["anchor"].startswith(("feature:", "order"))
        return TrainConfig(**summary["config"])

    llm, features = ran(commands[1]), ran(commands[2])
    measured = benchmark_configs(tmp_path / "bench")
    assert recipe(llm) == recipe(measured["llm"])
    assert recipe(features) == recipe(measured["features"])
