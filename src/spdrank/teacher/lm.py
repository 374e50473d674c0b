"""Load a causal LM for an in-process teacher (``hf``, ``likelihood``), optionally cut short.

:func:`spdrank.backbone.load.load_backbone` serves the student (LoRA, no cache, hidden states);
a teacher needs the LM head and the KV cache, and nothing else. ``layers`` keeps the first
``L`` transformer layers, cut in the config before loading so only their weights are read:
a weaker but much cheaper teacher, and what lets tests run the real weights quickly. A model
whose folder holds its own Python is refused unless ``trust_remote_code`` (the teacher's
``--trust-remote-code``) lets it run.
"""

from __future__ import annotations

from typing import Any


def load_causal_lm(
    model: str,
    layers: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
) -> tuple[Any, Any, str]:
    """The model (eval mode, on its device), its tokenizer, and the resolved device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from spdrank.backbone.load import load_tokenizer, resolve_device, resolve_dtype
    from spdrank.backbone.locate import resolve_path
    from spdrank.backbone.trust import check_loadable, load_errors

    device = resolve_device(device)
    path = resolve_path(model)
    check_loadable(path, trust_remote_code)
    with load_errors(path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if layers is not None:
        total = getattr(config, "num_hidden_layers", None)
        if not isinstance(total, int):
            raise ValueError(f"{path}: the model config has no num_hidden_layers to cut it by")
        if not 1 <= layers <= total:
            raise ValueError(f"--layers must be between 1 and {total} for {model}")
        config.num_hidden_layers = layers
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:layers]
    with load_errors(path):
        lm = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=resolve_dtype(dtype, device),
            trust_remote_code=trust_remote_code,
        ).to(device)
    lm.eval()
    return lm, load_tokenizer(path, trust_remote_code), device
