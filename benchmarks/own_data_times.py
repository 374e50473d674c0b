"""How long each step of docs/own-data.md takes, on this machine, at the page's sizes or a
larger log of the same shape.

    .venv/bin/python benchmarks/own_data_times.py [--users 400] [--note "what else ran"] \\
        [--workdir runs/own-data-times] [--out DIR] [--dry-run]

Runs the page's commands in order (its ``bash`` blocks and the ``sh`` blocks a test cannot run:
the LLM student's training and evaluation), each timed on its own, in ``--workdir`` (the
commands' relative ``own-data/...`` paths are under it). ``--users`` is the generated log's
size (the page's: 400 users, 275 training slates; about 2,900 users make 2,000 training slates);
every other command is the page's as written. Not timed: the ``cmp`` checks, and ``spdrank
serve`` with its request (a server, started once).

Resumable: each finished step is appended to ``times.jsonl`` in ``--workdir`` with its command;
a rerun skips the steps recorded with the same command and ``--users``, and reruns any other
from scratch (its outputs removed first), so a killed run loses only the step it was in. The
bundled backbone's one-time conversion into spdrank's cache is not a step: run anything that
loads it once before, or it lands in the first LLM step.

Writes ``report.md`` (a table of each step's seconds), ``times.json`` and ``command.txt`` to
``--out`` (default ``benchmarks/results/own-data-times-cpu/users-N``), with the machine, date,
commit and what else ran (``--note``, and the load average after each step). ``--dry-run``
prints the commands, one a line, and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from machine import load, machine

ROOT = Path(__file__).resolve().parent.parent
#: The page's generated log: 400 users.
DOC_USERS = 400
FEATURES = "score,popularity,cooccurrence,transition,title_similarity"
BUILD = ("spdrank data sequences --sequences own-data/log.inter --titles own-data/log.item "
         "--candidate-file own-data/candidates.txt --candidates 20 --eval-fraction 0.2 --features")
TRAIN = ("spdrank train --slates own-data/labels/train.labels.slates.jsonl "
         "--eval-slates own-data/labels/eval.labels.slates.jsonl")
SHAPE = "--positions 20 --epochs 4 --batch-size 16 --no-progress"
EVAL = ("spdrank eval --slates own-data/labels/eval.labels.slates.jsonl "
        "--train own-data/slates/train.jsonl")
RETRIEVED = "spdrank eval --slates own-data/slates-retrieved/eval.jsonl"


@dataclass(frozen=True)
class Step:
    """One command of the page, what the table calls it, and what it writes (removed before a
    rerun, so a step interrupted half-way starts clean)."""

    name: str
    command: str
    outputs: tuple[str, ...] = ()


def steps(users: int = DOC_USERS) -> list[Step]:
    """docs/own-data.md's commands in its order, the example's log at ``users`` users."""
    example = "python benchmarks/own_data_example.py --out own-data"
    if users != DOC_USERS:
        example += f" --users {users}"
    return [
        Step("0. generate the example log", example, ("own-data",)),
        Step("1. build slates (RecBole files)", f"{BUILD} --no-progress --out own-data/slates",
             ("own-data/slates",)),
        Step("1. build slates (plain files)",
             "spdrank data sequences --sequences own-data/sequences.txt --titles "
             "own-data/titles.tsv --candidate-file own-data/candidates.txt --candidates 20 "
             "--eval-fraction 0.2 --features --no-progress --out own-data/slates-plain",
             ("own-data/slates-plain",)),
        Step("1. build slates without inserted targets",
             f"{BUILD} --no-insert-target --no-progress --out own-data/slates-retrieved",
             ("own-data/slates-retrieved",)),
        Step("2. teacher labels, training slates",
             "spdrank teacher --slates own-data/slates/train.jsonl --backend ranker:cooccurrence "
             "--out own-data/labels/train.labels.jsonl --no-progress",
             ("own-data/labels/train.labels.jsonl", "own-data/labels/train.labels.slates.jsonl")),
        Step("2. teacher labels, eval slates",
             "spdrank teacher --slates own-data/slates/eval.jsonl --backend ranker:cooccurrence "
             "--out own-data/labels/eval.labels.jsonl --no-progress",
             ("own-data/labels/eval.labels.jsonl", "own-data/labels/eval.labels.slates.jsonl")),
        Step("3. features-only student, clicks (the bar)",
             f"{TRAIN} --target clicks --features {FEATURES} --features-only {SHAPE} "
             "--out own-data/run-clicks", ("own-data/run-clicks",)),
        Step("3. features-only student, teacher+clicks",
             f"{TRAIN} --target teacher+clicks --features {FEATURES} --features-only {SHAPE} "
             "--out own-data/run", ("own-data/run",)),
        Step("3. LLM student (state cache + head)",
             f"{TRAIN} --target teacher+clicks --features {FEATURES} --backbone bundled "
             "--layers 2 --frozen --readout mean --cache-states own-data/states "
             f"{SHAPE} --out own-data/run-llm", ("own-data/states", "own-data/run-llm")),
        Step("4. eval: baselines and the features students",
             f"{EVAL} --model spd=own-data/run --model spd-clicks=own-data/run-clicks "
             "--ranker popularity --ranker cooccurrence --ranker feature:score --ranker "
             "title_similarity --k 1,5,10 --no-progress"),
        Step("4. eval: slates without inserted targets, against the bar",
             f"{RETRIEVED} --model spd=own-data/run --model spd-clicks=own-data/run-clicks "
             "--ranker popularity --ranker cooccurrence --ranker feature:score "
             "--reference spd-clicks --k 1,5,10 --no-progress"),
        Step("4. eval: the LLM student against the bar",
             f"{RETRIEVED} --model spd-llm=own-data/run-llm --model spd-clicks=own-data/run-clicks "
             "--reference spd-clicks --k 1,5,10 --no-progress"),
    ]


def argv_of(command: str) -> list[str]:
    """``command`` as run here: ``spdrank`` and ``python`` from this interpreter's venv, a
    ``benchmarks/`` script from this checkout."""
    argv = shlex.split(command)
    if argv[0] == "spdrank":
        argv[0] = str(Path(sys.executable).with_name("spdrank"))
    elif argv[0] == "python":
        argv[0] = sys.executable
        argv[1] = str(ROOT / argv[1])
    return argv


def journal(path: Path) -> dict[str, dict[str, object]]:
    """The steps a previous run finished, by name (a torn last line, from a kill, ignored)."""
    done: dict[str, dict[str, object]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[record["step"]] = record
    return done


def run_step(step: Step, workdir: Path, log: Path) -> float:
    """Run one step from scratch, its output to ``log``; its wall seconds."""
    for output in step.outputs:
        target = workdir / output
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    with log.open("w", encoding="utf-8") as out:
        t0 = time.perf_counter()
        done = subprocess.run(argv_of(step.command), cwd=workdir, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
        seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{step.name} failed (exit {done.returncode}); see {log}")
    return seconds


def slate_counts(workdir: Path) -> str:
    """``N train + M eval slates`` as the first build printed it."""
    for line in (workdir / "logs" / "01.log").read_text(encoding="utf-8").splitlines():
        if " train + " in line and "slates" in line:
            return line.split(", ")[0]  # "1,989 train + 497 eval slates, 20.0 candidates ..."
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=DOC_USERS)
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "own-data-times")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    plan = steps(args.users)
    if args.dry_run:
        for step in plan:
            print(step.command)
        return 0
    out = args.out or ROOT / "benchmarks" / "results" / "own-data-times-cpu" / f"users-{args.users}"
    workdir = args.workdir
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    path = workdir / "times.jsonl"
    done = journal(path)
    for index, step in enumerate(plan):
        record = done.get(step.name)
        if (record is not None and record["command"] == step.command
                and record.get("users") == args.users):
            print(f"{step.name}: {record['seconds']:.1f} s (a previous run's)", flush=True)
            continue
        seconds = run_step(step, workdir, workdir / "logs" / f"{index:02d}.log")
        record = {"step": step.name, "command": step.command, "users": args.users,
                  "seconds": round(seconds, 1),
                  "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                  "load_after": load()}
        with path.open("a", encoding="utf-8") as journal_file:
            journal_file.write(json.dumps(record) + "\n")
            journal_file.flush()
            os.fsync(journal_file.fileno())
        done[step.name] = record
        print(f"{step.name}: {seconds:.1f} s", flush=True)

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    records = [done[step.name] for step in plan]
    total = sum(float(r["seconds"]) for r in records)
    dates = [r["date"] for r in records if "date" in r]
    lines = [
        "# How long each step of docs/own-data.md takes (CPU)",
        "",
        ("Command: see [command.txt](command.txt); the commands are docs/own-data.md's, the "
        f"example log at {args.users} users ({slate_counts(workdir)})."),
        "",
        (f"- steps run {min(dates, default='?')} to {max(dates, default='?')}; "
         f"report written at commit {commit}"),
        f"- machine: {machine()}; nice {os.nice(0)}",
        f"- also running: {args.note or 'not noted'}; the load average after each step is its row's",
        "",
        "| step | seconds | load average after | command |",
        "|---|---|---|---|",
        *(f"| {r['step']} | {float(r['seconds']):.1f} | {r.get('load_after', '')} | "
          f"`{r['command']}` |" for r in records),
        f"| all of them | {total:.1f} | | |",
    ]
    out.mkdir(parents=True, exist_ok=True)
    passed = list(argv if argv is not None else sys.argv[1:])
    (out / "command.txt").write_text(
        f"nice -n {os.nice(0)} .venv/bin/python benchmarks/own_data_times.py "
        f"{shlex.join(passed)}\n", encoding="utf-8")
    (out / "times.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
