"""Argument types shared by the sub-commands: a bad value is a usage error naming the flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

from spdrank.core.flags import range_problem


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers >= ``low`` (and <= ``high``, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        problem = range_problem(value, low=low, high=high)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


def float_in(
    low: float | None = None,
    high: float | None = None,
    *,
    above: float | None = None,
    below: float | None = None,
) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite numbers in a range: at least ``low``, at most
    ``high``, strictly above ``above``, strictly below ``below`` (each when given). ``nan``,
    ``inf`` and a literal past a float's range (``1e999``) are refused: no setting means them,
    and each fails later, far from its flag (a NaN compares false with every bound)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]!r}")
        problem = range_problem(value, low=low, high=high, above=above, below=below)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


#: Any finite number.
finite_float = float_in()

#: The longest a network wait (a request's timeout, a back-off) may be set to: a day. A
#: larger number means "never", which no wait should be, and past ``threading.TIMEOUT_MAX``
#: (about 49 days) Python's own waits refuse it with an OverflowError.
MAX_WAIT_SECONDS = 86_400.0

#: Seconds to wait for a network answer or between attempts: above 0, at most a day.
wait_seconds = float_in(above=0, high=MAX_WAIT_SECONDS)


def model_name(text: str) -> str:
    """An argparse ``type`` for a name clients send (``--served-model-name``): not empty, no
    whitespace, control or format character (the id rule, :func:`spdrank.core.validation.
    id_problem`), so that a client can send it back as it was printed."""
    from spdrank.core.validation import id_problem

    problem = id_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"a model name {problem}, got {text[:80]!r}")
    return text


#: Integers >= 1: counts, sizes, limits.
positive_int = int_at_least(1)


#: What ``--trust-remote-code`` says, the same on every command that loads a model.
TRUST_REMOTE_CODE_HELP = (
    "let a model folder (or hub repo) whose config needs its own Python run that code; off by "
    "default, given for each run, never saved in a checkpoint: pass it only for code you trust"
)


#: The backbone dtypes a ranking command takes.
DTYPES = ("float32", "bfloat16", "float16", "auto")


def add_dtype_argument(p: argparse.ArgumentParser, whose: str = "the backbone's") -> None:
    """``--dtype``, for a command that ranks with a checkpoint; ``whose`` names what it sets."""
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help=f"{whose} dtype: float32, bfloat16, float16 or auto (bfloat16 on CUDA and on a "
        "CPU with native bfloat16 matrix units, AMX or AVX512-BF16; float32 elsewhere) "
        "(default: the checkpoint's own, auto unless trained with another); heads run in "
        "float32 whatever the backbone's dtype",
    )


def add_trust_remote_code(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--trust-remote-code``, for a command that loads a backbone or an LM."""
    p.add_argument("--trust-remote-code", action="store_true", help=TRUST_REMOTE_CODE_HELP)


def add_window_arguments(p: argparse.ArgumentParser) -> None:
    """``--window W`` and ``--window-stride S``: rank slates of more candidates than a model's K
    by RankGPT's sliding windows (:mod:`spdrank.rankers.windows`), one prefill a window."""
    p.add_argument(
        "--window",
        type=int_at_least(2),
        metavar="W",
        help="rank each slate by sliding windows of W candidates (at most the model's K), "
        "bottom-up as RankGPT does, one prefill a window (counted in the decode passes); "
        "slates of up to W candidates are ranked in one pass (default: no windows, a slate "
        "over K is refused)",
    )
    p.add_argument(
        "--window-stride",
        type=int_at_least(1),
        metavar="S",
        help="with --window: how far each window moves up the list (default: half the "
        "window, RankGPT's 20 and 10)",
    )


def windows_from_args(args: argparse.Namespace) -> object | None:
    """The :class:`spdrank.rankers.windows.Windows` the flags ask for, or None; a stride
    without a window is refused, since nothing would read it."""
    if getattr(args, "window", None) is None:
        if getattr(args, "window_stride", None) is not None:
            raise ValueError("--window-stride moves the windows of --window, and no --window "
                             "is given: add --window W or drop --window-stride")
        return None
    from spdrank.rankers.windows import Windows

    return Windows(args.window, args.window_stride or max(args.window // 2, 1))


def prompt_file(spec: str | None) -> str | None:
    """The file ``--prompt NAME|FILE`` names, an input no output may overwrite (None for a
    built-in template's name)."""
    from pathlib import Path

    return spec if spec is not None and Path(spec).is_file() else None


def model_folders(specs: list[str] | str | None) -> list[str]:
    """The folders holding the files of the models ``specs`` name (``--model DIR``, eval's
    ``[NAME=]DIR``, a backbone path): the outputs a command writes may lie in none of them
    (:func:`spdrank.core.files.check_outputs`' ``models``). A training run's folder stands for
    its checkpoint, ``DIR/model`` (:func:`spdrank.model.checkpoint.model_folder`), so a
    ranking written beside the run is still allowed; a hub name or a ``config:`` spec names no
    folder and is passed on to be skipped."""
    from spdrank.commands.named_rankers import split_named
    from spdrank.model.checkpoint import model_folder

    named = [specs] if isinstance(specs, str) else specs or []
    return [str(model_folder(split_named(spec)[1])) for spec in named]


def flag_defaults(parser: argparse.ArgumentParser, names: Iterable[str]) -> argparse.Namespace:
    """The defaults of the flags ``names`` (by their ``dest``) as ``parser`` defines them:
    what :func:`spdrank.core.unread.check_unread` compares the given values with, so a
    default is written once, where its flag is."""
    return argparse.Namespace(**{name: parser.get_default(name) for name in names})
