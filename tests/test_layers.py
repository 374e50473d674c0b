"""The package's layers, read from its source: each folder imports only the folders below it,
no modules import each other in a circle, and no folder imports another's private names.

Every import counts: at module level, inside a function (how a circle hides at run time) and
under ``if TYPE_CHECKING:``, since a type annotation naming a module above is the same
dependency on paper: code written against the layer above it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "spdrank"

#: Top to bottom: a folder may import its own modules and those of any folder on a lower row;
#: folders on one row are independent of each other. ``spdrank/__init__.py`` (the lazy
#: ``SPDRanker``) and ``__main__`` sit above them all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("commands",),
    ("serving", "compare"),
    ("training",),
    ("teacher",),
    ("datasets",),
    ("rankers",),
    ("model",),
    ("methods",),
    ("backbone",),
    ("eval",),
    ("core",),
)
TOP = ("__init__", "__main__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports, at run time or for its types."""
    found: set[str] = set()

    def add(target: str) -> None:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != name and target != "spdrank":
            found.add(target)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("spdrank."):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base == "spdrank" or base.startswith("spdrank."):
                for alias in node.names:
                    add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _row(folder: str) -> int:
    if folder in TOP:
        return -1
    for row, folders in enumerate(LAYERS):
        if folder in folders:
            return row
    raise AssertionError(f"spdrank/{folder} is in no layer: add it to LAYERS in {__file__}")


def test_every_folder_is_in_a_layer() -> None:
    for module in _modules():
        _row(_folder(module))


def test_folders_import_only_the_layers_below() -> None:
    wrong = []
    for module, imported in sorted(_graph().items()):
        here = _folder(module)
        for target in sorted(imported):
            there = _folder(target)
            if there != here and _row(there) <= _row(here):
                wrong.append(f"{module} imports {target} ({there} is not below {here})")
    assert not wrong, "\n".join(wrong)


def _private(name: str) -> bool:
    """A name its module keeps to itself: one leading underscore (a dunder is public)."""
    return name.startswith("_") and not name.startswith("__")


def test_no_folder_imports_another_folders_private_names() -> None:
    """What a folder offers the others is its public names: a private one (``_name``, or any
    name of a ``_module``) imported across folders is a part of its inside the other relies
    on, free to change under it."""
    wrong = []
    for module, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            source = node.module if isinstance(node, ast.ImportFrom) else None
            if not source or not source.startswith("spdrank.") or node.level:
                continue
            if _folder(source) == _folder(module):
                continue
            private = [a.name for a in node.names
                       if _private(a.name) or any(_private(p) for p in source.split("."))]
            wrong += [f"{module} imports {source}.{name}" for name in private]
    assert not wrong, "\n".join(wrong)


def test_private_imports_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above reads an import of another folder's private name as one."""
    package = tmp_path / "spdrank"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
    (package / "low" / "parts.py").write_text("def _inside():\n    pass\n")
    (package / "high" / "use.py").write_text(
        "def f():\n    from spdrank.low.parts import _inside\n")
    (package / "high" / "same.py").write_text("from spdrank.high.use import _within\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    with pytest.raises(AssertionError) as caught:
        test_no_folder_imports_another_folders_private_names()
    found = str(caught.value)
    assert found.splitlines()[0] == "spdrank.high.use imports spdrank.low.parts._inside"
    assert "high.same" not in found  # a folder's private names are its own modules' to share


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_circles() -> None:
    circles = _cycles(_graph())
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_cycles_are_found(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


def test_imports_are_read_as_python_runs_them(tmp_path: Path) -> None:
    """A function-level import counts, and so does one under TYPE_CHECKING."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from spdrank.core import slates\n"
        "if TYPE_CHECKING:\n    from spdrank.model.ranker import SPDRanker\n"
        "def f():\n    from spdrank.methods.spd.decode import decode\n"
    )
    modules = _modules()
    assert _imported("spdrank.core.probe", source, modules) == {
        "spdrank.core.slates", "spdrank.model.ranker", "spdrank.methods.spd.decode"
    }
