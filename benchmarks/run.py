"""One runner for every experiment: each is a declarative TOML file in benchmarks/experiments/.

    .venv/bin/python benchmarks/run.py benchmarks/experiments/NAME.toml [--set NAME=VALUE ...]
        [--out DIR] [--load TEXT] [--dry-run]

An experiment file names its settings, the commands it runs and the sections of its report.
The runner runs the commands in order, from the first whose output is missing (so a rerun resumes
where the last one stopped), logs every command to OUT/command.txt, and writes OUT/results.json
and OUT/report.md, whose first line is the one command that re-creates them. ``--dry-run``
prints the commands and runs nothing.

The file:

    title = "..."                    # the report's heading
    out = "benchmarks/results/NAME"  # where command.txt, results.json and report.md go
    about = "..."                    # the report's opening paragraph, markdown
    include = ["part.toml"]          # files whose settings and steps come first

    [settings]                       # the names the templates read, in order; --set overrides
    work = "data-out/NAME"           # a setting may read the settings above it: "{work}/runs"
    extra = []                       # a list: arguments, --set extra='["--flag", "value"]'
                                     # ("{extra}" in a command splices it in)

    [[step]]                         # a command, or one per row of `for`
    for = {set = ["dl19", "dl21"]}   # rows: the product of these lists (or of list settings,
                                     # "{name}"; a table member gives its fields), or a list
                                     # of tables
    run = ["spdrank", "data", "search", "--out", "{work}/{set}.jsonl"]
    done = "{work}/{set}.jsonl"      # the output whose presence marks the step done
    stdout = "{out}/table.txt"       # where the command's printout goes (and done, if unset)

    [[section]]                      # a table: a row per ranker of an eval's --per-slate file
    title = "{test} ({queries} queries)"
    rows = "{out}/{test}.rows.jsonl"
    metrics = ["nDCG@10", "AP(rel=2)"]               # each row's mean over the queries
    against = {retriever = "BM25"}   # paired 95% intervals of the first metric, row - this row
    names = {retriever = "BM25 (the first stage)"}   # how the table names a ranker

    [[section]]                      # a list: a line per item, formatted from a JSON file
    title = "What training chose"
    facts = [{label = "student", file = "{work}/run/train.json", text = "{verdict}"}]
                                     # (a fact may have a `for` of its own: a line per row)

    [[section]]                      # a file a command wrote: text in a code block
    text = "{out}/table.txt"         # (markdown = "...": inline)

    [[section]]                      # two rows of a --per-slate file on slices of the slates
    per_slate = "{out}/eval.rows.jsonl"
    slates = "{work}/eval.jsonl"     # what each slice reads
    pair = ["llm", "features"]       # the first metric of each, and their paired difference
    slices = [{label = "history of 1-3 items", by = "history", low = 1, high = 3},
              {label = "rare next items", by = "clicked:popularity", count = true, high = 5}]

Every string is a Python format string over the settings, ``out`` and the row of ``for``
(``{anchor[name]}`` reads into a JSON object; a ``.jsonl`` file's first line is read). An
argument that is exactly ``{name}`` of a list is spliced in, filled there, so a row of ``for``
can carry flags or a whole command; ``{each = "NAME", as = "X", args = [...]}`` in a command
gives ``args`` once per member X of the list NAME. ``spdrank`` and ``python`` run from this
interpreter's environment; commands run from the repository, where relative paths start.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, which spdrank supports: tomli is tomllib's backport
    import tomli as tomllib

from machine import ROOT, code_version, fmt, machine, shown

from spdrank.core.files import atomic_writer

Values = dict[str, Any]


class ExperimentError(ValueError):
    """An experiment file that cannot be run: names the file and the place in it."""


def named_list(item: Any, values: Values) -> list[Any] | None:
    """The list an item names when it is exactly ``{name}`` of a list, else None."""
    if isinstance(item, str) and item.startswith("{") and item.endswith("}"):
        found = values.get(item[1:-1])
        return found if isinstance(found, list) else None
    return None


def fill(template: Any, values: Values, where: str) -> Any:
    """``template`` with its ``{name}`` fields filled from ``values``, lists and tables member
    by member, a list's ``{name}`` items and ``each`` tables spliced in as the docstring says."""
    if isinstance(template, list):
        out: list[Any] = []
        for item in template:
            spliced = named_list(item, values)
            if spliced is not None:
                out += fill(spliced, values, where)
            elif isinstance(item, dict) and "each" in item:
                members = named_list(f"{{{item['each']}}}", values)
                if members is None or not isinstance(item.get("args"), list):
                    raise ExperimentError(f"{where}: 'each' names a list setting and 'args' "
                                          f"is a list: {item!r}")
                for member in members:
                    out += fill(item["args"], {**values, item.get("as", "item"): member}, where)
            else:
                out.append(fill(item, values, where))
        return out
    if isinstance(template, dict):
        return {key: fill(value, values, where) for key, value in template.items()}
    if not isinstance(template, str):
        return template
    named = named_list(template, values)
    if named is not None:  # a row's or a table's "{name}" of a list is that list
        return fill(named, values, where)
    try:
        return template.format_map(values)
    except (KeyError, IndexError, AttributeError, ValueError) as err:
        raise ExperimentError(f"{where}: cannot fill {template!r}: {err!r} (the names known "
                              f"there: {', '.join(sorted(values))})") from None


def resolved(value: Any, values: Values, where: str) -> Any:
    """A setting's or a row's value as the templates read it: a string filled, a list (or the
    ``{name}`` of one) kept whole, filled where it is spliced, so it may name what a row gives."""
    if isinstance(value, list):
        return value
    named = named_list(value, values)
    return named if named is not None else fill(value, values, where)


def with_row(values: Values, row: Values, where: str) -> Values:
    """``values`` with a row of ``for`` added, each field :func:`resolved`."""
    return {**values, **{key: resolved(value, values, where) for key, value in row.items()}}


def rows_of(section: Values, values: Values, where: str) -> Iterator[Values]:
    """The rows of a section's ``for`` (as the docstring says), or one empty row without it."""
    matrix = section.get("for")
    if matrix is None:
        yield {}
        return
    if isinstance(matrix, list) and all(isinstance(row, dict) for row in matrix):
        yield from matrix
        return
    if isinstance(matrix, dict):
        lists = {k: v if isinstance(v, list) else named_list(v, values) for k, v in matrix.items()}
        if all(v is not None for v in lists.values()):
            for combo in itertools.product(*lists.values()):
                row: Values = {}
                for key, member in zip(lists, combo, strict=True):
                    row |= member if isinstance(member, dict) else {key: member}
                yield row
            return
    raise ExperimentError(f"{where}: 'for' is a table of lists (or of list settings' "
                          "{names}) or a list of tables")


def overridden(name: str, default: Any, text: str) -> Any:
    """A ``--set`` value, of its default's kind: a list of arguments is written as TOML's
    ``["--flag", "value"]``, anything else is the text as given."""
    if not isinstance(default, list):
        return text
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = None
    if not isinstance(value, list):
        raise ExperimentError(f"--set {name}: a list of arguments, as "
                              f'\'["--flag", "value"]\' (an empty one: \'[]\'), not {text!r}')
    return value


@dataclass(frozen=True)
class Command:
    """One command of an experiment: its arguments, the output whose presence marks it done
    (None: it always runs), and the file its standard output goes to (None: the terminal)."""

    argv: list[str]
    done: Path | None
    stdout: Path | None

    def line(self) -> str:
        """The command as a shell reads it back."""
        line = shlex.join(self.argv)
        return f"{line} > {shlex.quote(shown(self.stdout))}" if self.stdout else line


def read_toml(path: Path) -> Values:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ExperimentError(f"{path}: {err}") from None


class Experiment:
    """An experiment file read and its settings resolved, ready to run or to report."""

    def __init__(self, path: Path, overrides: dict[str, str], out: Path | None = None) -> None:
        self.path = path
        spec = read_toml(path)
        for key in ("title", "out"):
            if not isinstance(spec.get(key), str):
                raise ExperimentError(f"{path}: needs '{key}', a string")
        settings, steps = {}, []
        for name in spec.get("include", []):  # shared steps, run before the file's own
            part = read_toml(path.parent / name)
            settings |= part.get("settings", {})
            steps += part.get("step", [])
        settings |= spec.get("settings", {})
        unknown = sorted(set(overrides) - set(settings))
        if unknown:
            raise ExperimentError(f"--set {unknown[0]}: {path} has no such setting (its "
                                  f"settings: {', '.join(settings) or 'none'})")
        self.values: Values = {}
        for name, value in settings.items():
            if name in overrides:
                value = overridden(name, value, overrides[name])
            self.values[name] = resolved(value, self.values, f"{path}: settings.{name}")
        self.overrides = overrides
        self.title: str = fill(spec["title"], self.values, f"{path}: title")
        self.out = out or Path(fill(spec["out"], self.values, f"{path}: out"))
        self.out_given = out is not None
        self.values["out"] = str(self.out)
        self.about: str = spec.get("about", "")
        self.steps: list[Values] = steps + spec.get("step", [])
        self.sections: list[Values] = spec.get("section", [])

    def commands(self) -> Iterator[Command]:
        """Each command of the experiment, in order."""
        for i, step in enumerate(self.steps, 1):
            where = f"{self.path}: step {i}"
            if not isinstance(step.get("run"), list) or not step["run"]:
                raise ExperimentError(f"{where}: needs 'run', a command as a list of strings")
            for row in rows_of(step, self.values, where):
                values = with_row(self.values, row, where)
                stdout = step.get("stdout")
                stdout = ROOT / fill(stdout, values, where) if stdout else None
                done = step.get("done")
                yield Command(fill(step["run"], values, where),
                              ROOT / fill(done, values, where) if done else stdout, stdout)

    def command_line(self) -> str:
        """The one command that re-creates the report."""
        sets = [f"--set {shlex.quote(f'{k}={v}')}" for k, v in self.overrides.items()]
        if self.out_given:
            sets.append(f"--out {shlex.quote(str(self.out))}")
        return " ".join([".venv/bin/python benchmarks/run.py", shown(self.path), *sets])


def execute(command: Command) -> None:
    """Run one command from the repository, ``spdrank`` and ``python`` from this interpreter's
    environment; its standard output, when kept, lands in its file only once it succeeds."""
    programs = {"spdrank": Path(sys.executable).parent / "spdrank", "python": sys.executable}
    argv = [str(programs.get(command.argv[0], command.argv[0])), *command.argv[1:]]
    if command.stdout is None:
        subprocess.run(argv, check=True, cwd=ROOT)
        return
    with atomic_writer(command.stdout) as fh:
        subprocess.run(argv, check=True, cwd=ROOT, stdout=fh)


def run_steps(experiment: Experiment, dry_run: bool) -> dict[str, float]:
    """Run each command from the first not done on; log them all; the seconds each command
    run took. Every command after one that runs runs too, since it may read what that one
    rewrote: a committed report's outputs never stand for a step whose inputs are new."""
    log, seconds, running = [], {}, False
    for command in experiment.commands():
        line = command.line()
        log.append(line)
        running = running or command.done is None or not command.done.exists()
        print("+" if running else "= (done)", line, flush=True)
        if dry_run or not running:
            continue
        t0 = time.perf_counter()
        execute(command)
        seconds[line] = round(time.perf_counter() - t0, 1)
    if not dry_run:
        (ROOT / experiment.out).mkdir(parents=True, exist_ok=True)
        (ROOT / experiment.out / "command.txt").write_text("\n".join(log) + "\n")
    return seconds


def read_json(path: Path) -> Any:
    """A JSON file, or a JSONL file's first line."""
    text = path.read_text()
    return json.loads(text.splitlines()[0] if path.suffix == ".jsonl" else text)


def per_query(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{ranker: {qid: per-slate row}}`` from an eval's ``--per-slate`` file, rankers in the
    order the file gives them."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    with path.open() as fh:
        for line in fh:
            row = json.loads(line)
            table.setdefault(row["ranker"], {})[str(row["qid"])] = row
    return table


def mean(values: list[Any]) -> float | None:
    defined = [v for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def paired(rows: dict[str, Any], ref: dict[str, Any], metric: str) -> dict[str, Any]:
    """The mean of ``rows - ref`` over the queries both define, with its 95% interval."""
    import numpy as np

    from spdrank.eval.paired import difference_of

    # Sorted by qid, so the bootstrap's resamples do not hang on the file's order.
    diffs = [rows[q][metric] - ref[q][metric] for q in sorted(set(rows) & set(ref))
             if rows[q].get(metric) is not None and ref[q].get(metric) is not None]
    diff = difference_of(np.array(diffs))
    return {"mean": diff.mean, "low": diff.low, "high": diff.high, "n": diff.n}


def summary(section: Values, path: Path) -> dict[str, Any]:
    """Each ranker's means, its paired differences and its median latency."""
    import numpy as np

    table = per_query(path)
    metrics, against = section.get("metrics", ["nDCG@10"]), section.get("against", {})
    out: dict[str, Any] = {}
    for name, rows in table.items():
        entry: dict[str, Any] = {"queries": len(rows)}
        entry |= {m: mean([r.get(m) for r in rows.values()]) for m in metrics}
        entry["ms"] = float(np.median([r["latency_ms"] for r in rows.values()]))
        for ref in against:
            if ref != name and ref in table:
                entry[f"- {ref}"] = paired(rows, table[ref], metrics[0])
        out[name] = entry
    return out


def interval(d: dict[str, Any] | None) -> str:
    if not d or d["mean"] is None:
        return "-"
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def table_lines(section: Values, found: dict[str, Any]) -> list[str]:
    """A markdown table: a row per ranker, its means, paired differences and latency."""
    metrics, against = section.get("metrics", ["nDCG@10"]), section.get("against", {})
    names = section.get("names", {})
    head = ["row", *metrics, *(f"- {label}" for label in against.values()), "ms a query (p50)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, entry in found.items():
        cells = [names.get(name, name), *(fmt(entry[m], ".3f") for m in metrics),
                 *(interval(entry.get(f"- {ref}")) for ref in against), f"{entry['ms']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table_section(section: Values, values: Values, where: str) -> tuple[list[str], Values]:
    rows = summary(section, ROOT / fill(section["rows"], values, where))
    values = {**values, "queries": max((r["queries"] for r in rows.values()), default=0)}
    title = fill(section.get("title", ""), values, where)
    return [f"## {title}", "", *table_lines(section, rows)], {"title": title, "rows": rows}


def facts_section(section: Values, values: Values, where: str) -> tuple[list[str], Values]:
    """A line per fact (one per row of its own ``for``, if it has one), its text formatted
    from a JSON file."""
    facts = {}
    for fact in section["facts"]:
        if not isinstance(fact, dict) or {"label", "file", "text"} - set(fact):
            raise ExperimentError(f"{where}: a fact is a table of label, file, text")
        for row in rows_of(fact, values, where):
            known = with_row(values, row, where)
            data = read_json(ROOT / fill(fact["file"], known, where))
            if not isinstance(data, dict):
                raise ExperimentError(f"{where}: {fact['file']} holds no JSON object")
            facts[fill(fact["label"], known, where)] = fill(fact["text"], {**known, **data},
                                                            where)
    title = fill(section.get("title", ""), values, where)
    return ([f"## {title}", "", *(f"- {k}: {v}" for k, v in facts.items())],
            {"title": title, "facts": facts})


def file_section(section: Values, values: Values, where: str) -> tuple[list[str], Values]:
    """A file a step wrote, as it is: ``text`` in a code block, ``markdown`` inline."""
    kind = "text" if "text" in section else "markdown"
    path = fill(section[kind], values, where)
    content = (ROOT / path).read_text().rstrip("\n")
    title = fill(section.get("title", ""), values, where)
    body = ["```", content, "```"] if kind == "text" else [content]
    return [*([f"## {title}", ""] if title else []), *body], {"title": title, kind: path}


def slice_value(slate: dict[str, Any], by: str, where: str) -> float | None:
    """What a slice reads of one slate (a line of a slates file): ``history``, the length of
    its query's history; ``clicked:NAME``, its clicked candidate's feature NAME (None when it
    has no clicked candidate)."""
    if by == "history":
        return len(slate["query"].get("history") or ())
    if by.startswith("clicked:"):
        clicked = set(slate.get("clicked") or ())
        target = next((c for c in slate["candidates"] if c["docid"] in clicked), None)
        return None if target is None else target["features"][by.removeprefix("clicked:")]
    raise ExperimentError(f"{where}: a slice is by history or clicked:FEATURE, not {by!r}")


def slice_qids(slates: list[dict[str, Any]], spec: Values, where: str) -> set[str]:
    """The qids of the slates in one slice: its value within ``[low, high]`` (either open
    when absent); ``count = true`` reads the feature as the ``log1p`` of a count and compares
    the count."""
    low, high = spec.get("low", -math.inf), spec.get("high", math.inf)
    qids = set()
    for slate in slates:
        value = slice_value(slate, spec["by"], where)
        if value is not None and spec.get("count"):
            value = round(math.expm1(value))
        if value is not None and low <= value <= high:
            qids.add(str(slate["query"]["qid"]))
    return qids


def slices_section(section: Values, values: Values, where: str) -> tuple[list[str], Values]:
    """Two rankers of an eval's ``--per-slate`` file (``pair``) on slices of its slates: the
    first metric's mean of each and their paired difference, a row per slice."""
    table = per_query(ROOT / fill(section["per_slate"], values, where))
    with (ROOT / fill(section["slates"], values, where)).open() as fh:
        slates = [json.loads(line) for line in fh if line.strip()]
    metric, names = section.get("metrics", ["nDCG@10"])[0], section.get("names", {})
    a, b = section["pair"]
    title = fill(section.get("title", ""), values, where)
    missing = [name for name in (a, b) if name not in table]
    if missing:  # a run of some of an experiment's rankers
        return ([f"## {title}", "", f"Not measured: no rows of {' or '.join(missing)}."],
                {"title": title, "slices": {}})
    head = ["slice", "queries", names.get(a, a), names.get(b, b), "difference"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    found = {}
    for spec in section["slices"]:
        qids = slice_qids(slates, spec, where)
        rows_a = {q: r for q, r in table[a].items() if q in qids}
        rows_b = {q: r for q, r in table[b].items() if q in qids}
        entry = {"queries": len(rows_a), a: mean([r.get(metric) for r in rows_a.values()]),
                 b: mean([r.get(metric) for r in rows_b.values()]),
                 "difference": paired(rows_a, rows_b, metric) if rows_a else None}
        found[spec["label"]] = entry
        lines.append(f"| {spec['label']} | {entry['queries']} | {fmt(entry[a], '.3f')} | "
                     f"{fmt(entry[b], '.3f')} | {interval(entry['difference'])} |")
    return [f"## {title}", "", *lines], {"title": title, "slices": found}


#: Each kind of report section, by the key that marks it.
SECTIONS = {"rows": table_section, "facts": facts_section, "text": file_section,
            "markdown": file_section, "slices": slices_section}


def report_sections(experiment: Experiment) -> tuple[list[str], list[Values]]:
    """The report's sections as markdown lines, and what each found, for results.json."""
    lines: list[str] = []
    found: list[Values] = []
    for i, section in enumerate(experiment.sections, 1):
        where = f"{experiment.path}: section {i}"
        kinds = [key for key in SECTIONS if key in section]
        if len(kinds) != 1:
            raise ExperimentError(f"{where}: a section has one of {', '.join(SECTIONS)}")
        for row in rows_of(section, experiment.values, where):
            values = with_row(experiment.values, row, where)
            text, data = SECTIONS[kinds[0]](section, values, where)
            lines += ["", *text]
            found.append(data)
    return lines, found


def timing_lines(seconds: dict[str, float]) -> list[str]:
    """The wall time of each command this invocation ran (those done before are not)."""
    if not seconds:
        return []
    return ["", "Seconds each command took, of those this invocation ran:", "", "```",
            *(f"{s:8.1f}  {line}" for line, s in seconds.items()), "```"]


def write_report(experiment: Experiment, meta: dict[str, Any]) -> str:
    """report.md and results.json from the experiment's finished outputs."""
    lines, found = report_sections(experiment)
    made = (f"Re-created by `{experiment.command_line()}` ({meta['date']}, commit "
            f"{meta['commit']}, {meta['machine']}; {meta['load']}; {meta['minutes']:.1f} min of "
            "commands run now). The commands are in command.txt.")
    about = fill(experiment.about, experiment.values, f"{experiment.path}: about").strip()
    text = "\n".join([f"# {experiment.title}", "", made, "", about, *lines,
                      *timing_lines(meta["seconds"])]) + "\n"
    out = ROOT / experiment.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "sections": found}, indent=2)
                                      + "\n")
    (out / "report.md").write_text(text)
    return text


def parse_sets(items: list[str]) -> dict[str, str]:
    sets = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ExperimentError(f"--set {item!r}: NAME=VALUE")
        sets[name] = value
    return sets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", type=Path, help="the experiment's TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one of the file's settings (repeatable)")
    parser.add_argument("--out", type=Path, help="write the report here, not to the file's "
                        "'out' (a rerun beside a committed one)")
    parser.add_argument("--load", default="nothing else running",
                        help="what else ran on the machine, for the report")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    try:
        experiment = Experiment(args.experiment.resolve(), parse_sets(args.set), args.out)
        started = time.time()
        seconds = run_steps(experiment, args.dry_run)
        if args.dry_run:
            return 0
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "commit": code_version(), "machine": f"{machine()}, Python "
                f"{platform.python_version()}", "load": args.load,
                "minutes": (time.time() - started) / 60, "command": experiment.command_line(),
                "seconds": seconds}
        print(write_report(experiment, meta))
    except (ExperimentError, OSError) as err:
        print(f"run.py: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"run.py: a step failed (exit {err.returncode}): {shlex.join(err.cmd)}; "
              "rerun to resume from it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
