"""A tiny decoder of a named family, with random weights, saved as a local model folder.

    .venv/bin/python benchmarks/tiny_backbone.py --family qwen3 --out runs/tiny-qwen3

The folder holds what a real checkpoint holds (config.json, safetensors weights, and the
bundled SmolLM2 tokenizer), so every command that takes ``--backbone`` or ``--model`` reads
it as it would read a downloaded model: ``benchmarks/gpu.sh --smoke`` runs the GPU script's
every step on it, and tests/backbone/test_model_families.py trains, saves, loads and ranks each
family on it. Two layers, 32 wide; SmolLM2's 8,192 positions (BM25's top 100 at 64 tokens a
passage fits) and vocabulary, so its prompts are tokenized exactly as the default backbone's.

Each family's config names what differs between the families spdrank is asked to read: the
attention layout (grouped query heads, a head width of its own), sliding windows and
alternating layer kinds (Mistral, Gemma 2 and 3), fused projections (Phi-3's ``qkv_proj`` and
``gate_up_proj``, GPT-NeoX's ``query_key_value``), partial rotary (GPT-NeoX) and norms on
queries and keys (Qwen3, OLMo 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: The shared size of every tiny decoder.
COMMON: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 8192,
}
_WINDOWED = {"head_dim": 8, "sliding_window": 16, "query_pre_attn_scalar": 8}
#: Each family's own settings on top of COMMON, by transformers' model_type.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "mistral": {"head_dim": 8, "sliding_window": 16},
    "gemma2": _WINDOWED,
    "gemma3_text": _WINDOWED | {"sliding_window_pattern": 2},
    "phi3": {},
    "gpt_neox": {"rotary_pct": 0.25},
    "olmo2": {},
}
#: A LoRA target list by name, as a user of each family would write it.
NAMED_MODULES: dict[str, list[str]] = {
    family: ["q_proj", "v_proj"] for family in FAMILIES
} | {
    "phi3": ["qkv_proj", "gate_up_proj"],
    "gpt_neox": ["query_key_value", "dense_h_to_4h"],
}


def save_tiny(family: str, folder: str | Path, tokenizer: Any = None, seed: int = 0) -> Path:
    """A 2-layer ``family`` decoder with seeded random weights and SmolLM2's tokenizer (or
    ``tokenizer``), saved to ``folder`` as safetensors; returns ``folder``. A folder that
    holds a config.json already is kept as it is, before torch or transformers is imported."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny {family!r}: one of {', '.join(FAMILIES)}")
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from spdrank.backbone.load import load_tokenizer
    from spdrank.backbone.locate import bundled_backbone_path
    from spdrank.core.atomic_dir import filled_once

    if tokenizer is None:
        tokenizer = load_tokenizer(str(bundled_backbone_path()))
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id}
    config = AutoConfig.for_model(
        family, vocab_size=len(tokenizer), tie_word_embeddings=True,
        **COMMON, **FAMILIES[family], **ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    # Filled beside the target and swapped in whole: a killed run leaves no half a model.
    return filled_once(folder, fill)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="qwen3", choices=sorted(FAMILIES),
                        help="the model family (transformers' model_type; default qwen3)")
    parser.add_argument("--out", required=True, type=Path, help="the model folder to write")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")
    args = parser.parse_args(argv)
    save_tiny(args.family, args.out, seed=args.seed)
    print(f"{args.out}: a tiny random {args.family} with SmolLM2's tokenizer (kept when there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
