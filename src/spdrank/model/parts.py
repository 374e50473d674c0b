"""The backbone and tokenizer a model's config names, or stand-ins for a features-only model.

A features-only model (``features_only``) has no backbone at all: its head reads the upstream
features alone, so it loads and ranks without the LLM (the ablation that measures what the
LLM adds). Its stand-ins sit where the LLM would, so the code around them needs no special case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spdrank.backbone.load import load_backbone, load_tokenizer
from spdrank.methods.base import method_for
from spdrank.model.config import SPDConfig


class NoBackbone(nn.Module):
    """The backbone of a features-only model: no weights, no prefill.

    It stands where the LLM would, so code that walks a model's parts (the optimizer's
    parameter groups, checkpoints) needs no special case.
    """


class NoTokenizer:
    """The tokenizer of a features-only model: it reads no text, so its prompts are empty.

    ``pad_token_id`` is there for code that collates prompts generically; there is never a
    token to pad.
    """

    pad_token_id = 0


def backbone_and_tokenizer(
    config: SPDConfig,
    device: torch.device | str,
    adapter: Path | None = None,
    trust_remote_code: bool = False,
    cpu_bf16: bool = False,
) -> tuple[nn.Module, Any]:
    """The backbone (with its trained ``adapter``, if any) and tokenizer ``config`` names.

    A features-only model gets stand-ins for both, and nothing of the LLM is read from disk.
    ``cpu_bf16`` lets ``dtype: auto`` load it in bfloat16 on a CPU with native bfloat16 units
    (a checkpoint loaded to rank; a model built to train keeps float32 on a CPU).
    """
    if config.features_only:
        return NoBackbone(), NoTokenizer()
    backbone = load_backbone(
        config.backbone,
        device=device,
        adapter_path=adapter,
        with_lm_head=method_for(config.head.kind).reads_logits,
        trust_remote_code=trust_remote_code,
        cpu_bf16=cpu_bf16,
    )
    tokenizer = load_tokenizer(config.backbone.name_or_path, trust_remote_code)
    vocab = getattr(backbone.config, "vocab_size", None)
    if config.backbone.random_weights and vocab is not None and len(tokenizer) > vocab:
        # A config's shape meets a tokenizer chosen apart from it: ids past the embedding
        # table would fail deep inside the prefill.
        raise ValueError(
            f"{config.backbone.name_or_path}: vocab_size {vocab} is smaller than its "
            f"tokenizer's {len(tokenizer)} tokens"
        )
    return backbone, tokenizer
