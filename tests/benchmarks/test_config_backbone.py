"""A backbone built from a config with random weights (``config:PATH``: how benchmarks/gpu.sh
times a larger model's shape, such as benchmarks/configs/qwen3-0.6b.json, with nothing
downloaded) ranks through the normal API; bench's latency batch; and benchmarks/train_step.py,
the GPU plan's training-step timer, on a CPU."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import spdrank.commands.cli
from spdrank.backbone.locate import resolve_path
from spdrank.compare.latency import STAGES, decompose
from spdrank.compare.report import latency_table
from spdrank.eval.metrics import is_valid_permutation
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker
from tests.helpers import ROOT, load_benchmark, make_slate, tiny_config, tiny_qwen3

QWEN3 = "config:benchmarks/configs/qwen3-0.6b.json"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spd_config(config_file: Path, positions: int = 16) -> SPDConfig:
    return tiny_config(f"config:{config_file}", positions=positions)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def random_model(config_file) -> SPDRanker:
    torch.manual_seed(0)
    return SPDRanker.build(spd_config(config_file))


# -- the Qwen3-0.6B shape --------------------------------------------------------------------


def test_qwen3_config_has_qwen3_0_6b_shape():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(ROOT / QWEN3.removeprefix("config:")))
    assert type(config).__name__ == "Qwen3Config"
    shape = {k: getattr(config, k) for k in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "hidden_act",
    )}
    assert shape == {
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True,
        "hidden_act": "silu",
    }


# -- config: backbones -------------------------------------------------------------------------


def test_random_backbone_ranks_a_slate_and_is_the_same_every_time(random_model, config_file):
    rng = random.Random(0)
    slate = make_slate(rng, 9)
    ranking = random_model.rank(slate)
    assert is_valid_permutation(list(ranking.docids), slate.docids)
    assert set(ranking.timings) == set(STAGES)
    assert len(random_model.tokenizer) == 49152  # no tokenizer beside the config: SmolLM2's
    assert random_model.config.backbone.random_weights
    # the weights are a function of the config: a second build (another global seed) has them
    torch.manual_seed(123)
    again = SPDRanker.build(spd_config(config_file))
    for (name, a), b in zip(random_model.backbone.state_dict().items(), again.backbone.state_dict().values()):
        if "lora_A" not in name:  # peft draws LoRA's A from the global RNG; B starts at 0
            assert torch.equal(a, b), name


def test_random_backbone_checkpoint_records_its_config(random_model, config_file, tmp_path):
    """The checkpoint names the config and its digest: it reloads to the same scores, and a
    config changed since is refused rather than read as other weights."""
    slate = make_slate(random.Random(1), 7)
    with torch.no_grad():
        for name, p in random_model.backbone.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = random_model.score_matrix(slate)
    random_model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())["backbone"]
    assert saved["name_or_path"] == f"config:{config_file}"
    assert len(saved["config_sha256"]) == 64
    loaded = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.score_matrix(slate), before, rtol=1e-5, atol=1e-5)

    changed = tmp_path / "changed"
    tiny_qwen3(changed)
    data = json.loads((changed / "config.json").read_text()) | {"intermediate_size": 96}
    (changed / "config.json").write_text(json.dumps(data))
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["backbone"]["name_or_path"] = f"config:{changed}"
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="changed since this checkpoint was saved"):
        SPDRanker.from_pretrained(tmp_path / "ckpt")


def test_random_backbone_refusals(tmp_path):
    with pytest.raises(ValueError, match="random-weight backbone"):
        resolve_path(QWEN3)  # nothing reads a model's weights from a config: name
    with pytest.raises(FileNotFoundError, match="no config file"):
        SPDRanker.build(spd_config(tmp_path / "missing.json"))
    small = tiny_qwen3(tmp_path / "small", vocab_size=1000)
    with pytest.raises(ValueError, match="vocab_size 1000 is smaller"):
        SPDRanker.build(spd_config(small))


# -- the latency batch -------------------------------------------------------------------------


def test_latency_batch_decomposes_rank_batch_calls(random_model):
    rng = random.Random(2)
    slates = [make_slate(rng, rng.randint(4, 9), qid=f"q{i}") for i in range(5)]
    rows = decompose(random_model, slates, sizes=(6,), batch_size=2, latency_batches=(1, 2), warmup=0)
    single, batched = rows
    assert (single.latency_batch, single.slates, single.label) == (1, 5, "spd-attn")
    # two calls of two slates: the fifth slate would make a partial batch, left out
    assert (batched.latency_batch, batched.slates, batched.batch_size) == (2, 4, 2)
    assert batched.label == "spd-attn (batch 2)"
    for r in rows:
        assert r.random_weights and r.backbone.startswith("config:")
        assert all(0 <= v <= r.total_ms["p95"] for v in r.stages_ms.values())
        assert 0 < r.overhead_ms <= r.total_ms["p95"] and r.bare_prefill_ms > 0
        assert r.throughput > 0
    assert "| spd-attn (batch 2) | 6 | 4 |" in latency_table(rows)
    with pytest.raises(ValueError, match="latency batch of 6 slates"):
        decompose(random_model, slates, sizes=(6,), latency_batches=(6,))


def test_latency_batch_flag_parses():
    parser = spdrank.commands.cli.build_parser()
    base = ["bench", "--slates", "s.jsonl", "--model", "m"]
    assert parser.parse_args(base).latency_batch == [1]
    assert parser.parse_args([*base, "--latency-batch", "1,32"]).latency_batch == [1, 32]
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--latency-batch", "0"])


# -- the training step ------------------------------------------------------------------------


def test_train_step_times_steps_and_leaves_a_checkpoint(config_file, train_file, tmp_path, monkeypatch, capsys):
    train_step = load_benchmark("train_step", monkeypatch)
    out = tmp_path / "run"
    argv = ["--warmup", "1", "--steps", "2", "--json", str(tmp_path / "step.json"), "--",
            "--slates", str(train_file), "--out", str(out), "--backbone", f"config:{config_file}",
            "--positions", "16", "--batch-size", "2", "--lora-r", "4", "--lora-alpha", "8",
            "--max-item-tokens", "8", "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert train_step.main(argv) == 0
    d = json.loads((tmp_path / "step.json").read_text())
    assert len(d["step_ms"]["all"]) == 2 and d["step_ms"]["median"] > 0
    assert d["random_weights"] and d["lora_r"] == 4 and d["trainable_params"] > 0
    # The warm-up step's FLOPs counted; no stated peak on a CPU, so no MFU unless one is given.
    assert d["flops_per_step"] > 0 and d["tflops"] > 0 and d["mfu"] is None
    assert json.loads((out / "train.json").read_text())["step"] == 3  # warm-up + timed
    assert SPDRanker.from_pretrained(out).config.backbone.random_weights
    assert json.loads(capsys.readouterr().out)["batch_size"] == 2
