"""Property search over tampered checkpoints: random edits of config.json, of the adapter's
adapter_config.json and of the safetensors headers, and backbones pointed at a folder whose
config asks to run its own Python.

Whatever the tampering, loading and ranking with ``spdrank rank`` either works or fails with
one line naming what is wrong (exit 2, no traceback); the folder's code never runs (its
marker file never appears, though stdin says "y"), and no file but the output changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdrank.commands.cli import main
from spdrank.model.ranker import SPDRanker
from tests.helpers import save_features_only_model, tiny_config

SLATE = {"query": {"qid": "q", "text": "1. rose shampoo"},
         "candidates": [{"docid": "a", "doc": {"title": "argan oil"}, "features": {"pop": 1}},
                        {"docid": "b", "doc": {"title": "lotion"}, "features": {"pop": 0}}]}

#: Values a tampered field may take: sizes past any bound, wrong types, paths, odd strings.
VALUES = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2, 70), st.sampled_from([0, 10**9, 10**18, -(10**9), 2**63]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e9, -1.0, 0.5]),
    st.text(max_size=12), st.sampled_from(["", "LORA", "PREFIX_TUNING", "first", "attn",
                                           "hungarian", "/dev/zero", "\u200b", "../../etc"]),
    st.lists(st.integers(-1, 5), max_size=3), st.dictionaries(st.text(max_size=4),
                                                              st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_backbone) -> dict[str, Path]:
    """The checkpoints to tamper with (a LoRA one on the tiny Llama, a features-only one), a
    folder whose config needs its own code, and the slates to rank."""
    root = tmp_path_factory.mktemp("fuzz-checkpoints")
    lora = root / "lora"
    SPDRanker.build(tiny_config(tiny_backbone, positions=4)).save_pretrained(lora)
    features = save_features_only_model(root / "features", 4)
    evil = root / "evil"
    evil.mkdir()
    marker = root / "MARKER"
    (evil / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (evil / "config.json").write_text(json.dumps({
        "model_type": "evil_model",
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
    }))
    slates = root / "in.jsonl"
    slates.write_text(json.dumps(SLATE) + "\n")
    return {"root": root, "lora": lora, "features": features, "evil": evil, "marker": marker,
            "slates": slates, "backbone": Path(tiny_backbone)}


def digests(*folders: Path) -> dict[str, str]:
    """Each file under ``folders`` (links not followed) -> its SHA-256."""
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def json_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON tree (keys and indices)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += json_paths(v, (*prefix, i))
    return out


def tamper_json(path: Path, data: st.DataObject, evil: Path) -> None:
    """One random edit of the JSON file at ``path``: a value replaced or removed, the backbone
    pointed at ``evil``, or the bytes cut short or replaced."""
    how = data.draw(st.sampled_from(["replace", "replace", "delete", "evil", "bytes", "cut"]))
    try:
        tree = json.loads(path.read_bytes())
    except ValueError:  # an earlier edit left no JSON: edit its bytes
        how = "bytes"
    if how == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=64)))
        return
    if how == "cut":
        text = path.read_bytes()
        path.write_bytes(text[: data.draw(st.integers(0, len(text)))])
        return
    if how == "evil" and isinstance(tree.get("backbone"), dict):
        tree["backbone"]["name_or_path"] = str(evil)
    else:
        where = data.draw(st.sampled_from(json_paths(tree)[1:] or [()]))
        parent = tree
        for key in where[:-1]:
            parent = parent[key]
        if not where:
            tree = data.draw(VALUES)
        elif how == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = data.draw(VALUES)
    path.write_text(json.dumps(tree))


def tamper_safetensors(path: Path, data: st.DataObject) -> None:
    """One random edit of a safetensors file's header: its length, or bytes inside it."""
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8]) if len(raw) >= 8 else (0,)
    how = data.draw(st.sampled_from(["length", "flip", "json"]))
    try:
        header = json.loads(raw[8 : 8 + length])
    except ValueError:
        header = None
    if header is None or not 8 + length <= len(raw):  # an earlier edit broke it: any bytes
        how = "flip" if raw else "length"
        length = max(len(raw) - 8, 1)
    if how == "length":
        raw[:8] = struct.pack("<Q", data.draw(st.sampled_from(
            [0, 1, max(length - 1, 0), length + 1, len(raw), 2**40, 2**64 - 1])))
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    else:
        name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        entry = header[name]
        field = data.draw(st.sampled_from(["shape", "dtype", "data_offsets"]))
        entry[field] = data.draw(st.one_of(VALUES, st.lists(st.integers(-1, 10**12), max_size=3)))
        new = json.dumps(header).encode()
        raw = bytearray(struct.pack("<Q", len(new)) + new + raw[8 + length :])
    path.write_bytes(bytes(raw))


def rank_tampered(world: dict[str, Path], ckpt: Path, out: Path, capsys, monkeypatch) -> None:
    """Run ``spdrank rank`` on ``ckpt`` with "y" on stdin and check the properties."""
    before = digests(world["lora"], world["features"], world["evil"], world["backbone"], ckpt)
    slates_before = world["slates"].read_bytes()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    capsys.readouterr()
    code = main(["rank", "--model", str(ckpt), "--input", str(world["slates"]),
                 "--output", str(out)])
    captured = capsys.readouterr()
    assert not world["marker"].exists(), "the folder's code ran"
    assert "Do you wish to run the custom code?" not in captured.out + captured.err
    assert digests(world["lora"], world["features"], world["evil"], world["backbone"],
                   ckpt) == before
    assert world["slates"].read_bytes() == slates_before
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    if code == 0:
        assert out.is_file() and not errors
    else:
        assert code == 2 and len(errors) == 1, captured.err
        assert "Traceback" not in captured.err and not out.exists()


FUZZ = settings(max_examples=40, report_multiple_bugs=False, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_a_tampered_features_only_checkpoint_is_ranked_or_one_line(world, data, capsys,
                                                                   monkeypatch):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(shutil.copytree(world["features"], Path(tmp) / "ckpt"))
        targets = ["config", "config", "head"]
        for _ in range(data.draw(st.integers(1, 2))):
            target = data.draw(st.sampled_from(targets))
            if target == "config":
                tamper_json(ckpt / "config.json", data, world["evil"])
            else:
                tamper_safetensors(ckpt / "head.safetensors", data)
        rank_tampered(world, ckpt, Path(tmp) / "out.jsonl", capsys, monkeypatch)


@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_a_tampered_lora_checkpoint_is_ranked_or_one_line(world, data, capsys, monkeypatch,
                                                          one_torch_thread):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(shutil.copytree(world["lora"], Path(tmp) / "ckpt"))
        target = data.draw(st.sampled_from(["config", "adapter_config", "adapter", "head"]))
        if target == "config":
            tamper_json(ckpt / "config.json", data, world["evil"])
        elif target == "adapter_config":
            tamper_json(ckpt / "adapter" / "adapter_config.json", data, world["evil"])
        elif target == "adapter":
            tamper_safetensors(ckpt / "adapter" / "adapter_model.safetensors", data)
        else:
            tamper_safetensors(ckpt / "head.safetensors", data)
        rank_tampered(world, ckpt, Path(tmp) / "out.jsonl", capsys, monkeypatch)
