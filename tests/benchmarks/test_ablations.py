"""benchmarks/experiments/ablation-*.toml: every command they would run parses with the real
CLI, each ablation varies only what it names, the bench evaluates exactly the runs trained,
the four share the run they have in common, and one runs for real (tiny backbone, a few
slates), resumably."""

from __future__ import annotations

import json
import random
import shlex

import pytest

import spdrank.commands.cli
from spdrank.core.slates import write_slates
from tests.helpers import ROOT, make_slate

EXPERIMENTS = ROOT / "benchmarks" / "experiments"

ABLATIONS = ("signal", "heads", "decoders", "depth")


def dry_run(run, name: str, capsys, *sets: str) -> list[list[str]]:
    """The spdrank commands (argv, without the program) the ablation would run."""
    capsys.readouterr()
    args = [x for s in sets for x in ("--set", s)]
    assert run.main([str(EXPERIMENTS / f"ablation-{name}.toml"), "--dry-run", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [shlex.split(line.split("spdrank ", 1)[1]) for line in lines]


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


@pytest.mark.parametrize("name", ABLATIONS)
def test_every_command_parses_and_the_bench_evaluates_what_was_trained(name, capsys, run):
    commands = dry_run(run, name, capsys)
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


def trains(run, name: str, capsys, *sets: str) -> list[list[str]]:
    return [a for a in dry_run(run, name, capsys, *sets) if a[0] == "train"]


def only_differ_in(commands: list[list[str]], *names: str) -> None:
    """The commands are the same but for the flags ``names`` (and where each run goes)."""
    rest = {tuple(without(a, "--out", *names)) for a in commands}
    assert len(rest) == 1, rest


def test_each_ablation_varies_only_what_it_names(capsys, run):
    signal = trains(run, "signal", capsys)
    only_differ_in(signal, "--target", "--frozen", "--lora-r", "--lora-alpha")
    assert {(flag(a, "--target"), "--frozen" in a) for a in signal} == {
        ("clicks", True), ("teacher", True), ("teacher", False), ("teacher+clicks", False)
    }
    for argv in signal:  # LoRA's rank is the same for every LoRA run; a frozen one has none
        assert ("--lora-r" in argv) != ("--frozen" in argv)
    heads = trains(run, "heads", capsys)
    only_differ_in(heads, "--head")
    assert [flag(a, "--head") for a in heads] == ["attn", "linear"]
    for sets, layers in (((), ["8", "4", "2"]), (('depths=["1", "3"]',), ["1", "3"])):
        depth = trains(run, "depth", capsys, *sets)
        only_differ_in(depth, "--layers")
        assert [flag(a, "--layers") for a in depth] == layers
    (bench,) = [a for a in dry_run(run, "depth", capsys, 'depths=["1", "3"]') if a[0] == "bench"]
    assert flag(bench, "--reference") == "L1:hungarian"
    assert flags(bench, "--model")[0].startswith("L1=")  # rows in the order asked for
    decoders = dry_run(run, "decoders", capsys)
    assert [a[0] for a in decoders].count("train") == 1
    (bench,) = [a for a in decoders if a[0] == "bench"]
    assert flag(bench, "--decoders") == "hungarian,greedy,argsort,expected_rank"
    assert flag(bench, "--reference") == "spd:hungarian"


def test_one_student_is_trained_once_for_all_four(capsys, run):
    """The attention-head, teacher, LoRA run at the default layers is the same command in
    every ablation, so it lands in the same run folder; any other setting gives a new one."""
    outs = [{flag(a, "--out") for a in trains(run, name, capsys)} for name in ABLATIONS]
    (shared,) = set.intersection(*outs)
    assert shared.endswith("/teacher-lora-attn-L4")
    (other,) = {flag(a, "--out") for a in trains(run, "decoders", capsys, "epochs=2")}
    assert other != shared and other.endswith("/teacher-lora-attn-L4")


def test_gpu_settings_reach_every_command(capsys, run):
    gpu = ("device=cuda", "dtype=bfloat16", "train_n=21245", "eval_n=1118", "layers=30",
           "batch=16")
    commands = dry_run(run, "heads", capsys, *gpu)
    train = [a for a in commands if a[0] == "train"]
    (bench,) = [a for a in commands if a[0] == "bench"]
    for argv in [*train, bench]:
        assert (flag(argv, "--device"), flag(argv, "--dtype")) == ("cuda", "bfloat16")
    for argv in train:
        assert (flag(argv, "--layers"), flag(argv, "--batch-size")) == ("30", "16")
    limits = [flag(a, "--limit") for a in commands if a[0] == "teacher"]
    assert limits == ["21245", "1118"]


@pytest.mark.slow  # the whole ablation: two trainings and a bench, then a rerun
def test_the_heads_ablation_runs_and_resumes(tmp_path, tiny_backbone, capsys, run):
    """For real, at toy scale: teacher labels, two students, the bench with paired
    differences, the runner's report; a rerun redoes nothing."""
    rng = random.Random(0)
    data = tmp_path / "data"
    data.mkdir()
    write_slates(data / "train.jsonl", [make_slate(rng, 8, qid=f"t{i}") for i in range(10)])
    write_slates(data / "eval.jsonl", [make_slate(rng, 8, qid=f"e{i}") for i in range(5)])
    (data / "manifest.json").write_text("{}\n")  # present: the Beauty build is skipped
    out = tmp_path / "out"
    sets = [f"data={data}", f"work={tmp_path / 'work'}", f"backbone={tiny_backbone}",
            "layers=2", "train_n=6", "eval_n=4", "batch=2", 'baselines=["--ranker", "popularity"]',
            "bootstrap=100"]
    argv = [str(EXPERIMENTS / "ablation-heads.toml"), "--out", str(out),
            *(x for s in sets for x in ("--set", s))]
    assert run.main(argv) == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# Ablation: scoring heads (Table 4)\n\nRe-created by `")
    assert f"the first {2} layers of {tiny_backbone}" in report
    assert "## Student attn" in report and "3 steps over 6 slates" in report
    assert "popularity" in report and "attn:hungarian" in report
    d = json.loads((out / "bench" / "results.json").read_text())
    assert list(d["rankers"]) == ["popularity", "attn:hungarian", "linear:hungarian"]
    assert d["n_slates"] == 4 and d["n_with_teacher"] == 4
    assert list(d["paired"]["rows"]) == ["popularity", "linear:hungarian"]
    runs = sorted((tmp_path / "work" / "runs").glob("*/train.json"))
    assert len(runs) == 2 and all(json.loads(p.read_text())["train_slates"] == 6 for p in runs)

    capsys.readouterr()
    assert run.main(argv) == 0  # every output is there: nothing runs again
    assert capsys.readouterr().out.count("= (done)") == 6  # data, two labellings, two students, the bench
