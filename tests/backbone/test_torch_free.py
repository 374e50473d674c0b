"""Reading a backbone's settings and a checkpoint's whole config, and importing the checks, the
packaged backbones' table and the checkpoint module (its file names, finding a run's model),
load no torch: a command reads a checkpoint's config.json before it pays for torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MODULES = ["spdrank.backbone.settings", "spdrank.backbone.trust", "spdrank.backbone.locate",
           "spdrank.backbone.gguf", "spdrank.methods.head_config",
           "spdrank.methods.spd.history_settings", "spdrank.model.config",
           "spdrank.model.checkpoint"]


def assert_runs_without_torch(code: str) -> None:
    """``code`` runs in a fresh interpreter, and torch is not imported when it ends."""
    code += "\nimport sys\nassert 'torch' not in sys.modules, 'torch was imported'\nprint('done')\n"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_no_torch(module):
    assert_runs_without_torch(f"import {module}")


def test_a_checkpoint_backbone_config_is_read_and_checked_without_torch(tmp_path):
    """A checkpoint's backbone settings, read from its config.json with every size checked, in
    a process that never imports torch."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"backbone": {
        "name_or_path": "bundled", "layers": 2, "dtype": "auto",
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
    }}))
    assert_runs_without_torch(
        "from spdrank.backbone.settings import BackboneConfig, read_json\n"
        f"backbone = BackboneConfig.from_dict(read_json({str(config)!r})['backbone'])\n"
        "assert backbone.layers == 2 and backbone.lora.r == 4, backbone\n"
    )


def test_a_checkpoint_config_is_read_and_checked_without_torch():
    """The whole record a checkpoint saves (backbone, head, prompt, decoder), written and read
    back with every field checked, in a process that never imports torch."""
    assert_runs_without_torch(
        "from spdrank.model.config import SPDConfig\n"
        "from spdrank.methods.head_config import HeadConfig\n"
        "from spdrank.methods.spd.history_settings import HistorySettings\n"
        "history = HistorySettings(match='tfidf')\n"
        "config = SPDConfig(head=HeadConfig(kind='history', positions=20, history=history))\n"
        "again = SPDConfig.from_dict(config.to_dict())\n"
        "assert again == config, again\n"
    )
