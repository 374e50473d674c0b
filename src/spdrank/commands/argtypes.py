"""Argument types shared by the sub-commands: a bad value is a usage error naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


#: Integers >= 1: counts, sizes, limits.
positive_int = int_at_least(1)


#: What ``--trust-remote-code`` says, the same on every command that loads a model.
TRUST_REMOTE_CODE_HELP = (
    "let a model folder (or hub repo) whose config needs its own Python run that code; off by "
    "default, given for each run, never saved in a checkpoint: pass it only for code you trust"
)


def add_trust_remote_code(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--trust-remote-code``, for a command that loads a backbone or an LM."""
    p.add_argument("--trust-remote-code", action="store_true", help=TRUST_REMOTE_CODE_HELP)
