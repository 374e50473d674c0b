"""``--dtype auto``: bfloat16 on a CPU with native bfloat16 matrix units when ranking, float32
on other CPUs and to train; the detection read from torch's query or /proc/cpuinfo."""

from __future__ import annotations

import pytest
import torch

from spdrank.backbone import cpu
from spdrank.backbone.load import resolve_dtype
from spdrank.model.ranker import SPDRanker
from tests.helpers import tiny_config

AMX_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
bogomips\t: 4800.00

processor\t: 1
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
AVX2_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n"


@pytest.fixture
def detect(monkeypatch):
    """No override, and a fresh detection each call: the test sets what the hardware says."""
    monkeypatch.delenv(cpu.ENV, raising=False)
    cpu.detected_bf16.cache_clear()
    yield monkeypatch
    cpu.detected_bf16.cache_clear()


def test_cpuinfo_flags_are_read_from_every_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(AMX_CPUINFO)
    flags = cpu.cpuinfo_flags(info)
    assert {"amx_bf16", "avx512_bf16", "avx2"} <= flags and "4800.00" not in flags
    assert cpu.cpuinfo_flags(tmp_path / "absent") == frozenset()


@pytest.mark.parametrize(
    ("text", "native"), [(AMX_CPUINFO, True), (AVX2_CPUINFO, False), (ARM_CPUINFO, False)]
)
def test_detection_falls_back_to_cpuinfo_without_torchs_query(detect, tmp_path, text, native):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    detect.setattr(cpu, "CPUINFO", info)
    detect.setattr(cpu, "torch_capabilities", lambda: None)
    assert cpu.native_bf16() is native


def test_detection_without_cpuinfo_or_torchs_query_is_float32(detect, tmp_path):
    detect.setattr(cpu, "CPUINFO", tmp_path / "absent")
    detect.setattr(cpu, "torch_capabilities", lambda: None)
    assert cpu.native_bf16() is False


@pytest.mark.parametrize(
    ("capabilities", "native"),
    [
        ({"avx512_bf16": True, "amx_bf16": False}, True),
        ({"avx512_bf16": False, "amx_bf16": True}, True),
        ({"avx512_bf16": False, "amx_bf16": False, "avx2": True}, False),
        ({"architecture": "arm64"}, False),
    ],
)
def test_torchs_query_is_asked_first(detect, capabilities, native):
    detect.setattr(cpu, "torch_capabilities", lambda: capabilities)
    detect.setattr(cpu, "cpuinfo_flags", lambda path=None: frozenset({"amx_bf16"}))
    assert cpu.native_bf16() is native


def test_torchs_query_exists_and_answers():
    capabilities = cpu.torch_capabilities()
    assert capabilities is not None and "architecture" in capabilities


def test_the_environment_overrides_the_detection(detect):
    detect.setattr(cpu, "torch_capabilities", lambda: {"amx_bf16": True})
    detect.setenv(cpu.ENV, "0")
    assert cpu.native_bf16() is False
    detect.setattr(cpu, "torch_capabilities", lambda: {"amx_bf16": False})
    detect.setenv(cpu.ENV, "1")
    assert cpu.native_bf16() is True
    detect.setenv(cpu.ENV, "yes")
    with pytest.raises(ValueError, match="SPDRANK_CPU_BF16 must be 1 or 0, got 'yes'"):
        cpu.native_bf16()


@pytest.mark.parametrize("native", [True, False])
def test_auto_resolves_per_machine_to_rank_and_to_float32_to_train(monkeypatch, native):
    monkeypatch.setenv(cpu.ENV, "1" if native else "0")
    ranked = torch.bfloat16 if native else torch.float32
    assert resolve_dtype("auto", "cpu", cpu_bf16=True) == ranked
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", torch.device("cpu"), cpu_bf16=True) == ranked
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("auto", "meta", cpu_bf16=True) == torch.float32
    for name, dtype in [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                        ("float16", torch.float16)]:
        assert resolve_dtype(name, "cpu", cpu_bf16=True) == dtype
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        resolve_dtype("fp8", "cpu", cpu_bf16=True)


def backbone_dtype(model: SPDRanker) -> torch.dtype:
    return next(model.backbone.parameters()).dtype


@pytest.mark.parametrize("frozen", [True, False])
def test_a_checkpoint_saved_with_auto_loads_in_each_machines_dtype(
    monkeypatch, tmp_path, tiny_backbone, frozen
):
    """A model built to train is float32 on a bfloat16 CPU; its checkpoint says auto and loads
    in bfloat16 there, its head's products with it, and in float32 on another CPU."""
    monkeypatch.setenv(cpu.ENV, "1")
    built = SPDRanker.build(tiny_config(tiny_backbone, frozen=frozen))
    assert backbone_dtype(built) == torch.float32
    built.save_pretrained(tmp_path / "m")
    loaded = SPDRanker.from_pretrained(tmp_path / "m")
    assert loaded.config.backbone.dtype == "auto"
    assert backbone_dtype(loaded) == torch.bfloat16
    assert {p.dtype for p in loaded.head.parameters()} == {torch.float32}
    assert len(loaded.rank("1. shampoo", ["serum", "mascara", "oil"]).docids) == 3
    monkeypatch.setenv(cpu.ENV, "0")
    elsewhere = SPDRanker.from_pretrained(tmp_path / "m")
    assert backbone_dtype(elsewhere) == torch.float32
    assert {p.dtype for p in elsewhere.head.parameters()} == {torch.float32}


def test_an_explicit_float32_stays_float32_on_a_bfloat16_cpu(monkeypatch, tmp_path, tiny_backbone):
    monkeypatch.setenv(cpu.ENV, "1")
    config = tiny_config(tiny_backbone, frozen=True)
    config.backbone.dtype = "float32"
    SPDRanker.build(config).save_pretrained(tmp_path / "f32")
    assert backbone_dtype(SPDRanker.from_pretrained(tmp_path / "f32")) == torch.float32
    SPDRanker.build(tiny_config(tiny_backbone, frozen=True)).save_pretrained(tmp_path / "auto")
    overridden = SPDRanker.from_pretrained(tmp_path / "auto", dtype="float32")
    assert backbone_dtype(overridden) == torch.float32
    assert overridden.config.backbone.dtype == "float32"


def test_a_device_this_machine_lacks_is_refused_by_name(monkeypatch):
    """accelerate falls back to the CPU for a device it cannot use: a run asked for CUDA
    would train on the CPU without a word, and a ranker fail with torch's traceback."""
    from spdrank.backbone.load import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"--device cuda: this machine has no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match=r"--device 'gpu': use cpu, cuda, cuda:N"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match=r"--device cuda:1: this machine has 1 CUDA devices"):
        resolve_device("cuda:1")
