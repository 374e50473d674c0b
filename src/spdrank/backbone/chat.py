"""A backbone's chat template, rendered under bounds.

The chat template comes with the backbone's files (``tokenizer_config.json``,
``chat_template.jinja``), which a checkpoint names and a user may have been handed: it is
data. transformers renders it in Jinja's sandbox, which keeps it from reaching anything but
not from running for ever (loops inside loops), and lets its own refusals (a ``range`` past
its limit) out as exceptions of any kind. Here a render is bounded:

- in time: while it runs, a trace on the rendering thread alone (``sys.settrace``) reads the
  clock at each line of the template's compiled code and stops it past
  :data:`~spdrank.core.defaults.CHAT_TEMPLATE_SECONDS`;
- by refusing the power operator before it runs: one ``**`` of large numbers is a single
  step in C that no trace reaches, and no chat template needs it;
- in what it says: any failure is a ``ValueError`` of one line naming the tokenizer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from spdrank.core.defaults import CHAT_TEMPLATE_SECONDS

#: The file name Jinja gives a template's compiled code, which the trace follows.
_TEMPLATE_CODE = "<template>"


class _TooSlow(Exception):
    """Raised inside the template's code once its time is spent."""


def _sources(template: Any) -> list[str]:
    """A tokenizer's template texts: one string, or a dict of named templates."""
    if isinstance(template, str):
        return [template]
    if isinstance(template, dict):
        return [t for t in template.values() if isinstance(t, str)]
    return []


def _check_operators(tokenizer: Any) -> None:
    """Refuse a template that raises to a power (found by Jinja's lexer, outside strings)."""
    from jinja2 import Environment
    from jinja2.exceptions import TemplateSyntaxError

    for source in _sources(getattr(tokenizer, "chat_template", None)):
        try:
            tokens = list(Environment().lex(source))
        except TemplateSyntaxError as exc:
            raise ValueError(f"{_name(tokenizer)}: its chat template does not parse "
                             f"({exc.message}, line {exc.lineno})") from None
        if any(kind == "operator" and value == "**" for _, kind, value in tokens):
            raise ValueError(f"{_name(tokenizer)}: its chat template raises to a power (**), "
                             "which no chat template needs and no time bound can stop")


def _name(tokenizer: Any) -> str:
    return f"the tokenizer of {getattr(tokenizer, 'name_or_path', None) or 'the backbone'}"


def render_chat_template(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    seconds: float = CHAT_TEMPLATE_SECONDS,
    **template_kwargs: Any,
) -> str:
    """``tokenizer.apply_chat_template(messages, tokenize=False, ...)``, stopped past
    ``seconds``; every failure a ``ValueError`` naming the tokenizer."""
    _check_operators(tokenizer)
    end = time.monotonic() + seconds

    def line(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > end:
            raise _TooSlow
        return line

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        return line if frame.f_code.co_filename == _TEMPLATE_CODE else None

    from jinja2 import TemplateError

    # The sandbox's refusals (a range past its limit: OverflowError; an unsafe attribute), a
    # template's own errors (raise_exception, a missing key, a bad type), and recursion.
    failures = (TemplateError, ArithmeticError, LookupError, TypeError, ValueError,
                AttributeError, RecursionError, MemoryError)
    previous = sys.gettrace()
    sys.settrace(call)
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, **template_kwargs)
    except _TooSlow:
        raise ValueError(f"{_name(tokenizer)}: its chat template ran past {seconds:g} s and was "
                         "stopped (a template renders in milliseconds)") from None
    except failures as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{_name(tokenizer)}: its chat template failed to render "
                         f"({type(exc).__name__}: {reason[:300]})") from None
    finally:
        sys.settrace(previous)
