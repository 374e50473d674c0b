"""The backbone's prefill: its stack run whole, or split at one layer.

:func:`last_hidden` runs the transformer stack (LoRA layers included) over a batch of token
rows; :func:`prompt_hidden` runs a batch's prompts, whole or from the cached states its batch
carries; :func:`last_token_logits` reads the LM's next-token logits at each prompt's end.

With LoRA on the top layers only (``LoraSettings.top_layers``), the layers below the first
adapted one never change, so what enters that layer is a pure function of the prompt: it can
be computed once per slate and cached (:mod:`spdrank.model.state_cache`), and each training
step runs only the few adapted layers over it, not the whole model.

Both halves run the backbone's own forward, so masks, rotary positions and per-layer
attention kinds (sliding windows) are the model's, for any family: :func:`lower_hidden` stops
the forward where the split layer begins; :func:`upper_hidden` runs it on a view of the model
whose layer list starts at the split layer, fed the cached states as its input embeddings.
:func:`check_split` compares the two halves with one whole prefill, so a family whose forward
does something else between its embeddings and its first layer is refused, not trained wrong.

LoRA adapters over a bfloat16 or float16 backbone run in its dtype
(:func:`adapters_in_compute_dtype`), in every prefill, here where the prefill is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from spdrank.backbone.batching import PromptTensors

#: How far (relative to the states' scale, in units of the dtype's epsilon) a split prefill
#: may be from a whole one: rounding of the same operations, run in another grouping.
SPLIT_TOLERANCE_EPS = 64

#: The dtypes whose matrix products an adapter in float32 would slow down: a bfloat16 or
#: float16 backbone runs its own products in them.
LOW_PRECISION = (torch.bfloat16, torch.float16)


@contextmanager
def adapters_in_compute_dtype(model: nn.Module) -> Iterator[None]:
    """Run ``model``'s LoRA adapters in its base weights' dtype, where that is bfloat16 or
    float16 (elsewhere: nothing changes).

    peft keeps the adapters' weights in float32 over a low-precision backbone, so that the
    optimizer's small updates are not rounded away, and casts each adapted module's input to
    float32: every adapter then runs its products in float32, the slowest route on a GPU, and
    pays two casts of its input. Under autocast the products run in the backbone's dtype from
    the float32 weights (cast once per product, the gradients flowing back to them in float32)
    and peft's own input casts are turned off.
    """
    from peft.helpers import disable_input_dtype_casting
    from peft.tuners.tuners_utils import BaseTunerLayer

    weight = next(model.parameters(), None)
    adapted = weight is not None and any(isinstance(m, BaseTunerLayer) for m in model.modules())
    if not adapted:
        yield
        return
    dtype = model.get_input_embeddings().weight.dtype if hasattr(
        model, "get_input_embeddings") else weight.dtype
    if dtype not in LOW_PRECISION:
        yield
        return
    with torch.autocast(weight.device.type, dtype=dtype), disable_input_dtype_casting(model):
        yield


def decoder_of(model: nn.Module) -> nn.Module:
    """The transformer stack of a backbone (LoRA-wrapped or not): what ``last_hidden`` runs."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder() if hasattr(base, "lm_head") else base


def last_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """One prefill; the last kept layer's hidden states [B, T, D] (``attention_mask`` None:
    causal attention alone, for rows with no padding or right padding only)."""
    return decoder_of(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def prompt_hidden(model: nn.Module, prompt: PromptTensors) -> torch.Tensor:
    """A batch's prefill, the last kept layer's hidden states [B, T, D]: run whole, or from
    the cached states entering its first adapted layer when the batch carries them.

    The batch is right-padded, so its mask is left out: under the causal mask a real token
    attends only to the tokens before it, all real, and rotary positions count from each
    row's start either way, so every real token's state is the one the padding mask gives;
    only the pads' states, which nothing reads, change (they are zeros when the rows run
    apart). Without a mask the backbone builds no [B, 1, T, T] mask in every layer and
    scaled-dot-product attention takes its causal route, whose fused kernel skips the blocks
    above the diagonal. On a CPU, rows of different lengths run one at a time: a row's
    products are as efficient alone there, so the padding would be work for nothing. LoRA
    adapters over a low-precision backbone run in its dtype
    (:func:`adapters_in_compute_dtype`).
    """
    def run(rows: slice, length: int | None = None) -> torch.Tensor:
        if prompt.lower is not None:
            return upper_hidden(model, prompt.lower[rows, :length], None, prompt.lower_layer)
        return last_hidden(model, prompt.input_ids[rows, :length], None)

    with adapters_in_compute_dtype(model):
        if prompt.input_ids.device.type != "cpu":
            return run(slice(None))
        lengths = prompt.attention_mask.sum(1).tolist()
        if len(set(lengths)) == 1:
            return run(slice(None))
        rows = [run(slice(i, i + 1), n)[0] for i, n in enumerate(lengths)]
    hidden = nn.utils.rnn.pad_sequence(rows, batch_first=True)
    return nn.functional.pad(hidden, (0, 0, 0, prompt.input_ids.size(1) - hidden.size(1)))


def last_token_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """One prefill; the LM's next-token logits at each prompt's last real token. [B, V]."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    lm_head = getattr(base, "lm_head", None)
    if lm_head is None:
        raise ValueError("this backbone was loaded without its LM head (with_lm_head=False)")
    hidden = last_hidden(model, input_ids, attention_mask)
    last = attention_mask.sum(1) - 1  # right padding: the last real token
    return lm_head(hidden[torch.arange(hidden.size(0), device=hidden.device), last])


def layers_of(decoder: nn.Module) -> nn.ModuleList:
    """The decoder's list of layers, where the families transformers writes today keep it
    (``layers``); a family that keeps them elsewhere (GPT-2's ``h``) cannot be split or have
    only its top layers adapted, which is said in one line rather than as an AttributeError."""
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return layers
    raise ValueError(
        f"{type(decoder).__name__} keeps its layers where spdrank does not look (no "
        "`layers` list), so LoRA on its top layers alone (--lora-layers) cannot be set up: "
        "adapt every layer instead"
    )


def split_layer(model: nn.Module, top_layers: int | None) -> int | None:
    """The first layer LoRA adapts when it adapts only the top ``top_layers`` (None: no split,
    every layer is adapted or none is)."""
    if top_layers is None:
        return None
    return int(model.config.num_hidden_layers) - top_layers


class _Reached(Exception):
    """Raised by the hook on the split layer to stop the forward with what enters it."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


def lower_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int
) -> torch.Tensor:
    """The hidden states entering layer ``layer`` [B, T, D]; the layers from it on never run."""
    decoder = decoder_of(model)

    def stop(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _Reached(args[0] if args else kwargs["hidden_states"])

    handle = layers_of(decoder)[layer].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        decoder(input_ids=input_ids, attention_mask=attention_mask)
    except _Reached as reached:
        return reached.hidden
    finally:
        handle.remove()
    raise RuntimeError(f"the backbone's forward never reached its layer {layer}")


@contextmanager
def _layers_from(decoder: nn.Module, layer: int) -> Iterator[None]:
    """``decoder`` running its layers from ``layer`` on (their per-layer settings with them)."""
    config = decoder.config
    layers, count = layers_of(decoder), config.num_hidden_layers
    kinds = getattr(config, "layer_types", None)
    decoder.layers = nn.ModuleList(list(layers)[layer:])
    config.num_hidden_layers = count - layer
    if isinstance(kinds, list):
        config.layer_types = kinds[layer:]
    try:
        yield
    finally:
        decoder.layers = layers
        config.num_hidden_layers = count
        if isinstance(kinds, list):
            config.layer_types = kinds


def upper_hidden(
    model: nn.Module, lower: torch.Tensor, attention_mask: torch.Tensor | None, layer: int
) -> torch.Tensor:
    """The last layer's hidden states [B, T, D] from ``lower``, the states entering ``layer``."""
    decoder = decoder_of(model)
    dtype = next(decoder.parameters()).dtype
    with _layers_from(decoder, layer):
        out = decoder(inputs_embeds=lower.to(dtype), attention_mask=attention_mask)
    return out.last_hidden_state


def check_split(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int
) -> None:
    """Refuse a backbone whose two halves do not make its whole prefill: the cached states
    would then stand for something the model never computes."""
    decoder = decoder_of(model)
    with torch.inference_mode():
        whole = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        lower = lower_hidden(model, input_ids, attention_mask, layer)
        split = upper_hidden(model, lower, attention_mask, layer)
    real = attention_mask.bool()
    scale = whole[real].float().abs().max().clamp_min(1e-6)
    gap = (whole[real].float() - split[real].float()).abs().max() / scale
    if gap > SPLIT_TOLERANCE_EPS * torch.finfo(whole.dtype).eps:
        raise ValueError(
            f"this backbone ({type(decoder).__name__}) cannot be split at layer {layer}: "
            f"its layers run from cached states differ from a whole prefill by {gap:.2e} of "
            "their scale; train without --cache-states"
        )
