"""Loading a backbone: the model (its first L layers, LoRA-adapted or frozen), its tokenizer,
a trained adapter, a checkpoint's tensors (its prefill is :mod:`spdrank.backbone.split`'s).

Any Hugging Face model id or local path works, or a packaged name (``bundled``, SmolLM2, the
default; ``gemma3-270m``), found by :mod:`spdrank.backbone.locate`. ``config:PATH`` builds a
backbone from a Hugging Face ``config.json`` alone (PATH the file or the folder holding it)
with random weights drawn from a fixed seed: nothing is downloaded. It is for timing a model's
shape (latency does not depend on the weights), never for quality; loading one logs a
warning, and a checkpoint records the config's digest so a changed config is refused instead
of silently giving other weights.

Nothing a model folder or checkpoint holds runs code (:mod:`spdrank.backbone.trust` checks
each before it is read): every transformers load is told ``trust_remote_code`` (False unless
the user passes ``--trust-remote-code`` for that run; a checkpoint never records it), and
LoRA adapters are rebuilt from spdrank's own settings (:mod:`spdrank.backbone.lora`) with
only their weights read from the folder.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from spdrank.backbone import cpu
from spdrank.backbone.locate import random_config_file, resolve_path, tokenizer_path
from spdrank.backbone.lora import lora_config
from spdrank.backbone.settings import (
    BackboneConfig,
    ConfigError,
    LoraSettings,
    read_json,
)
from spdrank.backbone.trust import (
    DECODER_ONLY,
    check_config_digest,
    check_decoder_only,
    check_loadable,
    load_errors,
    require_safetensors,
)

log = logging.getLogger(__name__)

#: The seed of a ``config:`` backbone's weights: the same config always gives the same weights.
RANDOM_SEED = 0


def resolve_device(name: str) -> str:
    """``auto`` is CUDA when available, else CPU; ``cpu``, ``cuda`` and ``cuda:N`` are checked
    against this machine: a device it lacks would fail deep in torch with a traceback, or,
    where accelerate falls back to the CPU, train on the CPU without a word."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    if kind == "cpu" and not index:
        return name
    if name == "mps" and torch.backends.mps.is_available():
        return name
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"--device {name!r}: use cpu, cuda, cuda:N, mps (on Apple silicon) "
                         "or auto")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this machine has no CUDA device torch can use "
                         f"(torch {torch.__version__}); use cpu or auto")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                         "devices, numbered from 0")
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
    """The tokenizer of a backbone (:func:`spdrank.backbone.locate.tokenizer_path`); its
    folder's own Python runs only with ``trust_remote_code``."""
    from transformers import AutoTokenizer

    path = tokenizer_path(name_or_path)
    check_loadable(path, trust_remote_code)
    with load_errors(path):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextmanager
def quiet_load() -> Iterator[None]:
    """Hush what transformers and peft say while a model loads, unless debugging.

    Loading the first L layers leaves the others' weights unread, which transformers reports
    as a table of UNEXPECTED keys; its weight-loading bar and peft's FutureWarnings come with
    it. All are expected, and look like errors, so they are hidden at ordinary verbosity
    (``spdrank -v`` shows them) and the settings restored after the load. Any in-process
    model load may use it (the dense ranker's encoder does).
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


#: The largest magnitude a checkpoint's weight may have. A trained weight is near 1 (a
#: state's standardisation buffers, the largest, are a state's own scale, thousands at most);
#: one past this bound is damage, and it reaches float32's limit (3.4e38) in the first
#: product with states of backbones whose massive activations are 1e4 and more, so the model
#: would rank by infinities and NaN, near-constantly, instead of failing.
MAX_WEIGHT = 1e15


def read_tensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file ``path`` (its ``what`` weights), or one line naming it:
    missing, unreadable (a truncated or tampered header), or holding a tensor with a value
    that is not finite (NaN, ±inf) or past :data:`MAX_WEIGHT`, named with the tensor. Every
    reader of a checkpoint's tensors (the head, the LoRA adapter, ``--init-from``) reads
    through here, so a damaged weight is refused where it is read, not blamed later on the
    learning rate or seen as a constant ranking."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the checkpoint has no {what} weights")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type is not exported stably
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    for name, tensor in tensors.items():
        problem = _weight_problem(tensor)
        if problem:
            raise ValueError(f"{path}: tensor {name!r} of the {what} weights {problem}; the "
                             "checkpoint is damaged: train it again or restore it")
    return tensors


def _weight_problem(tensor: torch.Tensor) -> str | None:
    """What makes ``tensor`` no trained weight (a value not finite, or past
    :data:`MAX_WEIGHT`), or None; tensors of integers (token ids) hold no such value."""
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return None
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        values = tensor[~finite]
        kinds = [label for label, present in (("NaN", bool(torch.isnan(values).any())),
                                              ("inf", bool(torch.isinf(values).any())))
                 if present]
        return f"holds {values.numel():,} values that are not finite ({', '.join(kinds)})"
    peak = float(tensor.abs().max())
    if peak > MAX_WEIGHT:
        return (f"holds a value of magnitude {peak:.3g}, past {MAX_WEIGHT:.0e}, which no trained "
                "weight comes near")
    return None


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
    with quiet_load():
        model = load_model(config, device, with_lm_head, trust_remote_code, cpu_bf16)
        model.config.use_cache = False
        if config.lora is None:
            model.requires_grad_(False)
            model.eval()
            return model
        if adapter_path is not None:
            return load_adapter(model, config.lora, Path(adapter_path)).to(device)
        from peft import get_peft_model

        return get_peft_model(model, lora_config(config.lora, model))


def load_model(
    config: BackboneConfig,
    device: torch.device | str = "cpu",
    with_lm_head: bool = False,
    trust_remote_code: bool = False,
    cpu_bf16: bool = False,
) -> nn.Module:
    """The transformers model ``config`` names, cut to its first ``config.layers`` layers, on
    ``device``, as transformers builds it (what it is used for, the caller decides).

    Every model spdrank runs in process loads through here (a ranker's backbone by
    :func:`load_backbone`, an LM teacher by :func:`spdrank.teacher.lm.load_causal_lm`), so
    all are held to the same rules: weights are safetensors only, a folder's own Python runs
    only with ``trust_remote_code``, the model is a decoder-only causal LM, and the layer cut
    is made in the config before loading so only the kept layers' weights are read.
    ``with_lm_head`` keeps the language-model head; ``cpu_bf16`` is :func:`resolve_dtype`'s.
    """
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
    return model.to(device)


#: The files of a LoRA adapter folder, as peft saves them.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def load_adapter(model: nn.Module, settings: LoraSettings, folder: Path) -> nn.Module:
    """``model`` with the trained LoRA adapter in ``folder`` (trainable, as training left it).

    The adapter is rebuilt from the checkpoint's own LoRA ``settings`` and only its weights are
    read from the folder: an adapter_config.json can ask peft for other initialisations and
    module imports, which a checkpoint does not get to choose.
    """
    from peft import get_peft_model

    model = get_peft_model(model, lora_config(settings, model))
    load_adapter_weights(model, settings, folder)
    return model


def check_adapter_config(folder: Path, settings: LoraSettings) -> None:
    """Refuse an adapter folder of pickles, or whose adapter_config.json is no LoRA adapter of
    the checkpoint's own rank and alpha, naming the file."""
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


def load_adapter_weights(model: nn.Module, settings: LoraSettings, folder: Path) -> None:
    """Read the LoRA weights in ``folder`` into ``model``, already adapted with ``settings``.

    The one reader of a checkpoint's adapter, for a loaded model (:func:`load_adapter`) and a
    run warm-started from it alike: the folder's adapter_config.json must describe a LoRA
    adapter of the same rank and alpha, and weights that do not fit the adapters are an error
    naming the file.
    """
    from peft import set_peft_model_state_dict

    check_adapter_config(folder, settings)
    weights = folder / ADAPTER_WEIGHTS
    tensors = read_tensors(weights, "adapter")
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


def context_length(backbone: nn.Module) -> int | None:
    """The backbone's positions (``max_position_embeddings``), or None when it names none."""
    value = getattr(getattr(backbone, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None
