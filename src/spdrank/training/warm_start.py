"""Start a training run from a trained checkpoint (``spdrank train --init-from``).

The use it serves: a student distilled from a teacher already reads the text as the teacher
does, and a team then fine-tunes it on its clicks with upstream features added (popularity,
co-occurrence). Training the same head on clicks from scratch must rediscover the teacher's
reading from one clicked item per slate; starting from the distilled head keeps it.

What carries over is the head's weights (and the LoRA adapters, when both runs train LoRA).
The two runs must read the same states: the same backbone, depth and prompt, and the same
head shape. Features are the one thing a run may add: the projection of features the
checkpoint did not read starts at zero, so before its first step the new model ranks exactly
as the checkpoint does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spdrank.model.config import SPDConfig
    from spdrank.model.ranker import SPDRanker

#: Head parameters that project the upstream features (see :mod:`spdrank.methods.heads`).
FEATURE_PREFIX = "features."
#: Head settings a run may choose afresh: they shape training, not the weights.
TRAINING_ONLY = {"dropout"}


def mismatches(new: SPDConfig, old: SPDConfig) -> list[str]:
    """The settings that differ between a run and the checkpoint it would start from, so that
    its head would read states other than those it was trained on (empty: compatible)."""
    found = []
    for what, a, b in (
        ("backbone", new.backbone.name_or_path, old.backbone.name_or_path),
        ("layers", new.backbone.layers, old.backbone.layers),
        ("features_only", new.features_only, old.features_only),
    ):
        if a != b:
            found.append(f"{what}: {b!r} in the checkpoint, {a!r} here")
    for section, a, b in (
        ("head", new.head.to_dict(), old.head.to_dict()),
        ("prompt", new.prompt.to_dict(), old.prompt.to_dict()),
    ):
        for key in sorted((set(a) | set(b)) - TRAINING_ONLY):
            if a.get(key) != b.get(key):
                found.append(f"{section}.{key}: {b.get(key)!r} in the checkpoint, {a.get(key)!r} here")
    old_lora, new_lora = old.backbone.lora, new.backbone.lora
    if old_lora is not None and new_lora is None:
        found.append("the checkpoint's head reads LoRA-adapted states, but this run is --frozen")
    elif old_lora is not None and new_lora is not None and old_lora != new_lora:
        found.append(f"LoRA: {old_lora} in the checkpoint, {new_lora} here")
    if old.features is not None:
        old_names = list(old.features.names)
        new_names = list(new.features.names) if new.features is not None else []
        if old_names != new_names:
            found.append(
                f"features: the checkpoint reads {old_names}; a run from it must read the same "
                f"(it may add features only to a checkpoint that reads none), here {new_names}"
            )
    return found


def warm_start(model: SPDRanker, path: str | Path) -> list[str]:
    """Load the checkpoint at ``path`` into ``model`` (about to be trained); return the names of
    the head parameters that start fresh (at zero: the features the checkpoint did not read).

    A ValueError names every setting that makes the checkpoint's weights unfit for this model.
    """
    from spdrank.backbone.load import load_adapter_weights, read_tensors
    from spdrank.model.checkpoint import (
        ADAPTER_DIR,
        CONFIG_NAME,
        HEAD_NAME,
        checkpoint_dir,
        load_head,
        read_config,
    )

    path = checkpoint_dir(path)
    old = read_config(path / CONFIG_NAME)
    found = mismatches(model.config, old)
    if found:
        raise ValueError(
            f"--init-from {path}: the checkpoint was trained with other settings than this run's "
            f"({'; '.join(found)}); train with the checkpoint's settings, or without --init-from"
        )
    head = model.head
    fresh = [k for k in head.state_dict() if k.startswith(FEATURE_PREFIX)] \
        if old.features is None else []
    if fresh:
        saved = read_tensors(path / HEAD_NAME, "head")
        own = head.state_dict()
        missing = sorted(set(own) - set(saved) - set(fresh))
        extra = sorted(set(saved) - set(own))
        shapes = [f"{k} is {tuple(v.shape)}, here {tuple(own[k].shape)}"
                  for k, v in saved.items() if k in own and own[k].shape != v.shape]
        problems = [f"{what} {names}" for what, names in
                    (("missing", missing), ("not in this head:", extra), ("shapes:", shapes))
                    if names]
        if problems:
            raise ValueError(f"{path / HEAD_NAME}: the weights do not fit this head "
                             f"({'; '.join(problems)})")
        with torch.no_grad():
            for name, param in head.named_parameters():
                if name in fresh:
                    param.zero_()
        head.load_state_dict(saved, strict=False)
    else:
        load_head(head, path / HEAD_NAME)
    if old.backbone.lora is not None:
        load_adapter_weights(model.backbone, old.backbone.lora, path / ADAPTER_DIR)
    return fresh
