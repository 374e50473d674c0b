"""A checkpoint on disk: ``config.json``, ``head.safetensors`` and, for a LoRA-adapted
backbone, the peft adapter under ``adapter/``.

Nothing in it is a pickle, so loading a checkpoint never runs code; nor can its backbone
reference make it: the Python of a model folder runs only when the caller passes
``trust_remote_code`` for that load, which no checkpoint records. A checkpoint is written to
a temporary sibling and swapped in, so it is never half-written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from spdrank.backbone.load import read_tensors
from spdrank.backbone.settings import read_json
from spdrank.core.atomic_dir import atomic_directory
from spdrank.model.config import SPDConfig

CONFIG_NAME = "config.json"
HEAD_NAME = "head.safetensors"
ADAPTER_DIR = "adapter"


def checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory ``path`` names: a model directory, or a training run's (whose
    model is in ``OUT/model``); a FileNotFoundError when it is neither."""
    path = Path(path)
    if not (path / CONFIG_NAME).exists() and (path / "model" / CONFIG_NAME).exists():
        path = path / "model"
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
    with atomic_directory(path) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
        save_file(weights, str(tmp / HEAD_NAME))
        if config.backbone.lora is not None:
            backbone.save_pretrained(str(tmp / ADAPTER_DIR), safe_serialization=True)
