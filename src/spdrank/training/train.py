"""Training the SPD student: Sinkhorn cross-entropy against a target permutation per slate.

The loop runs through accelerate, so ``accelerate launch`` or ``spdrank train
--num-processes N`` spreads it over processes as data-parallel training: each process takes
its share of every global batch of ``batch_size`` slates, and the loss is weighted so that
DDP's gradient mean is the gradient of the global batch's mean loss, as one process would
compute it. Only the main process writes checkpoints, state and logs.

Slates are read from the file as they are needed (:mod:`spdrank.training.slate_source`), so the
training file may be larger than memory. The run is resumable: every ``save_every`` steps it
writes a training state (model, optimizer, scheduler, step, each process's random-number
state) under ``OUT/state`` with no pickles; rerunning the same command continues from there.
The data order is a pure function of the seed and the epoch, so a resumed run sees exactly
the batches an uninterrupted one would have, and the same seed gives the same weights.

With a frozen backbone and ``cache_states``, the readout states of the training and eval
slates are computed once (:mod:`spdrank.model.state_cache`) and every step reads them instead of
running the backbone: the head, targets, loss, data order and checkpoint are those of a live
run, and the upstream features still come from the slates.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.logging import get_logger
from safetensors.torch import load_file, save_file

from spdrank.backbone.batching import Batch
from spdrank.backbone.load import resolve_device
from spdrank.core.atomic_dir import atomic_directory
from spdrank.core.defaults import DEFAULT_WARMUP, DEFAULT_WARMUP_SHARE
from spdrank.core.features import FeatureNormalizer, parse_feature_names
from spdrank.core.progress import Progress
from spdrank.core.slates import Slate, SlateError, iter_slates, load_slates, read_slates
from spdrank.core.validation import located
from spdrank.eval.first_stage import selection_metric, verdict
from spdrank.eval.metrics import SlateMetrics, aggregate
from spdrank.methods.anchor_spec import BEST_ANCHOR, FEATURE_ANCHOR, parse_anchor
from spdrank.model.checkpoint import (
    MODEL_DIR,
    OPTIMIZER_NAME,
    RNG_NAME,
    STATE_DIR,
    SUMMARY_NAME,
    TRAINER_NAME,
)
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import StateCache, open_state_cache
from spdrank.training.blend import best_blend
from spdrank.training.config import TrainConfig
from spdrank.training.inputs import input_names, mean_of, score_inputs, slates_metrics
from spdrank.training.run_record import (
    ALREADY_KEY,
    FILES_KEY,
    SETTINGS_KEY,
    RunFinished,
    check_rerun,
    input_files,
    settings_record,
)
from spdrank.training.slate_source import SkipSlate, open_slate_source
from spdrank.training.targets import (
    RELEVANCE_TARGETS,
    has_relevant_candidate,
    ranks_clicks_first,
    target_matrix,
    teacher_ties,
)
from spdrank.training.warm_start import warm_start

#: Logs from the main process only, so N processes do not print every line N times.
log = get_logger(__name__)

#: The targets that read clicks: a slate without a clicked item gives them nothing to learn.
CLICK_TARGETS = ("clicks", "teacher+clicks")

#: Where a run keeps the best model evaluated so far (``--select best``), and what it scored.
BEST_DIR = "best"
BEST_NAME = "best.json"
#: An anchor's strength at the start of a run on clicks. The clicks target puts the clicked
#: item first and asserts no order among the rest, so a prior that pins every item to its
#: rank is fought by every unclicked item's row; a weak one still makes the untrained student
#: rank exactly as its anchor, and leaves the head free to learn what the clicks say.
CLICKS_STRENGTH = 1.0
#: Where a run saves the input it keeps when no evaluation of its student ranks as well.
INPUT_MODEL = "input"
#: The training slates ``--anchor best`` chooses on when the run has no eval slates to
#: choose on: enough to tell rankers apart, read once.
CHOICE_SLATES = 2000
LOG_NAME = "log.jsonl"
#: The training slates read to tell whether the teacher saw their clicks.
CLICK_COPY_READ = 1000


# -- optimizer state without pickles ----------------------------------------------------------


def _save_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> dict[str, Any]:
    """Tensors to safetensors, the rest (hyper-parameters) returned for the JSON state."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    save_file(tensors, str(path))
    return {"param_groups": sd["param_groups"], "scalars": scalars}


def _load_optimizer(optimizer: torch.optim.Optimizer, path: Path, meta: dict[str, Any]) -> None:
    tensors = load_file(str(path))
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, extra in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(extra)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


# -- the loop ---------------------------------------------------------------------------------




def warmup_steps(asked: int | None, total: int) -> int:
    """The warm-up of a run of ``total`` steps: ``asked``, else the default, cut to a tenth of
    the run (at least one step), since 20 steps of a 16-step run would end it before the
    learning rate ever reached its value."""
    if asked is not None:
        return asked
    return min(DEFAULT_WARMUP, max(1, math.ceil(total * DEFAULT_WARMUP_SHARE)))


def warmup_note(asked: int | None, warmup: int, total: int) -> tuple[int, str] | None:
    """``(log level, line)`` on a run's warm-up of ``warmup`` steps in ``total``, when it is not
    what the flags say at face value: the default cut to a tenth of the run (:func:`warmup_steps`;
    why the default would not fit is said only when it would not, a run no longer than it),
    or an ``asked`` warm-up the run never finishes. None otherwise."""
    if asked is None and warmup < DEFAULT_WARMUP:
        share = f"{DEFAULT_WARMUP_SHARE:.0%} of"
        why = (f"the default {DEFAULT_WARMUP} would not end before the run does"
               if DEFAULT_WARMUP >= total else
               f"the default of {DEFAULT_WARMUP} steps is cut to {share} a run, so that most of "
               "it trains at the full learning rate")
        return logging.INFO, (f"warming up over {warmup} steps, {share} this run's {total} "
                              f"({why}); --warmup-steps N to choose")
    if asked is not None and asked >= total:
        return logging.WARNING, (
            f"--warmup-steps {asked} is not below this run's {total} steps: the learning rate "
            "never reaches its value (leave --warmup-steps out to warm up over "
            f"{DEFAULT_WARMUP_SHARE:.0%} of the run)"
        )
    return None


def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def share(start: int, stop: int, process: int, processes: int) -> range:
    """Process ``process``'s contiguous part of the global batch at positions ``start:stop``.

    A full batch splits into equal parts; the short last batch of an epoch into parts whose
    sizes differ by at most one (some empty when it holds fewer slates than processes).
    """
    size, extra = divmod(stop - start, processes)
    first = start + process * size + min(process, extra)
    return range(first, first + size + (process < extra))


def _dropout_seed(seed: int, process: int) -> int:
    """The seed of one process's dropout stream: distinct per process and from the init seed."""
    return int(np.random.SeedSequence([seed, process]).generate_state(1)[0])


def model_rankings(
    model: SPDRanker, slates: list[Slate], batch_size: int = 4, cache: StateCache | None = None
) -> list[list[str]]:
    """The model's ranking of each of ``slates`` (docids, best first); ``cache``: the slates'
    cached states, read instead of running the backbone."""
    rankings = []
    for i in range(0, len(slates), batch_size):
        chunk = slates[i : i + batch_size]
        batch = None if cache is None else cache.batch(range(i, i + len(chunk)), chunk, model)
        rankings += [ranking.docids for ranking in model.rank_batch(chunk, batch=batch)]
    return rankings


def given_order_metrics(slates: list[Slate]) -> dict[str, float | None]:
    """Mean metrics of the slates' own order, the first stage's: what a reranker must beat."""
    return mean_metrics(slates, [slate.docids for slate in slates])


def mean_metrics(slates: list[Slate], rankings: list[list[str]]) -> dict[str, float | None]:
    """Mean metrics of one ranking a slate (docids best first) against what each slate holds:
    clicks or graded judgements, and the teacher's ranking when labelled."""
    return means(slates_metrics(slates, rankings))


def means(found: list[SlateMetrics]) -> dict[str, float | None]:
    """Each metric's mean over the slates that define it."""
    return {name: s.mean for name, s in aggregate(found).items()}


def missing_label(slate: Slate, cfg: TrainConfig) -> str | None:
    """What ``slate`` lacks for the run's ``--target`` (a clicked item, a relevant candidate),
    so that the run leaves it out; None when the run trains on it."""
    if cfg.require_clicks:
        return None  # such a slate is refused, not left out
    if cfg.target in CLICK_TARGETS and not slate.clicked:
        return "clicked item"
    if cfg.target in RELEVANCE_TARGETS and not has_relevant_candidate(slate):
        return "relevant candidate"
    return None


def fit_feature_normalizer(cfg: TrainConfig) -> FeatureNormalizer | None:
    """The ``--features`` normalisation of a run, fitted in one streamed pass over its training
    slates: the same ``--limit`` of them it trains on, so the slates it leaves out (nothing to
    learn for its target) neither count towards the limit nor move the statistics; None
    without features."""
    if cfg.features is None:
        return None
    names = parse_feature_names(cfg.features)
    lacking: Counter[str] = Counter()  # the slates left out so far, by what they lack

    def learnable() -> Iterator[Slate]:
        for slate in read_slates(cfg.slates):
            missing = missing_label(slate, cfg)
            if missing is None:
                yield slate
            else:
                lacking[missing] += 1

    slates = islice(learnable(), cfg.limit)
    first = next(slates, None)
    if first is None:  # the same refusal the slate source makes, before the fit's own
        why = "".join(f" (every one of its {n} slates has no {what})"
                      for what, n in lacking.items())
        raise SlateError(f"{cfg.slates} holds no slates to train on{why}")
    return FeatureNormalizer.fit(names, chain([first], slates))


class Trainer:
    """Owns one training run (in one process of it): data, model, optimizer, state files.

    It is given the run's settings as the user gave them: it refuses a rerun that differs from
    the run already in ``--out`` before it writes anything (and raises :class:`RunFinished`
    for a finished run rerun as it was run, before it reads a slate), and then writes and
    reads the ``--holdout`` parts (:func:`with_holdout`)."""

    def __init__(self, cfg: TrainConfig, trust_remote_code: bool = False) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        #: When this run began: its wall time counts loading and the state cache too.
        self.started = time.perf_counter()
        self.cfg = cfg
        self.out = Path(cfg.out)
        cfg.check()  # what one process can refuse; the process count's rules once joined
        #: The slate files given, as the run records them: their paths and digests.
        self.input_files = input_files(cfg)
        # Before the held-out parts are written (a run refused keeps the parts it read) and
        # before a process group is joined, which a finished run would never leave.
        check_rerun(holdout_settings(cfg), self.input_files)
        self.accelerator = Accelerator(cpu=resolve_device(cfg.device) == "cpu")
        self.processes = self.accelerator.num_processes
        cfg.check(self.processes)
        cfg = self.cfg = with_holdout(cfg)
        set_seed(cfg.seed)  # every process builds the same initial weights
        normalizer = fit_feature_normalizer(cfg)
        #: K: the most candidates a slate may hold to be trained on or evaluated.
        self.positions = cfg.rank_positions()
        evaluates = cfg.eval_slates and self.accelerator.is_main_process  # the others train only
        self.eval_slates = self.read_eval_slates(normalizer) if evaluates else []
        #: The eval slates' own order scored (the first stage's), and the metric that selects
        #: the model kept.
        self.first_stage = given_order_metrics(self.eval_slates) if self.eval_slates else {}
        self.metric = selection_metric(
            (k for k, v in self.first_stage.items() if v is not None),
            clicks_first=cfg.target in CLICK_TARGETS,
        )
        #: What ``--anchor best`` chose, and every input's figure it chose among.
        self.anchor_choice = self.choose_anchor(normalizer)
        model_config = self.model_config = cfg.model_config(
            normalizer, self.anchor_choice["anchor"] if self.anchor_choice else None
        )
        self.source = open_slate_source(
            cfg.slates, seed=cfg.seed, check=self.check_slate, limit=cfg.limit
        )
        if self.source.skipped:
            log.warning(
                "left out %d slates with nothing to train on for --target %s (the first: %s); "
                "%s",
                self.source.skipped, cfg.target, self.source.skip_reason,
                "`spdrank data windows --relevant-only` leaves such windows out of the file"
                if cfg.target in RELEVANCE_TARGETS else "--require-clicks refuses such a file",
            )
        self.check_first_slates()
        self.model = SPDRanker.build(
            model_config, device=self.accelerator.device, trust_remote_code=trust_remote_code
        )
        if cfg.init_from:
            fresh = warm_start(self.model, cfg.init_from)
            log.info("starting from %s%s", cfg.init_from,
                     f" (new at zero: {', '.join(fresh)})" if fresh else "")
        elif self.model.anchored and cfg.target == "clicks":
            self.model.set_anchor_strength(CLICKS_STRENGTH)
        steps_per_epoch = math.ceil(len(self.source) / cfg.batch_size)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
        self.steps_per_epoch = steps_per_epoch
        head_params, backbone_params = self.model.trainable_parameters()
        frozen = model_config.backbone.lora is None
        refusal = self.model.frozen_refusal() if frozen else None
        if refusal is not None:
            raise ValueError(
                f"--head {cfg.head} with --frozen has nothing to train ({refusal}): drop "
                "--frozen to train LoRA adapters"
            )
        groups = [
            {"params": params, "lr": lr}
            for params, lr in ((head_params, cfg.head_lr), (backbone_params, cfg.lr))
            if params
        ]
        self.optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.warmup_steps = warmup_steps(cfg.warmup_steps, self.total_steps)
        self.report_warmup()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(self.warmup_steps, self.total_steps)
        )
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        # Each process sees other slates, so each draws its own dropout masks.
        torch.manual_seed(_dropout_seed(cfg.seed, self.accelerator.process_index))
        self.step = 0
        #: The cached states of the training and eval slates (with ``cache_states``).
        self.cache: StateCache | None = None
        self.eval_cache: StateCache | None = None
        #: (step, metrics, each eval slate's value of the selection metric) of the latest
        #: evaluation, so the final one is not run twice.
        self.last_eval: tuple[int, dict[str, float | None], list[float | None]] | None = None
        #: Seconds spent opening (building or completing) the state caches.
        self.cache_s = 0.0
        #: Each ranker the student reads, scored slate by slate on the eval slates: what the
        #: model kept is compared with (:mod:`spdrank.training.inputs`).
        self.inputs = score_inputs(self.eval_slates, self.input_names(), self.metric) \
            if self.eval_slates and self.metric else {}
        #: The best evaluation so far: {step, epoch, metric, value, per_slate}.
        self.best: dict[str, Any] | None = self.read_best()

    def report_warmup(self) -> None:
        """Say when the warm-up was cut to the run, or cannot end within it."""
        note = warmup_note(self.cfg.warmup_steps, self.warmup_steps, self.total_steps)
        if note is not None:
            log.log(*note)

    def report_cuts(self, summary: dict[str, Any]) -> None:
        """Say how many of the training prompts' candidates and queries were cut to their
        token budgets, counted where they were cut: in the state cache's prompts (recorded by
        the run that computed them, this one or an earlier one) when the states come from
        it, else in the prompts this run encoded (each slate once an epoch)."""
        budget = self.spd.config.prompt.max_item_tokens
        if self.cache is not None:
            cuts, over = self.cache.cuts(), f"in the {len(self.cache):,} cached slates' prompts"
            if cuts is None:
                log.info("cut to the token budget: not known for the states in %s, computed "
                         "before caches recorded it", self.cache.directory)
                return
        else:
            cuts, over = self.spd.cuts, "in the prompts this run encoded"
        if not cuts.queries:
            return
        summary["cut"] = {"candidates": cuts.candidates_cut, "of_candidates": cuts.candidates,
                          "queries": cuts.queries_cut, "of_queries": cuts.queries,
                          "max_item_tokens": budget}
        log.info("%s, %s", over, cuts.summary(budget))

    @property
    def spd(self) -> SPDRanker:
        return self.accelerator.unwrap_model(self.model)

    def check_first_slates(self) -> None:
        """Read the first :data:`CLICK_COPY_READ` training slates once for what their labels
        say before any step: a teacher that orders nothing (:meth:`check_teacher_ties`), an
        order that saw the clicks (:meth:`warn_click_copies`)."""
        slates = list(islice(read_slates(self.cfg.slates), CLICK_COPY_READ))
        self.check_teacher_ties(slates)
        self.warn_click_copies(slates)

    def check_teacher_ties(self, slates: list[Slate]) -> None:
        """Refuse ``--target teacher`` when every teacher ranking of ``slates`` orders no pair
        (all its ``teacher_scores`` equal), and say it when most do: such a target matrix is
        uniform, so those slates teach nothing (a teacher that failed, or scored every
        candidate alike). Refused only when nothing else is left to learn; with clicks or
        judgements beside the teacher they still order the target, so it is said. Every
        process refuses, so none is left waiting for the others."""
        target = self.cfg.target
        if "teacher" not in target.split("+"):
            return
        tied, labelled = teacher_ties(slates)
        if not labelled or 2 * tied <= labelled:
            return
        seen = (f"{tied} of the {labelled} teacher-labelled slates of the first "
                f"{CLICK_COPY_READ} of {self.cfg.slates}")
        if tied == labelled and target == "teacher":
            raise ValueError(
                f"--target teacher: the teacher scores every candidate equally in {seen} "
                "(teacher_scores all one value), so every target orders no pair and the "
                "student would learn nothing; relabel them with a teacher that ranks, or "
                "train on another --target")
        log.warning(
            "the teacher scores every candidate equally in %s (teacher_scores all one value): "
            "their targets under --target %s take no order from the teacher, so they teach "
            "%s; relabel them with a teacher that ranks", seen, target,
            "nothing" if target == "teacher" else "only what the clicks or judgements say")

    def warn_click_copies(self, slates: list[Slate]) -> None:
        """Say when an order the student learns from or reads ranks the clicked item first in
        nearly every one of ``slates`` (the first training slates): a teacher that
        saw the clicks, whose labels teach the clicks, not its ranking; or candidates listed
        with the clicked item first, whose numbering and given order tell the student where
        the click is, which no first stage will tell it when it serves."""
        if not self.accelerator.is_main_process:
            return
        copies = ranks_clicks_first(slates, lambda slate: slate.teacher)
        if copies is not None and "teacher" in self.cfg.target:
            log.warning(
                "the teacher ranks the clicked item first in %d of the %d slates of the first "
                "%d of %s that have one click: a teacher that saw these slates' clicks (one "
                "fitted on them, or labels copied from them) teaches the clicks, not its own "
                "ranking; label them with a teacher that did not", *copies, CLICK_COPY_READ,
                self.cfg.slates)
        listed = ranks_clicks_first(slates, lambda slate: slate.docids)
        if listed is not None:
            log.warning(
                "the clicked item is the first candidate listed in %d of the %d slates of the "
                "first %d of %s that have one click: a student can read the candidates' order (their "
                "numbers in an LLM student's prompt, the given order it may start from), and so "
                "learn where the click is listed, which no first stage tells it when it serves; list each slate's "
                "candidates in its first stage's order, or shuffled", *listed, CLICK_COPY_READ,
                self.cfg.slates)

    def check_fits(self, slate: Slate) -> None:
        """Refuse a slate of more candidates than the model's K: it cannot be ranked in one
        pass, and a training run ranks no slate by windows."""
        if len(slate) > self.positions:
            raise SlateError(
                f"slate {slate.query.qid!r} has {len(slate)} candidates, more than the model's "
                f"{self.positions} rank positions (--positions)",
                field="candidates",
            )

    def check_slate(self, slate: Slate) -> None:
        """What training needs of a slate beyond its format: it fits K and has its labels."""
        self.check_fits(slate)
        missing = missing_label(slate, self.cfg)
        if missing is not None:
            raise SkipSlate(f"slate {slate.query.qid!r} has no {missing}")
        target_matrix(slate, self.cfg.target)  # raises when the target's labels are missing

    def read_eval_slates(self, normalizer: FeatureNormalizer | None) -> list[Slate]:
        """The eval slates the run reads (:attr:`TrainConfig.eval_cut`), each refused as it is read, naming its
        ``file:line``, when the model could not rank it: more candidates than its K, or a
        feature it reads missing or past what its normalisation holds. Found at the first
        evaluation instead, such a slate fails the run after its steps are spent.

        This is the model's own check (:meth:`SPDRanker.check`: K, then the normaliser) made
        before the model exists, since ``--anchor best`` reads these slates to build it; the
        normaliser is the very one the model will hold, and K is refused in training's words
        (a training run ranks nothing by windows)."""
        slates = []
        for where, slate in islice(iter_slates(self.cfg.eval_slates), self.cfg.eval_cut):
            with located(where):
                self.check_fits(slate)
                if normalizer is not None:
                    normalizer(slate)
            slates.append(slate)
        return slates

    def trains_on(self, slate: Slate) -> bool:
        """Whether the run trains on ``slate`` (:meth:`check_slate` does not leave it out):
        the slates its state cache holds, so the cache's k-th slate is the source's."""
        try:
            self.check_slate(slate)
        except SkipSlate:
            return False
        return True

    # -- state -----------------------------------------------------------------------------

    def _state_meta(self) -> dict[str, Any]:
        return {SETTINGS_KEY: settings_record(asdict(self.cfg)), FILES_KEY: self.input_files,
                "processes": self.processes}

    def save_state(self) -> None:
        """Write the resumable state; every process must call it (it gathers their RNG states)."""
        rng = self.accelerator.gather(torch.get_rng_state().unsqueeze(0))
        if not self.accelerator.is_main_process:
            return
        with atomic_directory(self.out / STATE_DIR) as tmp:
            self.spd.save_pretrained(tmp / MODEL_DIR)
            opt = _save_optimizer(self.optimizer, tmp / OPTIMIZER_NAME)
            save_file({"torch": rng.contiguous()}, str(tmp / RNG_NAME))
            meta = self._state_meta() | {
                "step": self.step,
                "optimizer": opt,
                "scheduler": self.scheduler.state_dict(),
            }
            (tmp / TRAINER_NAME).write_text(json.dumps(meta, indent=1))

    def maybe_resume(self) -> bool:
        state = self.out / STATE_DIR
        if not (state / TRAINER_NAME).exists():
            return False
        meta = json.loads((state / TRAINER_NAME).read_text())  # its settings: check_rerun
        if meta["processes"] != self.processes:
            raise ValueError(
                f"{state} holds a run on {meta['processes']} processes, not {self.processes}: "
                f"resume it on {meta['processes']} (each process's dropout stream was saved), "
                "or use another --out"
            )
        self.spd.load_weights(state / MODEL_DIR)
        _load_optimizer(self.optimizer, state / OPTIMIZER_NAME, meta["optimizer"])
        self.scheduler.load_state_dict(meta["scheduler"])
        rng = load_file(str(state / RNG_NAME))["torch"]
        # A copy: set_rng_state reads a row view from its storage's start (torch 2.13).
        torch.set_rng_state(rng[self.accelerator.process_index].clone())
        self.step = meta["step"]
        log.info("resumed from %s at step %d/%d", state, self.step, self.total_steps)
        return True

    def open_caches(self) -> None:
        """Open (building or completing first) the state caches, with ``cache_states``."""
        cfg = self.cfg
        if not cfg.cache_states:
            return
        t0 = time.perf_counter()
        settings = {
            "storage": cfg.cache_dtype, "batch_size": cfg.cache_batch_size,
            "progress": cfg.progress,
        }
        root = Path(cfg.cache_states)
        self.cache = open_state_cache(
            root / "train", self.spd, cfg.slates, len(self.source), **settings,
            keep=self.trains_on,
        )
        if self.eval_slates:
            self.eval_cache = open_state_cache(
                root / "eval", self.spd, cfg.eval_slates, len(self.eval_slates), **settings
            )
        self.cache_s = time.perf_counter() - t0

    # -- steps -----------------------------------------------------------------------------

    def batch_span(self, step: int) -> tuple[int, int, int]:
        """``(epoch, start, stop)``: the global batch at ``step`` is positions start:stop."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.cfg.batch_size
        return epoch, start, min(start + self.cfg.batch_size, len(self.source))

    def batch(self, numbered: list[tuple[int, Slate]]) -> Batch:
        """The model's input for these slates (each with its place in the file): their padded
        prompts for one prefill, or their cached states."""
        slates = [slate for _, slate in numbered]
        if self.cache is not None:
            batch = self.cache.batch([i for i, _ in numbered], slates, self.spd)
        else:
            batch = self.spd.collate([self.spd.encode(s) for s in slates])
        return batch.to(self.accelerator.device)

    def slate_losses(self, numbered: list[tuple[int, Slate]]) -> torch.Tensor:
        """The [B] per-slate losses of the slates (each with its place in the file), as the
        model's ranking method scores them against their targets."""
        slates = [slate for _, slate in numbered]
        batch = self.batch(numbered)
        scores = self.model(batch).float()
        # The widest slate, counted on the host: read from the batch on a GPU, it would wait
        # for the forward just queued.
        width = max(len(slate) for slate in slates)
        target = torch.zeros((len(slates), width, width))
        for row, slate in enumerate(slates):
            t = target_matrix(slate, self.cfg.target)
            target[row, : t.shape[0], : t.shape[1]] = torch.from_numpy(t)
        return self.spd.losses(scores, target.to(scores.device), batch.sizes, self.cfg)

    def loss_at(self, step: int) -> torch.Tensor:
        """This process's term of the global batch's mean loss at ``step``, ready for DDP.

        DDP averages gradients over the P processes, so a process holding slates S of a batch
        of B returns P/B * sum of its losses: the mean of those terms is the batch's mean loss.
        """
        epoch, start, stop = self.batch_span(step)
        part = share(start, stop, self.accelerator.process_index, self.processes)
        if not part:
            # Fewer slates than processes: this one still joins the gradient all-reduce, with
            # a zero-weighted pass over the batch's first slate.
            return self.slate_losses(self.source.take_numbered(epoch, start, start + 1)).sum() * 0.0
        losses = self.slate_losses(self.source.take_numbered(epoch, part.start, part.stop))
        return losses.sum() * (self.processes / (stop - start))

    def evaluate(self) -> dict[str, float | None]:
        """Metrics on the eval slice at the current step (computed once per step)."""
        if self.last_eval is None or self.last_eval[0] != self.step:
            rankings = model_rankings(self.spd, self.eval_slates, cache=self.eval_cache)
            found = slates_metrics(self.eval_slates, rankings)
            values = [f.values.get(self.metric) for f in found] if self.metric else []
            self.last_eval = (self.step, means(found), values)
        return self.last_eval[1]

    # -- the rankers the student reads -------------------------------------------------------

    def input_names(self) -> list[str]:
        """The rankers the student reads, as inputs to compare it with: each feature, and the
        given order when the model reranks a first stage's list (or starts from it)."""
        config = self.model_config
        names = input_names(config.features.names if config.features else ())
        return names if config.reranks_first_stage else names[1:]

    def choose_anchor(self, normalizer: FeatureNormalizer | None) -> dict[str, Any] | None:
        """What ``--anchor best`` starts from: of the given order and each feature read, the
        one that ranks best the slates the run chooses on (its eval slates when it selects on
        them, else its first training slates), by the metric that selects, or a blend of the
        features led by the best of them (:func:`~spdrank.training.blend.best_blend`) where
        it ranks them better still; a warm start without ``--anchor``, its checkpoint's
        anchor; None for any other ``--anchor``. Every process reads the same slates, so all
        choose alike."""
        cfg = self.cfg
        if cfg.init_from and cfg.anchor is None:
            from spdrank.model.checkpoint import CONFIG_NAME, checkpoint_dir, read_config

            kept = read_config(checkpoint_dir(cfg.init_from) / CONFIG_NAME).head.anchor
            read = normalizer.names if normalizer is not None else ()
            if not set(parse_anchor(kept).names) <= set(read):  # warm_start names the gap
                kept = cfg.plain_anchor()
            return {"anchor": kept, "why": "the --init-from checkpoint's"}
        if cfg.head_anchor() != BEST_ANCHOR:
            return None
        names = normalizer.names if normalizer is not None else ()
        if not names:
            return {"anchor": cfg.plain_anchor(), "why": "no features to choose among"}
        on_eval = cfg.selection == "best" and bool(cfg.eval_slates)
        if on_eval:
            slates = self.eval_slates or load_slates(cfg.eval_slates, limit=cfg.eval_cut)
            where = f"its {len(slates)} eval slates"
        else:
            slates = list(islice(read_slates(cfg.slates), CHOICE_SLATES))
            where = f"its first {len(slates)} training slates"
        # On the main process the eval slates' metric is the run's own, already found from
        # their given order; the other processes hold no eval slates and find it here.
        metric = self.metric if on_eval and self.eval_slates else selection_metric(
            (k for k, v in given_order_metrics(slates).items() if v is not None),
            clicks_first=cfg.target in CLICK_TARGETS)
        if metric is None:
            log.warning("--anchor best: %s define no metric to choose by (no judgements, "
                        "teacher or clicks); starting as %s", where, cfg.plain_anchor())
            return {"anchor": cfg.plain_anchor(), "why": f"{where} define no metric"}
        figures = {name: mean_of(values)
                   for name, values in score_inputs(slates, input_names(names), metric).items()}
        chosen = max((n for n in figures if figures[n] is not None), key=lambda n: figures[n])
        shown = ", ".join(f"{n} {v:.4f}" for n, v in figures.items() if v is not None)
        choice = {"anchor": chosen, "metric": metric, "on": where, "inputs": figures}
        # The blend starts from the best feature, which may tie with the given order it is
        # the score of (BM25's), and must rank better than every input to be chosen.
        features = [n for n in figures if n.startswith(FEATURE_ANCHOR) and figures[n] is not None]
        if len(names) > 1 and normalizer is not None and features:
            lead = max(features, key=lambda n: figures[n])
            blend, value = best_blend(slates, normalizer, lead[len(FEATURE_ANCHOR):], metric)
            if value is not None and value > figures[chosen]:
                choice |= {"anchor": blend.text(), "blend": value}
                shown += f"; blended, {blend.text()} {value:.4f}"
        log.info("--anchor best: starting as %s, which ranks %s best by %s (%s)",
                 choice["anchor"], where, metric, shown)
        return choice

    @property
    def selects(self) -> bool:
        """Whether this run keeps its best evaluated model (``--select best`` with slates to
        evaluate on and a metric to judge by)."""
        return self.cfg.selection == "best" and bool(self.eval_slates) and self.metric is not None

    def read_best(self) -> dict[str, Any] | None:
        """The best evaluation a resumed run had kept, if any."""
        path = self.out / BEST_DIR / BEST_NAME
        return json.loads(path.read_text()) if path.exists() and self.cfg.selection == "best" \
            else None

    def consider(self, metrics: dict[str, float | None]) -> None:
        """Keep the model as it is now when it does better on the eval slates than every one
        kept before (ties keep the earlier, smaller change)."""
        value = metrics.get(self.metric) if self.metric else None
        if not self.selects or value is None:
            return
        if self.best is not None and value <= self.best["value"]:
            return
        self.best = {"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 3),
                     "metric": self.metric, "value": value, "per_slate": self.last_eval[2]}
        if self.accelerator.is_main_process:
            with atomic_directory(self.out / BEST_DIR) as tmp:
                self.spd.save_pretrained(tmp / MODEL_DIR)
                (tmp / BEST_NAME).write_text(json.dumps(self.best) + "\n")

    def log_event(self, event: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / LOG_NAME, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event) + "\n")

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.open_caches()
        resumed = self.maybe_resume()
        if not self.cfg.eval_slates and self.spd.anchored:
            log.warning("no --eval-slates: nothing will compare this student with the first "
                        "stage it reranks, nor choose its epoch; hold out some queries for it")
        if not resumed:  # a best model left by an earlier run is not this run's
            self.best = None
            shutil.rmtree(self.out / BEST_DIR, ignore_errors=True)
        if self.selects and not resumed and (self.spd.anchored or cfg.init_from):
            # The model it starts as is a candidate to keep: an untrained anchored one ranks
            # as the first stage, a warm start as the checkpoint it was given.
            self.consider(self.evaluate())
        self.model.train()
        start_step, started = self.step, time.perf_counter()
        bar = Progress(
            "train",
            unit="step",
            total=self.total_steps,
            initial=self.step,
            # A bar on a terminal, log lines elsewhere; the other processes stay quiet.
            mode=None if cfg.progress and self.accelerator.is_main_process else False,
        )
        loss_ema: float | None = None
        stop_at = self.total_steps if cfg.stop_after is None else min(
            self.total_steps, self.step + cfg.stop_after
        )
        while self.step < stop_at:
            value = self.train_step()
            loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
            rate = (self.step - start_step) * cfg.batch_size / (time.perf_counter() - started)
            bar.update(1, loss=f"{loss_ema:.4f}", slates_s=f"{rate:.2f}")
            if self.step % 10 == 0 or self.step == stop_at:
                self.log_event({"step": self.step, "loss": value, "loss_ema": loss_ema, "lr": self.scheduler.get_last_lr()})
            periodic = cfg.eval_every and self.step % cfg.eval_every == 0
            epoch_end = self.selects and self.step % self.steps_per_epoch == 0
            if self.eval_slates and (periodic or epoch_end):
                metrics = self.evaluate()
                self.consider(metrics)
                self.model.train()
                self.log_event({"step": self.step, "eval": metrics})
                bar.write(f"step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if v is not None))
            if cfg.save_every and self.step % cfg.save_every == 0 and self.step < self.total_steps:
                self.save_state()
        bar.close()
        if self.step < self.total_steps:
            self.save_state()
            return {"finished": False, "step": self.step, "total_steps": self.total_steps}
        return self.finish(time.perf_counter() - self.started)

    def train_step(self) -> float:
        """One optimizer step on the batch of the current step; the global batch's loss.

        The whole of one step of :meth:`run` (benchmarks/train_step.py times exactly this).
        """
        cfg = self.cfg
        loss = self.loss_at(self.step)
        self.accelerator.backward(loss)
        if cfg.max_grad_norm:
            self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # The mean of the processes' terms is the global batch's loss (see loss_at).
        value = float(self.accelerator.reduce(loss.detach(), "mean"))
        if not math.isfinite(value):
            raise FloatingPointError(f"loss became {value} at step {self.step}; lower --lr")
        return value

    def finish(self, wall_s: float) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "finished": True,
            "step": self.step,
            "total_steps": self.total_steps,
            "train_slates": len(self.source),
            "skipped_slates": self.source.skipped,
            "processes": self.processes,
            "wall_s_this_run": round(wall_s, 1),
            "warmup_steps": self.warmup_steps,
            "config": asdict(self.cfg),
            SETTINGS_KEY: settings_record(asdict(self.cfg)),
            FILES_KEY: self.input_files,
        }
        if self.cfg.cache_states:
            summary["state_cache_s"] = round(self.cache_s, 1)
        self.report_cuts(summary)
        kept = None
        if self.eval_slates:
            summary["eval"] = self.evaluate()
            summary["eval_slates"] = len(self.eval_slates)
            summary["first_stage"] = self.first_stage
            if self.anchor_choice is not None:
                summary["anchor"] = self.anchor_choice
            self.consider(summary["eval"])
            kept = self.report_selection(summary)
        if self.accelerator.is_main_process:
            if kept is not None:
                with atomic_directory(self.out / MODEL_DIR) as tmp:
                    shutil.copytree(kept, tmp, dirs_exist_ok=True)
            else:
                self.spd.save_pretrained(self.out / MODEL_DIR)
            (self.out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
            shutil.rmtree(self.out / STATE_DIR, ignore_errors=True)
            shutil.rmtree(self.out / BEST_DIR, ignore_errors=True)
        return summary

    def report_selection(self, summary: dict[str, Any]) -> Path | None:
        """Say in one line (``summary["verdict"]``) which model the run keeps and, for a model
        that reranks a first stage's list, whether it is below that list's order on the eval
        slates; the kept model's folder when it is not the last step's."""
        if self.metric is None:
            return None
        final = summary["eval"].get(self.metric)
        chosen = dict(self.best) if self.selects and self.best is not None else \
            {"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 3),
             "metric": self.metric, "value": final}
        values = chosen.pop("per_slate", None) or self.last_eval[2]
        first = self.first_stage.get(self.metric)
        summary["selected"] = chosen | {"first_stage": first, "of_steps": self.step}
        if chosen["value"] is None or first is None:
            return None
        besides = [found for name, other in self.inputs.items()
                   if (found := verdict("the student", self.metric, values, other,
                                        against=name)) is not None]
        summary["inputs"] = [found.__dict__ | {"below": found.below} for found in besides]
        summary["input_lines"] = [found.line() for found in besides]
        slates = f"on its {len(self.eval_slates)} eval slates"
        better = max((found for found in besides if found.below),
                     key=lambda found: found.first_stage, default=None)
        if better is not None and self.selects and self.start_as(better.against):
            summary["selected"] = {"input": better.against, "metric": self.metric,
                                   "value": better.first_stage, "student": chosen["value"],
                                   "first_stage": first, "of_steps": self.step}
            summary["verdict"] = (
                f"kept {better.against} itself: no evaluation of the student ranks as well "
                f"{slates} ({self.metric} {chosen['value']:.3f} against "
                f"{better.first_stage:.3f}), so the model saved ranks exactly as "
                f"{better.against} does"
            )
            return self.out / BEST_DIR / INPUT_MODEL
        kept = f"kept the model of step {chosen['step']} of {self.step} (epoch {chosen['epoch']})"
        if self.spd.config.reranks_first_stage:
            where = "below" if chosen["value"] < first else "not below"
            summary["verdict"] = (f"{kept}: {where} the first stage's order {slates}, "
                                  f"{self.metric} {chosen['value']:.3f} against {first:.3f}")
        else:
            summary["verdict"] = f"{kept}: {self.metric} {chosen['value']:.3f} {slates}"
        if better is not None:
            summary["verdict"] += (f"; {better.against} ranks them better "
                                   f"({better.first_stage:.3f})")
        elif chosen["step"] == 0 and self.spd.anchored and not self.cfg.init_from:
            summary["verdict"] += (f": its untrained start, which ranks exactly as its anchor "
                                   f"{self.spd.config.head.anchor}, since no epoch ranked "
                                   "them better")
        if chosen["step"] != self.step:
            return self.out / BEST_DIR / MODEL_DIR
        return None

    def start_as(self, name: str) -> bool:
        """Save, as the run's pick, a model that ranks exactly as the input ``name`` (its
        head's correction zeroed, anchored to that input's order); False, and a warning, for
        a head that cannot be anchored (its scores have no output layer to zero)."""
        try:
            self.spd.start_as(name)
        except ValueError as err:
            log.warning("the student ranks below %s on the eval slates, and cannot be saved as "
                        "it: %s", name, err)
            return False
        if self.accelerator.is_main_process:
            self.spd.save_pretrained(self.out / BEST_DIR / INPUT_MODEL)
        return True


def holdout_settings(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` reading its two parts when it holds queries out (``--holdout``), as the run
    reads and records its settings; nothing is written."""
    if cfg.holdout is None or cfg.eval_slates:
        return cfg
    from dataclasses import replace

    from spdrank.training.holdout import HOLDOUT_DIR, held_parts

    train, validation = held_parts(Path(cfg.out) / HOLDOUT_DIR)
    return replace(cfg, slates=str(train), eval_slates=str(validation))


def with_holdout(cfg: TrainConfig) -> TrainConfig:
    """:func:`holdout_settings`, its two parts written: by the main process
    (:func:`spdrank.training.holdout.hold_out`), while the others wait for it."""
    held = holdout_settings(cfg)
    if held is cfg:
        return cfg
    from accelerate import PartialState

    from spdrank.training.holdout import hold_out

    state = PartialState()
    with state.main_process_first():
        if state.is_main_process:
            hold_out(cfg.slates, cfg.holdout, Path(held.slates).parent, cfg.seed)
    evaluated = "every one evaluated" if cfg.eval_limit is None else \
        f"the first {cfg.eval_limit} evaluated (--eval-limit)"
    log.info("held out --holdout %s of %s's queries as the eval slates (%s; %s)", cfg.holdout,
             cfg.slates, held.eval_slates, evaluated)
    return held


def finished_summary(done: RunFinished) -> dict[str, Any]:
    """The summary a rerun of a finished run gives back: that run's, :data:`ALREADY_KEY`
    saying nothing was done."""
    return done.record | {ALREADY_KEY: str(done)}


def finished_run(cfg: TrainConfig) -> dict[str, Any] | None:
    """:func:`finished_summary` of the run in ``--out`` when this one would repeat it,
    ``None`` when there is work to do; another run there is refused, naming what differs.
    For a launcher to ask before it starts processes that would each find nothing to do."""
    try:
        check_rerun(holdout_settings(cfg), input_files(cfg))
    except RunFinished as done:
        return finished_summary(done)
    return None


def train(cfg: TrainConfig, trust_remote_code: bool = False) -> dict[str, Any]:
    """Train (or resume) a run; the finished model lands in ``OUT/model``.

    ``trust_remote_code`` lets a backbone whose folder holds its own Python run it; it is no
    setting of the run, so neither the checkpoint nor ``train.json`` records it.

    In a data-parallel run every process calls this and gets the summary; only the main
    process writes files.

    A finished run in ``OUT`` that this one would repeat (the same settings and inputs) is
    not run again, nor is any of its files written: its summary (``OUT/train.json``) comes
    back, with :data:`ALREADY_KEY` saying so.
    """
    try:
        trainer = Trainer(cfg, trust_remote_code)
    except RunFinished as done:
        return finished_summary(done)
    try:
        return trainer.run()
    finally:
        trainer.accelerator.end_training()  # leaves the process group of a launched run
