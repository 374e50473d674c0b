"""Fixtures of the benchmark tests."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="session")
def run() -> Iterator[ModuleType]:
    """benchmarks/run.py, the experiment runner, as a module."""
    with pytest.MonkeyPatch.context() as patch:
        yield load_benchmark("run", patch)
