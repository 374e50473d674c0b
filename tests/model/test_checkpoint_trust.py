"""A checkpoint is data: loading one never runs code, never reads without bound, and what it
cannot be is one line naming the file.

A checkpoint names its backbone by path, so a tampered one can point at a folder whose config
asks transformers to run the folder's Python. That code runs only when the user passes
``--trust-remote-code`` for the run; no checkpoint can record it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from spdrank.backbone.settings import MAX_JSON_BYTES, read_json
from spdrank.commands.cli import main
from spdrank.model.ranker import SPDRanker
from tests.helpers import save_features_only_model, subprocess_env, tiny_config

PROMPT = "Do you wish to run the custom code?"
SLATE = {"query": {"qid": "q", "text": "1. shampoo"},
         "candidates": [{"docid": "a", "doc": {"title": "argan oil"}},
                        {"docid": "b", "doc": {"title": "lotion"}}]}


def evil_folder(root: Path, marker: Path, tokenizer_only: bool = False) -> Path:
    """A model folder whose config names a model type transformers does not know, with an
    ``auto_map`` to the folder's evil.py, which writes ``marker`` when imported.

    ``tokenizer_only``: the config is a plain Llama's, and the tokenizer config carries the
    auto_map instead.
    """
    folder = root / ("evil-tokenizer" if tokenizer_only else "evil")
    folder.mkdir()
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig, PreTrainedTokenizer\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_model'\n"
        "class EvilModel:\n    pass\n"
        "class EvilTokenizer(PreTrainedTokenizer):\n    pass\n"
    )
    if tokenizer_only:
        (folder / "config.json").write_text(json.dumps({
            "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 49152,
        }))
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "EvilTokenizer",
            "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]},
        }))
    else:
        (folder / "config.json").write_text(json.dumps({
            "model_type": "evil_model",
            "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
        }))
    return folder


@pytest.fixture(scope="module")
def frozen_checkpoint(tmp_path_factory, tiny_backbone) -> Path:
    """A frozen-backbone checkpoint on the tiny Llama (no adapter)."""
    path = tmp_path_factory.mktemp("trust") / "frozen"
    SPDRanker.build(tiny_config(tiny_backbone, frozen=True)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory, tiny_backbone) -> Path:
    """A LoRA (r 4) checkpoint on the tiny Llama."""
    path = tmp_path_factory.mktemp("trust") / "lora"
    SPDRanker.build(tiny_config(tiny_backbone)).save_pretrained(path)
    return path


def copy_checkpoint(src: Path, dst: Path, **backbone) -> Path:
    """A copy of the checkpoint ``src`` at ``dst``, its backbone settings updated."""
    shutil.copytree(src, dst)
    if backbone:
        config = json.loads((dst / "config.json").read_text())
        config["backbone"].update(backbone)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def tampered_checkpoint(tmp_path: Path, checkpoint: Path) -> tuple[Path, Path, Path]:
    """A copy of ``checkpoint`` whose backbone is an :func:`evil_folder` in ``tmp_path``: the
    marker its code writes when it runs, the folder, and the copy."""
    marker = tmp_path / "MARKER"
    evil = evil_folder(tmp_path, marker)
    return marker, evil, copy_checkpoint(checkpoint, tmp_path / "ckpt", name_or_path=str(evil))


def rank_tampered(
    tmp_path: Path, checkpoint: Path, *flags: str, **run
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """``spdrank rank`` of one slate on a :func:`tampered_checkpoint` in a fresh interpreter
    (with ``flags``; ``run`` for subprocess.run, which says what stdin holds): the marker, the
    evil folder and the finished process."""
    marker, evil, ckpt = tampered_checkpoint(tmp_path, checkpoint)
    slates = tmp_path / "in.jsonl"
    slates.write_text(json.dumps(SLATE) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "spdrank", "rank", "--model", str(ckpt), "--input", str(slates),
         "--output", str(tmp_path / "out.jsonl"), *flags],
        check=False, capture_output=True, text=True, timeout=300,
        env=subprocess_env() | {"HF_MODULES_CACHE": str(tmp_path / "modules")}, **run,
    )
    return marker, evil, done


def edit_config(path: Path, edit) -> Path:
    """Apply ``edit`` to the JSON in ``path`` and write it back."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def rank_error(tmp_path: Path, model: Path, capsys) -> str:
    """The one line ``spdrank rank --model MODEL`` fails with (it must fail with exactly one)."""
    slates = tmp_path / "in.jsonl"
    slates.write_text(json.dumps(SLATE) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["rank", "--model", str(model), "--input", str(slates), "--output", str(out)])
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err and not out.exists()
    return lines[0]


# -- no code runs ---------------------------------------------------------------------------


def test_a_backbone_that_needs_its_own_code_is_refused_even_when_stdin_says_yes(
    tmp_path, frozen_checkpoint
):
    marker, evil, done = rank_tampered(tmp_path, frozen_checkpoint, input="y\n")
    assert not marker.exists()
    assert PROMPT not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert str(evil / "config.json") in lines[0] and "--trust-remote-code" in lines[0]


def test_the_python_api_refuses_it_too_and_never_asks(tmp_path, frozen_checkpoint, monkeypatch,
                                                      capsys):
    import io

    marker, evil, ckpt = tampered_checkpoint(tmp_path, frozen_checkpoint)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(ValueError, match="--trust-remote-code") as caught:
        SPDRanker.from_pretrained(ckpt)
    assert str(evil) in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists() and PROMPT not in capsys.readouterr().out


def test_a_tokenizer_that_needs_its_own_code_is_refused(tmp_path, monkeypatch, capsys):
    import io

    from spdrank.backbone.load import load_tokenizer

    marker = tmp_path / "MARKER"
    evil = evil_folder(tmp_path, marker, tokenizer_only=True)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(ValueError, match="--trust-remote-code") as caught:
        load_tokenizer(str(evil))
    assert str(evil) in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists() and PROMPT not in capsys.readouterr().out


def test_the_teacher_lm_refuses_it(tmp_path, monkeypatch):
    import io

    from spdrank.teacher.lm import load_causal_lm

    marker = tmp_path / "MARKER"
    evil = evil_folder(tmp_path, marker)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(ValueError, match="--trust-remote-code"):
        load_causal_lm(str(evil), device="cpu")
    assert not marker.exists()


def pickled_copy(tiny_backbone: str, root: Path) -> Path:
    """The tiny Llama with its weights under a pickle's name (``pytorch_model.bin``): never
    read, so its bytes need not be a real pickle."""
    folder = Path(shutil.copytree(tiny_backbone, root / "pickled"))
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("loader", ["backbone", "teacher", "dense"])
def test_every_model_loader_refuses_pickle_only_weights(tmp_path, tiny_backbone, loader):
    """The student's backbone and an LM teacher load through one loader, and the dense
    baseline's encoder under its rules: a folder whose weights are only pickles is refused by
    each, in one line naming it, before any read."""
    from spdrank.backbone.load import load_backbone
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.rankers.dense import DenseRanker
    from spdrank.teacher.lm import load_causal_lm

    folder = pickled_copy(tiny_backbone, tmp_path)
    with pytest.raises(ValueError, match="weights are pickles") as caught:
        if loader == "backbone":
            load_backbone(BackboneConfig(name_or_path=str(folder), lora=None))
        elif loader == "teacher":
            load_causal_lm(str(folder), device="cpu")
        else:
            DenseRanker(str(folder)).embed(["a text"])
    assert str(folder) in str(caught.value) and "\n" not in str(caught.value)


def test_the_teacher_cuts_layers_as_the_backbone_does(tiny_backbone):
    """One layer cut for every model: a teacher cut to L layers holds those of the backbone
    cut to L, and a cut past the model's depth is refused alike."""
    import torch

    from spdrank.backbone.load import load_backbone
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.teacher.lm import load_causal_lm

    lm, _, _ = load_causal_lm(tiny_backbone, layers=1, device="cpu", dtype="float32")
    backbone = load_backbone(BackboneConfig(name_or_path=tiny_backbone, layers=1,
                                            dtype="float32", lora=None))
    assert lm.config.num_hidden_layers == backbone.config.num_hidden_layers == 1
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(lm.get_decoder()(input_ids=ids).last_hidden_state,
                           backbone(input_ids=ids).last_hidden_state)
    for load in (lambda: load_causal_lm(tiny_backbone, layers=3, device="cpu"),
                 lambda: load_backbone(BackboneConfig(name_or_path=tiny_backbone, layers=3))):
        with pytest.raises(ValueError, match="--layers must be between 1 and 2"):
            load()


def test_trust_remote_code_given_by_the_user_is_what_lets_it_run(tmp_path, frozen_checkpoint):
    """The flag reaches transformers: with it (and only with it) the folder's code runs."""
    marker, _, done = rank_tampered(tmp_path, frozen_checkpoint, "--trust-remote-code",
                                    stdin=subprocess.DEVNULL)
    assert marker.exists(), done.stderr  # the user's own choice
    assert PROMPT not in done.stdout + done.stderr and done.returncode != 0


@pytest.mark.parametrize("command", ["rank", "eval", "bench", "serve", "train", "teacher"])
def test_every_command_that_loads_a_model_takes_the_flag_off_by_default(command):
    from spdrank.commands.cli import build_parser

    parser = build_parser()
    required = {
        "rank": ["--model", "m", "--input", "i", "--output", "o"],
        "eval": ["--slates", "s"], "bench": ["--slates", "s"], "serve": ["--model", "m"],
        "train": ["--slates", "s", "--out", "o"], "teacher": [],
    }[command]
    assert parser.parse_args([command, *required]).trust_remote_code is False
    assert parser.parse_args([command, *required, "--trust-remote-code"]).trust_remote_code


def test_trust_is_never_saved_in_a_checkpoint(tmp_path, tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone), trust_remote_code=True)
    model.save_pretrained(tmp_path / "ckpt")
    for path in (tmp_path / "ckpt").rglob("*.json"):
        assert "trust" not in path.read_text().lower(), path
    from spdrank.training.config import TrainConfig

    assert "trust_remote_code" not in {f.name for f in __import__("dataclasses").fields(
        TrainConfig)}  # a run's settings (train.json, its resume state) cannot carry it


# -- hub ids without a network ---------------------------------------------------------------


def test_an_uncached_hub_id_without_a_network_is_one_line_at_once(tmp_path, monkeypatch,
                                                                  frozen_checkpoint, capsys):
    def no_network(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    name = "spdrank-tests/no-such-model-anywhere"
    ckpt = copy_checkpoint(frozen_checkpoint, tmp_path / "ckpt", name_or_path=name)
    started = time.perf_counter()
    line = rank_error(tmp_path, ckpt, capsys)
    assert time.perf_counter() - started < 5  # no retries with backoff
    assert name in line and "cannot be reached" in line


def test_a_missing_local_path_is_one_line(tmp_path, frozen_checkpoint, capsys):
    ckpt = copy_checkpoint(frozen_checkpoint, tmp_path / "ckpt",
                           name_or_path=str(tmp_path / "no" / "such" / "folder"))
    assert "no such folder" in rank_error(tmp_path, ckpt, capsys)


# -- bounded reads and sizes -------------------------------------------------------------------


@pytest.fixture(scope="module")
def features_model(tmp_path_factory) -> Path:
    return save_features_only_model(tmp_path_factory.mktemp("trust") / "features", 4)


def test_a_config_linked_to_dev_zero_fails_at_once(tmp_path, features_model, capsys):
    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    (ckpt / "config.json").unlink()
    os.symlink("/dev/zero", ckpt / "config.json")
    started = time.perf_counter()
    line = rank_error(tmp_path, ckpt, capsys)
    assert time.perf_counter() - started < 5
    assert str(ckpt / "config.json") in line and "not a regular file" in line


def test_a_fifo_or_an_oversized_config_is_refused(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_json(fifo)  # opened without blocking: no writer is waited for
    big = tmp_path / "big.json"
    big.write_text("[" + " " * MAX_JSON_BYTES + "]")
    with pytest.raises(ValueError, match=f"{big}: .* more than the {MAX_JSON_BYTES}"):
        read_json(big)
    link = tmp_path / "link.json"
    (tmp_path / "target.json").write_text('{"a": 1}')
    os.symlink(tmp_path / "target.json", link)
    assert read_json(link) == {"a": 1}  # a link to a regular file (the hub cache's) is fine


@pytest.mark.parametrize("field,value,phrase", [
    ("positions", 10**9, "head.positions must be between 1 and"),
    ("positions", 1e9, "head.positions must be an integer"),
    ("width", 10**7, "head.width must be between"),
    ("layers", -1, "head.layers must be between"),
    ("heads", True, "head.heads must be an integer"),
    ("dropout", "x", "head.dropout must be a number"),
    # the history head's own settings, in every kind's record
    ("match_width", 10**7, "head.match_width must be between"),
    ("match_width", 8.0, "head.match_width must be an integer"),
    ("match", "bm25", "unknown match 'bm25'"),
])
def test_head_sizes_are_bounded_before_anything_is_built(tmp_path, features_model, capsys,
                                                         field, value, phrase):
    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    edit_config(ckpt / "config.json", lambda c: c["head"].update({field: value}))
    line = rank_error(tmp_path, ckpt, capsys)
    assert str(ckpt / "config.json") in line and phrase in line


def test_a_head_too_large_in_all_is_refused():
    from spdrank.methods.head_config import HeadConfig

    with pytest.raises(ValueError, match="weights, more than the"):
        HeadConfig(width=8192, layers=64)
    HeadConfig(width=1024, layers=8, positions=1000)  # large, but within the bound


@pytest.mark.parametrize("field,value,phrase", [
    ("layers", 10**9, "backbone.layers must be between"),
    ("layers", "2", "backbone.layers must be an integer"),
    ("name_or_path", 7, "backbone.name_or_path must be"),
    ("lora", {"r": 10**9}, "backbone.lora.r must be between"),
    ("lora", {"r": 4, "alpha": 8, "dropout": None}, "backbone.lora.dropout must be a number"),
    ("lora", {"r": 4, "alpha": 8, "dropout": 1.0}, "backbone.lora.dropout must be a number"),
    ("lora", [1], "backbone.lora must be an object"),
])
def test_backbone_settings_are_checked(tmp_path, features_model, capsys, field, value, phrase):
    """On the backbone record (and whole prompt) a features-only model wrote before it saved
    them as null, which is read, and checked, as every model's is."""
    from spdrank.backbone.prompt import PromptSettings
    from spdrank.backbone.settings import BackboneConfig

    def with_backbone(config: dict) -> None:
        config["backbone"] = BackboneConfig(lora=None).to_dict() | {field: value}
        config["prompt"] = PromptSettings().to_dict() | {
            k: config["prompt"][k] for k in ("readout", "history_items")}

    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    edit_config(ckpt / "config.json", with_backbone)
    assert phrase in rank_error(tmp_path, ckpt, capsys)


def test_an_unknown_format_version_is_refused(tmp_path, features_model, capsys):
    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    edit_config(ckpt / "config.json", lambda c: c.update(format_version=99))
    line = rank_error(tmp_path, ckpt, capsys)
    assert str(ckpt / "config.json") in line
    assert "format_version 99 is not one this spdrank reads (it reads 1)" in line


# -- adapters -----------------------------------------------------------------------------------


def test_an_adapter_of_an_unknown_peft_type_is_one_line(tmp_path, lora_checkpoint, capsys):
    ckpt = copy_checkpoint(lora_checkpoint, tmp_path / "ckpt")
    adapter_config = ckpt / "adapter" / "adapter_config.json"
    edit_config(adapter_config, lambda c: c.update(peft_type="NO_SUCH_TYPE"))
    line = rank_error(tmp_path, ckpt, capsys)
    assert str(adapter_config) in line and "'NO_SUCH_TYPE' is no LoRA adapter" in line


def test_an_adapter_whose_rank_differs_from_the_config_is_one_line(tmp_path, lora_checkpoint,
                                                                  capsys):
    ckpt = copy_checkpoint(lora_checkpoint, tmp_path / "ckpt")
    adapter_config = ckpt / "adapter" / "adapter_config.json"
    edit_config(adapter_config, lambda c: c.update(r=8))
    line = rank_error(tmp_path, ckpt, capsys)
    assert str(adapter_config) in line and "r is 8, but the checkpoint's config.json says 4" in line


def test_adapter_weights_of_another_rank_are_one_line(tmp_path, lora_checkpoint, capsys):
    """Both configs say r 8; the weights are r 4 (the 51-line size mismatch of peft)."""
    ckpt = copy_checkpoint(lora_checkpoint, tmp_path / "ckpt")
    edit_config(ckpt / "adapter" / "adapter_config.json", lambda c: c.update(r=8))
    edit_config(ckpt / "config.json", lambda c: c["backbone"]["lora"].update(r=8))
    line = rank_error(tmp_path, ckpt, capsys)
    weights = ckpt / "adapter" / "adapter_model.safetensors"
    assert str(weights) in line and "do not fit" in line


def test_adapter_weights_under_other_names_are_refused_not_ignored(tmp_path, lora_checkpoint,
                                                                  capsys):
    ckpt = copy_checkpoint(lora_checkpoint, tmp_path / "ckpt")
    weights = ckpt / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    save_file({f"renamed.{k}": v for k, v in tensors.items()}, str(weights))
    assert "do not fit" in rank_error(tmp_path, ckpt, capsys)


def test_a_lora_checkpoint_still_loads_to_the_same_scores(tmp_path, tiny_backbone):
    """The adapter is rebuilt from spdrank's settings, its weights read: the trained adapter's
    scores come back exactly."""
    import random

    import numpy as np
    import torch

    from tests.helpers import make_slate

    model = SPDRanker.build(tiny_config(tiny_backbone))
    with torch.no_grad():  # a trained adapter: nonzero B, so the adapter changes the states
        for name, param in model.backbone.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    slate = make_slate(random.Random(0), 5)
    model.eval()
    before = model.score_matrix(slate)
    model.save_pretrained(tmp_path / "ckpt")
    again = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(again.score_matrix(slate), before, rtol=1e-5, atol=1e-6)
    assert any(p.requires_grad for n, p in again.backbone.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("field,value,phrase", [
    ("max_item_tokens", 1e9, "prompt.max_item_tokens must be an integer"),
    ("max_query_tokens", 10**12, "prompt.max_query_tokens must be between 1 and"),
])
def test_token_budgets_are_bounded(tmp_path, features_model, capsys, field, value, phrase):
    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    edit_config(ckpt / "config.json", lambda c: c["prompt"].update({field: value}))
    assert phrase in rank_error(tmp_path, ckpt, capsys)


@pytest.mark.parametrize("edit,phrase", [
    (lambda c: c.update(decoder={"a": 1}), "decoder must be a decoder's name"),
    (lambda c: c.update(text_fields="title"), "text_fields must be a list of field names"),
    (lambda c: c["head"].update(width=18, heads=4), "must be a multiple of head.heads"),
    (lambda c: c["features"].update(mean=["x", 0.5]), "mean and std must be finite numbers"),
    (lambda c: c["features"].update(std=[1.0]), "one of each per name"),
    (lambda c: c["features"].update(std=[0.0, 1.0]), "every std must be positive"),
])
def test_what_the_fuzz_search_found_is_one_line(tmp_path, features_model, capsys, edit, phrase):
    """Each once reached a TypeError, an AssertionError or a numpy error past loading."""
    ckpt = copy_checkpoint(features_model, tmp_path / "ckpt")
    edit_config(ckpt / "config.json", edit)
    assert phrase in rank_error(tmp_path, ckpt, capsys)
