"""A checkpoint whose weights hold a value no training leaves (NaN, ±inf, a magnitude such as
1e30) is refused where its tensors are read, naming the file and the tensor: when a model
loads to rank, and when a run starts from it (``--init-from``), which otherwise reported
"loss became nan at step 1; lower --lr" (:func:`spdrank.backbone.load.read_tensors`)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from spdrank.backbone.load import MAX_WEIGHT, read_tensors
from spdrank.model.ranker import SPDRanker
from tests.helpers import save_features_only_model

DAMAGE = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf"), "-1e30": -1e30}


def _damage(file, value: float) -> str:
    """Set one value of ``file``'s first floating tensor to ``value``; the tensor's name."""
    tensors = load_file(str(file))
    name = next(k for k, v in sorted(tensors.items()) if v.is_floating_point() and v.numel())
    tensors[name].view(-1)[0] = value
    save_file(tensors, str(file))
    return name


@pytest.mark.parametrize("value", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_head_is_refused_when_the_model_loads(tmp_path, value):
    ckpt = save_features_only_model(tmp_path / "m", 4)
    name = _damage(ckpt / "head.safetensors", DAMAGE[value])
    with pytest.raises(ValueError) as raised:
        SPDRanker.from_pretrained(ckpt)
    message = str(raised.value)
    assert f"head.safetensors: tensor {name!r} of the head weights holds" in message, message
    assert "\n" not in message


def test_weights_within_the_bound_and_integer_tensors_are_read(tmp_path):
    file = tmp_path / "w.safetensors"
    save_file({"w": torch.tensor([-MAX_WEIGHT, 3.0, MAX_WEIGHT]),
               "ids": torch.tensor([2**40, -1]), "empty": torch.zeros(0)}, str(file))
    assert set(read_tensors(file, "head")) == {"w", "ids", "empty"}
    save_file({"w": torch.tensor([1.0, 2 * MAX_WEIGHT], dtype=torch.bfloat16)}, str(file))
    with pytest.raises(ValueError, match=r"tensor 'w' of the head weights holds a value of "
                                         r"magnitude 2e\+15, past 1e\+15"):
        read_tensors(file, "head")


@pytest.mark.parametrize("value", ["nan", "-1e30"])
def test_a_run_from_a_damaged_checkpoint_is_refused_before_it_trains(tmp_path, tiny_backbone,
                                                                     value):
    from spdrank.core.slates import write_slates
    from spdrank.training.train import Trainer, train
    from tests.helpers import signal_slates, train_config

    write_slates(tmp_path / "train.jsonl", signal_slates(8, seed=1))
    base = {"frozen": True, "positions": 8, "lora_r": 4, "lora_alpha": 8}
    train(train_config(tmp_path, tiny_backbone, "first", **(base | {"max_steps": 1})))
    name = _damage(tmp_path / "first" / "model" / "head.safetensors", DAMAGE[value])
    again = train_config(tmp_path, tiny_backbone, "next",
                         **(base | {"init_from": str(tmp_path / "first")}))
    with pytest.raises(ValueError, match=f"head.safetensors: tensor '{name}' of the head "
                                         "weights holds"):
        Trainer(again)
