"""Load a causal LM for an in-process teacher (``hf``, ``likelihood``), optionally cut short.

The model loads through :func:`spdrank.backbone.load.load_model`, the loader of every model
spdrank runs in process, so a teacher is held to the student's rules: safetensors weights only,
a folder's own Python refused unless ``trust_remote_code`` (the teacher's
``--trust-remote-code``) lets it run, a decoder-only causal LM. Unlike the student's backbone a
teacher keeps the LM head and the KV cache, and trains nothing. ``layers`` keeps the first
``L`` transformer layers, cut in the config before loading so only their weights are read: a
weaker but much cheaper teacher, and what lets tests run the real weights quickly.
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
    from spdrank.backbone.load import load_model, load_tokenizer, quiet_load, resolve_device
    from spdrank.backbone.locate import resolve_path
    from spdrank.backbone.settings import BackboneConfig

    device = resolve_device(device)
    # A config: name (random weights) is refused here: it has nothing to teach.
    resolve_path(model)
    config = BackboneConfig(name_or_path=model, layers=layers, dtype=dtype, lora=None)
    with quiet_load():
        lm = load_model(config, device, with_lm_head=True, trust_remote_code=trust_remote_code)
    lm.eval()
    return lm, load_tokenizer(model, trust_remote_code), device
