"""Every name a benchmark script imports from spdrank exists: the scripts run for hours on
machines that are lent for minutes, so a name moved in the package must fail here, not there.
Python scripts are read with ``ast`` (module level and inside functions); shell scripts by their
``python -c 'from spdrank... import ...'`` lines."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"
SHELL_IMPORT = re.compile(r"from (spdrank(?:\.\w+)*) import ([\w, ]+?)(?: as \w+)?[;'\"]")


def imports() -> list[tuple[str, str, str]]:
    """(script, module, name) for each name a benchmark script imports from spdrank."""
    found = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spdrank"):
                found += [(path.name, node.module, alias.name) for alias in node.names]
    for path in sorted(BENCHMARKS.glob("*.sh")):
        for module, names in SHELL_IMPORT.findall(path.read_text()):
            found += [(path.name, module, name.strip()) for name in names.split(",")]
    return found


def test_the_scripts_import_something_from_spdrank():
    scripts = {script for script, _, _ in imports()}
    assert "offline_bundle.sh" in scripts and "train_profile.py" in scripts


@pytest.mark.parametrize(("script", "module", "name"), imports())
def test_every_name_a_benchmark_imports_from_spdrank_exists(script, module, name):
    assert hasattr(importlib.import_module(module), name), f"{script}: {module}.{name}"
