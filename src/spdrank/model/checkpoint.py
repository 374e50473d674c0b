"""A checkpoint on disk: ``config.json``, ``head.safetensors`` and, for a LoRA-adapted
backbone, the peft adapter under ``adapter/``; and the names of every file spdrank writes for
a model, a training run's resumable state included.

Nothing in it is a pickle, so loading a checkpoint never runs code; nor can its backbone
reference make it: the Python of a model folder runs only when the caller passes
``trust_remote_code`` for that load, which no checkpoint records. A checkpoint is written to
a temporary sibling and swapped in, so it is never half-written. Torch-free at import: a
command finds a checkpoint and reads its config before it pays for torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from spdrank.backbone.settings import read_json
from spdrank.core.atomic_dir import atomic_directory
from spdrank.model.config import SPDConfig

if TYPE_CHECKING:
    from torch import nn

    from spdrank.backbone.settings import LoraSettings

#: A checkpoint's files: its settings, its head's weights, and a LoRA backbone's peft adapter.
CONFIG_NAME = "config.json"
HEAD_NAME = "head.safetensors"
ADAPTER_DIR = "adapter"
#: Where a training run keeps a model it writes as a checkpoint: the one it ends with
#: (``OUT/model``), its best and its resumable state's (``OUT/best/model``, ``OUT/state/model``).
MODEL_DIR = "model"
#: Where a training run keeps its resumable state (``OUT/state``), until it finishes.
STATE_DIR = "state"
#: The rest of a training run's resumable state, beside its model: the optimizer's tensors,
#: each process's random-number state, and the trainer's JSON (step, settings, the
#: optimizer's and scheduler's other values). Safetensors and JSON: no pickles here either.
OPTIMIZER_NAME = "optimizer.safetensors"
RNG_NAME = "rng.safetensors"
TRAINER_NAME = "trainer.json"
#: A finished training run's summary, beside its model: steps, evaluations and its settings.
SUMMARY_NAME = "train.json"


def model_folder(path: str | os.PathLike[str]) -> Path:
    """The folder holding the checkpoint ``path`` names: ``path`` itself, or a training run's
    model (``path/model``) when only that holds a config.json. Nothing is checked beyond that
    (:func:`checkpoint_dir` refuses a folder that is no checkpoint)."""
    path = Path(path)
    if not (path / CONFIG_NAME).exists() and (path / MODEL_DIR / CONFIG_NAME).exists():
        return path / MODEL_DIR
    return path


def run_slates(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The slates the run that wrote checkpoint ``path`` read, as its ``train.json`` records
    them: ``slates`` (what it trained on) and ``eval_slates`` (what it chose its epoch and
    input on, with ``--select best``), each where given; empty for a model that is no run's
    (``OUT/model``) or a run without that record. Paths are as the run was given them,
    relative to where it ran."""
    folder = model_folder(path)
    summary = folder.parent / SUMMARY_NAME
    if folder.name != MODEL_DIR or not summary.is_file():
        return {}
    try:
        data = read_json(summary)
    except (ValueError, OSError):
        return {}
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return {}
    chose = config.get("select") == "best"
    return {key: Path(config[key]) for key in ("slates", "eval_slates")
            if isinstance(config.get(key), str) and (key == "slates" or chose)}


def checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory ``path`` names: a model directory, or a training run's (whose
    model is in ``OUT/model``); a FileNotFoundError when it is neither."""
    path = model_folder(path)
    if not (path / CONFIG_NAME).exists():
        raise FileNotFoundError(f"{path} is not an spdrank checkpoint: no {CONFIG_NAME}")
    return path


def read_config(path: Path) -> SPDConfig:
    """A checkpoint's ``config.json``; a ValueError naming ``path`` when it cannot be one.

    It is read only as a regular file of bounded size (:func:`spdrank.backbone.load.read_json`),
    and every size in it is checked before anything is built from it.
    """
    try:
        data = read_json(path)
    except ValueError as exc:
        raise ValueError(f"{path}: not a JSON checkpoint config "
                         f"({str(exc).removeprefix(f'{path}: ')})") from None
    try:
        return SPDConfig.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except (AttributeError, KeyError, TypeError) as exc:  # AttributeError: not an object
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a usable spdrank checkpoint config ({what})") from None


def load_head(head: nn.Module, path: Path) -> None:
    """Load the head's weights from safetensors; a ValueError naming ``path`` when the file is
    unreadable (a truncated header) or does not fit the head the config describes, saying
    what to do when its layers are named otherwise (weights from another spdrank version)."""
    from spdrank.backbone.load import read_tensors

    tensors = read_tensors(path, "head")
    try:
        head.load_state_dict(tensors)
    except RuntimeError as exc:  # missing or unexpected keys, shapes that differ
        first = str(exc).strip().splitlines()
        reason = " ".join(line.strip() for line in first[:3])
        named_otherwise = set(tensors) != set(head.state_dict())
        raise ValueError(
            f"{path}: the weights do not fit the head in config.json ({reason})"
            + (RENAMED_LAYERS if named_otherwise else "")
        ) from None


#: What a head whose weights are named otherwise than its layers is told: the layer names a
#: head is saved under are its format, and weights under any others are not mapped.
RENAMED_LAYERS = (
    "; this spdrank reads a head's weights only under its layers' names (the linear and "
    "scalar heads of earlier versions saved theirs as norm./out. and mlp.*, which are not "
    "read): train the model again with this version"
)


def save_checkpoint(
    path: str | os.PathLike[str], config: SPDConfig, head: nn.Module, backbone: nn.Module
) -> None:
    """Write ``config``, the ``head``'s weights and, with LoRA, ``backbone``'s adapter."""
    from safetensors.torch import save_file

    with atomic_directory(path) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
        save_file(weights, str(tmp / HEAD_NAME))
        if config.backbone.lora is not None:
            backbone.save_pretrained(str(tmp / ADAPTER_DIR), safe_serialization=True)


def load_weights(
    path: Path, head: nn.Module, backbone: nn.Module, lora: LoraSettings | None
) -> None:
    """Read the checkpoint in ``path``'s trained weights into a model built already with its
    settings: the ``head``'s and, with ``lora``, ``backbone``'s adapter. Resuming a run needs
    this rather than a fresh load, since its model is wrapped for training and its optimizer
    holds those very parameters."""
    load_head(head, path / HEAD_NAME)
    if lora is not None:
        from spdrank.backbone.load import load_adapter_weights

        load_adapter_weights(backbone, lora, path / ADAPTER_DIR)
