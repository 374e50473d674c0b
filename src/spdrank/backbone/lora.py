"""Which modules of a backbone LoRA adapts, as peft's config for spdrank's settings.

Module names differ by family (Phi-3 fuses q, k and v into ``qkv_proj``, GPT-NeoX names it
``query_key_value``), so a name the model lacks is refused here, in one line listing the
model's own, before peft builds anything.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from spdrank.backbone.settings import LoraSettings
from spdrank.backbone.split import decoder_of, layers_of, split_layer

log = logging.getLogger(__name__)


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

    peft's own refusal of a list that names nothing does not say what the model calls its
    modules: here it is one line listing the model's linear module names. A name that matches
    nothing beside others that do is what peft accepts (a checkpoint saved with one still
    loads), so it is only logged.
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

