"""benchmarks/ablation_*.sh: every command they would run parses with the real CLI, each
ablation varies only what it names, the bench evaluates exactly the runs trained, and one
script runs for real (tiny backbone, a few slates), resumably."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import spdrank.commands.cli
from spdrank.core.slates import write_slates
from tests.helpers import ROOT, make_slate, subprocess_env

SCRIPTS = ("signal", "heads", "decoders", "depth")
#: The settings the scripts read from the environment: none may leak in from the caller's.
SETTINGS = (
    "BIN", "NEG", "DATA", "WORK", "OUT", "TRAIN_N", "EVAL_N", "BACKBONE", "LAYERS", "LORA_R",
    "ITEM_TOKENS", "QUERY_TOKENS", "TARGET", "EPOCHS", "BATCH", "LR", "HEAD_LR", "SEED", "DEVICE",
    "DTYPE", "JOBS", "THREADS", "BASELINES", "BOOTSTRAP", "HEADS", "DECODERS", "LAYERS_LIST",
)
FAKE_BIN = "/nonexistent/bin"


def dry_run(script: str, **settings: str) -> list[list[str]]:
    """The spdrank commands (argv, without the executable) that ``--dry-run`` prints."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / f"ablation_{script}.sh"), "--dry-run"],
        env={**env, "BIN": FAKE_BIN, **settings}, capture_output=True, text=True, timeout=60,
        check=True,
    )
    prefix = f"{FAKE_BIN}/spdrank "
    return [shlex.split(line)[1:] for line in done.stdout.splitlines() if line.startswith(prefix)]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def flags(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def without(argv: list[str], *names: str) -> list[str]:
    """``argv`` without the given flags and their values (``--frozen``, a switch, alone)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = a != "--frozen"
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_command_parses_and_the_bench_evaluates_what_was_trained(script):
    commands = dry_run(script)
    parser = spdrank.commands.cli.build_parser()
    for argv in commands:
        parser.parse_args(argv)  # exits (fails the test) on an unknown flag or a bad value
    assert [a[0] for a in commands] == ["data", "teacher", "teacher", *(["train"] * (
        len(commands) - 4)), "bench"]
    train = [a for a in commands if a[0] == "train"]
    (bench,) = [a for a in commands if a[0] == "bench"]
    labelled = {flag(a, "--slates-out") for a in commands if a[0] == "teacher"}
    assert {flag(a, "--slates") for a in train} < labelled and flag(bench, "--slates") in labelled
    models = dict(spec.split("=", 1) for spec in flags(bench, "--model"))
    assert sorted(models.values()) == sorted(flag(a, "--out") for a in train)
    decoders = flag(bench, "--decoders").split(",")
    assert flag(bench, "--reference") in {f"{m}:{d}" for m in models for d in decoders}
    assert flags(bench, "--ranker") == ["random", "popularity", "cooccurrence"]
    for argv in [*train, bench]:
        assert (flag(argv, "--device"), flag(argv, "--dtype")) == ("cpu", "float32")


def trains(script: str, **settings: str) -> list[list[str]]:
    return [a for a in dry_run(script, **settings) if a[0] == "train"]


def only_differ_in(commands: list[list[str]], *names: str) -> None:
    """The commands are the same but for the flags ``names`` (and where each run goes)."""
    rest = {tuple(without(a, "--out", *names)) for a in commands}
    assert len(rest) == 1, rest


def test_each_ablation_varies_only_what_it_names():
    signal = trains("signal")
    only_differ_in(signal, "--target", "--frozen", "--lora-r", "--lora-alpha")
    assert {(flag(a, "--target"), "--frozen" in a) for a in signal} == {
        ("clicks", True), ("teacher", True), ("teacher", False), ("teacher+clicks", False)
    }
    for argv in signal:  # LoRA's rank is the same for every LoRA run; a frozen one has none
        assert ("--lora-r" in argv) != ("--frozen" in argv)
    heads = trains("heads")
    only_differ_in(heads, "--head")
    assert [flag(a, "--head") for a in heads] == ["attn", "linear"]
    for settings, layers in (({}, ["8", "4", "2"]), ({"LAYERS_LIST": "1 3"}, ["3", "1"])):
        depth = trains("depth", **settings)
        only_differ_in(depth, "--layers")
        assert [flag(a, "--layers") for a in depth] == layers  # deepest first
    (bench,) = [a for a in dry_run("depth", LAYERS_LIST="1 3") if a[0] == "bench"]
    assert flag(bench, "--reference") == "L1:hungarian"
    assert flags(bench, "--model")[0].startswith("L1=")  # rows in the order asked for
    decoders = dry_run("decoders")
    assert [a[0] for a in decoders].count("train") == 1
    (bench,) = [a for a in decoders if a[0] == "bench"]
    assert flag(bench, "--decoders") == "hungarian,greedy,argsort,expected_rank"
    assert flag(bench, "--reference") == "spd:hungarian"


def test_one_student_is_trained_once_for_all_four():
    """The attention-head, teacher, LoRA run at LAYERS is the same command in every script, so
    it lands in the same run directory; any other setting gives a new one."""
    outs = [{flag(a, "--out") for a in trains(script)} for script in SCRIPTS]
    (shared,) = set.intersection(*outs)
    assert "/teacher-lora-attn-L4-" in shared
    (other,) = {flag(a, "--out") for a in trains("decoders", EPOCHS="2")}
    assert other != shared and "/teacher-lora-attn-L4-" in other


def test_gpu_settings_reach_every_command():
    gpu = {"DEVICE": "cuda", "DTYPE": "bfloat16", "TRAIN_N": "21245", "EVAL_N": "1118",
           "LAYERS": "30", "BATCH": "16"}
    commands = dry_run("heads", **gpu)
    train = [a for a in commands if a[0] == "train"]
    (bench,) = [a for a in commands if a[0] == "bench"]
    for argv in [*train, bench]:
        assert (flag(argv, "--device"), flag(argv, "--dtype")) == ("cuda", "bfloat16")
    for argv in train:
        assert (flag(argv, "--layers"), flag(argv, "--batch-size")) == ("30", "16")
        assert flag(argv, "--slates").endswith("train-21245.slates.jsonl")
    assert flag(bench, "--slates").endswith("eval-1118.slates.jsonl")


@pytest.mark.slow  # the whole script: three trainings and a bench, twice
def test_the_heads_ablation_runs_and_resumes(tmp_path, tiny_backbone):
    """For real, at toy scale: data subsets, teacher labels, two students trained in parallel,
    the bench with the preamble and paired differences; a rerun redoes nothing."""
    rng = random.Random(0)
    data = tmp_path / "data"
    data.mkdir()
    write_slates(data / "train.jsonl", [make_slate(rng, 8, qid=f"t{i}") for i in range(10)])
    write_slates(data / "eval.jsonl", [make_slate(rng, 8, qid=f"e{i}") for i in range(5)])
    (data / "manifest.json").write_text("{}\n")  # present: the Beauty build is skipped
    work, out = tmp_path / "work", tmp_path / "out"
    env = {k: v for k, v in subprocess_env().items() if k not in SETTINGS} | {
        "BIN": str(Path(sys.executable).parent), "DATA": str(data), "WORK": str(work),
        "OUT": str(out), "BACKBONE": tiny_backbone, "LAYERS": "2", "TRAIN_N": "6",
        "EVAL_N": "4", "BATCH": "2", "HEADS": "attn linear", "BASELINES": "popularity",
        "BOOTSTRAP": "100",
    }

    def run() -> str:
        done = subprocess.run(["bash", str(ROOT / "benchmarks" / "ablation_heads.sh")], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = run()
    report = (out / "report.md").read_text()
    assert report.startswith("# Ablation: scoring heads (Table 4)\n\nOne command: `NEG=uniform")
    assert "HEADS='attn linear' bash benchmarks/ablation_heads.sh`" in report
    assert "- varies: the head (`--head attn linear`" in report
    assert "| attn | `" in report and "| linear | `" in report
    # the commands in the report are exactly those run
    commands = re.search(r"\nCommands \(.*?\n```\n(.*?)\n```\n", report, re.DOTALL).group(1)
    dry = subprocess.run(["bash", str(ROOT / "benchmarks" / "ablation_heads.sh"), "--dry-run"],
                         env=env, capture_output=True, text=True, check=True)
    assert commands == dry.stdout.rstrip("\n") and "--head linear" in commands
    assert "## Paired differences vs `attn:hungarian`" in report
    d = json.loads((out / "results.json").read_text())
    assert list(d["rankers"]) == ["popularity", "attn:hungarian", "linear:hungarian"]
    assert d["n_slates"] == 4 and d["n_with_teacher"] == 4
    assert list(d["paired"]["rows"]) == ["popularity", "linear:hungarian"]
    runs = sorted((work / "runs").glob("*/train.json"))
    assert len(runs) == 2 and all(json.loads(p.read_text())["train_slates"] == 6 for p in runs)
    assert first.count(": started, log in ") == 2 and "== bench:" in first

    second = run()
    # data, two teacher labellings, two students, the bench
    assert second.count(": already done") == 6 and ": started" not in second
    for p in runs:  # one training attempt each
        assert len(Path(str(p.parent) + ".wall.tsv").read_text().splitlines()) == 1

    # another bench setting: the report is redone (not kept from the old command), the
    # students are not
    env["BOOTSTRAP"] = "50"
    third = run()
    assert third.count(": already done") == 5 and "== bench:" in third
    assert json.loads((out / "results.json").read_text())["paired"]["resamples"] == 50
