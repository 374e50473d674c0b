"""benchmarks/prefill_limit.py: the prefill against its matrix products alone, on a tiny
config backbone at tiny sizes."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from tests.helpers import ROOT, tiny_qwen3


@pytest.fixture
def limit(monkeypatch):
    """The script as a module (it imports serve_harness from its own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("prefill_limit")


@pytest.fixture(scope="module")
def config_backbone(tmp_path_factory) -> str:
    return f"config:{tiny_qwen3(tmp_path_factory.mktemp('qwen3'))}"


def test_the_script_times_prefill_and_products_and_profiles_the_rest(
    limit, tmp_path, config_backbone, one_torch_thread
):
    out = tmp_path / "out"
    argv = ["--backbone", config_backbone, "--layers", "0", "--sizes", "3,5", "--history", "2",
            "--reps", "2", "--warmup", "1", "--profile-reps", "1", "--top", "5",
            "--threads", "1", "--note", "a teacher run", "--out", str(out)]
    assert limit.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["dtype"], r["n"]) for r in rows] == [
        ("float32", 3), ("float32", 5), ("bfloat16", 3), ("bfloat16", 5)]
    for r in rows:
        assert r["products"] == 2 * 7  # two layers: q, k, v, o, gate, up, down each
        assert list(r["products_by_kind_ms"]) == [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        assert r["ratio"] == pytest.approx(r["prefill_ms"]["median"] / r["products_ms"]["median"])
        prof = r["profile"]
        assert set(prof["categories_ms"]) == set(limit.CATEGORIES)
        assert sum(prof["categories_ms"].values()) == pytest.approx(prof["total_ms"])
        for spent in ("matrix products", "attention kernel", "norms", "embedding"):
            assert prof["categories_ms"][spent] > 0, spent
        assert len(prof["top_ops"]) == 5
        assert set(r["routes_ms"]) == set(limit.ROUTES) and min(r["routes_ms"].values()) > 0
    # a longer slate is a longer prompt: the prompts come from the builder, not a fixed size
    assert rows[0]["tokens"] < rows[1]["tokens"]
    meta = results["meta"]
    assert meta["model_layers"] == 2 and meta["threads"] == 1 and meta["note"] == "a teacher run"
    text = (out / "report.md").read_text()
    assert "| float32 | 5 |" in text and "also running: a teacher run" in text
    assert "### Top ops, bfloat16, N = 3" in text
    assert "| float32 | 3 |" in text.split("other attention routes")[1]
    assert (out / "command.txt").read_text().startswith(
        ".venv/bin/python benchmarks/prefill_limit.py --backbone config:")


def test_layers_cut_the_backbone_and_its_products(limit, tmp_path, config_backbone,
                                                  one_torch_thread):
    out = tmp_path / "out"
    assert limit.main(["--backbone", config_backbone, "--layers", "1", "--sizes", "2",
                       "--history", "1", "--dtypes", "float32", "--reps", "1", "--warmup", "0",
                       "--profile-reps", "1", "--out", str(out)]) == 0
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["products"] == 7


def test_products_take_each_layers_real_shapes(limit):
    from transformers import LlamaConfig, LlamaModel

    model = LlamaModel(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2))
    linears = limit.projections(model)
    assert [k for k, _ in linears][:7] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    products = limit.Products(linears, tokens=9, dtype=torch.bfloat16)
    shapes = [(tuple(x.shape), tuple(w.shape)) for _, x, w, _ in products.products[:7]]
    assert shapes == [((1, 9, 32), (32, 32)), ((1, 9, 32), (16, 32)), ((1, 9, 32), (16, 32)),
                      ((1, 9, 32), (32, 32)), ((1, 9, 32), (48, 32)), ((1, 9, 32), (48, 32)),
                      ((1, 9, 48), (32, 48))]
    assert all(w.dtype == torch.bfloat16 for _, _, w, _ in products.products)


@pytest.mark.parametrize(("scope", "op", "expected"), [
    ("matrix products", "aten::copy_", "matrix products"),
    ("attention", "aten::_scaled_dot_product_flash_attention_for_cpu", "attention kernel"),
    ("attention", "aten::cat", "rotary"),
    ("attention", "aten::transpose", "copies and views"),
    ("norms", "aten::rsqrt", "norms"),
    ("mlp", "aten::silu", "activation and gating"),
    ("layer", "aten::add", "residual adds"),
    ("model", "aten::arange", "masks and positions"),
    (None, "aten::mul", "other ops"),
])
def test_ops_are_put_in_the_module_they_ran_in(limit, scope, op, expected):
    assert limit.category(scope, op) == expected


def test_bad_sizes_are_refused_in_one_line(limit, capsys):
    with pytest.raises(SystemExit):
        limit.main(["--sizes", "20,x"])
    assert "--sizes takes sizes like 20,50,150, got '20,x'" in capsys.readouterr().err


def test_the_eager_route_runs_no_sdpa_and_is_undone(limit, config_backbone, monkeypatch):
    from spdrank.backbone.load import load_backbone
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.backbone.split import last_hidden

    backbone = load_backbone(BackboneConfig(name_or_path=config_backbone, lora=None))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        default = last_hidden(backbone, ids, torch.ones_like(ids))
        assert calls
        calls.clear()
        with limit.attention_route(backbone, "eager"):
            eager = last_hidden(backbone, ids, torch.ones_like(ids))
        assert not calls
        with limit.attention_route(backbone, "sdpa math"):
            math = last_hidden(backbone, ids, torch.ones_like(ids))
        last_hidden(backbone, ids, torch.ones_like(ids))
    assert calls  # the default route is back
    torch.testing.assert_close(eager, default, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(math, default, atol=1e-5, rtol=1e-4)
