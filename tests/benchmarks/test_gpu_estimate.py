"""benchmarks/gpu_estimate.py: what the GPU scripts' steps will cost, before they run. Its
arithmetic on a tiny config checked by hand, its bytes saved for the backward against what
autograd saves for every family spdrank reads, and the scripts printing its table and
stopping, in one line, on a configuration the device cannot hold."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_estimate as est

TINY = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64, "vocab_size": 1000,
        "tie_word_embeddings": True}


def test_a_tiny_config_by_hand():
    shape = est.Shape.from_config(TINY)
    assert (shape.q_dim, shape.kv_dim) == (32, 16)
    # q, k, v, o, gate, up, down: 1024 + 512 + 512 + 1024 + 3 * 2048 weights, plus two norms
    assert shape.layer_params() == 9216 + 64
    assert shape.params() == 1000 * 32 + 2 * 9280 + 32  # embeddings (tied), layers, final norm
    assert shape.lora_params(4) == 4 * (64 + 48 + 48 + 64 + 96 + 96 + 96)
    # per token and layer: two norms 2 * (4*32 + 4); q, k, v, out in bf16 and 4 bytes a head;
    # gate, up, activation 3 * 2 * 64; each adapter's float32 input and rank-4 output
    assert est.saved_bytes_per_token(shape, 2, 4) == 264 + (2 * (64 + 32) + 16) + 384 + (4 * 256 + 7 * 16)
    work = est.Work("train", sequences=2, tokens=10, batch=2, train=True, adapted=2)
    cost = est.work_cost(work, shape, est.DEVICES["h200"], 2, 4)
    weights, adapters = 2 * 50592, 16 * 2 * 2048  # bf16; float32 adapters, grads, two moments
    saved, grads, states = 20 * 2 * 1992, 20 * 4 * (32 + 64), 20 * 2 * 32
    assert cost.memory_bytes == weights + adapters + saved + grads + states
    # forward: 2 FLOPs a weight a token, causal attention 4 * q_dim * T/2 a token and layer, and
    # LoRA's 2 * 2048 a layer; the backward: the layers again, attention once more, LoRA twice
    per_token, lora = 2 * (2 * 9216 + 4 * 32 * 5), 2 * 2 * 2048
    forward = 10 * (per_token + lora)
    backward = 10 * per_token + 10 * 4 * 32 * 5 * 2 + 2 * 10 * lora
    assert cost.flops == 2 * (forward + backward)


def test_the_bundled_shape_is_smollm2s():
    cached = est.cache_dir() / "backbones" / est.BUNDLED_CACHE_NAME / "config.json"
    if not cached.is_file():
        pytest.skip("the bundled SmolLM2 has not been converted here")
    assert est.Shape.from_config(json.loads(cached.read_text())) == est.Shape.from_config(est.BUNDLED_CONFIG)


def test_a_backbone_is_read_offline(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert est.read_shape(str(tmp_path)).hidden == 32
    assert est.read_shape(f"config:{tmp_path / 'config.json'}").layers == 2
    assert est.read_shape("config:benchmarks/configs/qwen3-0.6b.json").vocab == 151936
    assert est.read_shape(str(tmp_path / "not-yet"), tiny="qwen3").head_dim == 8  # the smoke folder
    with pytest.raises(FileNotFoundError, match="no config.json for backbone"):
        est.read_shape("nobody/no-such-model")


def lora_model(shape_config: dict, layers: int, lora_r: int):
    """A random-weight causal LM of ``shape_config``'s shape in bfloat16, cut to ``layers``,
    LoRA-wrapped as spdrank wraps it (peft, every linear module, no dropout)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{**shape_config, "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    return get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_r, lora_dropout=0.0,
                                            target_modules="all-linear", bias="none"))


def saved_bytes(model, tokens: int) -> int:
    """Bytes of every tensor autograd saves in a training forward of the decoder stack (each
    storage once, the model's own weights and buffers left out)."""
    import torch

    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    ids = torch.randint(0, 1000, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.get_base_model().base_model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return sum(seen.values())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text",
                                    "phi3", "gpt_neox", "olmo2"])
def test_saved_bytes_are_what_autograd_saves(family):
    """A LoRA training forward of the tiny model of each family: the bytes of every tensor
    autograd keeps (4 layers minus 2, per token) within 12% of the estimate."""
    pytest.importorskip("torch")
    from tiny_backbone import COMMON, FAMILIES

    config = {"model_type": family, "vocab_size": 49152, **COMMON, **FAMILIES[family]}
    tokens = 64
    two, four = (saved_bytes(lora_model(config, k, 4), tokens) for k in (2, 4))
    measured = (four - two) / 2 / tokens
    estimated = est.saved_bytes_per_token(est.Shape.from_config(config), 2, 4, tokens)
    assert 0.88 <= estimated / measured <= 1.12, (measured, estimated)


def test_a_run_that_will_not_fit_is_refused_in_one_line(capsys):
    assert est.main(["gpu.sh", "BATCH=4096"]) == 1
    out, err = capsys.readouterr()
    assert "train-attn" in out
    line, = err.splitlines()
    # the training step, timed first, is the first step that cannot fit
    assert line.startswith("gpu_estimate: step train-step needs about ")
    assert "GiB usable of the NVIDIA H200" in line and "4096 x 1600 tokens" in line


def test_a_budget_is_kept_when_given(capsys, tmp_path):
    """A step that alone outlasts the budget is refused; a longer run is planned to stop before
    the step that would end past it, each step's estimate written for the script's step."""
    assert est.main(["gpu.sh", "BUDGET_S=5"]) == 1
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith("gpu_estimate: step ") and "more than BUDGET_S=5 s" in line
    # The offline bundle's first sizes (benchmarks/offline_bundle.sh) are planned; the paper's cannot start in one call.
    assert est.main(["gpu.sh", "BUDGET_S=540"]) == 1
    assert "step train-attn alone needs about" in capsys.readouterr().err
    plan = tmp_path / "plan.tsv"
    assert est.main(["gpu.sh", "BUDGET_S=540", "TRAIN_SLATES=4096", "AR_N=8", "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    rows = dict(line.split("\t") for line in plan.read_text().splitlines())
    # GPU steps only, the training step and the latency at N = 50 first
    assert list(rows)[:4] == ["train-step", "step-latency", "train-attn", "bench-all"]
    assert "data" not in rows and all(int(v) > 0 for v in rows.values())
    elapsed, stop = 0, None
    for name, seconds in rows.items():
        elapsed += int(seconds)
        if elapsed > 540:
            stop = name
            break
    assert stop is not None and f"BUDGET_S=540: the run stops before step {stop} " in out
    assert est.main(["gpu.sh", "BUDGET_S=100000"]) == 0
    assert "stops before" not in capsys.readouterr().out


def test_a_measured_step_replaces_the_assumption_for_training(tmp_path):
    """The calibrated estimate of the measured step is the measurement; without a measurement
    (another device, or none kept) training stays at the assumed MFU."""
    measured = est.calibration("h200")
    assert measured is not None and 0 < measured.train_mfu < est.MFU
    record = json.loads((est.MEASURED / "measured-h200.json").read_text())["train"]
    shape = est.read_shape(record["backbone"])
    work = est.Work("train", record["batch"], est.rec_tokens(record["candidates"]),
                    batch=record["batch"], train=True, adapted=shape.layers)
    cost = est.work_cost(work, shape, est.DEVICES["h200"], 2, record["lora_r"], measured=measured)
    assert cost.seconds == pytest.approx(record["seconds_per_step"], rel=1e-6)
    assert cost.memory_bytes / est.GIB == pytest.approx(record["peak_gib"], rel=1e-6)
    inference = est.Work("eval", 16, est.rec_tokens(50), batch=16)
    assert est.work_cost(inference, shape, est.DEVICES["h200"], 2, 64, measured=measured) == \
        est.work_cost(inference, shape, est.DEVICES["h200"], 2, 64)
    assert est.calibration("l4") is None
    assert est.calibration("h200", folder=tmp_path) is None
    (tmp_path / "measured-h200.json").write_text(json.dumps({"train": {**record, "seconds_per_step": 1e-6}}))
    with pytest.raises(ValueError, match="shorter than its estimated dispatch cost"):
        est.calibration("h200", folder=tmp_path)


def test_the_device_is_a_parameter():
    """The same run fits an H200 and not an L4; a setting the script lacks is an error."""
    assert est.main(["gpu.sh"]) == 0
    assert est.main(["gpu.sh", "--device", "l4"]) == 1
    assert est.main(["gpu.sh", "BACKBONE=/no/such/folder"]) == est.NO_ESTIMATE
    with pytest.raises(SystemExit) as usage:
        est.main(["gpu.sh", "BATCHES=3"])
    assert usage.value.code == 2


def dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "BIN": "/nonexistent/bin", **env}
    for name in ("BACKBONE", "BATCH", "ESTIMATE_DEVICE", "FIT_CHECK", "BUDGET_S"):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / script), *args, "--dry-run"],
                          env=environ, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("smoke", [False, True])
def test_the_script_prints_the_table_before_the_first_step(smoke):
    done = dry_run("gpu.sh", *(["--smoke"] if smoke else []))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("Estimated cost on NVIDIA H200"))
    first = next(i for i, line in enumerate(lines) if " data beauty " in line)
    assert table < first
    assert any(line.startswith("total (GPU steps)") for line in lines)


def test_gpu_sh_stops_naming_the_step_that_will_not_fit():
    done = dry_run("gpu.sh", BATCH="4096")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("gpu_estimate: step train-step needs about ")
    assert " data beauty " not in done.stdout  # no step is printed after the refusal
    done = dry_run("gpu.sh", BATCH="4096", FIT_CHECK="0")
    assert done.returncode == 0 and "FIT_CHECK=0: running it anyway" in done.stdout
    done = dry_run("gpu.sh", ESTIMATE_DEVICE="l4")
    assert done.returncode == 1 and "of the NVIDIA L4" in done.stderr


def test_a_backbone_without_a_readable_config_runs_unestimated():
    done = dry_run("gpu.sh", BACKBONE="/no/such/folder")
    assert done.returncode == 0
    assert "gpu_estimate: no estimate: no config.json for backbone '/no/such/folder'" in done.stderr
    assert "the steps run unestimated" in done.stdout and " data beauty " in done.stdout


def run_steps(tmp_path: Path, budget: int, only: str = "") -> subprocess.CompletedProcess:
    """Three steps through benchmarks/lib.sh's ``step`` under ``budget``: ``a`` estimated at 4 s,
    ``cpu`` not estimated, ``b`` at 20 s; with ``only``, the steps it names alone."""
    (tmp_path / "plan.tsv").write_text("a\t4\nb\t20\n")
    script = f"""
        set -euo pipefail; . benchmarks/lib.sh
        OUT={tmp_path}; PLAN={tmp_path}/plan.tsv; BUDGET_S={budget}; start_all=$SECONDS; ONLY='{only}'
        for name in a cpu b; do step $name {tmp_path}/$name.done touch {tmp_path}/$name.done; done
        echo all done
    """
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_step_past_the_budget_is_left_for_a_rerun(tmp_path):
    done = run_steps(tmp_path, budget=10)
    assert done.returncode == 75, done.stderr
    assert (tmp_path / "a.done").exists() and (tmp_path / "cpu.done").exists()
    assert not (tmp_path / "b.done").exists() and "all done" not in done.stdout
    assert re.search(r"== b: not started: its estimated 20 s after [01] s would end past BUDGET_S=10;",
                     done.stdout)
    again = run_steps(tmp_path, budget=30)
    assert again.returncode == 0, again.stderr
    assert "== a: already done" in again.stdout and (tmp_path / "b.done").exists()
    assert "all done" in again.stdout


def test_only_the_named_steps_run_and_a_later_run_takes_the_rest(tmp_path):
    """A short run runs the steps that tell most first: the others wait, unestimated by the
    budget, for a run without ONLY."""
    first = run_steps(tmp_path, budget=30, only="b cpu")
    assert first.returncode == 0, first.stderr
    assert "== a: not in ONLY, left for a later run" in first.stdout
    assert not (tmp_path / "a.done").exists()
    assert (tmp_path / "b.done").exists() and (tmp_path / "cpu.done").exists()
    rest = run_steps(tmp_path, budget=30)
    assert rest.returncode == 0 and (tmp_path / "a.done").exists()
    assert "== b: already done" in rest.stdout
    # The estimate weighs only the steps that will run.
    assert est.main(["gpu.sh", "BUDGET_S=540", "ONLY=bench-all"]) == 0
    assert est.main(["gpu.sh", "BUDGET_S=540", "ONLY=train-attn"]) == 1
