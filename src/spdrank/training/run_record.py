"""What a run in ``--out`` records of itself, and whether a rerun into that folder may go on.

Rerunning ``spdrank train`` as a run was run continues it from ``OUT/state``; a finished run
(``OUT/train.json``) so rerun has nothing left to do and writes nothing, and is never
replaced by another run's model.

What is compared is what decides the weights the run trains. Its settings, but not how often
it saves, evaluates or reports, nor where this invocation stops (:data:`CADENCE`), which a
resumed run may change; not ``--out``, where the record lies; and a path by where it leads,
not as it is spelled (``r/x/``, ``./r/x``, the same folder named from another working
directory), so the record holds paths resolved. And the inputs it reads by their content (a
sha256 each): its slate files, its ``--prompt`` template file and its ``--init-from``
checkpoint. One rewritten under its path would resume weights, a feature normalisation and a
data order made from other slates, or from another template or starting model. A refusal
names each setting that differs with both values and each input that changed, and never
advises deleting the run: its state is work that resumes. A record written before an input
was recorded holds nothing of it, and that input is not compared: unknown, not changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from spdrank.backbone.load import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from spdrank.backbone.settings import RANDOM_PREFIX
from spdrank.backbone.templates import BUILTINS
from spdrank.core.files import sha256_file
from spdrank.core.flags import is_flag
from spdrank.model.checkpoint import (
    ADAPTER_DIR,
    CONFIG_NAME,
    HEAD_NAME,
    MODEL_DIR,
    STATE_DIR,
    SUMMARY_NAME,
    TRAINER_NAME,
    model_folder,
)
from spdrank.training.config import TrainConfig

#: Settings that say how often a run saves, evaluates or shows its progress, and where this
#: invocation stops: none changes the weights a step computes, so a rerun may change them.
CADENCE = frozenset({"save_every", "eval_every", "progress", "stop_after"})
#: Where the record lies, not what it trains.
WHERE = frozenset({"out"})
#: Settings that always name a file or folder.
PATHS = ("slates", "eval_slates", "init_from", "cache_states")
#: The key of a record's settings (:func:`settings_record`), in the state's ``trainer.json``
#: and a finished run's ``train.json``.
SETTINGS_KEY = "settings"
#: The key of what a record holds of the inputs the run was given (:func:`input_files`).
FILES_KEY = "input_files"
#: The files of a checkpoint that decide what a run started from it (``--init-from``) begins
#: as: its settings, its head's weights and a LoRA adapter's settings and weights. Nothing
#: else in its folder (a model card) moves the weights.
CHECKPOINT_FILES = (CONFIG_NAME, HEAD_NAME, f"{ADAPTER_DIR}/{ADAPTER_CONFIG}",
                    f"{ADAPTER_DIR}/{ADAPTER_WEIGHTS}")
#: The key that :func:`spdrank.training.train.train` adds to a finished run's record when it
#: is rerun as it was run (:class:`RunFinished`): it did nothing, and says so there.
ALREADY_KEY = "already_finished"
#: The key under which records written before the settings were resolved kept them as given
#: (``train.json`` still does, for its readers: the paths as the run was given them).
LEGACY_KEY = "config"


def resolved(name: str, value: Any) -> Any:
    """Setting ``name``'s ``value`` with the path it names made absolute and its links
    followed: always for :data:`PATHS`; for ``--prompt`` and ``--backbone`` only when they
    name a file or folder (a built-in template or a hub id is a name, not a path)."""
    if not isinstance(value, str) or not value:
        return value
    if name in PATHS:
        return str(Path(value).resolve())
    if name == "prompt" and value not in BUILTINS:
        return str(Path(value).resolve())
    if name == "backbone":
        if value.startswith(RANDOM_PREFIX):
            return RANDOM_PREFIX + str(Path(value.removeprefix(RANDOM_PREFIX)).resolve())
        if Path(value).exists():
            return str(Path(value).resolve())
    return value


def settings_record(values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that decide what a run trains, from its settings as ``asdict`` gives them
    or as a record holds them: :data:`CADENCE` and :data:`WHERE` left out, paths resolved
    (:func:`resolved`; a record's already are, and resolving them again changes nothing)."""
    return {name: resolved(name, value) for name, value in values.items()
            if name not in CADENCE and name not in WHERE}


def setting_changes(
    recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """``(setting, the recorded run's value, this run's)`` for each setting that differs,
    ``current`` being this run's settings as ``asdict`` gives them. A setting added since the
    record was written held its default then; one removed since, recorded off (False or
    None), changed nothing."""
    defaults = asdict(TrainConfig(slates=current["slates"], out=current["out"]))
    now = settings_record(current)
    then = {name: value for name, value in settings_record(defaults | dict(recorded)).items()
            if name in now or value not in (False, None)}
    return [(name, then.get(name), now.get(name)) for name in sorted(then.keys() | now.keys())
            if then.get(name) != now.get(name)]


def _flag(name: str) -> str:
    """How the user names setting ``name``: its flag, or its field's name for a setting with
    none (``extra``, or one this version no longer has)."""
    flags = {f.name for f in fields(TrainConfig) if is_flag(f)}
    return "--" + name.replace("_", "-") if name in flags else name


def _shown(value: Any) -> str:
    return "unset" if value is None else value if isinstance(value, str) else json.dumps(value)


def describe(changes: list[tuple[str, Any, Any]]) -> str:
    """Each change as ``--lr: 0.0002 in that run, 0.5 now``, joined by semicolons."""
    known = {f.name for f in fields(TrainConfig)}
    return "; ".join(
        f"{_flag(name)}: {_shown(then)} in that run, "
        + (f"{_shown(now)} now" if name in known else "a setting this version no longer has")
        for name, then, now in changes)


def read_record(path: Path) -> dict[str, Any]:
    """A JSON record spdrank wrote into a run's folder; a ValueError naming ``path`` when it
    holds none (a damaged or foreign file is not taken as a run's settings)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a record of an spdrank train run ({exc})") from None
    settings = data.get(SETTINGS_KEY, data.get(LEGACY_KEY)) if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        raise ValueError(  # noqa: TRY004 - a file's bad input
            f"{path}: not a record of an spdrank train run (no settings in it)")
    return data


def recorded_settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record's settings: resolved ones, or the settings as given of an older record."""
    return record.get(SETTINGS_KEY, record.get(LEGACY_KEY))


def checkpoint_digest(folder: Path) -> str:
    """A sha256 over the :data:`CHECKPOINT_FILES` the checkpoint in ``folder`` holds: each
    one's name and its own sha256 (:func:`spdrank.core.files.sha256_file`), so a file
    rewritten, added or removed moves it. Cheap beside a run: a head's weights and an adapter
    are small, and the backbone's weights (named by the settings) are not read."""
    digest = hashlib.sha256()
    for name in CHECKPOINT_FILES:
        if (folder / name).is_file():
            digest.update(f"{name} {sha256_file(folder / name)}\n".encode())
    return digest.hexdigest()


def input_files(cfg: TrainConfig) -> dict[str, dict[str, str]]:
    """What a run records of the inputs it reads by their content, by flag: each one's
    resolved path and sha256. The slate files and a ``--prompt`` template file by the file's
    (:func:`spdrank.core.files.sha256_file`, the digest ``data features`` keeps of its
    inputs), the ``--init-from`` checkpoint by its :func:`checkpoint_digest`. ``cfg`` as the
    user gave it: with ``--holdout``, ``--slates`` is the file the parts are drawn from. A
    pipe is not read here (that would consume it), nor a path that names no file or
    checkpoint (its reader refuses it), nor a built-in template's name."""
    prompt = None if cfg.prompt in BUILTINS else cfg.prompt
    given = (("--slates", cfg.slates), ("--eval-slates", cfg.eval_slates), ("--prompt", prompt))
    found = {flag: {"path": str(Path(path).resolve()), "sha256": sha256_file(path)}
             for flag, path in given if path is not None and Path(path).is_file()}
    if cfg.init_from is not None:
        folder = model_folder(cfg.init_from)
        if (folder / CONFIG_NAME).is_file():
            found["--init-from"] = {"path": str(folder.resolve()),
                                    "sha256": checkpoint_digest(folder)}
    return found


def file_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Each input whose content differs from what the recorded run read, as ``--slates PATH:
    sha256 ... when the run read it, ... now``; an input the record does not hold (a run
    recorded before that input was, or a pipe) is not compared."""
    found = []
    for flag, now in current.items():
        then = recorded.get(flag)
        if not isinstance(then, dict) or then.get("sha256") in (None, now["sha256"]):
            continue
        read = "" if then.get("path") == now["path"] else f" (the run read {then.get('path')})"
        found.append(f"{flag} {now['path']}{read}: sha256 {str(then['sha256'])[:12]}... when "
                     f"the run read it, {now['sha256'][:12]}... now")
    return found


class RunFinished(Exception):
    """``--out`` holds this very run, finished: rerun as it was run (the same settings and
    inputs), it has nothing left to do, as a build tool leaves a target that is up to date,
    so nothing is trained and no file in ``--out`` is written. ``record`` is the run's
    ``train.json``."""

    def __init__(self, out: Path, record: dict[str, Any]) -> None:
        super().__init__(
            f"the run in {out} is already finished ({out / SUMMARY_NAME}), with these settings "
            f"and inputs: nothing to do; its model is {out / MODEL_DIR}")
        self.record = record


def check_rerun(cfg: TrainConfig, files: Mapping[str, Any]) -> None:
    """Refuse a run into ``cfg.out`` that is not the run already there, naming what differs:
    each setting with both values, each input whose content changed; ``cfg`` as the run
    records its settings (reading the held-out parts, with ``--holdout``), ``files`` what
    :func:`input_files` found of the inputs it was given. An unfinished run (``OUT/state``)
    is resumed only with its own settings and inputs, since its weights, feature
    normalisation and data order were made from them; a finished one (``OUT/train.json``) is
    not replaced by another run's model, nor its log continued by another's lines; rerun as
    it was run, it has nothing left to do (:class:`RunFinished`)."""
    out = Path(cfg.out)
    state = out / STATE_DIR
    if (state / TRAINER_NAME).exists():
        changes, changed = differences(read_record(state / TRAINER_NAME), cfg, files)
        if changes or changed:
            undo = " and ".join(what for what, found in (
                ("rerun with that run's settings", changes),
                ("restore the content it read", changed)) if found)
            raise ValueError(f"{state} holds an unfinished run{_what(changes, changed)}: {undo} "
                             "to resume it, or pass another --out to start a new run")
    elif (out / SUMMARY_NAME).exists():
        record = read_record(out / SUMMARY_NAME)
        changes, changed = differences(record, cfg, files)
        if changes or changed:
            raise ValueError(
                f"{out} holds a finished run{_what(changes, changed)}, whose model "
                f"{out / MODEL_DIR} this run would replace: pass another --out for this run "
                f"(--init-from {out} starts from that model)"
            )
        raise RunFinished(out, record)


def differences(
    record: Mapping[str, Any], cfg: TrainConfig, files: Mapping[str, Any]
) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """How a run with settings ``cfg`` reading ``files`` differs from the run ``record``
    describes: its :func:`setting_changes` and :func:`file_changes`."""
    return (setting_changes(recorded_settings(record), asdict(cfg)),
            file_changes(record.get(FILES_KEY) or {}, files))


def _what(changes: list[tuple[str, Any, Any]], changed: list[str]) -> str:
    """`` with other settings (...) and whose inputs changed since it read them (...)``:
    what differs."""
    return " and".join(part for part, found in (
        (f" with other settings ({describe(changes)})", changes),
        (f" whose inputs changed since it read them ({'; '.join(changed)})", changed)) if found)
