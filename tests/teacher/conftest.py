"""The slates file the HTTP teacher tests label, with the proxy variables unset so that their
requests reach the fakes on loopback and no proxy the machine names."""

from __future__ import annotations

from pathlib import Path

import pytest

from spdrank.core.slates import write_slates
from tests.helpers import make_slates


@pytest.fixture
def slates_file(tmp_path, monkeypatch) -> Path:
    """Six item slates (seed 3) as ``tmp_path/slates.jsonl``."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    write_slates(tmp_path / "slates.jsonl", make_slates(6, seed=3))
    return tmp_path / "slates.jsonl"
