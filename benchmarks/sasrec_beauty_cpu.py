"""The student against SASRec on Amazon Beauty (issue 22), at CPU scale.

    .venv/bin/python benchmarks/sasrec_beauty_cpu.py [--settings uniform retrieved]
        [--note TEXT] [--dry-run]

Two kinds of slate, each built once under ``data-out/`` with a validation split of 1,000
training users (``spdrank data beauty --validation 1000``) and the features
popularity, co-occurrence, title similarity and SASRec's score:

- ``uniform``: the target and 49 negatives drawn uniformly, SASRec's score a feature;
- ``retrieved``: SASRec's top 50 of the catalogue (``--retriever sasrec --candidates 50``), the
  target never inserted: a slate whose target was not retrieved stays and counts as a miss, so
  every click metric of that table is against the whole catalogue.

Rows: SASRec as ``spdrank eval --ranker sasrec`` (fitted on the training slates: each one's
history then its target), SASRec as the build's feature model (``feature:sasrec``: fitted on
the training users' items without their last, the model that scores the feature and, in the
retrieved setting, retrieved the candidates, so its order there is the retriever's own),
co-occurrence, the best current student (features-only attention head on popularity,
co-occurrence and title similarity, clicks target: the recipe of ``clicks/3f-only`` in
benchmarks/results/fidelity-beauty-cpu) and the same student reading SASRec's score too.

The protocol of benchmarks/quality_beauty_cpu.py: each student is trained in a few variants
(:data:`VARIANTS`), every variant and baseline is scored on the validation slates, the
variant best on validation NDCG@10 is kept per student, and so is the SASRec row (of the two)
best on validation NDCG@10: the reference. Only then are the kept rows scored once on the
1,118 eval slates, with paired 95% bootstrap intervals against the reference
(:mod:`spdrank.eval.paired`, 2,000 resamples, seed 0).

Resumable: a build with its manifest, a run with its ``train.json`` and an evaluation whose
JSON holds the same rows are reused (runs and logs under ``runs/sasrec/``). SASRec's fits are
cached by spdrank itself (``$SPDRANK_CACHE/sasrec``). Every command runs on one thread.
Writes ``benchmarks/results/sasrec-beauty-cpu/`` (report.md, results.json, commands.txt).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from spdrank.eval.paired import RESAMPLES, PairedDifference, difference_of

BIN = Path(".venv/bin")
OUT = Path("benchmarks/results/sasrec-beauty-cpu")
WORK = Path("runs/sasrec")
VALIDATION = 1000
CANDIDATES = 50
METRICS = ("AUC", "R@1", "R@10", "NDCG@5", "NDCG@10", "MRR")
#: The metrics of the issue's goal: the student above SASRec with the interval above zero.
GOAL = ("NDCG@10", "R@1")
#: What validation chooses by (variants and the SASRec reference).
CHOOSE_BY = "NDCG@10"
SEED = 0

THREE = "popularity,cooccurrence,title_similarity"
#: The features every build computes: the students read three or all four.
BUILD_FEATURES = f"{THREE},sasrec"
#: The two SASRec rows; the one best on validation is the reference.
SASREC_ROWS = ("sasrec", "feature:sasrec")
BASELINES = (*SASREC_ROWS, "cooccurrence")


@dataclass(frozen=True)
class Setting:
    """One kind of slate: the build's own arguments beside the shared ones."""

    name: str
    what: str
    build: tuple[str, ...]

    def data(self) -> Path:
        return Path("data-out") / f"sasrec-{self.name}"

    def work(self) -> Path:
        return WORK / self.name


SETTINGS = {
    "uniform": Setting(
        "uniform", "the target and 49 uniform negatives, SASRec's score a feature", ()
    ),
    "retrieved": Setting(
        "retrieved",
        f"SASRec's top {CANDIDATES} of the catalogue, the target never inserted",
        ("--retriever", "sasrec"),
    ),
}

#: The student of ``clicks/3f-only`` (benchmarks/fidelity_beauty_cpu.py): features only,
#: attention head, clicks target, 2,048 slates x 4 epochs, batch 32, head lr 1e-3, seed 0.
RECIPE = [
    "--features-only", "--head", "attn", "--target", "clicks", "--limit", "2048",
    "--epochs", "4", "--batch-size", "32", "--head-lr", "1e-3", "--warmup-steps", "20",
    "--seed", str(SEED), "--save-every", "100", "--eval-every", "0",
]
#: The two students: the best current one, and the same reading SASRec's score.
STUDENTS = {"student": THREE, "student+sasrec": BUILD_FEATURES}


@dataclass(frozen=True)
class Variant:
    """Settings tried on validation, each overriding the recipe's."""

    name: str
    what: str
    args: tuple[str, ...] = ()
    #: The settings whose slates it is tried on (the retrieved build has about 2,500
    #: training slates with a retrieved target, so more slates than 2,048 add little there).
    settings: tuple[str, ...] = ("uniform", "retrieved")


VARIANTS = [
    Variant("e4", "the recipe: 2,048 slates x 4 epochs, head lr 1e-3"),
    Variant("e8", "8 epochs", ("--epochs", "8")),
    Variant("lr3e-3", "head lr 3e-3", ("--head-lr", "3e-3")),
    Variant("8k", "8,192 slates x 4 epochs", ("--limit", "8192"), ("uniform",)),
]


@dataclass
class Log:
    """Every command behind this invocation's results, whether it ran now or was reused."""

    dry: bool
    commands: list[str] = field(default_factory=list)

    def run(self, cmd: list[str], log: Path, needed: bool = True) -> float:
        """Record ``cmd``; run it from the repository root on one thread when ``needed`` (and
        not a dry run). Its seconds (0 when not run)."""
        line = shlex.join(cmd)
        self.commands.append(line)
        if not needed:
            return 0.0
        print(("" if self.dry else "== ") + line, flush=True)
        if self.dry:
            return 0.0
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(log, "a") as fh:
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False
            )
        if done.returncode:
            raise SystemExit(f"failed ({done.returncode}): {line}; see {log}")
        return time.perf_counter() - t0


def write_wall(path: Path, seconds: float) -> None:
    path.write_text(f"{seconds:.0f}\n")


def read_wall(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


def build(setting: Setting, log: Log) -> dict[str, Any]:
    """The setting's slates (reused when its manifest exists); the manifest."""
    data = setting.data()
    needed = not (data / "manifest.json").exists()
    cmd = [
        str(BIN / "spdrank"), "data", "beauty", "--out", str(data),
        "--validation", str(VALIDATION), "--candidates", str(CANDIDATES),
        *setting.build, "--features", BUILD_FEATURES, "--seed", str(SEED), "--no-progress",
    ]
    seconds = log.run(cmd, WORK / f"build-{setting.name}.log", needed)
    if log.dry:
        return {}
    if needed:
        write_wall(data / "wall_s.txt", seconds)
    return json.loads((data / "manifest.json").read_text())


def with_settings(args: list[str], changes: tuple[str, ...]) -> list[str]:
    """``args`` (flag, value pairs) with the values of ``changes``' flags replaced, so every
    command names each setting once."""
    new = dict(zip(changes[::2], changes[1::2]))
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in new:
            out[i + 1] = new.pop(arg)
    return out + [x for pair in new.items() for x in pair]


def run_dir(setting: Setting, student: str, variant: Variant) -> Path:
    return setting.work() / "runs" / f"{student}__{variant.name}"


def label(student: str, variant: Variant) -> str:
    """The row's name in ``spdrank eval`` (no '/', which separates NAME=DIR)."""
    return f"{student}:{variant.name}"


def train(setting: Setting, student: str, variant: Variant, log: Log) -> None:
    """Train one variant of one student (reused when its run finished)."""
    out = run_dir(setting, student, variant)
    data = setting.data()
    cmd = [
        str(BIN / "spdrank"), "train", "--slates", str(data / "train.jsonl"),
        "--eval-slates", str(data / "valid.jsonl"), "--eval-limit", str(VALIDATION),
        "--out", str(out), "--features", STUDENTS[student], *with_settings(RECIPE, variant.args),
        "--no-progress",
    ]
    needed = not (out / "train.json").exists()
    seconds = log.run(cmd, out.parent / f"{out.name}.log", needed)
    if needed and not log.dry:
        write_wall(out / "wall_s.txt", seconds)


def evaluate(
    setting: Setting, split: str, models: dict[str, Path], rankers: tuple[str, ...], log: Log
) -> dict[str, Any]:
    """``spdrank eval`` of ``rankers`` and ``models`` on ``split`` (reused when the saved
    result holds exactly those rows), with its per-slate values."""
    out = setting.work() / f"{split}.json"
    per_slate = setting.work() / f"{split}.per-slate.jsonl"
    rows = [*rankers, *models]
    found = json.loads(out.read_text()) if out.exists() else None
    needed = found is None or list(found["rankers"]) != rows
    data = setting.data()
    cmd = [
        str(BIN / "spdrank"), "eval", "--slates", str(data / f"{split}.jsonl"),
        "--train", str(data / "train.jsonl"), *(f"--ranker={r}" for r in rankers),
        *(f"--model={name}={path}" for name, path in models.items()),
        "--json", str(out), "--per-slate", str(per_slate), "--no-progress",
    ]
    seconds = log.run(cmd, setting.work() / f"{split}.log", needed)
    if log.dry:
        return {"rankers": {}}
    if not needed:
        return found
    result = json.loads(out.read_text())
    result["meta"]["driver_wall_s"] = seconds
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def means(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``spdrank eval --json`` -> {row: {metric: mean}}."""
    return {
        name: {m: row["metrics"][m]["mean"] for m in METRICS if m in row["metrics"]}
        for name, row in result["rankers"].items()
    }


def per_slate(path: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The per-slate JSONL of ``spdrank eval`` -> {row: {slate index: its values}}."""
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    with open(path) as fh:
        for line in fh:
            rec = json.loads(line)
            rows.setdefault(rec["ranker"], {})[rec["index"]] = rec
    return rows


def paired(
    values: dict[str, dict[int, dict[str, Any]]], reference: str
) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """Each row minus ``reference``, slate by slate, with 95% percentile-bootstrap intervals
    (the method and seeds of :func:`spdrank.eval.paired.compare`, applied to saved per-slate
    values so that one evaluation serves every reference)."""
    ref = values[reference]
    out = {}
    for name, mine in values.items():
        if name == reference:
            continue
        out[name] = {}
        for m in METRICS:
            diffs = np.asarray(
                [
                    mine[i][m] - r[m]
                    for i, r in ref.items()
                    if r.get(m) is not None and mine.get(i, {}).get(m) is not None
                ],
                dtype=np.float64,
            )
            out[name][m] = difference_of(diffs, RESAMPLES, 0.95, SEED).to_dict()
    return out


def retrieved_only(
    values: dict[str, dict[int, dict[str, Any]]], slates: Path
) -> tuple[int, dict[str, dict[str, float]]]:
    """How many eval slates hold their target, and each row's means over those alone: the
    reranking quality once retrieval has succeeded."""
    with open(slates) as fh:
        hit = [bool(json.loads(line).get("clicked")) for line in fh if line.strip()]
    keep = {i for i, h in enumerate(hit) if h}
    rows = {}
    for name, recs in values.items():
        rows[name] = {
            m: float(np.mean([recs[i][m] for i in keep if recs[i].get(m) is not None]))
            for m in METRICS
        }
    return len(keep), rows


def choose(valid: dict[str, dict[str, float]], names: list[str]) -> str:
    """The row of ``names`` best on validation (:data:`CHOOSE_BY`, then MRR)."""
    return max(names, key=lambda n: (valid[n][CHOOSE_BY], valid[n]["MRR"]))


def experiment(setting: Setting, log: Log) -> dict[str, Any]:
    """Build, train, choose on validation, score the chosen rows on eval, pair them."""
    manifest = build(setting, log)
    variants = [v for v in VARIANTS if setting.name in v.settings]
    for student in STUDENTS:
        for variant in variants:
            train(setting, student, variant, log)
    models = {
        label(s, v): run_dir(setting, s, v) for s in STUDENTS for v in variants
    }
    valid_result = evaluate(setting, "valid", models, BASELINES, log)
    if log.dry:
        evaluate(setting, "eval", {}, BASELINES, log)
        return {}
    valid = means(valid_result)
    reference = choose(valid, list(SASREC_ROWS))
    chosen = {
        s: choose(valid, [label(s, v) for v in variants]) for s in STUDENTS
    }
    kept = {s: models[name] for s, name in chosen.items()}
    eval_result = evaluate(setting, "eval", kept, BASELINES, log)
    values = per_slate(setting.work() / "eval.per-slate.jsonl")
    result = {
        "setting": setting.name,
        "what": setting.what,
        "counts": manifest.get("counts"),
        "sasrec_settings": manifest.get("parameters", {}).get("sasrec"),
        "build_wall_s": read_wall(setting.data() / "wall_s.txt"),
        "reference": reference,
        "chosen": chosen,
        "valid": valid,
        "valid_meta": valid_result["meta"],
        "eval": means(eval_result),
        "eval_slates": eval_result["n_slates"],
        "eval_meta": eval_result["meta"],
        "paired": {ref: paired(values, ref) for ref in (*SASREC_ROWS, "cooccurrence")},
        "train": {
            label(s, v): train_summary(run_dir(setting, s, v)) for s in STUDENTS for v in variants
        },
    }
    if setting.name == "retrieved":
        n, rows = retrieved_only(values, setting.data() / "eval.jsonl")
        result["retrieved_eval_slates"] = n
        result["eval_retrieved_only"] = rows
    return result


def train_summary(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "train.json").read_text())
    return {
        "train_slates": summary.get("train_slates"),
        "steps": summary.get("total_steps"),
        "skipped_slates": summary.get("skipped_slates"),
        "wall_s": read_wall(run / "wall_s.txt"),
        "args": summary["config"],
    }


# -- report ---------------------------------------------------------------------------------


def git_commit() -> str:
    """HEAD's short hash, marked when src/ or the scripts hold uncommitted changes."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src", "benchmarks",
                            ":(exclude)benchmarks/results"], cwd=ROOT, check=False).returncode
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "src",
                                "benchmarks"], cwd=ROOT, capture_output=True, text=True,
                               check=False).stdout.strip()
    changed = dirty or bool(untracked)
    return (done.stdout.strip() or "unknown") + (" (+ uncommitted changes)" if changed else "")


def f3(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def ci(d: dict[str, Any]) -> str:
    return PairedDifference(**d).text(missing="—")


def goal_met(result: dict[str, Any], student: str) -> bool:
    """The issue's goal for one student row: above the reference on NDCG@10 and R@1, each
    95% interval entirely above zero."""
    diffs = result["paired"][result["reference"]][student]
    return all(diffs[m]["low"] is not None and diffs[m]["low"] > 0 for m in GOAL)


def table(rows: dict[str, dict[str, float]], names: list[str]) -> list[str]:
    lines = ["| row | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f3(rows[name].get(m)) for m in METRICS) + " |")
    return lines


def section(result: dict[str, Any]) -> list[str]:
    """One setting's part of the report."""
    name, ref = result["setting"], result["reference"]
    counts = result["counts"] or {}
    rows = [*BASELINES, *STUDENTS]
    lines = [f"## {name}: {result['what']}", ""]
    splits = ", ".join(f"{k} {counts[k]:,}" for k in ("train", "valid", "eval") if k in counts)
    if splits:
        lines += [f"Slates: {splits}.", ""]
    lines += [
        (f"Validation (all {VALIDATION:,} validation slates), every variant; chosen by "
        f"{CHOOSE_BY}: {', '.join(f'{s} -> `{v}`' for s, v in result['chosen'].items())}; "
        f"reference SASRec row: `{ref}`."),
        "",
        *table(result["valid"], list(result["valid"])),
        "",
        "Training of each variant:",
        "",
        "| variant | training slates | steps | skipped (no click) | train s |",
        "|---|---|---|---|---|",
    ]
    for variant, t in result["train"].items():
        lines.append(
            f"| {variant} | {t['train_slates']} | {t['steps']} | {t['skipped_slates'] or 0} | "
            f"{t['wall_s'] if t['wall_s'] is not None else '—'} |"
        )
    n_eval = f"{result['eval_slates']:,}"
    lines += [
        "",
        (f"Eval ({n_eval} eval slates, scored once; `student` and `student+sasrec` are the "
        "chosen variants):"),
        "",
        *table(result["eval"], rows),
    ]
    if "eval_retrieved_only" in result:
        n = result["retrieved_eval_slates"]
        total = result["eval_slates"]
        lines += [
            "",
            (f"SASRec retrieved the target for {n} of {total} eval slates (Recall@{CANDIDATES} "
            f"against the catalogue {n / total:.3f}); the table above counts every other slate "
            "as a miss (Recall against the catalogue). The same rows on the retrieved slates "
            "only, the reranking once retrieval succeeded:"),
            "",
            *table(result["eval_retrieved_only"], rows),
        ]
    for reference in (ref, *[r for r in (*SASREC_ROWS, "cooccurrence") if r != ref]):
        diffs = result["paired"][reference]
        lines += [
            "",
            (f"Paired differences on the eval slates, row minus `{reference}` (mean [95% "
            f"percentile bootstrap over slates, {RESAMPLES} resamples, seed {SEED}]):"),
            "",
            "| row | " + " | ".join(METRICS) + " |",
            "|---|" + "---|" * len(METRICS),
        ]
        for row in rows:
            if row in diffs:
                lines.append(f"| {row} | " + " | ".join(ci(diffs[row][m]) for m in METRICS) + " |")
    verdicts = [
        f"`{s}` {'meets' if goal_met(result, s) else 'does not meet'} it" for s in STUDENTS
    ]
    lines += [
        "",
        f"Goal (above `{ref}` on {' and '.join(GOAL)}, 95% intervals above zero): "
        + "; ".join(verdicts) + ".",
        "",
    ]
    return lines


def timing(results: list[dict[str, Any]]) -> list[str]:
    """The CPU time of each step, as measured when it ran (one thread each)."""
    lines = ["## CPU time (wall clock, one thread)", ""]
    for result in results:
        trains = [t["wall_s"] for t in result["train"].values() if t["wall_s"] is not None]
        fit = result["valid_meta"].get("fit_s", {})
        lines.append(
            f"- {result['setting']}: build {result['build_wall_s'] or '—'} s (SASRec fit, "
            f"encoding, features); students {sum(trains)} s over {len(trains)} runs; "
            f"validation eval {result['valid_meta'].get('driver_wall_s', 0):.0f} s (fits: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in fit.items())
            + f"); eval {result['eval_meta'].get('driver_wall_s', 0):.0f} s"
        )
    total = sum(step_seconds(r) for r in results)
    return lines + [f"- total of these steps: {total:.0f} s ({total / 60:.0f} min)", ""]


def step_seconds(result: dict[str, Any]) -> float:
    """The recorded seconds of one setting's steps (build, trainings, evaluations)."""
    trains = sum(t["wall_s"] or 0 for t in result["train"].values())
    evals = sum(result[k].get("driver_wall_s", 0) for k in ("valid_meta", "eval_meta"))
    return (result["build_wall_s"] or 0) + trains + evals


def sasrec_settings(results: list[dict[str, Any]]) -> str:
    """The SASRec settings the builds recorded (the same for every build here)."""
    found = {json.dumps(r.get("sasrec_settings"), sort_keys=True) for r in results}
    return "; ".join(
        ", ".join(f"{k} {v}" for k, v in json.loads(f).items()) for f in sorted(found) if f
    ) or "not recorded"


def report(results: list[dict[str, Any]], argv: list[str], note: str, wall: float,
           load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    command = shlex.join([".venv/bin/python", "benchmarks/sasrec_beauty_cpu.py", *argv])
    lines = [
        "# The student against SASRec on Amazon Beauty (issue 22), CPU scale",
        "",
        f"Command: `{command}`",
        "",
        (
            f"Date {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%MZ}; commit {git_commit()}; "
            f"machine {platform.machine()}, {os.cpu_count()} cores, no GPU; every command on one "
            f"thread (OMP_NUM_THREADS=1). This invocation: {wall:.0f} s (finished builds, runs "
            f"and evaluations reused; their own times below), load average "
            f"{load[0][0]:.1f} at its start and {load[1][0]:.1f} at its end. {note}"
        ).rstrip(),
        "",
        (
            "Scale and seeds: Beauty 2014 (bundled), history 10, 50 candidates, 1,000 "
            "validation users held out of the training users (their slates in valid.jsonl, "
            "not counted by any feature or fit), the 1,118 eval users scored once; build seed "
            f"{SEED}, SASRec's settings ({sasrec_settings(results)}; docs/sasrec.md), "
            f"students seed {SEED}: features only, attention head (2 layers, width 256), clicks "
            "target, batch 32, warm-up 20 steps, decoder expected_rank; the variants are "
            "listed per setting. Paired intervals: "
            f"{RESAMPLES} bootstrap resamples of the eval slates, seed {SEED}."
        ),
        "",
        (
            "Rows: `sasrec` = `spdrank eval --ranker sasrec`, fitted on the training slates "
            "(each one's history, then its target); `feature:sasrec` = the build's SASRec, "
            "fitted on the training users' items without their last (never a target), whose "
            "order on retrieved slates is the retriever's own; `cooccurrence` counted on the "
            "training slates; `student` = features-only student on popularity, co-occurrence "
            "and title similarity (`clicks/3f-only` of the fidelity report); `student+sasrec` "
            "= the same reading SASRec's score too. The SASRec row better on validation "
            f"{CHOOSE_BY} is the reference of the goal."
        ),
        "",
    ]
    for result in results:
        lines += section(result)
    lines += timing(results)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    p.add_argument("--dry-run", action="store_true", help="print the commands instead")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    start, load0 = time.time(), os.getloadavg()
    log = Log(args.dry_run)
    results = [experiment(SETTINGS[name], log) for name in args.settings]
    if args.dry_run:
        return 0
    text = report(results, argv, args.note, time.time() - start, (load0, os.getloadavg()))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.md").write_text(text)
    (OUT / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (OUT / "commands.txt").write_text("".join(c + "\n" for c in log.commands))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
