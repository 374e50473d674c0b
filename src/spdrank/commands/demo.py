"""``spdrank demo``: the whole pipeline on a laptop, in one command, in under 15 minutes.

    spdrank demo [--dir spdrank-demo] [--tiny]

1. builds the bundled Amazon Beauty 2014 slates, with the upstream features (popularity and
   co-occurrence counted on the training users, a lexical retriever's title similarity);
2. takes a CPU-sized subset (the first train and eval slates);
3. labels it with a teacher through ``spdrank teacher``: by default the co-occurrence
   ranker (``ranker:cooccurrence``), a teacher that carries signal and labels in seconds;
4. trains the SPD student with the best CPU recipe of ``benchmarks/quality_beauty_cpu.py``
   (:data:`RECIPE`): frozen SmolLM2 states (computed once, cached) and the features, clicks
   as the target, decoded by expected rank;
5. evaluates the student against its teacher and the baselines (``spdrank bench``), with the
   autoregressive SmolLM2 teacher's own answers on the same eval slates replayed from label
   files that ``spdrank teacher`` produced through llama.cpp's server (shipped with the
   package; command and provenance in ``spdrank/data/beauty/PROVENANCE.md``): quality,
   fidelity, latency, decode passes, validity and the speed-up over that teacher;
6. shows how to rank your own slates with the trained model and how to serve it.

Every step writes into ``--dir`` and is skipped when its output is already there, so an
interrupted demo picks up where it stopped. ``--tiny`` runs the same steps at a toy scale
(a handful of slates, one layer) so a test can run the demo end to end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

#: The autoregressive SmolLM2 teachers' label files shipped with the package (eval slates).
AR_TEACHERS = {
    "smollm2-direct": "smollm2-direct.eval.labels.jsonl",
    "smollm2-reasoning": "smollm2-reasoning.eval.labels.jsonl",
}


#: The student's row name in the results (``<name>:<decoder>`` in ``spdrank bench``).
STUDENT = "spd-student"

#: The best CPU recipe (benchmarks/results/quality-beauty-cpu/report.md): the features next
#: to frozen backbone states, clicks as the target, decoded by expected rank (the best of the
#: targets and decoders on the validation split), the rest of ``spdrank train``'s settings
#: as in that report. The features are the best set on the validation split: the two the
#: baselines rank by and the titles' TF-IDF similarity (transition added nothing there).
#: The scale (layers, slates, titles) comes from :class:`Scale`.
FEATURES = "popularity,cooccurrence,title_similarity"
DECODER = "expected_rank"
RECIPE = ["--target", "clicks", "--decoder", DECODER, "--features", FEATURES, "--frozen",
          "--head", "attn", "--lr", "1e-3", "--head-lr", "1e-3"]


@dataclass(frozen=True)
class Scale:
    """How big the demo runs; every number is printed before the step that uses it."""

    train: int
    eval: int
    layers: int
    epochs: float
    batch: int
    item_tokens: int
    #: Rough minutes of the training step on 2 CPU cores, for the step's message.
    train_minutes: float


FULL = Scale(train=1000, eval=200, layers=2, epochs=1, batch=16, item_tokens=12, train_minutes=5)
TINY = Scale(train=8, eval=6, layers=1, epochs=1, batch=4, item_tokens=6, train_minutes=0.2)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole pipeline on Beauty: data, teacher, student, evaluation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", default="spdrank-demo", help="working directory (default: ./spdrank-demo)")
    p.add_argument("--teacher", default="ranker:cooccurrence",
                   help="teacher backend to distil (any `spdrank teacher --backend`; default: "
                   "ranker:cooccurrence)")
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
    from spdrank.cli import main

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

    if has_features(data / "manifest.json"):
        steps.skip(f"Amazon Beauty 2014 slates in {data}")
    else:
        steps.announce(f"building the Amazon Beauty 2014 slates with their popularity, "
                       f"co-occurrence and title-similarity features in {data}", "about 1-2 min")
        call(["data", "beauty", "--out", str(data), "--negatives", "uniform", "--features"])

    steps.announce(f"taking the first {scale.train} train and {scale.eval} eval slates into {subset}")
    for split, n in (("train", scale.train), ("eval", scale.eval)):
        take_first_lines(data / f"{split}.jsonl", subset / f"{split}.jsonl", n)

    teacher_done = all((labels / f"{s}.slates.jsonl").exists() for s in ("train", "eval"))
    if teacher_done:
        steps.skip(f"teacher labels ({args.teacher}) in {labels}")
    else:
        steps.announce(f"labelling the subset with the teacher {args.teacher}",
                       "seconds for a ranker:, minutes per slate for an LLM on a CPU")
        for split in ("train", "eval"):
            argv = ["teacher", "--slates", str(subset / f"{split}.jsonl"),
                    "--out", str(labels / f"{split}.labels.jsonl"),
                    "--slates-out", str(labels / f"{split}.slates.jsonl"), "--backend", args.teacher]
            if args.teacher.startswith("ranker:"):
                argv += ["--train", str(data / "train.jsonl")]
            call(argv)

    if (model_dir / "train.json").exists():
        steps.skip(f"the SPD student in {model_dir}")
    else:
        steps.announce(
            f"training the SPD student: SmolLM2's first {scale.layers} layers (frozen; each "
            f"slate's states computed once into {root / 'states'}) and the features, attention "
            f"head, clicks as the target, {scale.train} slates",
            f"about {scale.train_minutes:g} min on 2 CPU cores; rerun to resume if interrupted",
        )
        call(["train", "--slates", str(labels / "train.slates.jsonl"), "--out", str(model_dir),
              *RECIPE, "--cache-states", str(root / "states"), "--layers", str(scale.layers),
              "--max-item-tokens", str(scale.item_tokens), "--batch-size", str(scale.batch),
              "--epochs", str(scale.epochs), "--save-every", "10", "--device", args.device])

    report = root / "report"
    steps.announce(
        f"evaluating the student against its teacher and the baselines on {scale.eval} eval "
        f"slates (spdrank bench: table, report and plots in {report})",
        "about 1 min",
    )
    argv = ["bench", "--slates", str(labels / "eval.slates.jsonl"), "--train", str(data / "train.jsonl"),
            "--ranker", "random", "--ranker", "popularity", "--ranker", "cooccurrence"]
    for name, path in ar_teacher_files().items():
        argv += ["--labels", f"{name}={path}"]
    argv += ["--model", f"{STUDENT}={model_dir}", "--decoders", f"{DECODER},hungarian",
             "--device", args.device,
             "--out", str(report), "--title", "spdrank demo: the SPD student on Amazon Beauty"]
    call(argv)

    steps.announce("done")
    print_speedup(report / "results.json")
    print_next_steps(root, model_dir, subset, time.perf_counter() - started)
    return 0


def take_first_lines(src: Path, dst: Path, n: int) -> None:
    """The first ``n`` slates of ``src`` into ``dst`` (kept when it already holds them)."""
    from spdrank.slates import atomic_writer

    if dst.exists() and sum(1 for _ in dst.open(encoding="utf-8")) == n:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open(encoding="utf-8") as fin, atomic_writer(dst) as fout:
        for i, line in enumerate(fin):
            if i >= n:
                break
            fout.write(line)


def has_features(manifest: Path) -> bool:
    """Whether the slates of ``manifest`` were built with the features the recipe reads (a
    demo directory from an earlier version holds slates without them)."""
    if not manifest.exists():
        return False
    built = json.loads(manifest.read_text())["parameters"].get("features") or []
    return set(FEATURES.split(",")) <= set(built)


def ar_teacher_files() -> dict[str, Path]:
    """The shipped SmolLM2 label files (present in the package data)."""
    base = resources.files("spdrank") / "data" / "beauty"
    return {name: Path(str(base / fname)) for name, fname in AR_TEACHERS.items()
            if (base / fname).is_file()}


def print_speedup(results: Path) -> None:
    """The student's median latency against each autoregressive teacher's, from the same run."""
    rankers = json.loads(results.read_text())["rankers"]
    student = rankers.get(f"{STUDENT}:{DECODER}")
    if not student:
        return
    ms = student["latency_ms"]["median"]
    print(f"\nSPD student: {ms:.0f} ms per slate (median), 1 forward pass, "
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

Rank your own slates (JSONL, one slate per line; see the README's slate format):
  spdrank rank --model {model_dir} --input {subset / 'eval.jsonl'} --output {root / 'ranked.jsonl'}

Serve the student over HTTP. It reads each candidate's upstream features next to its title,
so send whole slates (the format above) to /v1/rank; /v1/rerank takes text-only documents
and serves models trained without --features:
  spdrank serve --model {model_dir} --port 8000
  head -n 1 {subset / 'eval.jsonl'} | curl -s localhost:8000/v1/rank \\
    -H 'content-type: application/json' -d @-
""")
