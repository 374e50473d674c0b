"""docs/own-data.md, run: every command of its ``bash`` blocks and its Python block, in order,
on the generated example, so the walkthrough cannot drift from what spdrank does.

Commands run in-process in a temporary directory (``spdrank ...`` through the CLI's
``main``); ``spdrank serve`` builds its app, and the page's ``curl`` request is sent to it
through FastAPI's TestClient instead of a port; ``python -c`` and the Python block run in a
fresh interpreter. The ``sh`` block (training with the LLM, a
minute) is shown on the page but not run here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from spdrank.commands.cli import main
from tests.helpers import ROOT, subprocess_env

DOC = ROOT / "docs" / "own-data.md"


def blocks(text: str, lang: str) -> list[str]:
    """The contents of the page's fenced blocks of ``lang``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def commands(block: str) -> list[str]:
    """One command per logical line: backslash continuations joined."""
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def example_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "own_data_example", ROOT / "benchmarks" / "own_data_example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def python(code: str, stdin: str = "") -> str:
    """What ``python -c CODE`` prints, run here with this checkout's spdrank."""
    done = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                          text=True, env=subprocess_env(), check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Shell:
    """Runs the page's commands; knows exactly the ones the page uses."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
        self.capsys = capsys
        self.monkeypatch = monkeypatch
        self.app = None
        self.outputs: list[str] = []

    def run(self, command: str) -> None:
        argv = shlex.split(command.removesuffix("&"))
        if argv[:2] == ["python", "benchmarks/own_data_example.py"]:
            assert example_module().main(argv[2:]) == 0
        elif argv[:2] == ["spdrank", "serve"]:
            self.serve(argv[1:])
        elif argv[0] == "spdrank":
            assert main(argv[1:]) == 0, command
        elif argv[0] == "cmp":
            assert Path(argv[1]).read_bytes() == Path(argv[2]).read_bytes(), command
        elif argv[0] == "sleep":
            return
        elif argv[:3] == ["head", "-n", "1"] and "curl" in argv:
            self.request(argv)
        else:
            raise AssertionError(f"docs/own-data.md runs a command this test does not know: "
                                 f"{command}")
        self.outputs.append(self.capsys.readouterr().out)

    def serve(self, argv: list[str]) -> None:
        """``spdrank serve`` up to the port: the app is kept for the requests that follow."""
        import uvicorn

        def keep(app, **kwargs) -> None:
            self.app = app

        self.monkeypatch.setattr(uvicorn, "run", keep)
        assert main(argv) == 0

    def request(self, argv: list[str]) -> None:
        """``head -n 1 FILE | curl ... URL ... -d @- | python -c CODE``, through TestClient."""
        from fastapi.testclient import TestClient

        body = Path(argv[3]).read_text(encoding="utf-8").splitlines()[0]
        url = next(a for a in argv if a.startswith("localhost:"))
        code = argv[argv.index("-c") + 1]
        assert self.app is not None, "the page sends a request before starting the server"
        with TestClient(self.app) as client:
            answer = client.post(url.split(":8000", 1)[1], content=body,
                                 headers={"content-type": "application/json"})
        assert answer.status_code == 200, answer.text
        print(python(code, stdin=answer.text), end="")


@pytest.mark.slow  # every command of the page, builds and trainings included
def test_the_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    text = DOC.read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    shell = Shell(capsys, monkeypatch)
    for block in blocks(text, "bash"):
        for command in commands(block):
            shell.run(command)
    (code,) = blocks(text, "python")
    ranked, indices = python(code).splitlines()

    # What the page shows: the builds' summaries, the served ranking, the Python answer.
    built = [out for out in shell.outputs if out.startswith("275 train + 68 eval slates")]
    assert len(built) == 3
    for out in (built[0], built[2]):
        for line in out.splitlines():
            assert line in text, line
    served = next(out for out in shell.outputs if out.startswith("['"))
    assert served.strip() in text
    assert f"print(ranking.docids)   # {ranked}" in text
    assert f"print(ranking.indices)  # {indices}: positions" in text

    # And what the page says about them.
    lines = Path("own-data/slates-retrieved/eval.jsonl").read_text(encoding="utf-8").splitlines()
    retrieved = [json.loads(line) for line in lines]
    missed = [s for s in retrieved if "clicked_not_retrieved" in s]
    assert f"{len(missed)} of the {len(retrieved)} eval slates lost their target" in text
    assert all(s["clicked"] == [] for s in missed)
    summary = json.loads(Path("own-data/run/train.json").read_text())
    assert summary["warmup_steps"] == 8 and summary["eval_slates"] == 68
