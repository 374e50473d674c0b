"""benchmarks/own_data_times.py times docs/own-data.md's own commands: its dry run prints
exactly the page's (bash and sh blocks, but for the server and the byte checks), and a rerun
skips the steps its journal holds."""

from __future__ import annotations

import json
import shlex

from tests.benchmarks.test_own_data import DOC, blocks, commands
from tests.helpers import load_benchmark

#: What the script leaves untimed: the byte checks, and the server with its request.
UNTIMED = ("cmp ", "spdrank serve ", "sleep ", "head -n 1 ")


def page_commands() -> list[list[str]]:
    """The page's commands a user waits for, in its order (``bash`` and ``sh`` blocks), each
    as its argv."""
    text = DOC.read_text(encoding="utf-8")
    ordered = sorted(
        (text.index(block), block) for lang in ("bash", "sh") for block in blocks(text, lang)
    )
    return [shlex.split(c) for _, block in ordered for c in commands(block)
            if not c.startswith(UNTIMED)]


def test_the_dry_run_prints_the_pages_commands(monkeypatch, capsys):
    module = load_benchmark("own_data_times", monkeypatch)
    assert module.main(["--dry-run"]) == 0
    printed = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == page_commands()


def test_a_larger_log_changes_only_the_example(monkeypatch):
    module = load_benchmark("own_data_times", monkeypatch)
    small, large = module.steps(), module.steps(2900)
    assert large[0].command == small[0].command + " --users 2900"
    assert [s.command for s in large[1:]] == [s.command for s in small[1:]]


def test_a_rerun_skips_the_steps_its_journal_holds(tmp_path, monkeypatch):
    module = load_benchmark("own_data_times", monkeypatch)
    plan = module.steps()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "01.log").write_text("1,989 train + 497 eval slates, 20.0 candidates\n")
    records = [{"step": s.name, "command": s.command, "users": 400, "seconds": 1.5,
                "date": "2026-12-04T11:23Z", "load_after": "0.50 0.40 0.30"} for s in plan]
    records[3]["command"] += " --changed"  # a step whose command changed reruns
    records[5]["users"] = 2900  # and one timed at another size
    (tmp_path / "times.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records) + '{"step": "torn'
    )
    ran = []
    monkeypatch.setattr(module, "run_step", lambda step, workdir, log: ran.append(step) or 2.0)
    out = tmp_path / "out"
    assert module.main(["--workdir", str(tmp_path), "--out", str(out)]) == 0
    assert ran == [plan[3], plan[5]]
    report = (out / "report.md").read_text()
    assert "400 users (1,989 train + 497 eval slates)" in report  # the count's comma kept
    assert "| 0.50 0.40 0.30 |" in report  # each step's load as its journal recorded it
    assert "steps run 2026-12-04T11:23Z to " in report
    assert f"| all of them | {1.5 * (len(plan) - 2) + 4.0:.1f} |" in report
    assert len(json.loads((out / "times.json").read_text())) == len(plan)
