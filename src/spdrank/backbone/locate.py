"""Where a backbone's files are, by the name a user or checkpoint gives it.

A packaged name (``bundled``, ``gemma3-270m``: :mod:`spdrank.backbone.gguf`) is its copy
converted once into spdrank's cache; ``config:PATH`` is a config file with no weights; any
other name is a local folder or a Hugging Face id, passed through. Torch-free at import: only
a first conversion loads a model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from spdrank.backbone.gguf import PACKAGED, convert, part_paths
from spdrank.backbone.settings import BUNDLED, RANDOM_PREFIX, is_random
from spdrank.core.atomic_dir import filled_once

log = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def cache_dir() -> Path:
    """Where converted backbones live: $SPDRANK_CACHE, else $XDG_CACHE_HOME/spdrank."""
    if os.environ.get("SPDRANK_CACHE"):
        return Path(os.environ["SPDRANK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "spdrank"


def packaged_backbone_path(name: str) -> Path:
    """A safetensors copy of the packaged backbone ``name``, converted from its GGUF on first
    use (its licence said as it is)."""
    spec = PACKAGED[name]
    target = cache_dir() / "backbones" / spec.cache_name
    if (target / "config.json").exists():
        return target
    part_paths(spec)  # a missing wheel is its install line, before any word of converting
    log.info("converting the %s GGUF to safetensors once (a minute or more, %s) -> %s (set "
             "$SPDRANK_CACHE to keep it elsewhere); its licence: %s",
             spec.title, spec.converted_size, target, spec.licence)
    return filled_once(target, lambda folder: convert(spec, folder))


def bundled_backbone_path() -> Path:
    """A safetensors copy of the bundled SmolLM2, converted from its GGUF on first use."""
    return packaged_backbone_path(BUNDLED)


def resolve_path(name_or_path: str) -> str:
    """A packaged backbone's name as its cached safetensors folder; anything else passed through.

    A ``config:`` backbone has no weights to find: its name is refused here, so nothing that
    reads a model by path (a teacher, an LM) mistakes the config's folder for a model.
    """
    if is_random(name_or_path):
        raise ValueError(
            f"{name_or_path!r} is a random-weight backbone for timing a model's shape; it is "
            "no model to read weights from"
        )
    if name_or_path in PACKAGED:
        return str(packaged_backbone_path(name_or_path))
    return name_or_path


def random_config_file(name_or_path: str) -> Path:
    """The config.json a ``config:PATH`` backbone is built from (PATH a file or its folder)."""
    path = Path(name_or_path.removeprefix(RANDOM_PREFIX))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{name_or_path}: no config file at {path}")
    return path


def tokenizer_path(name_or_path: str) -> str:
    """Where the tokenizer of a backbone lives: a ``config:`` backbone's folder when it holds a
    tokenizer, else the bundled SmolLM2's (so token counts are that tokenizer's)."""
    if not is_random(name_or_path):
        return resolve_path(name_or_path)
    folder = random_config_file(name_or_path).parent
    if any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return str(folder)
    return str(bundled_backbone_path())
