"""benchmarks/run.py, the experiment runner: it runs a file's commands once (a rerun resumes),
logs them, writes the report and results.json; bad files and settings are named; and the
experiments' commands parse and their tables reproduce the numbers the scripts they replaced
committed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.helpers import ROOT

EXPERIMENTS = ROOT / "benchmarks" / "experiments"

#: Writes a per-slate rows file, as `spdrank eval --per-slate` does, and counts its calls.
WRITE_ROWS = """
import json, sys
out, calls = sys.argv[1], sys.argv[2]
open(calls, "a").write("called\\n")
with open(out, "w") as fh:
    for q in range(8):
        for name, score in (("retriever", 0.4), ("student", 0.5 + 0.01 * (q % 3))):
            fh.write(json.dumps({"ranker": name, "qid": f"q{q}", "latency_ms": 2.0,
                                 "nDCG@10": score}) + "\\n")
"""


def experiment_file(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "write_rows.py").write_text(WRITE_ROWS)
    (tmp_path / "train.json").write_text(json.dumps({"verdict": "kept step 3",
                                                     "anchor": {"anchor": "order"}}))
    path = tmp_path / "tiny.toml"
    path.write_text(f"""
title = "A tiny experiment"
out = "{tmp_path}/out"
about = "Scores at {{scale}} scale."

[settings]
work = "{tmp_path}"
scale = "toy"
{extra}
[[step]]
for = {{split = ["a", "b"]}}
run = ["python", "{{work}}/write_rows.py", "{{work}}/{{split}}.rows.jsonl", "{{work}}/calls.txt"]
done = "{{work}}/{{split}}.rows.jsonl"

[[section]]
title = "What training chose"
facts = [{{label = "student", file = "{{work}}/train.json", text = "{{anchor[anchor]}}; {{verdict}}"}}]

[[section]]
for = [{{split = "a"}}]
title = "Split {{split}} ({{queries}} queries)"
rows = "{{work}}/{{split}}.rows.jsonl"
against = {{retriever = "BM25"}}
names = {{retriever = "BM25"}}
""")
    return path


def test_it_runs_each_command_once_and_writes_the_report(tmp_path, capsys, run):
    path = experiment_file(tmp_path)
    assert run.main([str(path)]) == 0
    out = tmp_path / "out"
    report = (out / "report.md").read_text()
    assert report.startswith("# A tiny experiment\n\nRe-created by `.venv/bin/python "
                             f"benchmarks/run.py {path}`")
    assert "Scores at toy scale." in report and "- student: order; kept step 3" in report
    assert "## Split a (8 queries)" in report
    assert "| BM25 | 0.400 | - | 2.0 |" in report
    results = json.loads((out / "results.json").read_text())
    student = results["sections"][1]["rows"]["student"]
    assert student["nDCG@10"] == pytest.approx(0.50875) and student["queries"] == 8
    assert student["- retriever"]["mean"] == pytest.approx(0.10875)
    assert student["- retriever"]["low"] <= 0.10875 <= student["- retriever"]["high"]
    assert len(results["meta"]["seconds"]) == 2
    commands = (out / "command.txt").read_text().splitlines()
    assert [shlex.split(line)[2] for line in commands] == [f"{tmp_path}/a.rows.jsonl",
                                                           f"{tmp_path}/b.rows.jsonl"]
    # A rerun resumes: every step's output exists, so nothing runs again.
    capsys.readouterr()
    assert run.main([str(path)]) == 0
    assert capsys.readouterr().out.count("= (done)") == 2
    assert (tmp_path / "calls.txt").read_text().count("called") == 2


def test_once_a_step_runs_every_later_one_runs_too(tmp_path, capsys, run):
    """A later step's output, left by an earlier run, may have been made from what the
    rerun step now rewrites: it is made again, never kept."""
    path = experiment_file(tmp_path)
    assert run.main([str(path)]) == 0
    (tmp_path / "a.rows.jsonl").unlink()
    capsys.readouterr()
    assert run.main([str(path)]) == 0
    assert capsys.readouterr().out.count("= (done)") == 0
    assert (tmp_path / "calls.txt").read_text().count("called") == 4


def test_a_step_keeps_its_standard_output_as_its_output(tmp_path, run):
    path = tmp_path / "printed.toml"
    path.write_text(f'title = "Printed {{what}}"\nout = "{tmp_path}/out"\n'
                    '[settings]\nwhat = "words"\n'
                    '[[step]]\nrun = ["python", "-c", "print(\'a table\')"]\n'
                    f'stdout = "{tmp_path}/out/table.txt"\n'
                    f'[[section]]\ntext = "{tmp_path}/out/table.txt"\n')
    assert run.main([str(path)]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# Printed words\n") and "```\na table\n```" in report
    command = (tmp_path / "out" / "command.txt").read_text()
    assert command.endswith(f" > {tmp_path}/out/table.txt\n")


def test_a_setting_is_overridden_and_the_report_names_the_override(tmp_path, run):
    path = experiment_file(tmp_path)
    assert run.main([str(path), "--set", "scale=full"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "--set scale=full`" in report and "Scores at full scale." in report


def test_a_dry_run_prints_the_commands_and_runs_nothing(tmp_path, capsys, run):
    assert run.main([str(experiment_file(tmp_path)), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("+ python ") for line in lines)
    assert not (tmp_path / "calls.txt").exists() and not (tmp_path / "out").exists()


def settings_file(tmp_path: Path, body: str) -> Path:
    """An experiment file of a title, an out folder and ``body`` (its settings and steps)."""
    path = tmp_path / "experiment.toml"
    path.write_text(f'title = "t"\nout = "{tmp_path}/out"\n{body}')
    return path


def test_list_settings_splice_into_commands_and_rows(tmp_path, capsys, run):
    """A list setting is spliced where a command names it, filled there (so a row may pick
    which flags), gives a 'for' its members, and gives 'each' one group of arguments per
    member; --set replaces it with a TOML list."""
    path = settings_file(tmp_path, """
[settings]
sizes = ["1", "2"]
small = ["--small", "{size}"]
flags = "{small}"
[[step]]
for = {size = "{sizes}"}
run = ["python", "-c", "pass", "{flags}", {each = "sizes", as = "s", args = ["--all", "{s}"]}]
""")
    assert run.main([str(path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "+ python -c pass --small 1 --all 1 --all 2", "+ python -c pass --small 2 --all 1 --all 2"]
    assert run.main([str(path), "--dry-run", "--set", 'sizes=["7"]']) == 0
    assert capsys.readouterr().out.splitlines() == ["+ python -c pass --small 7 --all 7"]
    assert run.main([str(path), "--dry-run", "--set", "sizes=7"]) == 2
    assert "--set sizes: a list of arguments" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "extra", "says"), [
    (["--set", "nothing=1"], "", "--set nothing: "),
    (["--set", "scale"], "", "NAME=VALUE"),
    ([], "later = '{missing}'", "settings.later: cannot fill '{missing}'"),
    ([], "x = [", "tiny.toml: "),
])
def test_a_bad_file_or_setting_is_refused_naming_it(tmp_path, capsys, args, extra, says, run):
    assert run.main([str(experiment_file(tmp_path, extra)), *args]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "calls.txt").exists()


def test_a_failed_step_stops_the_run_and_says_a_rerun_resumes(tmp_path, capsys, run):
    path = tmp_path / "fails.toml"
    path.write_text(f'title = "t"\nout = "{tmp_path}/out"\n[[step]]\n'
                    'run = ["python", "-c", "raise SystemExit(3)"]\n')
    assert run.main([str(path)]) == 1
    assert "exit 3" in capsys.readouterr().err and not (tmp_path / "out" / "report.md").exists()


@pytest.mark.parametrize(
    "name", ["search-best-input-synthetic", "search-best-input-other", "beauty-best-input"])
def test_the_best_input_experiments_commands_parse_and_students_share_a_recipe(
    name, capsys, run
):
    from spdrank.commands.cli import build_parser

    assert run.main([str(EXPERIMENTS / f"{name}.toml"), "--dry-run"]) == 0
    argvs = [shlex.split(line.split("spdrank ", 1)[1])
             for line in capsys.readouterr().out.splitlines()]
    parser = build_parser()
    for argv in argvs:
        parser.parse_args(argv)  # exits (fails the test) on an unknown flag or value
    trains = [argv for argv in argvs if argv[0] == "train"]
    llm = [a for a in trains if "--features-only" not in a]
    features = [a for a in trains if "--features-only" in a]
    assert trains and len(llm) == len(features)
    for a, b in zip(llm, features, strict=True):  # chosen on validation, from the best input
        for flag in ("--features", "--slates", "--eval-slates", "--epochs"):
            assert a[a.index(flag) + 1] == b[b.index(flag) + 1]
        assert a[a.index("--select") + 1] == "best" and "--anchor" not in a
    evals = [argv for argv in argvs if argv[0] == "eval"]
    assert len(evals) == 2 and all(sum(x == "--model" for x in a) == 2 for a in evals)


def committed_rows(committed: dict, name: str) -> dict | None:
    """A table's rows in a committed results.json of the runner (a section per table, titled
    by the test set or setting it is of); None where the report was run without it (a
    ``--set`` of fewer settings)."""
    return next((s["rows"] for s in committed["sections"]
                 if "rows" in s and s["title"].lower().startswith(name)), None)


@pytest.mark.parametrize(
    "name", ["search-best-input-synthetic", "search-best-input-other", "beauty-best-input"])
def test_the_best_input_tables_reproduce_the_committed_numbers(name, run):
    """The tables, from the committed per-slate files, equal the committed results.json."""
    experiment = run.Experiment(EXPERIMENTS / f"{name}.toml", {})
    committed = json.loads((ROOT / experiment.out / "results.json").read_text())
    tables = [s for s in experiment.sections if "rows" in s]
    compared = 0
    for section in tables:
        rows_of = section["for"]  # a table of lists, or a list of tables
        key = next(iter(rows_of[0] if isinstance(rows_of, list) else rows_of))  # a set, a setting
        for row in run.rows_of(section, experiment.values, "test"):
            path = ROOT / run.fill(section["rows"], {**experiment.values, **row}, "test")
            rows = committed_rows(committed, row[key])
            if rows is None:
                continue
            for ranker, entry in run.summary(section, path).items():
                old = rows[ranker]
                for metric, value in entry.items():
                    if isinstance(value, dict):
                        for part in ("mean", "low", "high"):
                            assert value[part] == pytest.approx(old[metric][part], abs=1e-12)
                    else:
                        assert value == pytest.approx(old[metric], abs=1e-12)
                    compared += 1
    assert compared > 50


def test_a_for_member_table_gives_the_row_its_fields_and_its_lists_read_the_row(
    tmp_path, capsys, run
):
    """A list setting of tables: each member gives a row of 'for' its fields, and a list among
    them is filled where it is spliced, so it may name another field of the same row."""
    path = settings_file(tmp_path, """
[settings]
sets = ["a", "b"]
models = [{model = "m1", flags = ["--cache", "c/{set}"]}, {model = "m2", flags = []}]
[[step]]
for = {set = "{sets}", model = "{models}"}
run = ["python", "-c", "pass", "{model}", "{flags}"]
""")
    assert run.main([str(path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "+ python -c pass m1 --cache c/a", "+ python -c pass m2",
        "+ python -c pass m1 --cache c/b", "+ python -c pass m2"]


def test_a_slices_section_pairs_two_rankers_on_each_slice(tmp_path, run):
    """Slices by the history's length and by the clicked item's count (read back from its
    log1p feature): each slice's queries, both rankers' means and their paired difference."""
    import math

    slates, rows = [], []
    for q in range(12):
        count = (2, 10, 50)[q % 3]
        slates.append({"query": {"qid": f"q{q}", "history": ["x"] * (1 + q % 4)},
                       "clicked": ["d1"], "candidates": [
                           {"docid": "d0", "features": {"popularity": 0.0}},
                           {"docid": "d1", "features": {"popularity": math.log1p(count)}}]})
        rows += [{"ranker": "llm", "qid": f"q{q}", "latency_ms": 1.0, "nDCG@10": 0.5 + q / 100},
                 {"ranker": "features", "qid": f"q{q}", "latency_ms": 1.0, "nDCG@10": 0.5}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(s) + "\n" for s in slates))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    section = {"per_slate": str(tmp_path / "rows.jsonl"), "slates": str(tmp_path / "eval.jsonl"),
               "pair": ["llm", "features"], "title": "by slice", "slices": [
                   {"label": "rare", "by": "clicked:popularity", "count": True, "high": 5},
                   {"label": "common", "by": "clicked:popularity", "count": True, "low": 21},
                   {"label": "short", "by": "history", "low": 1, "high": 2}]}
    lines, found = run.slices_section(section, {}, "test")
    rare, common, short = (found["slices"][k] for k in ("rare", "common", "short"))
    assert rare["queries"] == 4 and rare["llm"] == pytest.approx(0.5 + 18 / 4 / 100)
    assert common["queries"] == 4 and common["features"] == pytest.approx(0.5)
    assert short["queries"] == 6 and short["difference"]["n"] == 6
    assert short["difference"]["mean"] == pytest.approx(sum(q for q in range(12) if q % 4 < 2)
                                                        / 6 / 100)
    assert any(line.startswith("| rare | 4 | ") for line in lines)
    with pytest.raises(run.ExperimentError, match="by history or clicked:FEATURE"):
        run.slices_section({**section, "slices": [{"label": "x", "by": "length"}]}, {}, "t")


def test_a_fact_with_a_for_of_its_own_gives_a_line_per_row(tmp_path, run):
    for name in ("llm", "features"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"verdict": f"kept {name}"}))
    section = {"title": "chose", "facts": [
        {"for": {"student": "{students}"}, "label": "{student}",
         "file": f"{tmp_path}/{{student}}.json", "text": "{verdict}"}]}
    lines, found = run.facts_section(section, {"students": ["llm", "features"]}, "test")
    assert found["facts"] == {"llm": "kept llm", "features": "kept features"}
    assert lines[-2:] == ["- llm: kept llm", "- features: kept features"]
