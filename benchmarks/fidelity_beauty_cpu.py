"""Does a single-pass student learn its teacher from what it reads? Amazon Beauty, CPU scale.

    .venv/bin/python benchmarks/fidelity_beauty_cpu.py [--only NAME ...] [--dry-run] \
        [--backbone NAME]

Teachers whose rankings the prompt's text determines, so that a perfect single-pass student
exists: ``lexical`` ranks the candidates by their title's TF-IDF similarity with the history
(``spdrank teacher --backend ranker:title_similarity``; its many equal scores are ties, kept
in ``teacher_scores``), and, where its labels exist, ``likelihood``, SmolLM2 scoring each
candidate by log p(title | history) - log p(title). Every student reads SmolLM2's frozen
first L layers (states cached once per backbone setting and shared by every row and teacher
that reads them) and no upstream feature, unless its row says so.

Each row is one ``spdrank train`` command (run directories under ``runs/fidelity/``; a
finished run is reused). Settings are read on the 1,000 validation users (the run's own
evaluation); the rows are then scored once on the 1,118 eval slates, through a state cache
of those slates, beside the baselines, with paired 95% bootstrap intervals. Fidelity is
Kendall tau over the pairs the teacher orders, top-1 agreement (the student's first among
the teacher's best) and top-10 overlap; quality is against the held-out clicks.

Writes ``benchmarks/results/fidelity-beauty-cpu/`` (report.md, results.json, commands.txt,
learning-curve plots).

``--backbone NAME`` (a packaged name such as ``gemma3-270m``, a Hugging Face id or a folder;
default ``bundled``, SmolLM2) makes every student read that backbone instead: its runs and
state caches go under ``runs/fidelity-SLUG/`` and its report into
``benchmarks/results/fidelity-beauty-cpu/SLUG/``, beside the main one, which such a run never
rewrites. The teachers and their labels stay the same (the likelihood teacher is SmolLM2's
whatever the student reads), so the students of two backbones learn the same targets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(".venv/bin")
OUT = Path("benchmarks/results/fidelity-beauty-cpu")
#: The LLM teachers' label files as committed with the report (``spdrank teacher`` output).
SHIPPED = OUT / "labels"
WORK = Path("runs/fidelity")
#: The teachers' labels, whatever backbone the students read (the teachers read none of it);
#: None: WORK's.
LABELS: Path | None = None
#: The backbone the students read (``--backbone``); WORK and OUT follow it (:func:`use_backbone`).
BACKBONE = "bundled"
DATA = Path("data-out/v-uniform")
VALIDATION = 1000
FIDELITY = ("tau", "top1", "top10")
QUALITY = ("AUC", "R@1", "R@10", "NDCG@10", "MRR")


@dataclass(frozen=True)
class Teacher:
    """How one teacher labels the splits, and how many slates of each (None: all)."""

    backend: tuple[str, ...]
    limits: dict[str, int | None]


TEACHERS = {
    "lexical": Teacher(("--backend", "ranker:title_similarity"),
                       {"train": 8192, "valid": None, "eval": None}),
    # The whole SmolLM2 on every title of a slate: about 5 s a slate on one core, so fewer.
    "likelihood": Teacher(("--backend", "likelihood", "--model", "bundled",
                           "--max-item-tokens", "12", "--batch-size", "1"),
                          {"train": 1024, "valid": 100, "eval": 300}),
    # SmolLM2 writing its ranking under constrained decoding: about 30 s a slate here, and
    # no student (too few labels); its row of the teachers' table.
    "constrained": Teacher(("--backend", "hf", "--model", "bundled", "--constrained",
                            "--max-item-tokens", "12", "--batch-size", "1"), {"eval": 20}),
}
BASELINES = ("random", "popularity", "cooccurrence", "title_similarity")
#: Rows every eval table is compared with, slate by slate, when they are in it.
REFERENCES = ("lex/history-mean", "lik/paper/512", "clicks/3f-only", "cooccurrence")


@dataclass
class Row:
    """One student: the settings of its ``spdrank train`` command."""

    name: str
    what: str
    teacher: str = "lexical"
    layers: int = 2
    readout: str = "mean"
    head: str = "history"
    limit: int = 2048
    #: Tokens kept of each title (candidates' and history items'), ``--max-item-tokens``.
    item_tokens: int = 12
    epochs: float = 8
    target: str = "teacher"
    features: str | None = None
    extra: list[str] = field(default_factory=list)
    #: Scored on the eval slates (the validation figures come with every row).
    on_eval: bool = True
    #: Part of the learning curve of its teacher and depth.
    curve: bool = False
    #: LoRA rank on the backbone's layers (live prefill, no state cache); None: frozen.
    lora: int | None = None
    #: Validation slates the run evaluates, when fewer than its teacher's (a live prefill each).
    valid_limit: int | None = None

    def states(self) -> Path:
        """The state cache this row reads: one per backbone setting, whatever the labels."""
        history = "hist" if self.head == "history" else "nohist"  # the prompt differs
        cut = "" if self.item_tokens == 12 else f"-t{self.item_tokens}"
        return WORK / f"states-L{self.layers}-{self.readout}-{history}{cut}"

    def run_dir(self) -> Path:
        return WORK / "runs" / self.name

    def reads_states(self) -> bool:
        return "--features-only" not in self.extra

    def train_command(self) -> list[str]:
        cmd = [
            str(BIN / "spdrank"), "train",
            *(["--backbone", BACKBONE] if BACKBONE != "bundled" else []),
            "--slates", str(labelled(self.teacher, "train")),
            "--eval-slates", str(labelled(self.teacher, "valid")),
            "--out", str(self.run_dir()),
            "--target", self.target, "--head", self.head,
        ]
        if self.reads_states():
            cmd += ["--readout", self.readout, "--layers", str(self.layers),
                    "--max-item-tokens", str(self.item_tokens)]
            cmd += (["--lora-r", str(self.lora), "--lora-alpha", str(self.lora)]
                    if self.lora else ["--frozen", "--cache-states", str(self.states())])
        valid = self.valid_limit or TEACHERS[self.teacher].limits["valid"] or VALIDATION
        cmd += [
            "--limit", str(self.limit), "--epochs", str(self.epochs),
            "--batch-size", "32", "--head-lr", "1e-3", "--warmup-steps", "20",
            "--eval-every", "0", "--eval-limit", str(valid), "--seed", "0", "--no-progress",
        ]
        if self.features:
            cmd += ["--features", self.features]
        return cmd + self.extra


def rows() -> list[Row]:
    """Every row of the report, grouped by the question it answers."""
    # The lexical words student, fine-tuned on clicks with features added.
    from_lexical = ["--match", "tfidf", "--init-from", str(WORK / "runs" / "lex/words-tfidf")]
    return [
        # Can a student reading SmolLM2's states learn the lexical teacher, and what does it
        # take? The readout and head, at 512 training slates (validation only).
        Row("lex/paper/512", "the paper's head and readout: attention over the candidates' "
            "last-token states", head="attn", readout="last", limit=512, on_eval=False),
        Row("lex/mean/512", "the same head on states averaged over each title's tokens",
            head="attn", limit=512, on_eval=False),
        Row("lex/history-mean/512", "the history head on mean states",
            limit=512, on_eval=False, curve=True),
        Row("lex/history-mean-32ep/512", "the same, 32 epochs at head lr 3e-3",
            limit=512, epochs=32, extra=["--head-lr", "3e-3"], on_eval=False),
        Row("lex/history-mean", "the history head on mean states, 2,048 training slates",
            curve=True),
        Row("lex/history-mean-t32/512", "the history head on mean states, titles cut to 32 "
            "tokens instead of 12", item_tokens=32, limit=512, on_eval=False, curve=True),
        Row("lex/history-mean-t32", "the same on 2,048 training slates", item_tokens=32,
            curve=True),
        Row("lex/history-mean-t32-8k", "the same on 8,192 training slates, 4 epochs",
            item_tokens=32, limit=8192, epochs=4, curve=True),
        Row("lex/history-mean-t32-dcg/512", "the same, the loss weighing the first positions "
            "most (DCG position weights)", item_tokens=32, limit=512, on_eval=False,
            extra=["--position-weights", "dcg"]),
        Row("lex/history-mean-t32-L1/512", "the same on SmolLM2's first layer only",
            item_tokens=32, layers=1, limit=512, on_eval=False),
        Row("lex/history-mean-t32-L6/512", "the same on SmolLM2's first six layers, where "
            "words split into several tokens are assembled", item_tokens=32, layers=6,
            limit=512, on_eval=False),
        Row("lex/tokens/512", "the history head matching token states (late interaction)",
            readout="tokens", extra=["--match", "maxsim"], limit=512, on_eval=False, curve=True),
        Row("lex/tokens", "the same on 2,048 training slates, 4 epochs", readout="tokens",
            extra=["--match", "maxsim"],
            epochs=4, curve=True),
        Row("lex/words-tfidf/512", "the history head on word states of 32-token titles (each "
            "word the mean of its tokens' states), matched as a soft TF-IDF cosine: every pair "
            "of words through a sharp kernel, learned weights on both sides", readout="words",
            item_tokens=32,
            limit=512, extra=["--match", "tfidf"], curve=True),
        Row("lex/words-tfidf", "the same on 2,048 training slates, 4 epochs", readout="words",
            item_tokens=32, epochs=4, extra=["--match", "tfidf"], curve=True),
        # LoRA, one lever: the 512-slate words student trained one more epoch in batches of 8,
        # its backbone frozen or LoRA-adapted (a live prefill a slate; validated on 200 slates).
        *[Row(f"lex/words-tfidf/512+1ep-{name}", f"lex/words-tfidf/512 trained one more epoch, "
              f"{what} (--init-from)", readout="words", item_tokens=32, limit=512, epochs=1,
              lora=lora, valid_limit=200, on_eval=False,
              extra=["--match", "tfidf", "--init-from", str(WORK / "runs" / "lex/words-tfidf/512"),
                     "--batch-size", "8", "--warmup-steps", "4"])
          for name, what, lora in (("frozen", "the backbone frozen", None),
                                   ("lora16", "LoRA r=16 on SmolLM2's 2 layers", 16))],
        # Does the LLM replace the lexical score, and add to the features? (clicks)
        Row("clicks/3f-only", "popularity + co-occurrence + title similarity alone, no LLM",
            head="attn", target="clicks", features="popularity,cooccurrence,title_similarity", epochs=4,
            extra=["--features-only"]),
        Row("clicks/history-mean+pop+co", "SmolLM2 states (recipe) + popularity + "
            "co-occurrence: the LLM in place of the lexical score", target="clicks",
            features="popularity,cooccurrence", epochs=4),
        Row("clicks/history-mean+3f", "SmolLM2 states (recipe) + the three features",
            target="clicks", features="popularity,cooccurrence,title_similarity", epochs=4),
        Row("clicks/history-mean-t32c+pop+co", "SmolLM2 states on 32-token titles + "
            "popularity + co-occurrence, clicks as the target", target="clicks", item_tokens=32,
            features="popularity,cooccurrence", epochs=4),
        Row("clicks/history-mean-t32c+3f", "SmolLM2 states on 32-token titles + the three "
            "features, clicks as the target", target="clicks", item_tokens=32,
            features="popularity,cooccurrence,title_similarity", epochs=4),
        Row("clicks/history-mean-t32+pop+co", "SmolLM2 states on 32-token titles + "
            "popularity + co-occurrence, taught the lexical teacher's order with the clicked "
            "item first", target="teacher+clicks", item_tokens=32,
            features="popularity,cooccurrence", epochs=4),
        Row("clicks/history-mean-t32+3f", "SmolLM2 states on 32-token titles + the three "
            "features, the same target", target="teacher+clicks", item_tokens=32,
            features="popularity,cooccurrence,title_similarity", epochs=4),
        Row("clicks/words-tfidf+pop+co", "SmolLM2's word states matched as a soft TF-IDF + "
            "popularity + co-occurrence, clicks as the target, 2 epochs: the LLM in place of "
            "the lexical score", target="clicks", readout="words", item_tokens=32,
            features="popularity,cooccurrence", epochs=2, extra=["--match", "tfidf"]),
        Row("clicks/words-tfidf-warm+pop+co", "the lexical student (lex/words-tfidf) "
            "fine-tuned on clicks with popularity + co-occurrence added (--init-from), 2 "
            "epochs: the LLM in place of the lexical score", target="clicks", readout="words",
            item_tokens=32, features="popularity,cooccurrence", epochs=2,
            extra=from_lexical),
        Row("clicks/words-tfidf-warm+3f", "the same with the three features", target="clicks",
            readout="words", item_tokens=32,
            features="popularity,cooccurrence,title_similarity", epochs=2,
            extra=from_lexical),
        Row("clicks/words-tfidf-warm+pop+co/4ep", "the lexical student fine-tuned on clicks "
            "with popularity + co-occurrence, 4 epochs", target="clicks", readout="words",
            item_tokens=32, features="popularity,cooccurrence", epochs=4,
            extra=from_lexical),
        # The same comparisons on fewer click-labelled slates: whether the gap closes with data.
        *[Row(f"clicks/3f-only/{n}", f"clicks/3f-only on {n:,} slates", head="attn",
              target="clicks", features="popularity,cooccurrence,title_similarity", epochs=4,
              limit=n, extra=["--features-only"]) for n in (512, 1024)],
        *[Row(f"clicks/words-tfidf-warm+{f}/{n}", f"clicks/words-tfidf-warm+{f} on {n:,} "
              "slates", target="clicks", readout="words", item_tokens=32, features=names,
              epochs=2, limit=n,
              extra=from_lexical)
          for n in (512, 1024)
          for f, names in (("pop+co", "popularity,cooccurrence"),
                           ("3f", "popularity,cooccurrence,title_similarity"))],
        # SmolLM2's own ranking, valid by construction, as the teacher.
        Row("lik/paper/512", "the paper's head and readout, distilled from SmolLM2's "
            "likelihood teacher", teacher="likelihood", head="attn", readout="last", limit=512),
        Row("lik/history-mean/512", "the history head on mean states, distilled from "
            "SmolLM2's likelihood teacher", teacher="likelihood", limit=512, curve=True),
        Row("lik/history-mean-16ep/512", "the same, 16 epochs", teacher="likelihood",
            limit=512, epochs=16),
        Row("lik/tokens/512", "the history head matching token states", teacher="likelihood",
            readout="tokens", extra=["--match", "maxsim"], limit=512, curve=True),
        Row("lik/words-tfidf/512", "the history head on word states of 32-token titles, "
            "matched as a soft TF-IDF cosine, distilled from SmolLM2's likelihood teacher",
            teacher="likelihood", readout="words", item_tokens=32, limit=512,
            extra=["--match", "tfidf"], curve=True),
        Row("lik/history-mean", "the history head on mean states, 1,024 training slates",
            teacher="likelihood", limit=1024, curve=True),
    ]


def use_backbone(name: str) -> None:
    """Students read ``name``: their runs, state caches and report go to its own folders."""
    global BACKBONE, LABELS, WORK, OUT
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.")
    BACKBONE, LABELS = name, labels_dir()
    WORK, OUT = WORK.with_name(f"{WORK.name}-{slug}"), OUT / slug  # runs/fidelity-SLUG


def labels_dir() -> Path:
    return LABELS or WORK


def backbone_title() -> str:
    """The students' backbone as the report names it."""
    from spdrank.backbone.gguf import PACKAGED

    return PACKAGED[BACKBONE].title if BACKBONE in PACKAGED else BACKBONE


def model_name() -> str:
    """The backbone's short name in the ceiling's rows (its tokenizer's tokens)."""
    return "SmolLM2" if BACKBONE == "bundled" else backbone_title()


def labelled(teacher: str, split: str) -> Path:
    return labels_dir() / teacher / f"{split}.labels.slates.jsonl"


def labelled_slates(teacher: str, split: str) -> int:
    """How many slates ``teacher`` has labelled in ``split`` (0 before its first run)."""
    path = labelled(teacher, split)
    if not path.exists():
        return 0
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def run(cmd: list[str], log: Path | None = None) -> float:
    """Run ``cmd`` from the repository root; its output to ``log``; seconds taken."""
    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "a") if log else open(os.devnull, "w") as fh:
        done = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {shlex.join(cmd)}; see {log}")
    return time.perf_counter() - t0


def prepare(teachers: set[str], dry: bool) -> list[list[str]]:
    """The data build and each teacher's labels (each step skipped when done)."""
    cmds = []
    if not (DATA / "valid.jsonl").exists():
        cmds.append([str(BIN / "spdrank"), "data", "beauty", "--out", str(DATA), "--features",
                     "--validation", str(VALIDATION), "--no-progress"])
    for name in sorted(teachers):
        teacher = TEACHERS[name]
        for split, limit in teacher.limits.items():
            shipped = SHIPPED / name / f"{split}.labels.jsonl"
            work = labels_dir() / name / f"{split}.labels.jsonl"
            if shipped.exists() and not work.exists() and not dry:
                # The LLM teachers' labels cost hours here: a run resumes from the committed ones.
                work.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shipped, work)
            if labelled_slates(name, split) < (limit or 1):  # a shorter run resumes
                cmds.append([
                    str(BIN / "spdrank"), "teacher", "--slates", str(DATA / f"{split}.jsonl"),
                    "--out", str(work), *teacher.backend,
                    "--no-progress", *(["--limit", str(limit)] if limit else []),
                ])
    if not dry:
        WORK.mkdir(parents=True, exist_ok=True)
        for cmd in cmds:
            run(cmd, WORK / "prepare.log")
    return cmds


def bench_teachers(dry: bool) -> list[list[str]]:
    """The teachers on the eval slates they labelled, next to the baselines: quality against
    clicks, validity, decode passes, ms per slate (one ``spdrank bench`` per slate count)."""
    sizes = sorted({t.limits["eval"] for t in TEACHERS.values() if t.limits["eval"]})
    cmds = []
    for size in sizes:
        labels = [f"--labels={name}={labels_dir() / name / 'eval.labels.jsonl'}"
                  for name, t in TEACHERS.items() if (t.limits["eval"] or 10**9) >= size]
        cmds.append([
            str(BIN / "spdrank"), "bench", "--slates", str(DATA / "eval.jsonl"),
            "--limit", str(size), "--train", str(DATA / "train.jsonl"),
            *(f"--ranker={name}" for name in BASELINES), *labels,
            "--reference", "cooccurrence", "--out", str(OUT / f"teachers-{size}"),
            "--title", f"The teachers on the first {size} Beauty eval slates", "--no-progress",
        ])
    if not dry:
        for cmd in cmds:
            run(cmd, WORK / "teachers.log")
    return cmds


def train_row(row: Row) -> dict[str, Any]:
    """Train (or reuse) the row's run; its summary, with the wall time of this call."""
    summary_path = row.run_dir() / "train.json"
    if summary_path.exists() and json.loads(summary_path.read_text()).get("finished"):
        return json.loads(summary_path.read_text())
    row.run_dir().parent.mkdir(parents=True, exist_ok=True)
    seconds = run(row.train_command(), WORK / f"{row.name.replace('/', '_')}.log")
    summary = json.loads(summary_path.read_text())
    summary["driver_wall_s"] = seconds
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class CachedStudent:
    """A checkpoint that ranks eval slates from their cached states (a features-only one,
    with no states to cache, ranks them directly)."""

    def __init__(self, name: str, model: Any, cache: Any, index: dict[str, int]) -> None:
        self.name, self.model, self.cache, self.index = name, model, cache, index

    def fit(self, train: Any) -> None:
        """Trained already."""

    def rank(self, slate: Any) -> Any:
        if self.cache is None:
            return self.model.rank(slate)
        batch = self.cache.batch([self.index[slate.query.qid]], [slate], self.model)
        return self.model.rank_batch([slate], batch=batch)[0]


def evaluate_on_eval(selected: list[Row], teacher: str) -> dict[str, Any]:
    """Every selected row of ``teacher`` and the baselines on the eval slates: metrics per
    row and paired differences against the first row and against title_similarity."""
    from spdrank.core.slates import load_slates, read_slates
    from spdrank.eval.evaluate import evaluate
    from spdrank.eval.paired import compare
    from spdrank.model.ranker import SPDRanker
    from spdrank.model.state_cache import open_state_cache
    from spdrank.rankers.baselines import make_baseline

    eval_path = labelled(teacher, "eval")
    slates = load_slates(eval_path)
    index = {s.query.qid: i for i, s in enumerate(slates)}
    rankers: list[Any] = []
    for name in BASELINES:
        ranker = make_baseline(name)
        ranker.fit(read_slates(DATA / "train.jsonl"))
        rankers.append(ranker)
    for row in selected:
        model = SPDRanker.from_pretrained(row.run_dir() / "model")
        cache = None
        if row.reads_states():
            cache = open_state_cache(row.states() / "heldout", model, eval_path, len(slates))
        rankers.append(CachedStudent(row.name, model, cache, index))
    results = evaluate(rankers, slates, ks=(1, 10), warmup=0, progress=None, total=len(slates))
    metrics = [*QUALITY, *FIDELITY]
    table = {
        r.name: {m: s.mean for m, s in r.summary().items() if m in (*metrics, "valid")}
        for r in results.rankers
    }
    names = {r.name for r in results.rankers}
    paired = {ref: compare(results, ref, metrics).to_dict() for ref in REFERENCES if ref in names}
    return {"n_slates": len(slates), "rows": table, "paired": paired}


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def interval(d: dict[str, Any]) -> str:
    from spdrank.eval.paired import PairedDifference

    return PairedDifference(**d).text()


PREAMBLE = (
    "Scale: SmolLM2-135M-Instruct (bundled), frozen first L layers, titles cut to 12 tokens "
    "unless a row says 32; "
    "training slates as each row says (of Beauty's 20,245), validation: the first slates of "
    "the 1,000 validation users' (1,000 for the lexical teacher, 100 for the likelihood "
    "teacher, whose labels cost the whole model per title), eval: the 1,118 eval slates "
    "(300 for the likelihood teacher), 50 candidates each, uniform negatives. Validation "
    "figures are the run's own evaluation; eval figures one pass over the eval slates "
    "through a state cache, beside the baselines. tau counts only the pairs the teacher "
    "orders (its score ties are not an order); top1: the student's first is among the "
    "teacher's best; top10: overlap of the two top 10s (ties at the teacher's boundary "
    "count for it). Quality (AUC, R@k, NDCG, MRR) is against the held-out next item."
)


def preamble() -> str:
    """PREAMBLE, naming the students' backbone when it is not the bundled SmolLM2."""
    if BACKBONE == "bundled":
        return PREAMBLE
    return PREAMBLE.replace(
        "Scale: SmolLM2-135M-Instruct (bundled), ",
        f"Backbone: **{backbone_title()}** (`--backbone {BACKBONE}`): every student reads it "
        "(a row description's SmolLM2 states or layers are its here); the teachers are the "
        "main report's, the likelihood teacher SmolLM2 (its shipped labels). Scale: ")


def write_report(selected: list[Row], summaries: dict[str, Any], evals: dict[str, Any],
                 probe: dict[str, float], ceiling: dict[str, Any], argv: list[str],
                 note: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    command = shlex.join([".venv/bin/python", "benchmarks/fidelity_beauty_cpu.py", *argv])
    lines = [
        "# Fidelity: does the single-pass student learn its teacher? (Beauty, CPU scale)",
        "",
        f"Command: `{command}`",
        "",
        (f"Machine: {platform.machine()}, {os.cpu_count()} cores; date "
         f"{dt.date.today().isoformat()}; commit {git_commit()}. {note}"),
        "",
        preamble(),
        "",
        "## Every row on validation",
        "",
        ("| row | what | teacher | target | slates | epochs | val tau | val top1 | val top10 "
         "| val AUC | val R@10 | train s |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in selected:
        summary = summaries.get(row.name)
        if summary is None:
            continue
        e = summary.get("eval", {})
        seconds = summary.get("driver_wall_s", summary.get("wall_s_this_run", 0))
        lines.append(
            f"| {row.name} | {row.what} | {row.teacher} | {row.target} | {row.limit} | "
            f"{row.epochs:g} | {fmt(e.get('tau'))} | {fmt(e.get('top1'))} | "
            f"{fmt(e.get('top10'))} | {fmt(e.get('AUC'))} | {fmt(e.get('R@10'))} | "
            f"{seconds:.0f} |"
        )
    if probe:
        lines += ["", (
            "Zero-shot, no training: each candidate ranked by its largest cosine with a "
            f"history item, the recipe's cached states centred ({probe['n']} validation "
            f"slates, lexical teacher): tau {probe['tau']:.3f}, top1 {probe['top1']:.3f}, "
            f"AUC {probe['AUC']:.3f}."
        )]
    if ceiling:
        lines += ["", "## What a perfect reader of the prompt could reach", "", (
            "The lexical teacher reads whole titles; the prompt holds each title cut to k "
            "tokens. Its score recomputed on the cut titles, against the teacher, on the "
            f"{ceiling['n_slates']} eval slates (IDF over the titles these slates show; the "
            f"whole-titles row checks that recomputation). The rows marked {model_name()}'s tokens "
            "compute the same TF-IDF cosine over the model's token ids instead of words: a "
            "reader matching the tokens exactly, without assembling the words the tokenizer "
            "splits into pieces; the rows marked assembled into words group those tokens back "
            "into words, as the words readout does:"), "",
            "| title tokens | tau | top1 | top10 |", "|---|---|---|---|"]
        for k, values in ceiling["rows"].items():
            lines.append(f"| {k} | " + " | ".join(fmt(values[m]) for m in FIDELITY) + " |")
    for teacher, result in evals.items():
        metrics = (*QUALITY, *FIDELITY)
        lines += ["", f"## Eval slates, teacher `{teacher}` ({result['n_slates']} slates)", "",
                  "| row | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        for name, values in result["rows"].items():
            lines.append(f"| {name} | " + " | ".join(fmt(values.get(m)) for m in metrics) + " |")
        for ref, comp in result["paired"].items():
            lines += ["", f"Paired differences, row minus `{ref}` (95% {comp['method']}):", "",
                      "| row | " + " | ".join(comp["metrics"]) + " |",
                      "|---|" + "---|" * len(comp["metrics"])]
            for name, diffs in comp["rows"].items():
                lines.append(f"| {name} | " + " | ".join(
                    interval(diffs[m]) for m in comp["metrics"]) + " |")
    (OUT / "report.md").write_text("\n".join(lines) + "\n")
    (OUT / "results.json").write_text(json.dumps(
        {"validation": summaries, "zero_shot": probe, "ceiling": ceiling, "eval": evals},
        indent=1) + "\n")
    (OUT / "commands.txt").write_text("\n".join(
        shlex.join(r.train_command()) for r in selected) + "\n")
    plot_curves(selected, summaries)


def zero_shot(n: int = 512) -> dict[str, float]:
    """The recipe's cached validation states with no training: candidates ranked by their
    largest cosine with a history item (states centred on their mean)."""
    import numpy as np
    import torch

    from spdrank.core.slates import load_slates
    from spdrank.eval.metrics import auc, kendall_tau, top1_agreement

    directory = Row("probe", "").states() / "eval"
    meta_path = directory / "key.json"
    if not meta_path.exists():
        return {}
    from safetensors import safe_open

    slates = load_slates(labelled("lexical", "valid"))[:n]
    items: list[np.ndarray] = []
    history: list[np.ndarray] = []
    shard = 0
    while len(items) < len(slates):
        with safe_open(str(directory / f"shard-{shard:05d}.safetensors"), "pt") as fh:
            for name, out in (("states", items), ("history", history)):
                rows = fh.get_tensor(name).float()
                sizes = fh.get_tensor("sizes" if name == "states" else "history_sizes")
                out.extend(t.numpy() for t in torch.split(rows, sizes.tolist()))
        shard += 1
    centre = np.concatenate(items[: len(slates)]).mean(0)
    taus, top1, aucs = [], [], []
    for slate, c, h in zip(slates, items, history):
        c = c - centre
        h = h - centre
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        h /= np.linalg.norm(h, axis=1, keepdims=True)
        order = [slate.docids[i] for i in np.argsort(-(c @ h.T).max(1), kind="stable")]
        tau = kendall_tau(order, slate.teacher, slate.teacher_scores)
        if tau is not None:
            taus.append(tau)
        top1.append(top1_agreement(order, slate.teacher, slate.teacher_scores))
        aucs.append(auc(order, set(slate.clicked or ())))
    return {"n": len(slates), "tau": float(np.mean(taus)), "top1": float(np.mean(top1)),
            "AUC": float(np.mean([a for a in aucs if a is not None]))}


def truncation_ceiling(
    cuts: tuple[int, ...] = (12, 16, 24, 32), model_tokens: tuple[int, ...] = (12, 32)
) -> dict[str, Any]:
    """How close a perfect reader of the prompt can come to the lexical teacher when every
    title is cut to k tokens: the teacher's own score recomputed on the cut titles (IDF over
    the titles the eval slates show), against the teacher on whole titles, on the eval slates.
    The uncut row checks the recomputation (the teacher's IDF counts the whole catalogue).

    The ``model_tokens`` rows compute the same TF-IDF cosine over SmolLM2's token ids instead
    of words: a reader that matches the model's tokens exactly, without assembling the words
    that the tokenizer splits into pieces (or telling "Nail" from "nail"). The ``assembled``
    rows group those token ids back into words (:mod:`spdrank.backbone.words`: the runs of letters
    and digits of the text they decode to), as the ``words`` readout does."""
    import numpy as np

    from spdrank.backbone.load import load_tokenizer
    from spdrank.backbone.prompt import PromptBuilder, PromptSettings
    from spdrank.backbone.words import WordSplitter
    from spdrank.core.slates import load_slates
    from spdrank.datasets.title_similarity import TitleSimilarity
    from spdrank.eval.metrics import kendall_tau, top1_agreement, topk_overlap

    slates = load_slates(labelled("lexical", "eval"))
    tokenizer = load_tokenizer(BACKBONE)  # the students' backbone's
    histories = [history_titles(s.query.text) for s in slates]
    titles = {t for h in histories for t in h} | {c.text() for s in slates for c in s.candidates}
    similarity = TitleSimilarity(sorted(titles))
    out: dict[str, Any] = {"n_slates": len(slates), "rows": {}}
    cases = [(k, "words") for k in (None, *cuts)] + [(k, "model") for k in model_tokens]
    cases += [(k, "assembled") for k in model_tokens]
    splitter = WordSplitter(tokenizer)
    for k, terms in cases:
        score = similarity
        if k is None:
            cut = {t: t for t in titles}
        else:
            prompt = PromptBuilder(tokenizer, PromptSettings(max_item_tokens=k))
            ids = {t: prompt.item_tokens(t) for t in titles}
            if terms in ("model", "assembled"):
                cut = {t: t for t in titles}
                terms_of = {t: [str(i) for i in ids[t]] for t in titles}
                if terms == "assembled":
                    terms_of = {t: assembled_words(ids[t], splitter) for t in titles}
                score = TitleSimilarity(sorted(titles), tokenize=terms_of.__getitem__)
            else:
                cut = {t: tokenizer.decode(ids[t]) for t in titles}
        values: dict[str, list[float]] = {m: [] for m in FIDELITY}
        for slate, history in zip(slates, histories):
            scores = np.asarray(score([cut[h] for h in history],
                                      [cut[c.text()] for c in slate.candidates]))
            order = [slate.docids[i] for i in np.argsort(-scores, kind="stable")]
            for metric, value in (
                ("tau", kendall_tau(order, slate.teacher, slate.teacher_scores)),
                ("top1", top1_agreement(order, slate.teacher, slate.teacher_scores)),
                ("top10", topk_overlap(order, slate.teacher, 10, slate.teacher_scores)),
            ):
                if value is not None:
                    values[metric].append(value)
        name = "whole titles" if k is None else str(k)
        label = {"words": name, "model": f"{name}, {model_name()}'s tokens",
                 "assembled": f"{name}, {model_name()}'s tokens assembled into words"}[terms]
        out["rows"][label] = {
            m: float(np.mean(v)) for m, v in values.items()}
    return out


def assembled_words(ids: list[int], splitter: Any) -> list[str]:
    """The lower-cased words a title's token ids make, as the ``words`` readout groups them."""
    pieces = ["".join(splitter.piece(i) for i in ids[a : z + 1]) for a, z in splitter.spans(ids)]
    return [p.strip().lower() for p in pieces]


def history_titles(text: str) -> list[str]:
    """The history's titles from a query text that lists them one a line as ``k. title``."""
    return [line.split(". ", 1)[-1] for line in text.splitlines() if line.strip()]


def plot_curves(selected: list[Row], summaries: dict[str, Any]) -> None:
    """Validation fidelity against training slates: a line per teacher, readout and metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = [r for r in selected if r.curve and r.name in summaries]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for teacher, readout, cut in sorted({(r.teacher, r.readout, r.item_tokens) for r in curve}):
        for metric, style in zip(FIDELITY, ("-", "--", ":")):
            points = sorted(
                (r.limit, summaries[r.name]["eval"].get(metric))
                for r in curve if (r.teacher, r.readout, r.item_tokens) == (teacher, readout, cut)
            )
            if points:
                ax.plot(*zip(*points), style, marker="o",
                        label=f"{teacher}, {readout}, {cut} tokens: {metric}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training slates")
    ax.set_ylabel("validation agreement with the teacher")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "curve-slates.png", dpi=120)
    plt.close(fig)


def git_commit() -> str:
    """HEAD's short hash, marked when src/ or the scripts hold uncommitted changes."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src", "benchmarks",
                            ":(exclude)benchmarks/results"],
                           cwd=ROOT, check=False).returncode
    return (done.stdout.strip() or "unknown") + (" (+ uncommitted changes)" if dirty else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these rows")
    parser.add_argument("--skip", nargs="+", metavar="NAME", default=[],
                        help="leave these rows out (e.g. ones too slow for this machine)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--backbone", default="bundled",
                        help="the students' backbone (spdrank train --backbone); any other than "
                        "bundled runs in runs/fidelity-SLUG/ and reports in OUT/SLUG/")
    args = parser.parse_args(argv)
    if args.backbone != "bundled":
        use_backbone(args.backbone)
    os.chdir(ROOT)
    selected = [r for r in rows() if (not args.only or r.name in args.only)
                and r.name not in args.skip]
    unknown = set(args.only or []) - {r.name for r in rows()}
    if unknown:
        parser.error(f"unknown rows: {sorted(unknown)}")
    cmds = prepare({r.teacher for r in selected} if args.only else set(TEACHERS), args.dry_run)
    if not args.only:
        cmds += bench_teachers(args.dry_run)
    if args.dry_run:
        for cmd in [*cmds, *(r.train_command() for r in selected)]:
            print(shlex.join(cmd))
        return 0
    summaries = {r.name: train_row(r) for r in selected}
    evals = {}
    for teacher in sorted({r.teacher for r in selected}):
        chosen = [r for r in selected if r.teacher == teacher and r.on_eval]
        evals[teacher] = evaluate_on_eval(chosen, teacher)
    lexical = any(r.teacher == "lexical" for r in selected)
    ceiling = truncation_ceiling() if lexical else {}
    write_report(selected, summaries, evals, zero_shot(), ceiling, argv, args.note)
    print(f"report: {OUT / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
