"""The ``spdrank`` command. Each sub-command lives in ``spdrank.commands.<name>``.

A command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed arguments and returning an exit code. Modules are
imported when the command line is parsed, so ``spdrank --help`` stays fast and a command's
heavy imports (torch, transformers) are paid only by the command that needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

from spdrank import __version__
from spdrank.core.files import WRITE_ERRNOS, WriteError
from spdrank.core.slates import SlateError

COMMANDS = ("data", "teacher", "eval", "bench", "train", "rank", "serve", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spdrank", description="Single-pass generative reranking (SPD)."
    )
    parser.add_argument("--version", action="version", version=f"spdrank {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"spdrank.commands.{name}").register(sub)
    plain_help(parser)
    return parser


#: reST a docstring holds (``literal``, :role:`target`), which a terminal prints as is.
_REST = re.compile(r"``([^`]*)``|:[a-z]+:`~?([^`]*)`")


def plain(text: str) -> str:
    """``text`` with its reST markup taken off, each literal and role left as its text."""
    return _REST.sub(lambda m: m[1] if m[1] is not None else m[2], text)


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Take the reST off every description and help of ``parser`` and its sub-commands': a
    command's description is its module's docstring, written for readers of the source."""
    if parser.description:
        parser.description = plain(parser.description)
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help) if isinstance(choice.help, str) else choice.help
            for child in dict.fromkeys(action.choices.values()):
                plain_help(child)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C, so that whatever cleans up after an
    interrupt (a temporary output removed, the previous output kept) runs for it too."""


#: The exit status of a process ended by SIGTERM, as a shell reports it.
TERMINATED = 128 + signal.SIGTERM


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`Terminated` instead of killing at once; a
    second SIGTERM kills as usual, so a stuck cleanup can still be ended.

    Not in a launched process (``--num-processes``, torchrun): its launcher stops the group
    with SIGTERM and expects the processes gone, while a process blocked in a collective would
    only see a Python-level exception when the collective returns. A server installs its own
    handler (uvicorn's graceful shutdown) for as long as it serves.
    """
    from spdrank.training.launch import launched

    if launched() or threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with _sigterm_raises():
            return int(args.func(args) or 0)
    except (
        SlateError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
        ValueError,
    ) as exc:
        # Bad input (or a path that cannot be used) is the user's to fix: say what and where,
        # without a traceback.
        print(f"spdrank {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A write the file system refused (a full disk, a read-only folder): spdrank's writers
        # name the output (WriteError) and leave nothing half-written, so one line says it all.
        if not isinstance(exc, WriteError) and exc.errno not in WRITE_ERRNOS:
            raise
        print(f"spdrank {args.command}: error: {_write_failure(exc)}", file=sys.stderr)
        return 1
    except Terminated:
        print(f"spdrank {args.command}: terminated", file=sys.stderr)
        return TERMINATED
    except KeyboardInterrupt:
        print(f"spdrank {args.command}: interrupted", file=sys.stderr)
        return 130


def _write_failure(exc: OSError) -> str:
    """A refused write in words: a :class:`WriteError` names its output; another OSError of
    :data:`WRITE_ERRNOS` (raised by a library's own writer) names the file it was given, if
    any."""
    if isinstance(exc, WriteError):
        return str(exc)
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot write{where}: {exc.strerror or exc}"


def run() -> NoReturn:
    """The ``spdrank`` executable and ``python -m spdrank``: :func:`main`, then exit with its code.

    A process started by a launcher (``--num-processes``, torchrun, accelerate) leaves through
    :func:`spdrank.training.launch.exit_launched`, which says why it must skip the interpreter's
    finalization.
    """
    from spdrank.training.launch import exit_launched, launched

    code = main()
    if launched():
        exit_launched(code)
    raise SystemExit(code)
