"""A run's lifecycle in its ``--out``: what is refused before the first step, and what a rerun
into a run's folder resumes or is refused."""

import json
import random
import re

import pytest

from spdrank.commands.cli import main
from spdrank.commands.train import config_argv
from spdrank.core.slates import SlateError, load_slates, write_slates
from spdrank.training.holdout import hold_out
from spdrank.training.train import Trainer, train
from tests.helpers import make_slate, signal_slates
from tests.helpers import train_config as config


def settings(tmp_path, out="run", **kw):
    """A features-only run on ``tmp_path/train.jsonl``: trains in seconds, reads no LLM."""
    base = {"target": "clicks", "features": "signal", "features_only": True, "positions": 8,
            "head_width": 16, "max_steps": 4, "lora_r": 64, "lora_alpha": 64}
    return config(tmp_path, "unused", out=out, **(base | kw))


@pytest.fixture
def files(tmp_path):
    write_slates(tmp_path / "train.jsonl", signal_slates(16, seed=1, teacher=False))
    write_slates(tmp_path / "eval.jsonl", signal_slates(6, seed=2, teacher=False))
    return tmp_path / "train.jsonl", tmp_path / "eval.jsonl"


@pytest.fixture
def no_step(monkeypatch):
    """A step taken fails the test: what is checked here is refused before the first one."""
    def step(self):
        raise AssertionError("a training step ran before the refusal")

    monkeypatch.setattr(Trainer, "train_step", step)


def long_slate(qid: str) -> object:
    """A slate of 9 candidates, one more than the runs' K of 8."""
    rng = random.Random(3)
    slate = make_slate(rng, 9, qid=qid, teacher=False)
    for c in slate.candidates:
        c.features = {"signal": rng.gauss(0, 1)}
    return slate


# -- eval slates the model cannot rank ---------------------------------------------------------


@pytest.mark.parametrize("select", ["last", "best"])
def test_an_eval_slate_longer_than_k_is_refused_before_the_first_step(
    tmp_path, files, no_step, select
):
    _, eval_file = files
    write_slates(eval_file, [*load_slates(eval_file)[:2], long_slate("long")])
    with pytest.raises(SlateError, match=r"eval\.jsonl:3: slate 'long' has 9 candidates, more "
                       r"than the model's 8 rank positions \(--positions\)"):
        train(settings(tmp_path, eval_slates=str(eval_file), select=select))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("select", ["last", "best"])
def test_an_eval_slate_missing_a_feature_is_refused_before_the_first_step(
    tmp_path, files, no_step, select
):
    _, eval_file = files
    slates = load_slates(eval_file)
    slates[1].candidates[2].features = {"other": 1.0}
    write_slates(eval_file, slates)
    with pytest.raises(SlateError, match=r"eval\.jsonl:2: slate 's2-1': candidates\[2\] "
                       r"\(docid 'd2'\) has no feature 'signal'"):
        train(settings(tmp_path, eval_slates=str(eval_file), select=select))
    assert not (tmp_path / "run").exists()


def test_a_held_out_slate_longer_than_k_is_refused_before_the_first_step(tmp_path, files,
                                                                         no_step):
    train_file, _ = files
    _, probe = hold_out(train_file, 1, tmp_path / "probe", seed=0)
    held = load_slates(probe)[0].query.qid
    write_slates(train_file, [long_slate(held) if s.query.qid == held else s
                              for s in load_slates(train_file)])
    with pytest.raises(SlateError, match=rf"holdout/validation\.jsonl:1: slate '{held}' has 9 "
                       "candidates"):
        train(settings(tmp_path, holdout=1))
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_only_the_eval_limit_of_the_eval_slates_is_read(tmp_path, files):
    _, eval_file = files
    write_slates(eval_file, [*load_slates(eval_file), long_slate("past-the-limit")])
    summary = train(settings(tmp_path, eval_slates=str(eval_file), eval_limit=6))
    assert summary["finished"] and summary["eval_slates"] == 6
    assert json.loads((tmp_path / "run" / "train.json").read_text())["eval_slates"] == 6


# -- what a rerun into an unfinished run compares -----------------------------------------------


def test_a_run_resumes_whatever_its_paths_are_spelled_and_wherever_it_is_run_from(
    tmp_path, files, monkeypatch
):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    first = train(settings(tmp_path, slates="train.jsonl", out="r/sl/", stop_after=1,
                           save_every=1))
    assert not first["finished"]
    again = train(settings(tmp_path, slates="./train.jsonl", out="r/sl", stop_after=1))
    assert not again["finished"] and again["step"] == 2
    monkeypatch.chdir(tmp_path / "elsewhere")
    last = train(settings(tmp_path, slates="../train.jsonl", out=str(tmp_path / "r" / "sl")))
    assert last["finished"] and last["step"] == 4


def test_how_often_a_run_saves_evaluates_and_reports_is_no_setting_it_resumes_by(
    tmp_path, files
):
    _, eval_file = files
    run = {"eval_slates": str(eval_file)}
    assert not train(settings(tmp_path, **run, stop_after=2, save_every=0))["finished"]
    again = train(settings(tmp_path, **run, save_every=1, eval_every=1, progress=True))
    assert again["finished"] and again["step"] == 4


def test_a_refused_resume_shows_both_values_and_keeps_the_state(tmp_path, files):
    train(settings(tmp_path, stop_after=1))
    state = tmp_path / "run" / "state"
    before = (state / "trainer.json").read_bytes()
    with pytest.raises(ValueError) as refused:
        train(settings(tmp_path, head_lr=0.5, seed=3))
    message = str(refused.value)
    assert message == (
        f"{state} holds an unfinished run with other settings (--head-lr: 0.001 in that run, "
        "0.5 now; --seed: 0 in that run, 3 now): rerun with that run's settings to resume it, "
        "or pass another --out to start a new run")
    assert "delete" not in message and (state / "trainer.json").read_bytes() == before


def test_a_state_written_with_its_settings_as_given_still_resumes(tmp_path, files):
    """States written before the settings were resolved kept them as the user gave them, with
    the bookkeeping flags, under ``config``."""
    from dataclasses import asdict

    cfg = settings(tmp_path, stop_after=1)
    train(cfg)
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    del meta["settings"]
    meta["config"] = asdict(cfg) | {"stop_after": None, "progress": None}
    meta_file.write_text(json.dumps(meta))
    assert train(settings(tmp_path, save_every=2))["finished"]


# -- a rerun into a finished run ----------------------------------------------------------------


def test_a_finished_run_is_not_replaced_by_a_run_with_other_settings(tmp_path, files):
    out = tmp_path / "run"
    train(settings(tmp_path))
    kept = {name: (out / name).read_bytes()
            for name in ("train.json", "log.jsonl", "model/head.safetensors")}
    with pytest.raises(ValueError) as refused:
        train(settings(tmp_path, head_lr=0.5))
    assert str(refused.value) == (
        f"{out} holds a finished run with other settings (--head-lr: 0.001 in that run, 0.5 "
        f"now), whose model {out / 'model'} this run would replace: pass another --out for "
        f"this run (--init-from {out} starts from that model)")
    assert {name: (out / name).read_bytes() for name in kept} == kept


def run_files(out) -> dict[str, tuple[bytes, int]]:
    """Every file under ``out``, with its bytes and when it was last written."""
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_finished_run_rerun_as_it_was_run_does_nothing(tmp_path, files, monkeypatch, capsys):
    """A finished run rerun with its own settings and inputs has nothing left to do: the
    command says so, naming train.json, exits 0, and writes no file (its log is not
    continued by a second run's lines, its model not replaced by a retrained one)."""
    out = tmp_path / "run"
    argv = ["train", *config_argv(settings(tmp_path))]
    assert main(argv) == 0
    kept = run_files(out)
    assert len((out / "log.jsonl").read_text().splitlines()) == 1
    capsys.readouterr()

    def step(self):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(Trainer, "train_step", step)
    assert main([*argv, "--stop-after", "1", "--save-every", "1"]) == 0  # cadence: no setting
    assert capsys.readouterr().out == (
        f"the run in {out} is already finished ({out / 'train.json'}), with these settings and "
        f"inputs: nothing to do; its model is {out / 'model'}\n")
    assert run_files(out) == kept
    again = train(settings(tmp_path))
    assert again == json.loads(kept["train.json"][0]) | {"already_finished": again[
        "already_finished"]}
    assert again["finished"] and run_files(out) == kept


def test_a_finished_run_rerun_on_several_processes_starts_none(tmp_path, files, monkeypatch,
                                                              capsys):
    """``--num-processes N`` into a finished run says so before it launches anything: N
    processes would each load the data and find nothing to do."""
    from spdrank.training import launch

    out = tmp_path / "run"
    argv = ["train", *config_argv(settings(tmp_path))]
    assert main(argv) == 0
    kept = run_files(out)
    capsys.readouterr()

    def no_launch(*args, **kwargs):
        raise AssertionError("processes were launched for a finished run")

    monkeypatch.setattr(launch, "launch", no_launch)
    assert main([*argv, "--num-processes", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"the run in {out} is already finished")
    assert run_files(out) == kept
    assert main([*argv, "--seed", "1", "--num-processes", "2"]) == 2
    assert "finished run with other settings (--seed: 0 in that run, 1 now)" in (
        capsys.readouterr().err)


def test_a_finished_run_reruns_with_its_settings_spelled_otherwise(tmp_path, files,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(settings(tmp_path, slates="train.jsonl", out="run"))
    assert train(settings(tmp_path, slates="./train.jsonl", out="run/", save_every=1,
                          progress=True))["already_finished"]


def test_a_finished_run_with_its_settings_as_given_is_compared_as_they_lead(tmp_path, files,
                                                                           monkeypatch):
    """A train.json written before the settings were recorded resolved holds them as given."""
    def as_given():
        summary_file = tmp_path / "run" / "train.json"
        summary = json.loads(summary_file.read_text())
        del summary["settings"]
        summary_file.write_text(json.dumps(summary))

    monkeypatch.chdir(tmp_path)
    train(settings(tmp_path, slates="train.jsonl", out="run"))
    as_given()
    assert train(settings(tmp_path, slates="./train.jsonl", out="run"))["already_finished"]
    with pytest.raises(ValueError, match=r"finished run with other settings \(--seed: 0 in "
                       r"that run, 1 now\)"):
        train(settings(tmp_path, slates="./train.jsonl", out="run", seed=1))


def test_a_finished_held_out_run_keeps_its_parts_when_a_rerun_is_refused(tmp_path, files):
    train(settings(tmp_path, holdout=2))
    parts = {p.name: p.read_bytes() for p in (tmp_path / "run" / "holdout").iterdir()}
    with pytest.raises(ValueError, match=r"--holdout: 2 in that run, 3 now"):
        train(settings(tmp_path, holdout=3))
    assert {p.name: p.read_bytes() for p in (tmp_path / "run" / "holdout").iterdir()} == parts


# -- the slate files a run read -----------------------------------------------------------------


def rewrite(path, seed):
    """``path`` rewritten with other slates of the same shape."""
    write_slates(path, signal_slates(len(load_slates(path)), seed=seed, teacher=False))


def changed(setting, path):
    """What a refusal says of a ``setting`` whose input at ``path`` changed since it was read."""
    return (rf"whose inputs changed since it read them \({setting} {re.escape(str(path))}: "
            r"sha256 [0-9a-f]{12}\.\.\. when the run read it, [0-9a-f]{12}\.\.\. now\)")


def test_a_run_whose_training_file_changed_is_not_resumed(tmp_path, files):
    train_file, _ = files
    original = train_file.read_bytes()
    train(settings(tmp_path, stop_after=1))
    state = tmp_path / "run" / "state"
    before = (state / "trainer.json").read_bytes()
    rewrite(train_file, seed=7)
    with pytest.raises(ValueError, match=(
            rf"{re.escape(str(state))} holds an unfinished run {changed('--slates', train_file)}: "
            r"restore the content it read to resume it, or pass another --out")):
        train(settings(tmp_path))
    assert (state / "trainer.json").read_bytes() == before
    train_file.write_bytes(original)  # the same content, written again: a new mtime
    resumed = train(settings(tmp_path))
    assert resumed["finished"] and resumed["step"] == 4


def test_a_run_whose_eval_file_changed_is_not_resumed(tmp_path, files):
    _, eval_file = files
    train(settings(tmp_path, eval_slates=str(eval_file), stop_after=1))
    rewrite(eval_file, seed=8)
    with pytest.raises(ValueError,
                       match=changed("--eval-slates", eval_file)):
        train(settings(tmp_path, eval_slates=str(eval_file)))


def test_a_held_out_run_whose_slates_changed_is_not_resumed_and_keeps_its_parts(tmp_path,
                                                                                 files):
    train_file, _ = files
    train(settings(tmp_path, holdout=2, stop_after=1))
    parts = {p.name: p.read_bytes() for p in (tmp_path / "run" / "holdout").iterdir()}
    rewrite(train_file, seed=9)
    with pytest.raises(ValueError, match=changed("--slates", train_file)):
        train(settings(tmp_path, holdout=2))
    assert {p.name: p.read_bytes() for p in (tmp_path / "run" / "holdout").iterdir()} == parts


def test_a_finished_run_is_not_replaced_by_a_run_on_other_slates(tmp_path, files):
    train_file, _ = files
    train(settings(tmp_path))
    model = (tmp_path / "run" / "model" / "head.safetensors").read_bytes()
    rewrite(train_file, seed=7)
    with pytest.raises(ValueError,
                       match=rf"holds a finished run {changed('--slates', train_file)}"):
        train(settings(tmp_path))
    assert (tmp_path / "run" / "model" / "head.safetensors").read_bytes() == model


# -- the checkpoint and the template file a run starts from ---------------------------------------


def trained_model(tmp_path, name, seed, **kw):
    """The model of a finished run in ``tmp_path/name`` trained with ``seed`` (and ``kw``): a
    checkpoint to start a run from (``--init-from``)."""
    train(settings(tmp_path, out=name, seed=seed, **kw))
    return tmp_path / name / "model"


def test_a_run_whose_init_from_model_changed_is_not_resumed_nor_replaced(tmp_path, files):
    model = trained_model(tmp_path, "base", seed=1)
    other = trained_model(tmp_path, "other", seed=2)
    started_from = (model / "head.safetensors").read_bytes()
    given = settings(tmp_path, init_from=str(tmp_path / "base"))
    train(settings(tmp_path, init_from=str(tmp_path / "base"), stop_after=1))
    state = tmp_path / "run" / "state"
    (model / "head.safetensors").write_bytes((other / "head.safetensors").read_bytes())
    with pytest.raises(ValueError, match=(
            rf"{re.escape(str(state))} holds an unfinished run {changed('--init-from', model)}: "
            r"restore the content it read to resume it, or pass another --out")):
        train(given)
    (model / "head.safetensors").write_bytes(started_from)
    assert train(given)["step"] == 4
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    with pytest.raises(ValueError, match=rf"holds a finished run {changed('--init-from', model)}"):
        train(given)


def test_a_run_whose_prompt_file_changed_is_not_resumed_nor_replaced(tmp_path, files):
    prompt = tmp_path / "prompt.json"
    prompt.write_text('{"name": "mine"}\n')
    train(settings(tmp_path, prompt=str(prompt), stop_after=1))
    state = tmp_path / "run" / "state"
    prompt.write_text('{"name": "theirs"}\n')
    with pytest.raises(ValueError, match=(
            rf"{re.escape(str(state))} holds an unfinished run {changed('--prompt', prompt)}: ")):
        train(settings(tmp_path, prompt=str(prompt)))
    prompt.write_text('{"name": "mine"}\n')
    assert train(settings(tmp_path, prompt=str(prompt)))["step"] == 4
    prompt.write_text('{"name": "theirs"}\n')
    with pytest.raises(ValueError, match=rf"holds a finished run {changed('--prompt', prompt)}"):
        train(settings(tmp_path, prompt=str(prompt)))


def test_a_run_recorded_before_its_model_and_template_were_still_resumes(tmp_path, files):
    """A record holding no digest of the --init-from checkpoint and the --prompt file does not
    know what they held then: they are not compared, and the run resumes (and records them)."""
    prompt = tmp_path / "prompt.json"
    prompt.write_text('{"name": "mine"}\n')
    trained_model(tmp_path, "base", seed=1, prompt=str(prompt))
    given = {"init_from": str(tmp_path / "base"), "prompt": str(prompt)}
    train(settings(tmp_path, stop_after=1, **given))
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    assert set(meta["input_files"]) == {"--slates", "--init-from", "--prompt"}
    meta["input_files"] = {"--slates": meta["input_files"]["--slates"]}
    meta_file.write_text(json.dumps(meta))
    finished = train(settings(tmp_path, **given))
    assert finished["step"] == 4
    assert set(finished["input_files"]) == {"--slates", "--init-from", "--prompt"}


def test_a_run_recorded_before_its_files_were_still_resumes(tmp_path, files):
    train(settings(tmp_path, stop_after=1))
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    del meta["input_files"]
    meta_file.write_text(json.dumps(meta))
    assert train(settings(tmp_path))["finished"]
