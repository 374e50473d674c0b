"""``spdrank demo``: the whole pipeline on a laptop, in one command, in under 15 minutes.

    spdrank demo [--dir spdrank-demo] [--tiny] [--teacher BACKEND]

1. builds the bundled Amazon Beauty 2014 slates, with the upstream features (popularity and
   co-occurrence counted on the training users, a lexical retriever's title similarity) that
   the baselines rank by;
2. takes a CPU-sized subset (the first train and eval slates);
3. labels it with a teacher through ``spdrank teacher``: by default the lexical teacher
   (``ranker:title_similarity``: candidates ranked by their title's TF-IDF similarity with
   the history's titles), a teacher the prompt's text determines, so a student reading the
   prompt can learn it, and which labels in seconds. Any ``spdrank teacher --backend`` can
   take its place (an LLM through ``hf:``, ``likelihood:`` or a server);
4. distils it into the SPD student with the recipe of
   ``benchmarks/results/fidelity-beauty-cpu`` (:data:`RECIPE`): SmolLM2's first layers,
   frozen, their states computed once and cached; the history head, which reads each
   candidate's and each history item's words (each word's token states averaged) and matches
   them as a soft TF-IDF cosine; the teacher's permutations as the target; no upstream
   feature, so whatever the student gets right it read in the prompt;
5. evaluates the student against its teacher and the baselines (``spdrank bench``: random,
   popularity, co-occurrence, title similarity and, at full scale, SASRec), with the
   autoregressive SmolLM2 teacher's own answers on the same eval slates replayed from label
   files that ``spdrank teacher`` produced through llama.cpp's server (shipped with the
   package; command and provenance in ``spdrank/data/beauty/PROVENANCE.md``): fidelity to
   the teacher (Kendall tau, top-1), quality against clicks, latency, decode passes, validity
   and the speed-up over that teacher;
6. shows how to rank your own slates with the trained model and how to serve it.

Every step writes into ``--dir`` and records the settings it ran with; a rerun skips a step
only when its recorded settings, and those of every step before it, are the same, so an
interrupted demo picks up where it stopped and a changed one (``--tiny`` before, another
``--teacher``) redoes what changed. ``--tiny`` runs the same steps at a toy scale (a handful
of slates, one layer) so a test can run the demo end to end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

#: The autoregressive SmolLM2 teachers' label files shipped with the package (eval slates).
AR_TEACHERS = {
    "smollm2-direct": "smollm2-direct.eval.labels.jsonl",
    "smollm2-reasoning": "smollm2-reasoning.eval.labels.jsonl",
}

#: The student's row name in the results (``<name>:<decoder>`` in ``spdrank bench``).
STUDENT = "spd-student"

#: The teacher distilled by default: the lexical retriever's ranking, which the text decides.
TEACHER = "ranker:title_similarity"

DECODER = "expected_rank"

#: The student recipe that learned its teachers best (benchmarks/results/fidelity-beauty-cpu):
#: the history head matching the words of frozen states, the teacher's permutations as the
#: target. The scale (layers, slates, title tokens, epochs) comes from :class:`Scale`.
RECIPE = ["--target", "teacher", "--head", "history", "--readout", "words", "--match", "tfidf",
          "--frozen", "--decoder", DECODER, "--head-lr", "1e-3"]

#: The file in each step's output directory that records the settings it ran with.
STAMP = ".demo-step.json"


@dataclass(frozen=True)
class Scale:
    """How big the demo runs; every number is printed before the step that uses it."""

    train: int
    eval: int
    layers: int
    epochs: float
    batch: int
    item_tokens: int
    #: Rough minutes of the training step (states and epochs) on 2 CPU cores, for its message.
    train_minutes: float
    #: Whether the evaluation carries SASRec, the sequential recommender a team would already
    #: run: fitted on every training user's sequence (cached by its inputs, so a rerun reuses
    #: it), which the toy scale is too short for.
    sasrec: bool = True


FULL = Scale(train=1000, eval=200, layers=2, epochs=3, batch=32, item_tokens=32, train_minutes=6)
TINY = Scale(train=8, eval=6, layers=1, epochs=1, batch=4, item_tokens=6, train_minutes=0.2,
             sasrec=False)
#: The baselines every demo evaluation carries (SASRec joins them at full scale).
BASELINES = ("random", "popularity", "cooccurrence", "title_similarity")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole pipeline on Beauty: data, teacher, student, evaluation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", default="spdrank-demo", help="working directory (default: ./spdrank-demo)")
    p.add_argument("--teacher", default=TEACHER,
                   help=f"teacher backend to distil (any `spdrank teacher --backend`; default: "
                   f"{TEACHER})")
    p.add_argument("--tiny", action="store_true", help="a toy scale, for tests (about 1 minute)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.set_defaults(func=run)


class Steps:
    """Numbered, announced steps: each says what it does and roughly how long it takes."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def announce(self, what: str, estimate: str | None = None) -> None:
        self.done += 1
        tail = f" ({estimate})" if estimate else ""
        print(f"\n[{self.done}/{self.total}] {what}{tail}", flush=True)

    def skip(self, what: str) -> None:
        self.done += 1
        print(f"\n[{self.done}/{self.total}] {what}: already done, reusing it", flush=True)


def run(args: argparse.Namespace) -> int:
    from spdrank.commands.cli import main

    scale = TINY if args.tiny else FULL
    root = Path(args.dir)
    data = root / "beauty-uniform"
    subset, labels, model_dir = root / "subset", root / "labels", root / "student"
    steps = Steps(6)
    started = time.perf_counter()

    def call(argv: list[str]) -> None:
        print("  $ spdrank " + shlex.join(argv), flush=True)
        code = main(argv)
        if code:
            raise SystemExit(code)

    # --overwrite: begin() has put the step's stamp in the folder, which the build replaces.
    data_argv = ["data", "beauty", "--out", str(data), "--overwrite", "--negatives", "uniform",
                 "--features"]
    data_settings: dict[str, Any] = {"argv": data_argv}
    if is_done(data, data_settings):
        steps.skip(f"Amazon Beauty 2014 slates in {data}")
    else:
        steps.announce(f"building the Amazon Beauty 2014 slates with their popularity, "
                       f"co-occurrence and title-similarity features in {data}", "about 1-2 min")
        begin(data, data_settings)
        call(data_argv)
        finish(data, data_settings)

    subset_settings = {"scale": asdict(scale), "after": data_settings}
    if is_done(subset, subset_settings):
        steps.skip(f"the first {scale.train} train and {scale.eval} eval slates in {subset}")
    else:
        steps.announce(f"taking the first {scale.train} train and {scale.eval} eval slates "
                       f"into {subset}")
        begin(subset, subset_settings)
        for split, n in (("train", scale.train), ("eval", scale.eval)):
            take_first_lines(data / f"{split}.jsonl", subset / f"{split}.jsonl", n)
        finish(subset, subset_settings)

    teacher_settings = {"teacher": args.teacher, "after": subset_settings}
    if is_done(labels, teacher_settings):
        steps.skip(f"teacher labels ({args.teacher}) in {labels}")
    else:
        steps.announce(f"labelling the subset with the teacher {args.teacher}",
                       "seconds for a ranker:, minutes per slate for an LLM on a CPU")
        begin(labels, teacher_settings)
        for split in ("train", "eval"):
            argv = ["teacher", "--slates", str(subset / f"{split}.jsonl"),
                    "--out", str(labels / f"{split}.labels.jsonl"),
                    "--slates-out", str(labels / f"{split}.slates.jsonl"), "--backend", args.teacher]
            if args.teacher.startswith("ranker:"):
                argv += ["--train", str(data / "train.jsonl")]
            call(argv)
        finish(labels, teacher_settings)

    train_argv = ["train", "--slates", str(labels / "train.slates.jsonl"), "--out", str(model_dir),
                  *RECIPE, "--cache-states", str(root / "states"), "--layers", str(scale.layers),
                  "--max-item-tokens", str(scale.item_tokens), "--batch-size", str(scale.batch),
                  "--epochs", str(scale.epochs), "--save-every", "10", "--device", args.device]
    student_settings = {"argv": train_argv, "after": teacher_settings}
    if is_done(model_dir, student_settings):
        steps.skip(f"the SPD student in {model_dir}")
    else:
        steps.announce(
            f"distilling the teacher into the SPD student: SmolLM2's first {scale.layers} "
            f"layers (frozen; each slate's states computed once into {root / 'states'}), the "
            f"history head matching the words of titles cut to {scale.item_tokens} tokens, "
            f"the teacher's "
            f"permutations as the target, no upstream feature, {scale.train} slates x "
            f"{scale.epochs:g} epochs",
            f"about {scale.train_minutes:g} min on 2 CPU cores; rerun to resume if interrupted",
        )
        # The state cache serves one backbone and prompt setting: made for another, it goes.
        begin(model_dir, student_settings, also=[root / "states"])
        call(train_argv)
        finish(model_dir, student_settings)

    report = root / "report"
    steps.announce(
        f"evaluating the student against its teacher and the baselines"
        f"{' (SASRec fitted on the training users first)' if scale.sasrec else ''} on "
        f"{scale.eval} eval slates (spdrank bench: table, report and plots in {report})",
        "about 5-8 min the first time (SASRec's fit, then cached)" if scale.sasrec else "about 1 min",
    )
    call(bench_argv(scale, data, labels, model_dir, report, args.device))

    steps.announce("done")
    print_speedup(report / "results.json", args.teacher)
    print_next_steps(root, model_dir, subset, time.perf_counter() - started)
    return 0


def bench_argv(
    scale: Scale, data: Path, labels: Path, model_dir: Path, report: Path, device: str
) -> list[str]:
    """The ``spdrank bench`` command of the demo's evaluation step."""
    argv = ["bench", "--slates", str(labels / "eval.slates.jsonl"),
            "--train", str(data / "train.jsonl")]
    for name in (*BASELINES, *(["sasrec"] if scale.sasrec else [])):
        argv += ["--ranker", name]
    for name, path in ar_teacher_files().items():
        argv += ["--labels", f"{name}={path}"]
    return argv + [
        "--model", f"{STUDENT}={model_dir}", "--decoders", f"{DECODER},hungarian",
        "--device", device,
        "--out", str(report), "--title", "spdrank demo: the SPD student on Amazon Beauty",
    ]


def recorded(directory: Path) -> dict[str, Any] | None:
    """The settings record of a step's output directory (None without one)."""
    stamp = directory / STAMP
    if not stamp.exists():
        return None
    try:
        return json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_done(directory: Path, settings: dict[str, Any]) -> bool:
    """Whether ``directory`` holds a finished run of the step with exactly ``settings``."""
    record = recorded(directory)
    return record is not None and record.get("done") is True and record["settings"] == settings


def begin(directory: Path, settings: dict[str, Any], also: Sequence[Path] = ()) -> None:
    """Make ``directory`` ready for a step with ``settings``: an unfinished run with the same
    settings is kept (the commands resume it); anything else there (another scale, teacher or
    version's output) is removed, so nothing made differently is reused, and so are the
    directories in ``also`` that the step writes besides its own."""
    record = recorded(directory)
    if record is None or record["settings"] != settings:
        for path in (directory, *also):
            if path.exists():
                print(f"  {path} holds output made with other settings: removing it", flush=True)
                shutil.rmtree(path)
        directory.mkdir(parents=True)
    (directory / STAMP).write_text(json.dumps({"settings": settings, "done": False}, indent=1))


def finish(directory: Path, settings: dict[str, Any]) -> None:
    """Record that the step with ``settings`` finished in ``directory``."""
    (directory / STAMP).write_text(json.dumps({"settings": settings, "done": True}, indent=1))


def take_first_lines(src: Path, dst: Path, n: int) -> None:
    """The first ``n`` slates of ``src`` into ``dst``."""
    from spdrank.core.slates import atomic_writer

    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open(encoding="utf-8") as fin, atomic_writer(dst) as fout:
        for i, line in enumerate(fin):
            if i >= n:
                break
            fout.write(line)


def ar_teacher_files() -> dict[str, Path]:
    """The shipped SmolLM2 label files (present in the package data)."""
    base = resources.files("spdrank") / "data" / "beauty"
    return {name: Path(str(base / fname)) for name, fname in AR_TEACHERS.items()
            if (base / fname).is_file()}


def print_speedup(results: Path, teacher: str) -> None:
    """The student's fidelity to its teacher, and its median latency against each
    autoregressive teacher's, from the same run."""
    rankers = json.loads(results.read_text())["rankers"]
    student = rankers.get(f"{STUDENT}:{DECODER}")
    if not student:
        return
    ms = student["latency_ms"]["median"]
    fidelity = student["metrics"]
    print(f"\nSPD student: Kendall tau {fidelity['tau']['mean']:.3f} and top-1 agreement "
          f"{fidelity['top1']['mean']:.3f} with its teacher ({teacher}) on held-out slates")
    print(f"SPD student: {ms:.0f} ms per slate (median), 1 forward pass, "
          f"{student['valid_pct']:.0f}% valid permutations")
    for name in AR_TEACHERS:
        t = rankers.get(name)
        if t and t["latency_ms"]["median"]:
            print(f"  vs {name}: {t['latency_ms']['median']:.0f} ms and "
                  f"{t['decode_passes_mean']:.0f} decode passes per slate, {t['valid_pct']:.0f}% "
                  f"valid: the student is {t['latency_ms']['median'] / ms:.1f}x faster")


def print_next_steps(root: Path, model_dir: Path, subset: Path, seconds: float) -> None:
    print(f"""
Finished in {seconds / 60:.1f} min. Report and plots: {root / 'report'}

Rank your own slates (JSONL, one slate per line; the format: docs/usage.md#the-slate-format):
  spdrank rank --model {model_dir} --input {subset / 'eval.jsonl'} --output {root / 'ranked.jsonl'}

Serve the student over HTTP. /v1/rank takes whole slates (the format above, with the
upstream features of a model that reads them); /v1/rerank takes a query (the user's history)
and text documents, for models trained without --features such as this one:
  spdrank serve --model {model_dir} --port 8000
  head -n 1 {subset / 'eval.jsonl'} | curl -s localhost:8000/v1/rank \\
    -H 'content-type: application/json' -d @-
""")
