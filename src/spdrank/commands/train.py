"""``spdrank train``: fit the SPD student on labelled slates."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from spdrank.core.flags import flag_bounds, flag_choices, flag_help, is_flag

if TYPE_CHECKING:
    from spdrank.training.config import TrainConfig


#: ``spdrank train --help``'s groups: each title and the :class:`TrainConfig` field it starts
#: at. They are TrainConfig's own sections, in its order (a test holds the titles to its
#: ``# -- title`` lines); a field belongs to the last section starting at or before it.
SECTIONS = (
    ("data", "slates"),
    ("ranking method, backbone & LoRA", "head"),
    ("head", "positions"),
    ("prompt & readout", "prompt"),
    ("features & warm start", "features"),
    ("state cache", "cache_states"),
    ("steps & optimisation", "limit"),
    ("decoder", "decoder"),
    ("evaluation, checkpoints & seed", "eval_every"),
    ("runtime", "device"),
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _negated(f: dataclasses.Field) -> bool:
    """Whether field ``f`` is a bool that defaults to True, set off by the flag ``--no-NAME``."""
    return f.type in ("bool", bool) and f.default is True


def _head_help(field_help: str) -> str:
    """``--head``'s help: each registered ranking method's own, then the field's."""
    from spdrank.methods.base import methods

    return f"{'; '.join(method.help for method in methods())} {field_help}"


def register(sub: argparse._SubParsersAction) -> None:
    """``spdrank train``'s flags: one per :class:`TrainConfig` field, its help, choices and
    range the field's own (:func:`spdrank.core.flags.setting`), grouped by TrainConfig's
    sections (:data:`SECTIONS`) and then one group for each registered ranking method's own
    settings; the head kinds and their help are the registered methods'."""
    from spdrank.commands.argtypes import add_trust_remote_code
    from spdrank.methods.base import head_kinds, methods
    from spdrank.training.config import TrainConfig

    p = sub.add_parser("train", help="train the SPD student",
                       description="spdrank train: fit the SPD student on labelled slates.")
    starts = {first: title for title, first in SECTIONS}
    for method in methods():
        if method.settings is not None:
            first = dataclasses.fields(method.settings)[0].name
            starts.setdefault(first, f"{method.title} settings (--head {', '.join(method.kinds)})")
    groups: dict[str, argparse._ArgumentGroup] = {}
    group: argparse._ArgumentGroup | argparse.ArgumentParser = p
    for f in dataclasses.fields(TrainConfig):
        if f.name in starts:
            group = groups[starts[f.name]] = p.add_argument_group(starts[f.name])
        if is_flag(f):
            _add_flag(group, f, head_kinds())
    # The flags that are no training setting join the runtime section.
    runtime = groups[SECTIONS[-1][0]]
    add_trust_remote_code(runtime)
    runtime.add_argument(
        "--num-processes", type=int, default=1, metavar="N",
        help="data-parallel training in N processes on this machine (gloo on CPU, one GPU "
        "each on GPUs); --batch-size stays the global batch, each process takes 1/N of it "
        "(default: 1)",
    )
    p.set_defaults(func=run)


def _add_flag(
    group: argparse._ArgumentGroup | argparse.ArgumentParser, f: dataclasses.Field,
    kinds: list[str],
) -> None:
    """The flag of settings field ``f`` (``kinds``: the head kinds ``--head`` may name)."""
    help_ = flag_help(f)
    if _negated(f):
        group.add_argument(_flag("no_" + f.name), action="store_true", help=help_)
        return
    if f.type in ("bool", bool):
        group.add_argument(_flag(f.name), action="store_true", help=help_)
        return
    choices = flag_choices(f)
    if f.name == "head":
        help_, choices = _head_help(help_), kinds
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    kind = {"int": _int_type(f), "float": _float_type(f)}.get(str(f.type).replace(" | None", ""), str)
    default = None if required else f.default
    if default is not None:
        help_ = f"{help_} (default: {default})".strip()
    group.add_argument(
        _flag(f.name), type=kind, required=required, default=default,
        choices=choices, help=help_,
    )


def _int_type(f: dataclasses.Field) -> Callable[[str], int]:
    """The argparse type of integer setting ``f``: at least the ``low`` its field declares."""
    from spdrank.commands.argtypes import int_at_least

    bounds = flag_bounds(f)
    return int if "low" not in bounds else int_at_least(int(bounds["low"]))


def _float_type(f: dataclasses.Field) -> Callable[[str], float]:
    """The argparse type of float setting ``f``: finite, and within the range its field
    declares (:func:`spdrank.core.flags.flag_bounds`)."""
    from spdrank.commands.argtypes import float_in

    if f.name == "holdout":
        return _holdout
    return float_in(**flag_bounds(f))


def _holdout(text: str) -> float:
    """``--holdout``: a whole number of queries or a share below 1
    (:func:`spdrank.training.holdout.holdout_problem`)."""
    from spdrank.commands.argtypes import finite_float
    from spdrank.training.holdout import holdout_problem

    value = finite_float(text)
    problem = holdout_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def config_argv(cfg: TrainConfig) -> list[str]:
    """The ``spdrank train`` flags that rebuild ``cfg`` (what launched processes are given)."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not is_flag(f) or value is None:
            continue
        if _negated(f):
            argv += [] if value else [_flag("no_" + f.name)]
        elif value is not False:
            # flag=value, so a value starting with "-" is not read as a flag; str() of a
            # float round-trips exactly.
            argv.append(_flag(f.name) if value is True else f"{_flag(f.name)}={value}")
    return argv


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training settings parsed ``spdrank train`` arguments describe."""
    from spdrank.training.config import TrainConfig

    values = {
        f.name: not getattr(args, "no_" + f.name) if _negated(f) else getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if is_flag(f)
    }
    return TrainConfig(**values)


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


def check_run_outputs(cfg: TrainConfig) -> None:
    """Refuse, before any work, a run whose files would destroy one of its inputs: the files
    it writes under ``--out`` and the folders it replaces whole there (model, state, best),
    none of which may lie in the checkpoint it starts from or its backbone's folder."""
    from spdrank.commands.argtypes import model_folders, prompt_file
    from spdrank.core.files import check_outputs
    from spdrank.model.checkpoint import MODEL_DIR
    from spdrank.training.train import BEST_DIR, LOG_NAME, STATE_DIR, SUMMARY_NAME

    out = Path(cfg.out)
    check_outputs(
        {"--slates": cfg.slates, "--eval-slates": cfg.eval_slates,
         "--prompt": prompt_file(cfg.prompt)},
        {"--out": [out / SUMMARY_NAME, out / LOG_NAME]},
        folders={"--out": [out / MODEL_DIR, out / STATE_DIR, out / BEST_DIR]},
        models={"--init-from": model_folders(cfg.init_from), "--backbone": cfg.backbone},
    )


def run(args: argparse.Namespace) -> int:
    from spdrank.core.inputs import check_rereadable

    cfg = config_from_args(args)
    # First: a pipe is refused before any check reads from it and consumes what it held.
    check_rereadable(Path(cfg.slates), "slate file")
    check_labels_template(cfg)
    check_run_outputs(cfg)
    if args.num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {args.num_processes}")
    if args.num_processes > 1:
        from spdrank.training.launch import launch, launched
        from spdrank.training.run_record import ALREADY_KEY
        from spdrank.training.train import finished_run

        if launched():
            raise ValueError(
                "this process was launched as one of several already (accelerate launch, "
                "torchrun); drop --num-processes, the launcher's count applies"
            )
        cfg.check(args.num_processes)  # refuse before starting any
        done = finished_run(cfg)
        if done is not None:  # the run in --out, finished: no process would do anything
            print(done[ALREADY_KEY])
            return 0
        verbose = ["--verbose"] if args.verbose else []
        # The trust flag is no training setting (a run never records it): each process is
        # given it as the user gave it to this one.
        trust = ["--trust-remote-code"] if args.trust_remote_code else []
        return launch([*verbose, "train", *config_argv(cfg), *trust], args.num_processes)

    from accelerate import PartialState

    from spdrank.training.run_record import ALREADY_KEY, FILES_KEY, SETTINGS_KEY
    from spdrank.training.train import train

    summary = train(cfg, trust_remote_code=args.trust_remote_code)
    if not PartialState().is_main_process:
        return 0
    if ALREADY_KEY in summary:  # the run in --out, finished: nothing was done
        print(summary[ALREADY_KEY])
        return 0
    shown = {k: v for k, v in summary.items()
             if k not in ("config", SETTINGS_KEY, FILES_KEY, "input_lines")}
    print(json.dumps(shown, indent=2))
    for line in summary.get("input_lines", ()):  # the student beside each ranker it reads
        print(line)
    if "verdict" in summary:
        print(summary["verdict"])
    if not summary["finished"]:
        print(f"stopped at step {summary['step']}/{summary['total_steps']}; rerun the same "
              "command to continue")
    return 0
