"""``spdrank train``: fit the SPD student on labelled slates."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from spdrank.backbone.templates import PROMPT_HELP
from spdrank.core.defaults import FEATURES_ONLY_HEAD, HISTORY_READOUT, OTHER_READOUT, TRAIN_HEAD
from spdrank.methods.spd import POSITION_WEIGHTS
from spdrank.training.config import CACHE_DTYPES
from spdrank.training.targets import TARGETS

if TYPE_CHECKING:
    from spdrank.training.config import TrainConfig

_HELP = {
    "slates": "training slates (JSONL, .gz too)",
    "out": "run directory: the model lands in OUT/model; OUT/state makes the run resumable",
    "eval_slates": "slates for periodic evaluation (a slice: --eval-limit)",
    "require_clicks": "with --target clicks (or teacher+clicks, relevance, teacher+relevance): "
    "refuse a file holding a slate without a clicked item (or a candidate graded above 0) "
    "(default: leave such slates out, and count them)",
    "target": "what to imitate: the teacher's ranking, clicks first, or both; relevance: the "
    "slates' graded judgements, higher grades first (teacher+relevance: the teacher's order "
    "within each grade)",
    "frozen": "freeze the backbone (no LoRA): only the head learns",
    "backbone": "Hugging Face model id or local path; 'bundled' = SmolLM2-135M-Instruct; "
    "'config:PATH' = the shape of the Hugging Face config.json at PATH with RANDOM weights "
    "(seeded; for timing only, nothing downloaded; tokenizer: PATH's folder's, else SmolLM2's)",
    "layers": "keep only the first L transformer layers (early exit)",
    "lora_modules": "the modules LoRA adapts: all-linear (the paper), or comma-separated "
    "module names such as q_proj,v_proj",
    "positions": "K, the number of rank positions (>= the largest slate)",
    "prompt": f"{PROMPT_HELP}. Slates a teacher labelled under another template are refused "
    "(its template is in their teacher_prompt)",
    "max_item_tokens": "token budget per candidate text (default: the template's, 32 for "
    "recommendation; for search, what lets --positions candidates and the query fit the "
    "backbone's context, saved in the checkpoint as a number)",
    "max_query_tokens": "token budget for the user context (its end is kept)",
    "readout": "how an item's token states reach the head: last (its last token's, the "
    "paper), mean (the mean over its text's tokens), tokens (every one, for --head history: "
    "candidates matched with history items token by token) or words (one mean per word of "
    "the text, for --head history: matched word by word) (default: "
    f"{HISTORY_READOUT} with --head history, {OTHER_READOUT} otherwise)",
    "match": "with --readout tokens or words, how --head history compares a candidate with a "
    "history item: maxsim (each candidate unit's best cosine with the item's, averaged with "
    "learned weights) or tfidf (a soft TF-IDF cosine: every pair of units, weighted on both "
    "sides, through a sharp learned kernel)",
    "features": "upstream features the head reads next to the hidden states, comma-separated "
    "names from the candidates' 'features' ('score' reads their score field); z-scored with "
    "the training slates' mean and std, saved in the checkpoint",
    "features_only": "train the head on --features alone, without the backbone (no prefill): "
    "the ablation that shows the LLM's own contribution; the model ranks without the LLM",
    "init_from": "start from this trained checkpoint (a model directory or a run's): its "
    "head, and its LoRA adapters if it has any. It must read the states this run reads (same "
    "backbone, layers, prompt and head); a run may add --features to a checkpoint that reads "
    "none, their weights starting at zero: e.g. fine-tune a student distilled from a teacher "
    "on clicks with popularity and co-occurrence",
    "cache_states": "with --frozen: compute the backbone's readout states of the training "
    "(and eval) slates once into DIR (resumable, checked against the settings) and train the "
    "head from them; the model saved is an ordinary checkpoint",
    "cache_dtype": "how cached states are stored",
    "cache_batch_size": "slates per prefill while the state cache is built",
    "limit": "use only the first N training slates",
    "epochs": "passes over the training slates (fractions allowed)",
    "max_steps": "train for exactly this many steps (overrides --epochs)",
    "batch_size": "slates per optimizer step (padded into one prefill)",
    "lr": "learning rate of the LoRA adapters",
    "head_lr": "learning rate of the head",
    "warmup_steps": "steps over which the learning rates rise to their values (default: 20, "
    "or a tenth of the run's steps when that is fewer, so a short run still reaches them)",
    "tau": "Sinkhorn temperature",
    "sinkhorn_iters": "Sinkhorn iterations",
    "position_weights": "how the Sinkhorn cross-entropy weighs each target position: uniform "
    "(the paper: every row alike) or dcg (a row by 1/log2(2+j) of its target position j, so "
    "the top counts as the metrics count it; ours). Scalar and FIRST peers use ListNet, "
    "DCG-weighted either way",
    "decoder": "the decoder saved with the model, used by its evaluations here and by rank, "
    "eval and serve unless they name another: expected_rank (Sinkhorn, then items by expected "
    "position), hungarian (the "
    "paper's exact assignment), greedy, argsort, or a registered one",
    "eval_every": "evaluate every N steps (0: only at the end)",
    "eval_limit": "number of eval slates used",
    "save_every": "write the resumable state every N steps",
    "device": "cpu, cuda, or auto",
    "dtype": "float32, bfloat16, float16, or auto (to train: bfloat16 on CUDA, float32 on a "
    "CPU; saved as auto, the model ranks in bfloat16 on a CPU with native bfloat16 units)",
    "stop_after": "stop this run after N steps, keeping the state (rerun to continue)",
}
_CHOICES = {
    "target": list(TARGETS),
    "readout": ["last", "mean", "tokens", "words"],
    "cache_dtype": list(CACHE_DTYPES),
    "position_weights": list(POSITION_WEIGHTS),
}
_SKIP = {"extra", "progress"}


def _head_help() -> str:
    """``--head``'s help: each ranking method's own, for every method registered."""
    from spdrank.methods.base import methods

    each = "; ".join(method.help for method in methods())
    return f"{each} (default: {TRAIN_HEAD}; {FEATURES_ONLY_HEAD} with --features-only)"


def register(sub: argparse._SubParsersAction) -> None:
    from spdrank.commands.argtypes import add_trust_remote_code
    from spdrank.methods.base import head_kinds
    from spdrank.training.config import TrainConfig

    helps = _HELP | {"head": _head_help()}
    choices = _CHOICES | {"head": head_kinds()}
    p = sub.add_parser("train", help="train the SPD student", description=__doc__)
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        help_ = helps.get(f.name, "")
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true", help=help_)
            continue
        kind = {"int": int, "float": float}.get(
            str(f.type).replace(" | None", ""), str
        )
        default = None if required else f.default
        if default is not None:
            help_ = f"{help_} (default: {default})".strip()
        p.add_argument(
            flag, type=kind, required=required, default=default,
            choices=choices.get(f.name), help=help_,
        )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_trust_remote_code(p)
    p.add_argument(
        "--num-processes", type=int, default=1, metavar="N",
        help="data-parallel training in N processes on this machine (gloo on CPU, one GPU "
        "each on GPUs); --batch-size stays the global batch, each process takes 1/N of it "
        "(default: 1)",
    )
    p.set_defaults(func=run)


def config_argv(cfg: TrainConfig) -> list[str]:
    """The ``spdrank train`` flags that rebuild ``cfg`` (what launched processes are given)."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in _SKIP or value is None or value is False:
            continue
        flag = "--" + f.name.replace("_", "-")
        # flag=value, so a value starting with "-" is not read as a flag; str() of a float
        # round-trips exactly.
        argv.append(flag if value is True else f"{flag}={value}")
    return argv + ([] if cfg.progress else ["--no-progress"])


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training settings parsed ``spdrank train`` arguments describe."""
    from spdrank.training.config import TrainConfig

    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name not in _SKIP
    }
    return TrainConfig(**values, progress=not args.no_progress)


def check_labels_template(cfg: TrainConfig) -> None:
    """Refuse training with ``--prompt`` on slates a teacher labelled under another template.

    The first slate speaks for the file (``spdrank teacher`` labels a file under one
    template, and warns when a label file mixes them). Clicks alone read no teacher label.
    """
    from spdrank.backbone.templates import check_labels_template as check
    from spdrank.core.slates import iter_slates

    if "teacher" not in cfg.target.split("+"):
        return
    slates = iter_slates(cfg.slates)
    try:
        where, first = next(slates, ("", None))
    finally:
        slates.close()
    if first is not None and first.teacher is not None:
        check(first.extra, cfg.template(), where)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    check_labels_template(cfg)
    if args.num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {args.num_processes}")
    if args.num_processes > 1:
        from spdrank.training.launch import launch, launched

        if launched():
            raise ValueError(
                "this process was launched as one of several already (accelerate launch, "
                "torchrun); drop --num-processes, the launcher's count applies"
            )
        cfg.check(args.num_processes)  # refuse before starting any
        verbose = ["--verbose"] if args.verbose else []
        # The trust flag is no training setting (a run never records it): each process is
        # given it as the user gave it to this one.
        trust = ["--trust-remote-code"] if args.trust_remote_code else []
        return launch([*verbose, "train", *config_argv(cfg), *trust], args.num_processes)

    from accelerate import PartialState

    from spdrank.training.train import train

    summary = train(cfg, trust_remote_code=args.trust_remote_code)
    if not PartialState().is_main_process:
        return 0
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    if not summary["finished"]:
        print(f"stopped at step {summary['step']}/{summary['total_steps']}; rerun the same "
              "command to continue")
    return 0
