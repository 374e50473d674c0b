"""What benchmarks/gpu.sh's steps will cost before they run: memory and time per step, from the
backbone's config.json and the device's stated bf16 throughput, and a refusal of a
configuration that will not fit.

    python3 benchmarks/gpu_estimate.py gpu.sh BACKBONE=bundled BATCH=16 LORA_R=64 ...
    python3 benchmarks/gpu_estimate.py gpu.sh BACKBONE=config:benchmarks/configs/qwen3-0.6b.json
    python3 benchmarks/gpu_estimate.py gpu.sh --device h100 BUDGET_S=600

``benchmarks/gpu.sh`` calls it before its first step with its own settings (the ``NAME=VALUE``
arguments are the script's environment variables, with their defaults when left out), prints
its table, and stops when it exits 1: a step whose estimated peak memory exceeds the device's
usable memory, or, when ``BUDGET_S`` is set, a step whose estimated time alone exceeds it. A
longer run is not refused: ``--plan FILE`` writes each step's estimated seconds, and the
script's ``step`` (benchmarks/lib.sh) stops before the first step that would end past the
budget, so a rerun continues from there. It needs only Python's standard library and reads no
weights: a backbone is its config.json, read offline (:func:`read_shape`).

Each step is a list of passes of the backbone (:class:`Work`); docs/scaling.md says what a
pass costs here (memory: :func:`saved_bytes_per_token` and :func:`work_cost`; time: FLOPs at an
assumed efficiency, dispatch and start-up) and how it was checked. Where a lent device has
timed a training step (``measured-<device>.json`` in benchmarks/results/gpu-estimate),
training passes take its efficiency and memory instead of the assumption (:func:`calibration`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import ROOT, shown

GIB = 1024**3


@dataclass(frozen=True)
class Device:
    """A device as its maker states it: memory, dense bf16 throughput, memory bandwidth."""

    name: str
    memory_gib: float  # what torch reports as the device's total, not the marketing GB
    bf16_tflops: float  # dense, without sparsity
    bandwidth_tbs: float


DEVICES: dict[str, Device] = {
    "h200": Device("NVIDIA H200 (141 GB HBM3e)", 139.8, 989.0, 4.8),
    "h100": Device("NVIDIA H100 SXM (80 GB)", 79.1, 989.0, 3.35),
    "a100": Device("NVIDIA A100 SXM (80 GB)", 79.1, 312.0, 2.0),
    "l4": Device("NVIDIA L4 (24 GB)", 22.0, 121.0, 0.3),
}

#: Model FLOPs utilisation assumed on a GPU: the low side of what sub-1B decoders reach in eager
#: PyTorch (docs/scaling.md), so that a plan made from it is not overrun.
MFU = 0.15
#: Share of the stated memory bandwidth a decode step's weight reads reach (an assumption).
BANDWIDTH_EFFICIENCY = 0.6
#: Seconds eager PyTorch spends dispatching and launching one operation on a GPU (an
#: assumption): what bounds small passes (batch 1, decode steps).
OP_SECONDS = 10e-6
#: Operations one decoder layer's forward runs, and each LoRA-adapted linear module adds
#: (cast, A, B, scale, add); a backward runs about twice a forward's.
OPS_PER_LAYER = 40
OPS_PER_ADAPTER = 5
#: Seconds a step's process spends before its first pass: Python, torch and CUDA
#: initialisation, reading the weights or the cached states (an assumption).
STARTUP_SECONDS = 20.0
#: The share of the device's memory a plan may fill: the CUDA context, cuBLAS workspaces and
#: the caching allocator's fragmentation take the rest.
USABLE = 0.9


#: SmolLM2-135M-Instruct's config.json, the ``bundled`` backbone, for when its converted copy
#: is not in the cache yet (tests/benchmarks/test_gpu_estimate.py holds the two equal).
BUNDLED_CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
}
BUNDLED_CACHE_NAME = "smollm2-135m-instruct-q4_1"
#: Families whose layers normalise queries and keys (one more saved tensor each).
QK_NORM = {"qwen3", "olmo2", "gemma3_text", "gemma3"}
#: Families with a norm after attention and after the MLP as well as before them.
FOUR_NORMS = {"gemma2", "gemma3_text", "gemma3"}
#: Families transformers runs with eager attention, which keeps the T x T scores.
EAGER_ATTENTION = {"gemma2"}
#: Families whose MLP is not gated (one up projection, one down).
PLAIN_MLP = {"gpt_neox", "gpt2", "gptj", "phi", "falcon"}


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a config.json."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Shape:
        """The shape of a Hugging Face config.json (Llama's names, GPT-2's and GPT-NeoX's)."""
        text = config.get("text_config")
        if isinstance(text, dict) and "hidden_size" in text:  # a multimodal wrapper: its LM
            config = {**text, "model_type": text.get("model_type", config.get("model_type"))}

        def first(*names: str, default: Any = None) -> Any:
            for name in names:
                if config.get(name) is not None:
                    return config[name]
            if default is None:
                raise ValueError(f"config.json has none of {', '.join(names)}")
            return default

        hidden = int(first("hidden_size", "n_embd", "d_model"))
        heads = int(first("num_attention_heads", "n_head"))
        return cls(
            model_type=str(config.get("model_type", "?")),
            hidden=hidden,
            layers=int(first("num_hidden_layers", "n_layer")),
            heads=heads,
            kv_heads=int(first("num_key_value_heads", default=heads)),
            head_dim=int(first("head_dim", default=hidden // heads)),
            intermediate=int(first("intermediate_size", "n_inner", default=4 * hidden)),
            vocab=int(first("vocab_size")),
            tied=bool(config.get("tie_word_embeddings", True)),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def gated(self) -> bool:
        return self.model_type not in PLAIN_MLP

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear module of one layer: what ``all-linear`` LoRA adapts (fused
        families have fewer, wider modules, with the same weights in all)."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        if self.model_type == "phi3":
            return [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)]
        if self.model_type in ("gpt_neox", "gpt2"):
            return [(h, q + 2 * kv), (q, h), (h, i), (i, h)]
        mlp = [(h, i), (h, i), (i, h)] if self.gated else [(h, i), (i, h)]
        return [(h, q), (h, kv), (h, kv), (q, h), *mlp]

    def layer_params(self) -> int:
        return sum(a * b for a, b in self.linears()) + 2 * self.hidden

    def params(self, lm_head: bool = False) -> int:
        """Parameters loaded: embeddings, layers, the final norm, and an untied LM head only
        when ``lm_head`` (SPD reads hidden states and drops it)."""
        head = self.vocab * self.hidden if lm_head and not self.tied else 0
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def lora_params(self, r: int) -> int:
        """One layer's LoRA parameters at rank ``r`` on every linear module."""
        return sum(r * (a + b) for a, b in self.linears())


def saved_bytes_per_token(shape: Shape, dtype_bytes: int, lora_r: int, tokens: int = 0) -> int:
    """Bytes autograd keeps for the backward, per token and LoRA-adapted decoder layer, tensor
    by tensor as transformers' decoder layers and peft's LoRA save them (frozen base weights,
    LoRA on every linear module, no gradient checkpointing):

    - each RMSNorm: its input upcast to float32 and the inverse root (4h + 4);
    - attention: q, k, v and the output of SDPA's fused kernel (no T x T matrix) and its
      log-sum-exp (4 bytes a head); q/k norms (Qwen3, OLMo 2, Gemma 3) their float32 inputs;
      a family run by eager attention (Gemma 2's soft-capping) its T x T scores, about 8
      bytes a head for each of the ``tokens`` a token attends to;
    - the MLP: gate and up outputs and the activation (gated), or the up output (plain);
    - each adapted module: its input cast to float32 (peft keeps adapters in float32) and its
      rank-r intermediate; the frozen linear itself keeps nothing.
    tests/benchmarks/test_gpu_estimate.py holds this to the bytes autograd really saves.
    """
    b, h, i = dtype_bytes, shape.hidden, shape.intermediate
    q, kv = shape.q_dim, shape.kv_dim
    norms = 4 if shape.model_type in FOUR_NORMS else 2
    total = norms * (4 * h + 4)
    total += b * (2 * q + 2 * kv) + 4 * shape.heads
    if shape.model_type in QK_NORM:
        total += 4 * (q + kv) + 4 * (shape.heads + shape.kv_heads)
    if shape.model_type in EAGER_ATTENTION:
        total += 8 * shape.heads * tokens
    total += b * (3 * i if shape.gated else i)
    total += sum(4 * a + 4 * lora_r for a, _ in shape.linears())
    return total


def working_bytes_per_token(shape: Shape, dtype_bytes: int) -> int:
    """Bytes a pass without gradients holds per token at its widest point: the residual
    stream, a norm's float32 copy and the MLP's gate, up and activation outputs."""
    b = dtype_bytes
    return 3 * b * shape.hidden + 4 * shape.hidden + b * 3 * shape.intermediate


def layer_flops_per_token(shape: Shape, context: float) -> float:
    """Forward FLOPs one layer spends on one token attending to ``context`` tokens: 2 a weight
    for the linear layers, and 2 * 2 * heads * head_dim * context for QK^T and AV."""
    return 2 * sum(a * b for a, b in shape.linears()) + 4 * shape.q_dim * context


def cache_dir() -> Path:
    return Path(os.environ.get("SPDRANK_CACHE") or Path.home() / ".cache" / "spdrank")


def read_shape(spec: str, tiny: str | None = None) -> Shape:
    """The shape of the backbone ``spec`` names, read offline.

    ``bundled``: SmolLM2-135M-Instruct (its converted copy's config when cached);
    ``config:PATH``: that config.json; a folder: its config.json; a Hugging Face id: its
    config.json in the local hub cache. ``tiny``: a family of benchmarks/tiny_backbone.py,
    whose shape a folder stands for that the smoke run has not made yet.
    """
    if spec == "bundled":
        cached = cache_dir() / "backbones" / BUNDLED_CACHE_NAME / "config.json"
        return Shape.from_config(json.loads(cached.read_text()) if cached.is_file() else BUNDLED_CONFIG)
    path = Path(spec.removeprefix("config:"))
    if spec.startswith("config:"):
        if not path.is_file() and (path / "config.json").is_file():
            path = path / "config.json"
        if path.is_file():
            return Shape.from_config(json.loads(path.read_text()))
    elif (path / "config.json").is_file():
        return Shape.from_config(json.loads((path / "config.json").read_text()))
    if tiny is not None and not path.exists():
        from tiny_backbone import COMMON, FAMILIES

        return Shape.from_config({"model_type": tiny, "vocab_size": 49152, **COMMON, **FAMILIES[tiny]})
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")
    snapshots = sorted((hub / f"models--{spec.replace('/', '--')}" / "snapshots").glob("*/config.json"))
    if snapshots:
        return Shape.from_config(json.loads(snapshots[-1].read_text()))
    raise FileNotFoundError(
        f"no config.json for backbone {spec!r} here (a folder, config:PATH, a Hugging Face id "
        "in the local cache, or bundled)"
    )


#: A recommendation prompt's tokens: the template and a 10-item history, then each candidate's
#: title cut to 32 tokens with its marker; fitted from spdrank's own prompts, with headroom for
#: padding to a batch's longest prompt (the calibration report shows the fit).
REC_BASE, REC_PER_CANDIDATE = 200, 28
#: A search prompt's: the template and the query, then each passage cut to 64 tokens.
SEARCH_BASE, SEARCH_PER_PASSAGE = 100, 66
#: The listwise teacher's instructions around the student's prompt, and the tokens of its
#: answer per candidate ("[12] > ").
TEACHER_EXTRA, ANSWER_PER_CANDIDATE = 150, 6


def rec_tokens(n: int) -> int:
    return REC_BASE + REC_PER_CANDIDATE * n


def search_tokens(n: int) -> int:
    return SEARCH_BASE + SEARCH_PER_PASSAGE * n


@dataclass
class Work:
    """Passes of the backbone: ``sequences`` prompts of ``tokens`` each, ``batch`` at a time.

    ``train``: gradients flow (LoRA on the top ``adapted`` layers, or a frozen backbone's head
    alone when ``adapted`` is 0 and ``backbone`` False); ``new_tokens``: tokens generated after
    each prompt, one decode step each at batch 1; ``logits``: tokens whose vocabulary logits are
    kept (float32); ``backbone``: False for a head-only pass over cached states."""

    what: str
    sequences: int
    tokens: int
    batch: int = 1
    train: bool = False
    adapted: int = 0
    new_tokens: int = 0
    logits: int = 0
    backbone: bool = True
    lm_head: bool = False


@dataclass
class Step:
    """One step of a script: its name, the backbone it loads, and its passes."""

    name: str
    shape: Shape | None
    work: list[Work] = field(default_factory=list)
    note: str = ""


@dataclass
class Cost:
    memory_bytes: float
    seconds: float
    flops: float


def work_cost(work: Work, shape: Shape, device: Device, dtype_bytes: int, lora_r: int,
              measured: Calibration | None = None) -> Cost:
    """Peak memory and time of one :class:`Work` on ``device``; a training pass at the MFU and
    memory ``measured`` on the device when it has been."""
    mfu = measured.train_mfu if work.train and measured is not None else MFU
    passes = math.ceil(work.sequences / work.batch)
    layers = shape.layers
    adapted = min(work.adapted, layers)
    weights = dtype_bytes * shape.params(work.lm_head)
    if not work.backbone:  # a head over cached states: no backbone pass at all
        return Cost(0.0, passes * 3 * 2 * OPS_PER_LAYER * OP_SECONDS, 0.0)
    batch_tokens = work.batch * work.tokens
    trainable = adapted * shape.lora_params(lora_r)
    memory = weights + 16 * trainable
    if work.train and adapted:
        # Layers below the first adapted one keep nothing for the backward.
        saved = saved_bytes_per_token(shape, dtype_bytes, lora_r, work.tokens)
        memory += batch_tokens * adapted * saved
        memory += batch_tokens * 4 * (shape.hidden + shape.intermediate)  # one layer's gradients
    else:
        memory += batch_tokens * working_bytes_per_token(shape, dtype_bytes)
    memory += batch_tokens * dtype_bytes * shape.hidden  # the states the head reads
    if work.new_tokens:
        memory += 2 * layers * shape.kv_dim * dtype_bytes * work.batch * (work.tokens + work.new_tokens)
    memory += 4 * work.logits * shape.vocab * work.batch
    if work.train and measured is not None:
        memory *= measured.train_memory

    per_token = layer_flops_per_token(shape, work.tokens / 2) * layers
    lora_flops = 2 * adapted * shape.lora_params(lora_r)
    flops_per_sequence = (work.tokens * (per_token + lora_flops)
                          + 2 * work.logits * shape.vocab * shape.hidden)
    if work.train:
        # Backward: the activations' gradients through the adapted layers (frozen weights need
        # no weight gradient), attention's about twice its forward, the adapters' both.
        share = adapted / layers if layers else 0.0
        attention = work.tokens * 4 * shape.q_dim * (work.tokens / 2) * adapted
        flops_per_sequence += share * work.tokens * per_token + attention + 2 * work.tokens * lora_flops
    ops = layers * (OPS_PER_LAYER + (OPS_PER_ADAPTER * len(shape.linears()) if adapted else 0))
    seconds = passes * ops * OP_SECONDS * (3 if work.train else 1)
    seconds += work.sequences * flops_per_sequence / (device.bf16_tflops * 1e12 * mfu)
    if work.new_tokens:
        read = weights / (device.bandwidth_tbs * 1e12 * BANDWIDTH_EFFICIENCY)
        decode_flops = 2 * shape.params(work.lm_head) * work.batch
        step = max(read, decode_flops / (device.bf16_tflops * 1e12 * mfu)) + (ops + 10) * OP_SECONDS
        seconds += passes * work.new_tokens * step
    return Cost(memory, seconds, work.sequences * flops_per_sequence)


def step_cost(step: Step, device: Device, dtype_bytes: int, lora_r: int,
              measured: Calibration | None = None) -> Cost:
    """A step's peak memory (its largest pass) and time (its passes, plus the start-up of the
    process that runs them)."""
    if step.shape is None or not step.work:
        return Cost(0.0, 0.0, 0.0)
    costs = [work_cost(w, step.shape, device, dtype_bytes, lora_r, measured) for w in step.work]
    return Cost(max(c.memory_bytes for c in costs), STARTUP_SECONDS + sum(c.seconds for c in costs),
                sum(c.flops for c in costs))


#: Where a device's measured training step is kept, as ``measured-<device>.json``: the step's
#: settings, its seconds and its peak memory, with where they were measured.
MEASURED = ROOT / "benchmarks" / "results" / "gpu-estimate"


@dataclass(frozen=True)
class Calibration:
    """A training pass as a device measured it: ``train_mfu``, the MFU at which this model's
    estimate of the measured step takes the measured time (its dispatch cost kept), and
    ``train_memory``, the measured peak over the estimated one."""

    train_mfu: float
    train_memory: float
    source: str


def calibration(device: str, folder: Path = MEASURED) -> Calibration | None:
    """The calibration of ``device`` (a key of DEVICES) from its measured step, or None."""
    path = folder / f"measured-{device}.json"
    if not path.is_file():
        return None
    step = json.loads(path.read_text())["train"]
    shape = read_shape(step["backbone"])
    dtype_bytes = 4 if step["dtype"] == "float32" else 2
    batch = int(step["batch"])
    work = Work("train", batch, rec_tokens(int(step["candidates"])), batch=batch, train=True,
                adapted=shape.layers)
    spec = DEVICES[device]
    assumed = work_cost(work, shape, spec, dtype_bytes, int(step["lora_r"]))
    dispatch = assumed.seconds - assumed.flops / (spec.bf16_tflops * 1e12 * MFU)
    arithmetic = float(step["seconds_per_step"]) - dispatch
    if arithmetic <= 0:
        raise ValueError(f"{path}: a step of {step['seconds_per_step']} s is shorter than its "
                         f"estimated dispatch cost alone ({dispatch:.3f} s)")
    return Calibration(train_mfu=assumed.flops / (spec.bf16_tflops * 1e12 * arithmetic),
                       train_memory=float(step["peak_gib"]) * GIB / assumed.memory_bytes,
                       source=shown(path))


#: The bundled Amazon Beauty 2014 slates (`spdrank data beauty`).
BEAUTY_TRAIN, BEAUTY_EVAL = 21245, 1118
#: TREC DL judged queries: DL19, DL21, DL22.
DL19, DL21, DL22 = 43, 53, 76

#: gpu.sh's settings and their defaults (its environment variables).
GPU_DEFAULTS: dict[str, str] = {
    "BACKBONE": "bundled", "SEARCH_BACKBONE": "", "DTYPE": "bfloat16", "CANDIDATES": "50",
    "VALIDATION": "1000", "AR_N": "24", "REASONING_TOKENS": "512", "BATCH": "16",
    "POSITIONS": "150", "PEERS": "", "LORA_R": "64", "STEP_WARMUP": "2", "STEPS": "10",
    "LATENCY_N": "50", "LATENCY_SIZES": "20,50,150",
    "LATENCY_SLATES": "100", "THROUGHPUT_BATCH": "32", "EVAL_LIMIT": "200",
    "FID_TRAIN": "4096", "FID_EVAL_LIMIT": "1000", "FID_BATCH": "64", "FID_EPOCHS": "8",
    "CLICKS_EPOCHS": "", "SEARCH_EPOCHS": "20", "SLATES": "0", "TRAIN_SLATES": "0",
    "SKIP_SEARCH": "", "BUDGET_S": "",
    "ONLY": "",
}

def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def kept(count: int, slates: int) -> int:
    """A split's slates, after the smoke run keeps its first ``slates`` (0: all)."""
    return min(count, slates) if slates else count


def gpu_steps(s: dict[str, str], shape_of: Any) -> list[Step]:
    """benchmarks/gpu.sh's steps, in its order, with the passes each runs on the GPU."""
    cut = int(s["SLATES"])
    n, batch = int(s["CANDIDATES"]), int(s["BATCH"])
    train_n, eval_n = kept(kept(BEAUTY_TRAIN, cut), int(s["TRAIN_SLATES"])), kept(BEAUTY_EVAL, cut)
    ar_n = min(int(s["AR_N"]), eval_n)
    valid_n = kept(int(s["VALIDATION"]), cut)
    fid_train_n = kept(BEAUTY_TRAIN - int(s["VALIDATION"]), cut)
    bb = shape_of(s["BACKBONE"])
    tokens, teacher_tokens = rec_tokens(n), rec_tokens(n) + TEACHER_EXTRA
    answer = ANSWER_PER_CANDIDATE * n
    steps = [Step("data", None, note="CPU"), Step("cooccurrence-train", None, note="CPU"),
             Step("cooccurrence-eval", None, note="CPU")]
    # First the training step (the student's, timed) and the latency at N = LATENCY_N on its
    # checkpoint: a quality pass over LATENCY_SLATES slates, then the timed calls.
    count = int(s["STEP_WARMUP"]) + int(s["STEPS"])
    steps.append(Step("train-step", bb, [
        Work("train", count * batch, tokens, batch=batch, train=True, adapted=bb.layers),
    ], f"{count} LoRA steps of {batch} x {tokens} tokens, r={s['LORA_R']}"))
    latency_n, latency_slates = int(s["LATENCY_N"]), int(s["LATENCY_SLATES"])
    steps.append(Step("step-latency", bb, [
        Work("quality", min(latency_slates, eval_n), tokens),
        Work("latency", 2 * (latency_slates + 3), rec_tokens(latency_n)),
    ], f"{latency_slates} slates at N={latency_n}, batch 1"))
    heads = ["attn", *s["PEERS"].split()]
    for head in heads:
        steps.append(Step(f"train-{head}", bb, [
            Work("train", train_n, tokens, batch=batch, train=True, adapted=bb.layers),
            Work("eval", min(int(s["EVAL_LIMIT"]), eval_n), tokens, batch=batch),
        ], f"{math.ceil(train_n / batch)} LoRA steps of {batch} x {tokens} tokens, r={s['LORA_R']}"))
    latency: list[Work] = []
    for size in ints(s["LATENCY_SIZES"]):
        latency += [Work("latency", 2 * latency_slates, rec_tokens(size)),
                    Work("throughput", 2 * latency_slates, rec_tokens(size),
                         batch=int(s["THROUGHPUT_BATCH"]))]
    rows = len(heads)
    steps.append(Step("bench-all", bb, [Work("quality", rows * eval_n, tokens)] + latency * rows,
                      f"{eval_n} slates x {rows} models, latency at N={s['LATENCY_SIZES']}"))
    steps.append(Step("teacher-direct", bb, [Work("generate", ar_n, teacher_tokens, new_tokens=answer, lm_head=True)],
                      f"{ar_n} slates, batch 1, {teacher_tokens} + {answer} tokens"))
    reasoning = answer + int(s["REASONING_TOKENS"])
    steps.append(Step("teacher-reasoning", bb, [Work("generate", ar_n, teacher_tokens, new_tokens=reasoning, lm_head=True)],
                      f"{ar_n} slates, batch 1, {teacher_tokens} + {reasoning} tokens"))
    steps.append(Step("bench-teachers", bb, [Work("quality", rows * ar_n, tokens)], f"{ar_n} slates"))
    steps.append(Step("data-features", None, note="CPU"))
    title = 33  # a title cut to 32 tokens and its separator
    split_n = {"train": min(int(s["FID_TRAIN"]), fid_train_n), "valid": valid_n, "eval": eval_n}
    for split in ("train", "valid", "eval"):
        steps.append(Step(f"lexical-{split}", None, note="CPU"))
        steps.append(Step(f"likelihood-{split}", bb, [
            Work("score", split_n[split], REC_BASE + 2 * title * n, logits=2 * title * n, lm_head=True)
        ], f"{split_n[split]} slates, batch 1"))
    fid_batch, fid_epochs = int(s["FID_BATCH"]), int(s["FID_EPOCHS"])
    fid_eval = min(int(s["FID_EVAL_LIMIT"]), valid_n)
    for teacher, count in (("lexical", fid_train_n), ("likelihood", split_n["train"])):
        # The lexical run caches every train and valid slate's states; the likelihood run's
        # slates are a prefix of the same texts, read from that cache.
        cache = [Work("cache", fid_train_n + valid_n, tokens, batch=fid_batch)] if teacher == "lexical" else []
        steps.append(Step(f"fidelity-{teacher}", bb, [
            *cache, Work("head", fid_epochs * count + fid_eval, tokens, batch=fid_batch, backbone=False),
        ], f"frozen, cached states; {fid_epochs} epochs of {count} slates"))
        steps.append(Step(f"fidelity-bench-{teacher}", bb, [Work("quality", eval_n, tokens)], f"{eval_n} slates"))
    clicks_epochs = int(s["CLICKS_EPOCHS"] or 2)
    steps.append(Step("fidelity-clicks-3f", None, note="features only"))
    steps.append(Step("fidelity-clicks-llm", bb, [
        Work("head", clicks_epochs * fid_train_n, tokens, batch=fid_batch, backbone=False)],
        "cached states"))
    steps.append(Step("fidelity-bench-clicks", bb, [Work("quality", eval_n, tokens)], f"{eval_n} slates"))
    if not s["SKIP_SEARCH"]:
        # search-best-input-other.toml: two LLM students over every layer's frozen states.
        sb = shape_of(s["SEARCH_BACKBONE"] or s["BACKBONE"])
        q19, q21, q22 = (min(x, cut or x) for x in (DL19, DL21, DL22))
        full, epochs = search_tokens(100), int(s["SEARCH_EPOCHS"])
        steps.append(Step("search", sb, [
            Work("state caches", 2 * q22 + q19 + q21, full, batch=1),
            Work("heads", 2 * epochs * q22, full, batch=8, backbone=False),
            Work("students ranked", q19 + q21, full),
        ], f"{q22} training + {q19 + q21} test queries, top 100 in one pass ({full} tokens)"))
    return steps


SCRIPTS = {"gpu.sh": (GPU_DEFAULTS, gpu_steps)}


@dataclass
class Estimate:
    """Every step's cost, and what the device and budget allow."""

    device: Device
    rows: list[tuple[Step, Cost]]
    budget_s: float | None
    measured: Calibration | None = None

    @property
    def usable_bytes(self) -> float:
        return self.device.memory_gib * GIB * USABLE

    def refusal(self) -> str | None:
        """One line naming the first step that will not fit the device's memory, or that alone
        outlasts the budget (no rerun could get past it); None."""
        for step, cost in self.rows:
            if cost.memory_bytes > self.usable_bytes:
                return (f"gpu_estimate: step {step.name} needs about {cost.memory_bytes / GIB:.1f} GiB "
                        f"({step.note}), more than the {self.usable_bytes / GIB:.1f} GiB usable of "
                        f"the {self.device.name}: lower its batch, candidates or LoRA rank")
        for step, cost in self.rows:
            if self.budget_s is not None and cost.seconds > self.budget_s:
                return (f"gpu_estimate: step {step.name} alone needs about {cost.seconds:.0f} s "
                        f"({step.note}), more than BUDGET_S={self.budget_s:.0f} s: lower its sizes "
                        "or raise BUDGET_S")
        return None

    def first_stop(self) -> tuple[str, float] | None:
        """The step a run under the budget stops before, and when that step would have ended
        (GPU steps only: the CPU steps' time is not estimated, and is counted as it passes); None
        when the whole run fits, or when a step alone outlasts the budget (a refusal)."""
        if self.budget_s is None or any(c.seconds > self.budget_s for _, c in self.rows):
            return None
        elapsed = 0.0
        for step, cost in self.rows:
            if step.shape is None:
                continue
            elapsed += cost.seconds
            if elapsed > self.budget_s:
                return step.name, elapsed
        return None

    def plan(self) -> str:
        """Each GPU step's name and estimated seconds, a tab-separated line each: what
        benchmarks/lib.sh's ``step`` weighs against the budget left."""
        return "".join(f"{step.name}\t{cost.seconds:.0f}\n" for step, cost in self.rows
                       if step.shape is not None)

    def table(self) -> str:
        training = ("" if self.measured is None else
                    f"; training at the measured {self.measured.train_mfu:.1%} MFU and "
                    f"{self.measured.train_memory:.2f}x the counted memory, {self.measured.source}")
        lines = [
            (f"Estimated cost on {self.device.name} ({self.device.memory_gib:.0f} GiB, "
             f"{self.device.bf16_tflops:.0f} TFLOP/s dense bf16 at an assumed {MFU:.0%} MFU, "
             f"{OP_SECONDS * 1e6:.0f} us an op, {STARTUP_SECONDS:.0f} s a start{training}; "
             "benchmarks/gpu_estimate.py):"),
            f"{'step':<26} {'peak GiB':>9} {'est. s':>8} {'TFLOP':>9}  what",
        ]
        for step, cost in self.rows:
            if step.shape is None:
                lines.append(f"{step.name:<26} {'-':>9} {'-':>8} {'-':>9}  {step.note} (not estimated)")
                continue
            lines.append(f"{step.name:<26} {cost.memory_bytes / GIB:>9.2f} {cost.seconds:>8.0f} "
                         f"{cost.flops / 1e12:>9.1f}  {step.note}")
        peak = max((c.memory_bytes for _, c in self.rows), default=0.0)
        total = sum(c.seconds for _, c in self.rows)
        budget = f"; budget {self.budget_s:.0f} s" if self.budget_s is not None else ""
        lines.append(f"{'total (GPU steps)':<26} {peak / GIB:>9.2f} {total:>8.0f} "
                     f"{sum(c.flops for _, c in self.rows) / 1e12:>9.1f}  of "
                     f"{self.usable_bytes / GIB:.0f} GiB usable{budget}")
        stop = self.first_stop()
        if stop:
            lines.append(f"BUDGET_S={self.budget_s:.0f}: the run stops before step {stop[0]} (it "
                         f"would end at about {stop[1]:.0f} s, CPU steps not counted); run it "
                         "again with the same settings to continue from there")
        return "\n".join(lines)


def estimate(script: str, settings: dict[str, str], device: Device, tiny: str | None = None,
             measured: Calibration | None = None) -> Estimate:
    """The estimate of ``script`` under ``settings`` (its environment variables; the rest take
    the script's defaults) on ``device``, its training passes as ``measured`` when given."""
    defaults, steps_of = SCRIPTS[script]
    s = {**defaults, **{k: v for k, v in settings.items() if v != ""}}
    shape_of = functools.cache(lambda spec: read_shape(spec, tiny))
    dtype_bytes = 4 if s["DTYPE"] == "float32" else 2
    only = set(s["ONLY"].split())
    rows = [(step, step_cost(step, device, dtype_bytes, int(s["LORA_R"]), measured=measured))
            for step in steps_of(s, shape_of) if not only or step.name in only]
    return Estimate(device, rows, float(s["BUDGET_S"]) if s["BUDGET_S"] else None, measured)


#: The exit status when the shape cannot be read: the script runs on, unestimated (1 is a
#: refusal, 2 a usage error).
NO_ESTIMATE = 3


def main(argv: list[str] | None = None) -> int:
    """Print the table; 1 when a step will not fit, NO_ESTIMATE when there is no estimate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", choices=sorted(SCRIPTS))
    parser.add_argument("settings", nargs="*", metavar="NAME=VALUE",
                        help="the script's settings (its environment variables)")
    parser.add_argument("--device", default="h200", choices=sorted(DEVICES),
                        help="the device estimated for (default h200)")
    parser.add_argument("--tiny", metavar="FAMILY",
                        help="a backbone folder not made yet is benchmarks/tiny_backbone.py's FAMILY")
    parser.add_argument("--plan", type=Path, metavar="FILE",
                        help="write each GPU step's estimated seconds here (name<TAB>seconds)")
    args = parser.parse_intermixed_args(argv)
    settings = {}
    for item in args.settings:
        name, eq, value = item.partition("=")
        if not eq:
            parser.error(f"a setting is NAME=VALUE, not {item!r}")
        settings[name] = value
    unknown = set(settings) - set(SCRIPTS[args.script][0])
    if unknown:
        parser.error(f"{args.script} has no setting {', '.join(sorted(unknown))}")
    try:
        result = estimate(args.script, settings, DEVICES[args.device], args.tiny,
                          calibration(args.device))
    except (OSError, ValueError) as e:
        print(f"gpu_estimate: no estimate: {e}", file=sys.stderr)
        return NO_ESTIMATE
    print(result.table())
    if args.plan:
        args.plan.parent.mkdir(parents=True, exist_ok=True)
        args.plan.write_text(result.plan())
    refusal = result.refusal()
    if refusal:
        print(refusal, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
