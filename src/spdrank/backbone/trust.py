"""What spdrank checks before it lets transformers, peft or safetensors read a model.

Nothing a model folder or checkpoint holds runs code: weights are safetensors only, a folder
whose config needs its own Python is refused in one line unless the user passes
``--trust-remote-code`` for that run (a checkpoint never records it), a hub id that cannot be
fetched fails at once, and a model that is no decoder-only causal LM is refused naming what
spdrank reads. Torch-free at import: transformers is imported only by the checks that need it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spdrank.backbone.settings import ConfigError, read_json
from spdrank.core.files import sha256_file

if TYPE_CHECKING:
    from spdrank.backbone.settings import BackboneConfig

TRUST_HINT = "pass --trust-remote-code (trust_remote_code=True) only if you trust that code"
#: Weight files that are pickles: loading one could run code, so spdrank never reads them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: What a backbone must be, said by every refusal of one that is not.
DECODER_ONLY = ("spdrank reads the hidden states of a decoder-only causal LM, each token "
                "seeing only those before it (Llama, Qwen2, Qwen3, Gemma 2, Gemma 3, Mistral, "
                "Phi-3, GPT-NeoX, OLMo 2 and their kin)")


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


def check_config_digest(config: BackboneConfig, config_file: Path) -> None:
    """Record the digest of a ``config:`` backbone's config file, or check the one recorded.

    The weights are a function of the config and a fixed seed; a checkpoint's adapter and head
    fit only those, so a config changed since it was saved is an error.
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
