"""Training the SPD student: Sinkhorn cross-entropy against a target permutation per slate.

The loop runs through accelerate, so ``accelerate launch`` spreads it over processes and
devices unchanged. It is resumable: every ``save_every`` steps it writes a training state
(model, optimizer, scheduler, step, random-number state) under ``OUT/state`` with no pickles;
rerunning the same command continues from there. The data order is a pure function of the seed
and the epoch, so a resumed run sees exactly the batches an uninterrupted one would have, and
the same seed gives the same weights.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from spdrank.atomic_dir import atomic_directory
from spdrank.backbone import resolve_device
from spdrank.listnet import listnet_loss
from spdrank.metrics import aggregate, slate_metrics
from spdrank.model import SPDRanker, collate
from spdrank.sinkhorn import log_sinkhorn, permutation_cross_entropy
from spdrank.slates import Slate, load_slates
from spdrank.targets import target_matrix
from spdrank.train_config import TrainConfig

log = logging.getLogger(__name__)

STATE_DIR = "state"
SUMMARY_NAME = "train.json"
LOG_NAME = "log.jsonl"


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


def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def _epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def evaluate_model(model: SPDRanker, slates: list[Slate], batch_size: int = 4) -> dict[str, float | None]:
    """Mean metrics of the model on ``slates`` (clicks, and teacher agreement when labelled)."""
    per_slate = []
    for i in range(0, len(slates), batch_size):
        chunk = slates[i : i + batch_size]
        for slate, ranking in zip(chunk, model.rank_batch(chunk)):
            per_slate.append(slate_metrics(ranking.docids, slate.docids, slate.clicked, slate.teacher))
    return {name: s.mean for name, s in aggregate(per_slate).items()}


class Trainer:
    """Owns one training run: data, model, optimizer, state files."""

    def __init__(self, cfg: TrainConfig) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.cfg = cfg
        self.out = Path(cfg.out)
        self.accelerator = Accelerator(cpu=resolve_device(cfg.device) == "cpu")
        set_seed(cfg.seed)
        self.train_slates = load_slates(cfg.slates, limit=cfg.limit)
        if not self.train_slates:
            raise ValueError(f"{cfg.slates} holds no slates")
        self.eval_slates = (
            load_slates(cfg.eval_slates, limit=cfg.eval_limit) if cfg.eval_slates else []
        )
        model_config = self.model_config = cfg.model_config()
        too_long = [s for s in self.train_slates if len(s) > cfg.positions]
        if too_long:
            raise ValueError(
                f"slate {too_long[0].query.qid!r} has {len(too_long[0])} candidates, more than "
                f"--positions {cfg.positions}"
            )
        # Targets are computed up front so a slate without the needed labels fails at once.
        self.targets = [target_matrix(s, cfg.target) for s in self.train_slates]
        self.model = SPDRanker.build(model_config, device=self.accelerator.device)
        self.encoded = [self.model.encode(s) for s in self.train_slates]
        steps_per_epoch = math.ceil(len(self.train_slates) / cfg.batch_size)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
        self.steps_per_epoch = steps_per_epoch
        head_params = list(self.model.head.parameters())
        backbone_params = [p for p in self.model.backbone.parameters() if p.requires_grad]
        groups = [
            {"params": params, "lr": lr}
            for params, lr in ((head_params, cfg.head_lr), (backbone_params, cfg.lr))
            if params
        ]
        if not groups:
            raise ValueError(
                f"--head {cfg.head} with --frozen has nothing to train (FIRST's only weights "
                "are the backbone's): drop --frozen to train LoRA adapters"
            )
        self.optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(cfg.warmup_steps, self.total_steps)
        )
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.step = 0
        #: (step, metrics) of the latest evaluation, so the final one is not run twice.
        self.last_eval: tuple[int, dict[str, float | None]] | None = None

    @property
    def spd(self) -> SPDRanker:
        return self.accelerator.unwrap_model(self.model)

    # -- state -----------------------------------------------------------------------------

    def _state_meta(self) -> dict[str, Any]:
        return {"config": asdict(self.cfg) | {"stop_after": None, "progress": None}}

    def save_state(self) -> None:
        if not self.accelerator.is_main_process:
            return
        with atomic_directory(self.out / STATE_DIR) as tmp:
            self.spd.save_pretrained(tmp / "model")
            opt = _save_optimizer(self.optimizer, tmp / "optimizer.safetensors")
            save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
            meta = self._state_meta() | {
                "step": self.step,
                "optimizer": opt,
                "scheduler": self.scheduler.state_dict(),
            }
            (tmp / "trainer.json").write_text(json.dumps(meta, indent=1))

    def maybe_resume(self) -> bool:
        state = self.out / STATE_DIR
        if not (state / "trainer.json").exists():
            return False
        meta = json.loads((state / "trainer.json").read_text())
        if meta["config"] != self._state_meta()["config"]:
            changed = sorted(
                k for k in meta["config"] if meta["config"][k] != self._state_meta()["config"].get(k)
            )
            raise ValueError(
                f"{state} holds a run with different settings ({', '.join(changed)}); "
                "use another --out or delete that directory to start over"
            )
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file as load_st

        spd = self.spd
        spd.head.load_state_dict(load_st(str(state / "model" / "head.safetensors")))
        if spd.config.backbone.lora is not None:
            adapter = load_st(str(state / "model" / "adapter" / "adapter_model.safetensors"))
            set_peft_model_state_dict(spd.backbone, adapter)
        _load_optimizer(self.optimizer, state / "optimizer.safetensors", meta["optimizer"])
        self.scheduler.load_state_dict(meta["scheduler"])
        torch.set_rng_state(load_file(str(state / "rng.safetensors"))["torch"])
        self.step = meta["step"]
        log.info("resumed from %s at step %d/%d", state, self.step, self.total_steps)
        return True

    # -- steps -----------------------------------------------------------------------------

    def batch_indices(self, step: int) -> np.ndarray:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = _epoch_order(len(self.train_slates), self.cfg.seed, epoch)
        return order[within * self.cfg.batch_size : (within + 1) * self.cfg.batch_size]

    def loss_on(self, idx: np.ndarray) -> torch.Tensor:
        batch = collate([self.encoded[i] for i in idx], self.spd.tokenizer.pad_token_id)
        batch = batch.to(self.accelerator.device)
        scores = self.model(batch).float()
        width = int(batch.sizes.max())
        target = torch.zeros((len(idx), width, width))
        for row, i in enumerate(idx):
            t = self.targets[i]
            target[row, : t.shape[0], : t.shape[1]] = torch.from_numpy(t)
        target = target.to(scores.device)
        if not self.spd.matrix:  # scalar and FIRST peers: one score per item
            return listnet_loss(scores, target, batch.sizes)
        log_s = log_sinkhorn(scores, batch.sizes, tau=self.cfg.tau, iters=self.cfg.sinkhorn_iters)
        return permutation_cross_entropy(log_s, target, batch.sizes)

    def evaluate(self) -> dict[str, float | None]:
        """Metrics on the eval slice at the current step (computed once per step)."""
        if self.last_eval is None or self.last_eval[0] != self.step:
            self.last_eval = (self.step, evaluate_model(self.spd, self.eval_slates))
        return self.last_eval[1]

    def log_event(self, event: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / LOG_NAME, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event) + "\n")

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.maybe_resume()
        self.model.train()
        start_step, started = self.step, time.perf_counter()
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not (cfg.progress and self.accelerator.is_main_process),
            dynamic_ncols=True,
        )
        loss_ema: float | None = None
        stop_at = self.total_steps if cfg.stop_after is None else min(
            self.total_steps, self.step + cfg.stop_after
        )
        while self.step < stop_at:
            idx = self.batch_indices(self.step)
            loss = self.loss_on(idx)
            self.accelerator.backward(loss)
            if cfg.max_grad_norm:
                self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {self.step}; lower --lr")
            loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
            rate = (self.step - start_step) * cfg.batch_size / (time.perf_counter() - started)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_ema:.4f}", slates_s=f"{rate:.2f}")
            if self.step % 10 == 0 or self.step == stop_at:
                self.log_event({"step": self.step, "loss": value, "loss_ema": loss_ema, "lr": self.scheduler.get_last_lr()})
            if self.eval_slates and cfg.eval_every and self.step % cfg.eval_every == 0:
                metrics = self.evaluate()
                self.model.train()
                self.log_event({"step": self.step, "eval": metrics})
                bar.write(f"step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if v is not None))
            if cfg.save_every and self.step % cfg.save_every == 0 and self.step < self.total_steps:
                self.save_state()
        bar.close()
        if self.step < self.total_steps:
            self.save_state()
            return {"finished": False, "step": self.step, "total_steps": self.total_steps}
        return self.finish(time.perf_counter() - started)

    def finish(self, wall_s: float) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "finished": True,
            "step": self.step,
            "total_steps": self.total_steps,
            "train_slates": len(self.train_slates),
            "wall_s_this_run": round(wall_s, 1),
            "config": asdict(self.cfg),
        }
        if self.eval_slates:
            summary["eval"] = self.evaluate()
            summary["eval_slates"] = len(self.eval_slates)
        if self.accelerator.is_main_process:
            self.spd.save_pretrained(self.out / "model")
            (self.out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
            shutil.rmtree(self.out / STATE_DIR, ignore_errors=True)
        return summary


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume) a run; the finished model lands in ``OUT/model``."""
    return Trainer(cfg).run()
