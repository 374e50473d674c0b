"""``spdrank train --init-from``: a run that starts from a trained checkpoint."""


import numpy as np
import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import load_slates, write_slates
from spdrank.model.ranker import SPDRanker
from spdrank.training.train import TrainConfig, Trainer, train
from tests.helpers import signal_slates, train_config


@pytest.fixture
def files(tmp_path):
    write_slates(tmp_path / "train.jsonl", signal_slates(32, seed=1))
    write_slates(tmp_path / "eval.jsonl", signal_slates(24, seed=2))
    return tmp_path / "train.jsonl", tmp_path / "eval.jsonl"


def settings(tmp_path, backbone, out, **kw) -> TrainConfig:
    base = {"frozen": True, "positions": 8, "lora_r": 4, "lora_alpha": 8}
    return train_config(tmp_path, backbone, out, **(base | kw))


def matrices(model: SPDRanker, slates) -> np.ndarray:
    return np.stack([model.score_matrix(s) for s in slates])


def test_a_run_from_a_checkpoint_ranks_as_it_does_then_learns_the_features_it_adds(
    tmp_path, tiny_backbone, files
):
    eval_file = files[1]
    train(settings(tmp_path, tiny_backbone, "teacher", max_steps=6))
    distilled = SPDRanker.from_pretrained(tmp_path / "teacher")
    slates = load_slates(eval_file)[:4]

    tuned = settings(tmp_path, tiny_backbone, "tuned", init_from=str(tmp_path / "teacher"),
                     target="clicks", features="signal", max_steps=40, head_lr=1e-2,
                     head_dropout=0.0, warmup_steps=4)
    before = Trainer(tuned).spd
    assert not before.head.features.weight.any()  # the added features start at zero
    np.testing.assert_allclose(matrices(before, slates), matrices(distilled, slates), atol=1e-5)

    train(tuned)
    model = SPDRanker.from_pretrained(tmp_path / "tuned")
    assert model.head.features.weight.any()
    held_out = load_slates(eval_file)

    def top1(model: SPDRanker) -> float:
        return sum(model.rank(s).docids[0] == s.clicked[0] for s in held_out) / len(held_out)

    # the clicked item is the top signal: found once the features are learnt (chance: 1/6)
    assert top1(distilled) <= 0.35 and top1(model) >= 0.5


def test_lora_adapters_carry_over_to_a_lora_run(tmp_path, tiny_backbone, files):
    train(settings(tmp_path, tiny_backbone, "lora", frozen=False, max_steps=3, lr=1e-2))
    slates = load_slates(files[1])[:3]
    before = Trainer(settings(tmp_path, tiny_backbone, "next", frozen=False,
                              init_from=str(tmp_path / "lora" / "model"))).spd
    saved = SPDRanker.from_pretrained(tmp_path / "lora")
    np.testing.assert_allclose(matrices(before, slates), matrices(saved, slates), atol=1e-5)



@pytest.mark.parametrize(("tamper", "named"), [
    (lambda a: (a / "adapter_model.safetensors").write_bytes(b"\x00" * 16),
     "adapter_model.safetensors: not a readable safetensors file"),
    (lambda a: (a / "adapter_model.safetensors").rename(a / "adapter_model.bin"),
     "the adapter weights are pickles"),
    (lambda a: (a / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 64}'),
     "adapter_config.json: r is 64"),
])
def test_a_warm_start_reads_the_adapter_as_a_loaded_checkpoint_does(
    tmp_path, tiny_backbone, files, tamper, named
):
    """--init-from reads a checkpoint's adapter through the loader's checks, so a damaged or
    pickled adapter is refused in one line naming its file, as loading the model refuses it."""
    train(settings(tmp_path, tiny_backbone, "lora", frozen=False, max_steps=1))
    tamper(tmp_path / "lora" / "model" / "adapter")
    with pytest.raises((ValueError, FileNotFoundError), match=named):
        Trainer(settings(tmp_path, tiny_backbone, "next", frozen=False,
                         init_from=str(tmp_path / "lora" / "model")))

@pytest.mark.parametrize(("change", "named"), [
    ({"head_width": 16}, "head.width: 32 in the checkpoint, 16 here"),
    ({"layers": 1}, "layers: None in the checkpoint, 1 here"),
    ({"max_item_tokens": 4}, "prompt.max_item_tokens"),
    ({"readout": "last"}, "prompt.readout"),
])
def test_a_checkpoint_that_reads_other_states_is_refused_naming_the_setting(
    tmp_path, tiny_backbone, files, change, named
):
    train(settings(tmp_path, tiny_backbone, "base", max_steps=1))
    with pytest.raises(ValueError, match="--init-from") as info:
        train(settings(tmp_path, tiny_backbone, "next", init_from=str(tmp_path / "base"),
                       max_steps=1, **change))
    assert named in str(info.value)
    assert not (tmp_path / "next").exists()


def test_features_and_lora_must_match_what_the_checkpoint_read(tmp_path, tiny_backbone, files):
    train(settings(tmp_path, tiny_backbone, "feat", features="signal", target="clicks",
                   max_steps=1))
    with pytest.raises(ValueError, match=r"features: the checkpoint reads \['signal'\]"):
        train(settings(tmp_path, tiny_backbone, "b", init_from=str(tmp_path / "feat"), max_steps=1))
    train(settings(tmp_path, tiny_backbone, "lora", frozen=False, max_steps=1))
    with pytest.raises(ValueError, match="this run is --frozen"):
        train(settings(tmp_path, tiny_backbone, "c", init_from=str(tmp_path / "lora"), max_steps=1))
    with pytest.raises(FileNotFoundError, match="not an spdrank checkpoint"):
        train(settings(tmp_path, tiny_backbone, "d", init_from=str(tmp_path / "nowhere"),
                       max_steps=1))


def test_the_cli_flag_starts_from_the_checkpoint(tmp_path, tiny_backbone, files, capsys):
    train(settings(tmp_path, tiny_backbone, "base", max_steps=2))
    args = ["train", "--slates", str(files[0]), "--out", str(tmp_path / "next"),
            "--backbone", tiny_backbone, "--frozen", "--positions", "8", "--head-width", "32",
            "--max-item-tokens", "8", "--batch-size", "4", "--max-steps", "2",
            "--init-from", str(tmp_path / "base"), "--no-progress"]
    assert main(args) == 0
    assert '"finished": true' in capsys.readouterr().out


def test_a_warm_start_is_a_candidate_to_keep(tmp_path, tiny_backbone, files):
    """With --select best, the checkpoint a run starts from is evaluated before the first
    step: a run whose steps only make it worse on the eval slates keeps it as it was.

    The eval slates' teacher ranks by the signal the start learned from clicks, so the
    selection metric (tau with the teacher) is high at the start; the run then learns the
    opposite clicks (the lowest signal clicked), so every later evaluation is lower."""
    eval_file = files[1]
    held_out = signal_slates(24, seed=2)
    for slate in held_out:
        slate.teacher = [c.docid for c in sorted(slate.candidates,
                                                 key=lambda c: -c.features["signal"])]
    write_slates(eval_file, held_out)
    inverted = signal_slates(32, seed=1)
    for slate in inverted:
        slate.clicked = [min(slate.candidates, key=lambda c: c.features["signal"]).docid]
    write_slates(tmp_path / "inverted.jsonl", inverted)
    train(settings(tmp_path, tiny_backbone, "start", features="signal", target="clicks",
                   max_steps=40, head_lr=1e-2, head_dropout=0.0, warmup_steps=4))
    start = SPDRanker.from_pretrained(tmp_path / "start")
    summary = train(settings(
        tmp_path, tiny_backbone, "worse", init_from=str(tmp_path / "start"),
        slates=str(tmp_path / "inverted.jsonl"), features="signal", target="clicks",
        head_lr=1e-1, max_steps=8, warmup_steps=1, eval_slates=str(eval_file), eval_every=4,
        select="best"))
    slates = load_slates(eval_file)[:4]
    kept = SPDRanker.from_pretrained(tmp_path / "worse")
    if "input" in summary["selected"]:
        # The signal the start learned is itself an input the student reads, and it ranks as
        # the teacher does: the run keeps it rather than any of its steps.
        assert summary["selected"]["input"] == "feature:signal"
        assert summary["verdict"].startswith("kept feature:signal itself")
        return
    assert summary["selected"]["step"] == 0
    assert np.allclose(matrices(kept, slates), matrices(start, slates), atol=1e-5)
