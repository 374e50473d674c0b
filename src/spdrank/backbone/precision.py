"""The dtype a LoRA-adapted backbone's adapters compute in.

Kept apart from :mod:`spdrank.backbone.lora` (which adapters a backbone gets) because the
prefill (:mod:`spdrank.backbone.split`) needs this and :mod:`~spdrank.backbone.lora` needs the
prefill's layer helpers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

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
