"""The README's "Your own data and teacher" commands, run as written on a small generated log,
reach the settings of the rows the README reports (benchmarks/fidelity_beauty_cpu.py's
``lex/words-tfidf`` and ``clicks/words-tfidf-warm+pop+co``), so the recipe shown is the one
measured.

Only what this machine lacks is substituted: the tiny backbone for the bundled one (``--backbone``
added to each ``train``) and a count baseline for the LLM server the teacher command names.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shlex
from pathlib import Path

from spdrank.commands.cli import main
from tests.helpers import ROOT, WORDS, load_benchmark

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
    """``argv`` with the tiny backbone for the bundled one and a baseline for the LLM server."""
    argv = list(argv)
    if argv[:2] == ["spdrank", "teacher"]:
        at = argv.index("--backend")
        del argv[at : at + 2]
        if "--base-url" in argv:
            at = argv.index("--base-url")
            del argv[at : at + 2]
        argv += ["--backend", "ranker:cooccurrence"]
    if argv[:2] == ["spdrank", "train"]:
        argv += ["--backbone", backbone]
    return argv + ["--no-progress"]


def benchmark_config(name: str, monkeypatch):
    """The TrainConfig of the fidelity benchmark's row ``name``, parsed as ``spdrank train``
    parses its command."""
    from spdrank.commands.cli import build_parser
    from spdrank.commands.train import config_from_args

    module = load_benchmark("fidelity_beauty_cpu", monkeypatch)
    (row,) = [r for r in module.rows() if r.name == name]
    argv = row.train_command()[1:]
    return config_from_args(build_parser().parse_args(argv))


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
        ["spdrank", "data"], ["spdrank", "teacher"], ["spdrank", "train"], ["spdrank", "eval"],
        ["spdrank", "train"],
    ]
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path)
    for argv in commands:
        assert main(substituted(argv, tiny_backbone)[1:]) == 0, argv
    assert "cooccurrence" in capsys.readouterr().out  # the eval's table, baselines beside

    def ran(command: list[str]) -> TrainConfig:
        out = Path(command[command.index("--out") + 1])
        summary = json.loads((out / "train.json").read_text(encoding="utf-8"))
        assert summary["finished"]
        return TrainConfig(**summary["config"])

    distilled, clicks = ran(commands[2]), ran(commands[4])
    assert (distilled.epochs, distilled.batch_size, distilled.head_lr) == (4, 32, 1e-3)
    assert (clicks.epochs, clicks.batch_size, clicks.init_from) == (2, 32, "runs/mine")
    assert recipe(distilled) == recipe(benchmark_config("lex/words-tfidf", monkeypatch))
    assert recipe(clicks) == recipe(
        benchmark_config("clicks/words-tfidf-warm+pop+co", monkeypatch)
    )
