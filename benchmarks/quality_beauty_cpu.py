"""What makes the SPD student worth its latency on Amazon Beauty, measured at CPU scale.

    .venv/bin/python benchmarks/quality_beauty_cpu.py [--negatives uniform popularity]
        [--only NAME ...] [--dry-run]

The protocol (issue 9): every configuration trains on the training users and is chosen on a
validation split of 1,000 other training users (``spdrank data beauty --validation 1000
--features``); the 1,118 eval slates are scored only for the configurations in the report's
eval columns. The co-occurrence baseline labels every split as the teacher
(``spdrank teacher --backend ranker:cooccurrence``), so ``teacher`` and ``teacher+clicks``
targets are available and every row shows its fidelity to that teacher.

Each configuration is one ``spdrank train`` command (run directory under ``runs/quality-NEG/``;
a finished run is reused, an interrupted one resumes), its validation metrics come from the
run's own evaluation on all 1,000 validation slates (through the state cache for frozen-
backbone runs), and its eval metrics from one ``spdrank eval`` beside the baselines. Writes
``benchmarks/results/quality-beauty-cpu/`` (report.md, results.json, the commands). The
slowest parts are the frozen backbone's states, computed once per backbone setting and shared
by the runs that read them, and the LLM rows' eval (the backbone runs on every eval slate).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Paths are relative to the repository root (the script runs there), so commands read portably.
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(".venv/bin")
OUT = Path("benchmarks/results/quality-beauty-cpu")
METRICS = ("AUC", "R@1", "R@10", "NDCG@10", "MRR", "tau", "top1")
FEATURES = ["--features", "popularity,cooccurrence"]
#: The other features of the build, each added to the two the baselines rank by.
TRANSITION = ["--features", "popularity,cooccurrence,transition"]
TITLE = ["--features", "popularity,cooccurrence,title_similarity"]
ALL_FEATURES = ["--features", "popularity,cooccurrence,transition,title_similarity"]
#: Validation slates (``spdrank data beauty --validation``), every one scored.
VALIDATION = 1000
#: The builder's history length; a row with another one reads slates of its own build.
HISTORY = 10


def build_suffix(history: int) -> str:
    """What names a build's files apart from the default build's: ``-h5`` for history 5."""
    return "" if history == HISTORY else f"-h{history}"


#: The student's settings every configuration shares unless it says otherwise.
COMMON = [
    "--head",
    "attn",
    "--batch-size",
    "32",
    "--epochs",
    "1",
    "--lr",
    "1e-3",
    "--head-lr",
    "1e-3",
    "--seed",
    "0",
    "--save-every",
    "100",
    "--eval-every",
    "0",
]
#: The backbone of the LLM rows unless they say otherwise: SmolLM2's first LAYERS layers,
#: titles cut to ITEM_TOKENS tokens.
LAYERS = 2
ITEM_TOKENS = 12


def backbone(
    layers: int = LAYERS,
    item_tokens: int = ITEM_TOKENS,
    lora_r: int | None = None,
    lora_modules: str | None = None,
) -> list[str]:
    """The backbone arguments of an LLM row: frozen (its states cached) unless ``lora_r``."""
    args = ["--layers", str(layers), "--max-item-tokens", str(item_tokens)]
    if lora_r is None:
        return ["--frozen", *args, "--cache-dtype", "float16"]
    args += ["--lora-r", str(lora_r), "--lora-alpha", str(lora_r)]
    return args + (["--lora-modules", lora_modules] if lora_modules else [])


LLM = backbone()


@dataclass
class Config:
    """One row: the extra arguments of its ``spdrank train`` command."""

    name: str
    what: str
    args: list[str] = field(default_factory=list)
    limit: int | None = None
    llm: bool = False
    #: Scored on the eval slates too. Off only for the rows of the LLM's states alone and the
    #: ten-epoch rows: far below both baselines on validation, so their eval (the backbone's
    #: prefill on 1,118 slates, 8-22 min of one core each) could not change a choice.
    on_eval: bool = True
    #: A 2,000-slate features-only row that competes for the best target/weights/decoder.
    candidate: bool = False
    #: This row takes the winning candidate's settings after its own ``args``.
    takes_best: bool = False
    #: Its eval slates are compared with co-occurrence's one by one (bootstrap intervals).
    paired: bool = False
    #: One lever changed from a row's settings (tables of --lever-negatives only).
    lever: bool = False
    #: Most recent items kept as the user's history (``spdrank data beauty --history``): a
    #: value other than the build's 10 reads slates (and baselines) of its own build.
    history: int = HISTORY

    def states(self) -> str | None:
        """The state cache directory's name of a frozen-backbone row (None: no cache): one per
        backbone setting and build, shared by the rows that read the same states."""
        if "--frozen" not in self.args:
            return None
        layers = self.args[self.args.index("--layers") + 1]
        tokens = self.args[self.args.index("--max-item-tokens") + 1]
        return f"states-L{layers}-t{tokens}" + build_suffix(self.history)


def features_only(*args: str, features: list[str] = FEATURES) -> list[str]:
    return features + ["--features-only", *args]


def lever(name: str, what: str, *settings: str) -> Config:
    """A 2,000-slate features-only row: the best candidate's settings and one lever changed,
    to be read against that candidate's own row (the same slates, steps and seed)."""
    return Config(
        f"lever/{name}", what, features_only(*settings), limit=2000, takes_best=True, lever=True
    )


def candidate(name: str, what: str, *settings: str) -> Config:
    """A 2,000-slate features-only row that competes to be the best settings."""
    return Config(name, what, features_only(*settings), limit=2000, candidate=True)


def llm_lever(name: str, what: str, args: list[str], on_eval: bool = True) -> Config:
    """A 2,000-slate row with the backbone (frozen or LoRA) and the best candidate's settings."""
    return Config(name, what, args, limit=2000, llm=True, on_eval=on_eval, takes_best=True)


#: The settings a candidate row varies: the rows that take the best one take these from it.
VARIED = ("--target", "--position-weights", "--decoder")

CONFIGS = [
    # The training target, the loss's position weights and the decoder, on 2,000 slates.
    candidate(
        "features/clicks/2k",
        "features only, clicks target (the paper's Track 1 signal), Hungarian decoder",
        "--target",
        "clicks",
        "--decoder",
        "hungarian",
    ),
    candidate(
        "features/clicks/2k/expected_rank",
        "as above, decoded by expected rank",
        "--target",
        "clicks",
        "--decoder",
        "expected_rank",
    ),
    candidate(
        "features/teacher/2k",
        "features only, the co-occurrence teacher's ranking",
        "--target",
        "teacher",
        "--decoder",
        "hungarian",
    ),
    candidate(
        "features/teacher/2k/expected_rank",
        "as above, decoded by expected rank",
        "--target",
        "teacher",
        "--decoder",
        "expected_rank",
    ),
    candidate(
        "features/teacher+clicks/2k",
        "features only, the teacher's ranking with the click first",
        "--target",
        "teacher+clicks",
        "--decoder",
        "hungarian",
    ),
    candidate(
        "features/teacher+clicks/2k/dcg",
        "as above, loss rows weighted 1/log2(2+j)",
        "--target",
        "teacher+clicks",
        "--position-weights",
        "dcg",
        "--decoder",
        "hungarian",
    ),
    candidate(
        "features/clicks/2k/dcg/expected_rank",
        "clicks, loss rows weighted 1/log2(2+j), decoded by expected rank",
        "--target",
        "clicks",
        "--position-weights",
        "dcg",
        "--decoder",
        "expected_rank",
    ),
    # The optimisation and head levers, one at a time, on 2,000 slates.
    lever("tau0.5", "Sinkhorn temperature 0.5 (default 1)", "--tau", "0.5"),
    lever("tau2", "Sinkhorn temperature 2", "--tau", "2"),
    lever("iters5", "5 Sinkhorn iterations (default 20)", "--sinkhorn-iters", "5"),
    lever("iters50", "50 Sinkhorn iterations", "--sinkhorn-iters", "50"),
    lever("width64", "head width 64 (default 256)", "--head-width", "64"),
    lever("width512", "head width 512", "--head-width", "512"),
    lever("head-layers1", "1 self-attention layer in the head (default 2)", "--head-layers", "1"),
    lever("head-layers4", "4 self-attention layers in the head", "--head-layers", "4"),
    lever("lr3e-4", "learning rate 3e-4 (default 1e-3)", "--lr", "3e-4", "--head-lr", "3e-4"),
    lever("lr3e-3", "learning rate 3e-3", "--lr", "3e-3", "--head-lr", "3e-3"),
    lever(
        "warmup0",
        "no warm-up (default: 20 of the 63 steps), then linear decay",
        "--warmup-steps",
        "0",
    ),
    lever("warmup60", "warm-up over nearly every step (60 of 63)", "--warmup-steps", "60"),
    # The number of training slates.
    Config(
        "features/best",
        "the best 2k row's settings on all 20,245 training slates",
        features_only(),
        takes_best=True,
        paired=True,
    ),
    # Features beyond the two the baselines rank by, on all training slates.
    Config(
        "features+transition/best",
        "+ transition: count of the candidate right after the user's last item",
        features_only(features=TRANSITION),
        takes_best=True,
        lever=True,
    ),
    Config(
        "features+title/best",
        "+ title_similarity: a lexical retriever's score (TF-IDF cosine with the history titles)",
        features_only(features=TITLE),
        takes_best=True,
        lever=True,
        paired=True,
    ),
    Config(
        "features-all/best",
        "all four features: popularity, co-occurrence, transition, title_similarity",
        features_only(features=ALL_FEATURES),
        takes_best=True,
        paired=True,
    ),
    # What the LLM's states add, at equal data.
    Config(
        f"llm-L{LAYERS}/best/2k",
        f"frozen SmolLM2 (first {LAYERS} layers) states only, 2,000 slates",
        LLM,
        limit=2000,
        llm=True,
        on_eval=False,
        takes_best=True,
    ),
    Config(
        f"llm-L{LAYERS}+features/best/2k",
        f"frozen SmolLM2 (first {LAYERS} layers) states and the features, 2,000 slates",
        LLM + FEATURES,
        limit=2000,
        llm=True,
        takes_best=True,
    ),
    # Steps: from cached states an epoch costs the head alone, so train ten.
    Config(
        f"llm-L{LAYERS}/best/2k/10ep",
        "states only, 10 epochs of the 2,000 slates",
        [*LLM, "--epochs", "10"],
        limit=2000,
        llm=True,
        on_eval=False,
        takes_best=True,
    ),
    Config(
        f"llm-L{LAYERS}+features/best/2k/10ep",
        "states and the features, 10 epochs of the 2,000 slates",
        [*LLM, *FEATURES, "--epochs", "10"],
        limit=2000,
        llm=True,
        on_eval=False,
        takes_best=True,
    ),
    # The LLM-side levers against the text signal's own row at equal data (2,000 slates).
    Config(
        "features+title/best/2k",
        "the three features of the best row, 2,000 slates: what the LLM rows below add to",
        features_only(features=TITLE),
        limit=2000,
        takes_best=True,
        lever=True,
    ),
    llm_lever(
        f"llm-L{LAYERS}+title/best/2k",
        f"frozen SmolLM2 (first {LAYERS} layers) states next to the three features, 2,000 slates",
        LLM + TITLE,
    ),
    llm_lever(
        "llm-L6/best/2k",
        "depth: frozen SmolLM2's first 6 layers, states only, 2,000 slates",
        backbone(layers=6),
        on_eval=False,
    ),
    llm_lever(
        "llm-L6+title/best/2k",
        "depth: the first 6 layers' states next to the three features, 2,000 slates",
        backbone(layers=6) + TITLE,
    ),
    llm_lever(
        f"llm-L{LAYERS}+title/best/2k/t24",
        f"title token budget 24 (default {ITEM_TOKENS}): states next to the three features",
        backbone(item_tokens=24) + TITLE,
    ),
    llm_lever(
        f"lora-L{LAYERS}-r16+title/best/2k",
        f"SmolLM2's first {LAYERS} layers trained with LoRA r=16 on every linear layer, "
        "next to the three features, 2,000 slates",
        backbone(lora_r=16) + TITLE,
    ),
    llm_lever(
        f"lora-L{LAYERS}-r64+title/best/2k",
        "as above, LoRA r=64 (spdrank train's default)",
        backbone(lora_r=64) + TITLE,
    ),
    llm_lever(
        f"lora-L{LAYERS}-r16-qv+title/best/2k",
        "as above, LoRA r=16 on the attention's query and value projections only",
        backbone(lora_r=16, lora_modules="q_proj,v_proj") + TITLE,
    ),
    # History length: the features read the history too (co-occurrence, title similarity).
    Config(
        "features+title/best/h5",
        "history of the 5 most recent items (default 10), the three features, all training slates",
        features_only(features=TITLE),
        takes_best=True,
        history=5,
        lever=True,
    ),
    Config(
        "features+title/best/h20",
        "history of the 20 most recent items, the three features, all training slates",
        features_only(features=TITLE),
        takes_best=True,
        history=20,
        lever=True,
    ),
]


def run(cmd: list[str], log: Path | None = None, dry: bool = False) -> None:
    """Run ``cmd`` (one thread: the machine's other core runs other jobs), or print it."""
    line = shlex.join(cmd)
    print(("" if dry else "== ") + line, flush=True)
    if dry:
        return
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with open(log, "a") if log else open(os.devnull, "w") as fh:
        subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            check=True,
            stdout=fh if log else None,
            stderr=subprocess.STDOUT if log else None,
        )


class Experiment:
    """The rows for one negative sampler: data, teacher labels, runs, evaluations."""

    def __init__(self, negatives: str, dry: bool) -> None:
        self.neg = negatives
        self.dry = dry
        self.work = Path("runs") / f"quality-{negatives}"
        #: Every command this invocation ran, or would run (commands.txt accumulates them).
        self.commands: list[str] = []
        #: The candidate row whose settings the ``takes_best`` rows use.
        self.best: str | None = None
        #: The history lengths whose slates and labels are ready.
        self.prepared: set[int] = set()

    def sh(self, cmd: list[str], log: Path | None = None) -> None:
        self.commands.append(shlex.join(cmd))
        run(cmd, log, self.dry)

    def data(self, history: int = HISTORY) -> Path:
        return Path("data-out") / f"v-{self.neg}{build_suffix(history)}"

    def labelled(self, history: int = HISTORY) -> Path:
        return self.work / f"cooccurrence{build_suffix(history)}"

    def slates(self, split: str, history: int = HISTORY) -> Path:
        return self.labelled(history) / f"{split}.slates.jsonl"

    def prepare(self, history: int = HISTORY) -> None:
        """The slates (with a validation split and features) and the teacher's labels."""
        if history in self.prepared:
            return
        self.prepared.add(history)
        data = self.data(history)
        if not (data / "manifest.json").exists() or self.dry:
            self.sh(
                [
                    str(BIN / "spdrank"),
                    "data",
                    "beauty",
                    "--out",
                    str(data),
                    "--negatives",
                    self.neg,
                    "--validation",
                    str(VALIDATION),
                    "--features",
                    *([] if history == HISTORY else ["--history", str(history)]),
                    "--no-progress",
                ]
            )
        for split in ("train", "valid", "eval"):
            summary = self.labelled(history) / f"{split}.summary.json"
            if summary.exists() and not self.dry:
                continue
            self.sh(
                [
                    str(BIN / "spdrank"),
                    "teacher",
                    "--slates",
                    str(data / f"{split}.jsonl"),
                    "--out",
                    str(self.labelled(history) / f"{split}.labels.jsonl"),
                    "--slates-out",
                    str(self.slates(split, history)),
                    "--backend",
                    "ranker:cooccurrence",
                    "--train",
                    str(data / "train.jsonl"),
                    "--json",
                    str(summary),
                    "--no-progress",
                ]
            )

    def run_dir(self, cfg: Config) -> Path:
        """Named by the row (and by the winner whose settings it takes: another winner, another run)."""
        name = cfg.name + (f"@{self.best}" if cfg.takes_best and self.best else "")
        return self.work / "runs" / name.replace("/", "__")

    def best_settings(self) -> list[str]:
        """The varied settings of the candidate row best on validation (R@10, then AUC)."""
        if self.dry:
            return ["<the best candidate's", *VARIED, ">"]
        scored = []
        for cfg in CONFIGS:
            if cfg.candidate:
                self.train(cfg)
                valid = json.loads((self.run_dir(cfg) / "train.json").read_text())["eval"]
                scored.append(((valid["R@10"], valid["AUC"]), cfg))
        best = max(scored, key=lambda pair: pair[0])[1]
        self.best = best.name
        return [
            a for i, a in enumerate(best.args) if a in VARIED or (i and best.args[i - 1] in VARIED)
        ]

    def train(self, cfg: Config) -> None:
        best = self.best_settings() if cfg.takes_best else []
        out = self.run_dir(cfg)
        if (out / "train.json").exists() and not self.dry:
            return
        self.prepare(cfg.history)
        cmd = [
            str(BIN / "spdrank"),
            "train",
            "--slates",
            str(self.slates("train", cfg.history)),
            "--out",
            str(out),
            *COMMON,
            *cfg.args,
            *best,
            "--eval-slates",
            str(self.slates("valid", cfg.history)),
            "--eval-limit",
            str(VALIDATION),
            "--no-progress",
        ]
        if cfg.limit:
            cmd += ["--limit", str(cfg.limit)]
        if cfg.states():
            cmd += ["--cache-states", str(self.work / cfg.states())]
        start = time.time()
        if not self.dry:
            out.parent.mkdir(parents=True, exist_ok=True)
        self.sh(cmd, out.parent / f"{out.name}.log")
        if not self.dry:
            (out / "wall_s.txt").write_text(f"{time.time() - start:.0f}\n")

    def evaluate(
        self, split: str, rows: list[Config], history: int = HISTORY, what: str = "models"
    ) -> dict[str, Any]:
        """The baselines and ``rows`` on ``split`` of the ``history`` build (each model with its
        own decoder), in ``{split}[-hH]-{what}.json``: rows not yet in it are evaluated by one
        more ``spdrank eval`` and merged in, so a new row never re-scores the others. Two
        drivers may evaluate different rows at once: each writes its own part file and merges
        it into the file as it is when its evaluation ends."""
        tag = what if history == HISTORY else f"h{history}-{what}"
        result = self.work / f"{split}-{tag}.json"

        def read() -> dict[str, Any]:
            if not result.exists() or self.dry:
                return {"rankers": {}, "parts": []}
            found = json.loads(result.read_text())
            found.setdefault("parts", [found.get("meta")])
            return found

        done = read()
        missing = [c for c in rows if label(c) not in done["rankers"]]
        if done["rankers"] and not missing:
            return done
        part = self.work / f"{split}-{tag}.part-{os.getpid()}.json"
        cmd = [
            str(BIN / "spdrank"),
            "eval",
            "--slates",
            str(self.slates(split, history)),
            "--train",
            str(self.data(history) / "train.jsonl"),
            "--ranker",
            "popularity",
            "--ranker",
            "cooccurrence",
        ]
        for cfg in missing:
            cmd += ["--model", f"{label(cfg)}={self.run_dir(cfg)}"]
        self.sh(cmd + ["--json", str(part), "--no-progress"], self.work / f"{split}-{tag}.log")
        if self.dry:
            return {}
        new = json.loads(part.read_text())
        done = read()
        # The baselines are deterministic: a part's agree with the file's, so the first stay.
        done["rankers"] = {**new["rankers"], **done["rankers"]}
        done["parts"].append(new["meta"])
        done.update({k: v for k, v in new.items() if k not in ("rankers", "meta")})
        tmp = part.with_suffix(".tmp")
        tmp.write_text(json.dumps(done, indent=1) + "\n")
        tmp.replace(result)
        part.unlink()
        return done

    def table(self, configs: list[Config]) -> list[dict[str, Any]]:
        self.prepare()
        for cfg in configs:
            self.train(cfg)
        histories = sorted(
            {c.history for c in configs} | {HISTORY}, key=lambda h: (h != HISTORY, h)
        )
        evals: dict[int, dict[str, dict[str, float]]] = {}
        table = []
        for history in histories:
            mine = [c for c in configs if c.history == history]
            evals[history] = rows_of(self.evaluate("eval", [c for c in mine if c.on_eval], history))
            valid = rows_of(self.evaluate("valid", [], history, "baselines"))
            for name in ("popularity", "cooccurrence"):
                table.append(
                    {
                        "row": name + ("" if history == HISTORY else f"/h{history}"),
                        "baseline": True,
                        "history": history,
                        "valid": valid.get(name),
                        "eval": evals[history].get(name),
                        "what": "baseline (counted on the training users)"
                        + ("" if history == HISTORY else f", history of {history} items"),
                    }
                )
        paired = {c.name: self.paired_with_cooccurrence(c) for c in configs if c.paired}
        for cfg in configs:
            run_dir = self.run_dir(cfg)
            summary = {} if self.dry else json.loads((run_dir / "train.json").read_text())
            table.append(
                {
                    "row": cfg.name,
                    "what": cfg.what + (f" ({self.best}'s settings)" if cfg.takes_best else ""),
                    "valid": pick(summary.get("eval")),
                    "eval": evals[cfg.history].get(label(cfg)),
                    "run": str(run_dir),
                    "history": cfg.history,
                    "train_slates": summary.get("train_slates"),
                    "steps": summary.get("total_steps"),
                    "train_wall_s": read_wall(run_dir),
                    "settings_of": self.best if cfg.takes_best else None,
                    "paired_vs_cooccurrence": paired.get(cfg.name),
                }
            )
        return table

    def paired_with_cooccurrence(self, cfg: Config) -> dict[str, Any] | None:
        """Slate-by-slate differences of ``cfg``'s row from co-occurrence on the eval slates,
        with 95% bootstrap intervals (``spdrank bench --reference``): is a gap noise?"""
        # The first paired row keeps the directory it had before there were several.
        out = self.work / ("paired-eval" if cfg.name == "features/best" else f"paired-{label(cfg)}")
        cmd = [
            str(BIN / "spdrank"),
            "bench",
            "--slates",
            str(self.slates("eval", cfg.history)),
            "--train",
            str(self.data(cfg.history) / "train.jsonl"),
            "--ranker",
            "cooccurrence",
            "--model",
            f"student={self.run_dir(cfg)}",
            "--decoders",
            "expected_rank,hungarian",
            "--reference",
            "cooccurrence",
            "--bootstrap",
            "2000",
            "--seed",
            "0",
            "--out",
            str(out),
            "--no-progress",
        ]
        if not (out / "results.json").exists() or self.dry:
            self.sh(cmd, out.with_suffix(".log"))
        if self.dry:
            return None
        rows = json.loads((out / "results.json").read_text())["paired"]["rows"]
        return {name: {m: row[m] for m in ("AUC", "R@1", "R@10")} for name, row in rows.items()}


def label(cfg: Config) -> str:
    """A row's name in ``spdrank eval`` (no '/', which separates NAME=DIR paths)."""
    return cfg.name.replace("/", ":")


def rows_of(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``spdrank eval --json`` output -> {ranker name: its metrics}."""
    return {name: pick(row["metrics"]) for name, row in result.get("rankers", {}).items()}


def pick(metrics: dict[str, Any] | None) -> dict[str, float] | None:
    if metrics is None:
        return None
    values = {m: metrics.get(m) for m in METRICS}
    # `spdrank eval --json` gives {"mean": x, "n": n} per metric; a run's summary gives x.
    return {m: v["mean"] if isinstance(v, dict) else v for m, v in values.items() if v is not None}


def read_wall(run_dir: Path) -> int | None:
    path = run_dir / "wall_s.txt"
    return int(path.read_text()) if path.exists() else None


def fmt(metrics: dict[str, float] | None, names: tuple[str, ...]) -> list[str]:
    return [f"{metrics[m]:.4f}" if metrics and m in metrics else "—" for m in names]


def beats_baselines(table: list[dict[str, Any]], row: dict[str, Any], split: str) -> bool | None:
    """Whether ``row`` beats both baselines (on slates of its history length) on AUC, R@1 and
    R@10 on ``split``."""
    mine = row.get(split)
    history = row.get("history", HISTORY)
    bases = [r[split] for r in table if r.get("baseline") and r.get("history", HISTORY) == history]
    if not mine or not all(bases):
        return None
    return all(mine[m] > b[m] for b in bases for m in ("AUC", "R@1", "R@10"))


def report(tables: dict[str, list[dict[str, Any]]], argv: list[str], wall_s: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?"
    )
    lines = [
        "# Quality of the SPD student on Amazon Beauty at CPU scale (issue 9)",
        "",
        f"One command: `.venv/bin/python benchmarks/quality_beauty_cpu.py {shlex.join(argv)}`".rstrip()
        + "",
        "",
        (
            f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%MZ}; commit: {commit}; machine: "
            f"{os.cpu_count()} CPU cores ({cpu}), no GPU; each job on one thread; wall time of this "
            f"invocation {wall_s:.0f} s (finished runs reused, their own wall time in the table)"
        ),
        (
            "- data: `spdrank data beauty --validation 1000 --features` (50 candidates, history 10): "
            "20,245 training slates, 1,000 validation slates (other training users; every choice is "
            "made on them), the 1,118 eval slates; features: log1p popularity, co-occurrence and "
            "transition (right after the last item) counted on the training users only, each "
            "training slate's own user left out, and title_similarity (TF-IDF cosine of the "
            "titles, no interactions); rows name the features they read (`features` = the two "
            "the baselines rank by)"
        ),
        (
            "- teacher: the co-occurrence baseline labels every split (`ranker:cooccurrence`); tau "
            "and top1 are fidelity to it"
        ),
        (
            f"- students: attention head (2 layers, width 256) + Hungarian unless the row says "
            f"otherwise; batch 32, 1 epoch, lr 1e-3 (head and LoRA), seed 0. LLM rows: "
            f"SmolLM2-135M-Instruct (bundled) cut to its first {LAYERS} of 30 layers (L6: 6), "
            f"titles cut to {ITEM_TOKENS} tokens (t24: 24), frozen with its states cached once "
            "(float16), or (lora-* rows) trained with LoRA (alpha = r), which no cache can serve; "
            "`train s` is the wall time of the invocation that finished the row's training, "
            "including the states it cached (an interrupted earlier one's not counted); `—` "
            "under eval: scored on validation only (the LLM's states alone and the ten-epoch "
            "rows, far below both baselines there)"
        ),
        (
            "- history: the user's 10 most recent items unless the row says otherwise (h5, h20: "
            "slates of their own `--history` build, the same users and candidates, with their own "
            "baselines: popularity/hH, cooccurrence/hH); `beats both` compares a row with the "
            "baselines of its own build"
        ),
        "",
    ]
    for neg, table in tables.items():
        lines += [
            f"## {neg} negatives",
            "",
            (
                "| row | valid AUC | valid R@1 | valid R@10 | eval AUC | eval R@1 | eval R@10 | "
                "eval NDCG@10 | eval tau | eval top1 | beats both (eval) | train slates | train s | what |"
            ),
            "| --- " * 14 + "|",
        ]
        for row in table:
            beat = beats_baselines(table, row, "eval")
            lines.append(
                "| "
                + " | ".join(
                    [
                        row["row"],
                        *fmt(row["valid"], ("AUC", "R@1", "R@10")),
                        *fmt(row["eval"], ("AUC", "R@1", "R@10", "NDCG@10", "tau", "top1")),
                        "" if row.get("baseline") else {True: "yes", False: "no", None: "—"}[beat],
                        str(row.get("train_slates") or ""),
                        str(row.get("train_wall_s") or ""),
                        row["what"],
                    ]
                )
                + " |"
            )
        students = [r for r in table if r.get("valid") and not r.get("baseline")]
        if students:
            best = max(students, key=lambda r: (r["valid"]["R@10"], r["valid"]["AUC"]))
            recall = best["valid"]["R@10"]
            # R@10 is a mean of 0/1 hits over the validation slates: its binomial error.
            error = (recall * (1 - recall) / VALIDATION) ** 0.5
            tied = [
                r["row"] for r in students if r is not best and recall - r["valid"]["R@10"] <= error
            ]
            summary = (
                f"Best on validation (R@10, then AUC): **{best['row']}** (R@10 {recall:.3f}; one "
                f"standard error of a R@10 over {VALIDATION:,} slates: {error:.3f}, so within it: "
                f"{', '.join(tied) or 'none'})."
            )
            lines += ["", summary]
        for row in table:
            for name, diffs in (row.get("paired_vs_cooccurrence") or {}).items():
                cells = ", ".join(
                    f"{m} {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
                    for m, d in diffs.items()
                )
                lines += [
                    "",
                    (
                        f"{row['row']} (`{name}`) minus co-occurrence on the eval slates, "
                        f"mean paired difference [95% bootstrap interval]: {cells}."
                    ),
                ]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--negatives",
        nargs="+",
        default=["uniform", "popularity"],
        choices=["uniform", "popularity"],
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these rows, their table printed, the committed report left alone (default: all)",
    )
    p.add_argument(
        "--skip",
        nargs="+",
        default=[],
        metavar="NAME",
        help="every row but these (rows not measured yet: the report names them in its command)",
    )
    p.add_argument(
        "--llm-negatives",
        nargs="*",
        default=["uniform", "popularity"],
        choices=["uniform", "popularity"],
        help="the negatives whose tables get the LLM rows (their states cost the most; "
        "default: both)",
    )
    p.add_argument(
        "--lever-negatives",
        nargs="*",
        default=["uniform"],
        choices=["uniform", "popularity"],
        help="the negatives whose tables get the one-lever-at-a-time rows (default: uniform)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands instead")
    args = p.parse_args(argv)
    unknown = (set(args.only or []) | set(args.skip)) - {c.name for c in CONFIGS}
    if unknown:
        p.error(f"unknown rows {sorted(unknown)}: choose from {[c.name for c in CONFIGS]}")
    configs = [
        c for c in CONFIGS if (not args.only or c.name in args.only) and c.name not in args.skip
    ]
    os.chdir(ROOT)
    start = time.time()
    tables = {}
    for neg in args.negatives:
        experiment = Experiment(neg, args.dry_run)
        rows = [
            c
            for c in configs
            if (neg in args.llm_negatives or not c.llm)
            and (neg in args.lever_negatives or not c.lever)
        ]
        tables[neg] = experiment.table(rows)
        if not args.dry_run and experiment.commands:
            with open(experiment.work / "commands.txt", "a") as fh:
                fh.write("\n".join(experiment.commands) + "\n")
    if args.dry_run:
        return 0
    if args.only:
        print(report(tables, argv, time.time() - start))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    text = report(tables, argv, time.time() - start)
    (OUT / "report.md").write_text(text)
    (OUT / "results.json").write_text(json.dumps(tables, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
