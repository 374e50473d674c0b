"""The model families users pass as ``--backbone``, each as a tiny random decoder built from its
config (benchmarks/tiny_backbone.py): trained one LoRA step by ``spdrank train``'s own loop (on
every linear module, and on the modules a user of the family would name), saved, loaded and
ranked; its cached states (the frozen readout, and the states entering the top adapted layer)
equal to a live prefill's; in float32 (tight) and bfloat16 (loose). A family spdrank cannot
read is refused in one line naming what it needs."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spdrank.backbone.settings import LoraSettings
from spdrank.core.slates import load_slates
from spdrank.eval.metrics import is_valid_permutation
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache
from spdrank.training.train import train
from tests.helpers import ROOT, make_slate, tiny_config, train_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_backbone_module():
    """benchmarks/tiny_backbone.py as a module (the folder is no package)."""
    name = "tiny_backbone"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


tiny = _tiny_backbone_module()
FAMILIES = sorted(tiny.FAMILIES)
#: How far bfloat16's states and scores may drift from their own recomputation in another
#: batch shape: a few units of bfloat16's 8-bit mantissa.
TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """Each family's tiny model folder, built on first use."""
    root = tmp_path_factory.mktemp("families")

    class Folders(dict):
        def __missing__(self, family: str) -> Path:
            self[family] = tiny.save_tiny(family, root / family, tokenizer)
            return self[family]

    return Folders()


def close(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray, dtype: str) -> bool:
    """Whether ``a`` is ``b`` to the dtype's tolerance, relative to their scale."""
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    scale = max(float(b.abs().max()), 1.0)
    return float((a - b).abs().max()) <= TOLERANCE[dtype] * scale


def family_matrix() -> list:
    """Every family x LoRA targets x dtype. Half of them, chosen so that each pair of values
    (a family and its targets, a family and a dtype, targets and a dtype) still meets, run in
    ``make check``; the other half are marked slow, for ``make test``."""
    cases = []
    for i, family in enumerate(FAMILIES):
        kept = {("all-linear", "float32"), ("named", "bfloat16")} if i % 2 else {
            ("all-linear", "bfloat16"), ("named", "float32")}
        for modules in ("all-linear", "named"):
            for dtype in ("float32", "bfloat16"):
                marks = () if (modules, dtype) in kept else (pytest.mark.slow,)
                cases.append(pytest.param(family, modules, dtype, marks=marks,
                                          id=f"{family}-{modules}-{dtype}"))
    return cases


@pytest.mark.parametrize(("family", "modules", "dtype"), family_matrix())
def test_a_family_trains_saves_loads_and_ranks(folders, tmp_path, train_file, family, modules,
                                               dtype):
    targets = "all-linear" if modules == "all-linear" else ",".join(tiny.NAMED_MODULES[family])
    config = train_config(tmp_path, str(folders[family]), max_steps=1, batch_size=2,
                          lora_r=4, lora_alpha=8, lora_modules=targets, device="cpu",
                          dtype=dtype, warmup_steps=0, lr=1e-2)
    summary = train(config)
    assert summary["finished"] and summary["step"] == 1
    model = SPDRanker.from_pretrained(tmp_path / "run", dtype=dtype)
    assert next(model.backbone.parameters()).dtype == getattr(torch, dtype)
    adapted = {name.split(".lora_B")[0].rsplit(".", 1)[-1]: p
               for name, p in model.backbone.named_parameters() if "lora_B" in name}
    if modules == "named":
        assert set(adapted) == set(tiny.NAMED_MODULES[family])
    else:  # every linear module of the layers, fused ones included
        assert set(tiny.NAMED_MODULES[family]) <= set(adapted) and len(adapted) >= 4
    # The one step moved LoRA's B off its zero start: the adapters were trained, and saved.
    assert any(float(p.detach().abs().max()) > 0 for p in adapted.values())
    slate = make_slate(random.Random(1), 7)
    ranking = model.rank(slate)
    assert is_valid_permutation(list(ranking.docids), slate.docids)
    before = model.score_matrix(slate)
    assert np.isfinite(before).all()
    model.save_pretrained(tmp_path / "again")
    again = SPDRanker.from_pretrained(tmp_path / "again", dtype=dtype)
    np.testing.assert_allclose(again.score_matrix(slate), before, rtol=0, atol=1e-6)


def live_states(model: SPDRanker, slate) -> torch.Tensor:
    with torch.inference_mode():
        return model.read(model.collate([model.encode(slate)])).items[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_states_are_the_live_ones(folders, tmp_path, train_file, family, dtype):
    """The frozen readout's cache and the split cache (what enters the one adapted top layer)
    score each slate as a live prefill does."""
    slates = load_slates(train_file)[:4]
    backbone = str(folders[family])
    for kind, lora in (("frozen", None), ("split", LoraSettings(r=4, alpha=8, top_layers=1))):
        torch.manual_seed(0)
        config = tiny_config(backbone, frozen=lora is None, lora=lora, dropout=0.0)
        config.backbone.dtype = dtype
        model = SPDRanker.build(config).eval()
        assert next(model.backbone.parameters()).dtype == getattr(torch, dtype)
        if lora is not None:
            with torch.no_grad():  # a trained adapter, so the split layer's LoRA does something
                for name, p in model.backbone.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.1)
        cache = open_state_cache(tmp_path / kind, model, train_file, len(slates),
                                 storage="float32", batch_size=3, shard_size=3, progress=False)
        if lora is None:
            for i, slate in enumerate(slates):
                assert close(cache.slate_states(i), live_states(model, slate), dtype), (kind, i)
        picked = [3, 0, 2]
        with torch.inference_mode():
            scores = model(cache.batch(picked, [slates[i] for i in picked], model))
        for row, i in enumerate(picked):
            live = model.score_matrix(slates[i])
            assert close(scores[row, : len(slates[i])], live, dtype), (kind, i)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_right_padded_prefill_needs_no_mask(folders, train_file, family, dtype):
    """A batch's prefill, run without its padding mask (causal attention alone), gives every
    real token the state the padding mask gives it, sliding windows included."""
    from spdrank.backbone.split import last_hidden, prompt_hidden

    slates = load_slates(train_file)[:3]
    config = tiny_config(str(folders[family]), frozen=True, dropout=0.0)
    config.backbone.dtype = dtype
    model = SPDRanker.build(config).eval()
    prompt = model.collate([model.encode(s) for s in slates]).prompt
    assert not prompt.attention_mask.all(), "the slates should differ in length"
    with torch.inference_mode():
        unmasked = prompt_hidden(model.backbone, prompt)
        masked = last_hidden(model.backbone, prompt.input_ids, prompt.attention_mask)
    real = prompt.attention_mask.bool()
    assert close(unmasked[real], masked[real], dtype)


# -- what spdrank refuses -----------------------------------------------------------------------


def save_encoder(folder: Path, tokenizer) -> Path:
    """A 2-layer BERT (an encoder: every token attends to every other) with SmolLM2's tokenizer."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("frozen", [True, False])
def test_an_encoder_is_refused_in_one_line(tmp_path, tokenizer, frozen):
    folder = save_encoder(tmp_path / "bert", tokenizer)
    for backbone in (str(folder), f"config:{folder}"):
        with pytest.raises(ValueError, match="decoder-only") as caught:
            SPDRanker.build(tiny_config(backbone, frozen=frozen))
        message = str(caught.value)
        assert "\n" not in message and "'bert' is an encoder" in message


def test_an_encoder_decoder_is_refused_in_one_line(tmp_path):
    config = {"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 4,
              "d_kv": 8, "vocab_size": 49152}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'t5' is an encoder-decoder") as caught:
        SPDRanker.build(tiny_config(f"config:{tmp_path}", frozen=True))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("top_layers", [None, 1])
def test_module_names_a_family_lacks_are_refused_naming_its_own(folders, top_layers):
    """Phi-3 fuses q, k and v into one projection: q_proj,v_proj names nothing there, and the
    refusal lists the names that do."""
    lora = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"], top_layers=top_layers)
    with pytest.raises(ValueError, match="names no linear module") as caught:
        SPDRanker.build(tiny_config(str(folders["phi3"]), lora=lora))
    message = str(caught.value)
    assert "\n" not in message
    assert all(name in message for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))


def test_a_family_without_a_layers_list_adapts_every_layer_and_refuses_the_top_ones(
    tmp_path, tokenizer
):
    """GPT-2 keeps its layers under ``h`` and its projections as ``Conv1D``: LoRA on every
    layer (all-linear or by its own module names) ranks; LoRA on its top layers alone, which
    needs the layer list, is refused in one line."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4,
                        n_positions=4096, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    slate = make_slate(random.Random(2), 5)
    for targets in ("all-linear", ["c_attn"]):
        lora = LoraSettings(r=4, alpha=8, target_modules=targets)
        model = SPDRanker.build(tiny_config(str(tmp_path / "gpt2"), lora=lora))
        assert is_valid_permutation(list(model.rank(slate).docids), slate.docids)
    with pytest.raises(ValueError, match="names no linear module .*c_attn, c_proj, c_fc"):
        SPDRanker.build(tiny_config(str(tmp_path / "gpt2"), lora=LoraSettings(
            r=4, alpha=8, target_modules=["q_proj"])))
    with pytest.raises(ValueError, match="no `layers` list.*--lora-layers") as caught:
        SPDRanker.build(tiny_config(str(tmp_path / "gpt2"), lora=LoraSettings(
            r=4, alpha=8, top_layers=1)))
    assert "\n" not in str(caught.value)
