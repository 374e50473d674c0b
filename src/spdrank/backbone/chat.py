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
- in size: ``'a' * 1000000000`` is one step in C too, and a string doubled in a loop reaches
  gigabytes in thirty steps, long before any time bound. So the sandbox transformers
  compiles chat templates in is, in this process, :class:`BoundedSandbox`: every string or
  list a template builds (by ``*``, ``+``, ``~``, ``%`` formatting, a method such as
  ``center`` or ``replace``, a filter such as ``indent`` or ``join``) is held to
  :data:`~spdrank.core.defaults.CHAT_TEMPLATE_CHARS`, checked before the step allocates
  where its size can be known beforehand and on its result otherwise, and so is the render;
- in what it says: any failure is a ``ValueError`` of one line naming the tokenizer.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

from spdrank.core.defaults import CHAT_TEMPLATE_CHARS, CHAT_TEMPLATE_SECONDS

#: The file name Jinja gives a template's compiled code, which the trace follows.
_TEMPLATE_CODE = "<template>"


class _TooSlow(Exception):
    """Raised inside the template's code once its time is spent."""


class TooLarge(Exception):
    """A value or render a chat template would build past :data:`CHAT_TEMPLATE_CHARS`."""


#: A width or precision of a ``%`` format (``%9999999d``, ``%.*f``) or of a ``{}`` one.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_NESTED_SPEC = re.compile(r"\{[^{}]*:[^{}]*\{")
_DIGITS = re.compile(r"\d+")


def _size(value: Any) -> int:
    """How many characters (or items) ``value`` holds, for the bound; 0 for anything else."""
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def _refuse(what: str, size: int) -> None:
    raise TooLarge(f"{what} would hold {size:,} characters or items, more than the "
                   f"{CHAT_TEMPLATE_CHARS:,} a chat template may build")


def _check(what: str, size: int) -> None:
    if size > CHAT_TEMPLATE_CHARS:
        _refuse(what, size)


def _check_format(text: str, what: str) -> None:
    """Refuse a format string whose widths or precisions reach past the bound (each pads its
    field to that many characters) or come from the arguments (``*``)."""
    for match in _PERCENT_SPEC.finditer(text):
        for number in match.groups():
            if number == "*":
                raise TooLarge(f"{what}: a width taken from the arguments (%*) is not allowed "
                               "in a chat template")
            if number:
                _check(what, int(number))
    if _NESTED_SPEC.search(text):
        raise TooLarge(f"{what}: a width taken from the arguments ({{:{{}}}}) is not allowed in "
                       "a chat template")
    for spec in _BRACE_SPEC.findall(text):
        for number in _DIGITS.findall(spec):
            _check(what, int(number))


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left operator right`` when its result would pass the bound, before it runs."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if _size(seq) and isinstance(times, int):
                _check(f"a repetition ({type(seq).__name__} * {times:,})", _size(seq) * times)
    elif operator == "+":
        _check("a concatenation", _size(left) + _size(right))
    elif operator == "%" and isinstance(left, str):
        _check_format(left, "a % format")


def _check_args(name: str, args: Iterable[Any]) -> None:
    """Refuse a call whose numbers reach past the bound: a width (``center``, ``indent``,
    ``zfill``, ``tojson``'s indent) asks for that many characters at once."""
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool):
            _check(f"{name}({arg:,})", abs(arg))


def _check_method(func: Any, args: Sequence[Any]) -> None:
    """The methods of a string whose result's size the arguments say before it is built."""
    owner, name = getattr(func, "__self__", None), getattr(func, "__name__", "")
    if isinstance(owner, str):
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_args(name, args[:1])
        elif name in ("format", "format_map"):
            _check_format(owner, f"{name} of a string")
        elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
            old, new = args[0], args[1]
            count = owner.count(old) if old else len(owner) + 1
            _check("replace", len(owner) + count * max(0, len(new) - len(old)))
        elif name == "join":
            items = list(args[0]) if args else []
            _check("join", sum(map(_size, items)) + len(owner) * len(items))
        elif name == "expandtabs" and args and isinstance(args[0], int):
            _check("expandtabs", len(owner) + owner.count("\t") * args[0])


def _check_filter(name: str, values: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """The filters whose result's size their arguments say before it is built: ``format``'s
    widths, ``indent``'s width on every line, ``join``'s items."""
    first = values[0] if values else None
    if name == "format" and isinstance(first, str):
        _check_format(first, "the format filter")
    elif name == "indent" and isinstance(first, str):
        width = values[1] if len(values) > 1 else kwargs.get("width", 4)
        per_line = width if isinstance(width, int) else _size(width)
        _check("the indent filter", len(first) + (first.count("\n") + 1) * per_line)
    elif name == "join" and first is not None and not isinstance(first, str):
        items = list(first)
        glue = values[1] if len(values) > 1 else kwargs.get("d", "")
        _check("the join filter", sum(map(_size, items)) + _size(glue) * len(items))


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter held to the bound: its numbers before it runs (a width), its result after."""

    @functools.wraps(func)  # keeps the filter's pass_context / pass_eval_context mark
    def bounded(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not hasattr(a, "environment")]  # not a Jinja context
        _check_args(f"the {name} filter", [*values, *kwargs.values()])
        _check_filter(name, values, kwargs)
        result = func(*args, **kwargs)
        _check(f"the {name} filter's result", _size(result))
        return result

    return bounded


class _BoundedFilters(dict):  # type: ignore[type-arg]
    """An environment's filters, each held to the bound as it is set (transformers sets its
    own ``tojson`` after the environment is made)."""

    def __setitem__(self, name: str, func: Callable[..., Any]) -> None:
        super().__setitem__(name, _bounded_filter(name, func))


def _join_bounded(parts: Iterable[Any]) -> str:
    """``~`` and a render's pieces joined, refused once they pass the bound."""
    pieces, total = [], 0
    for part in parts:
        text = part if isinstance(part, str) else str(part)
        total += len(text)
        _check("the render", total)
        pieces.append(text)
    return "".join(pieces)


@functools.cache
def bounded_sandbox() -> type:
    """:class:`BoundedSandbox`, made on first use: jinja2 is imported only when a chat
    template is rendered."""
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        """Jinja's code generator, with ``~`` joined through the bound."""

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.join_bounded((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        """transformers' sandbox for chat templates, with every value held to the bound.

        ``*``, ``+``, ``%`` and ``**`` go through :meth:`call_binop` (which also keeps Jinja
        from folding a constant product while compiling), every call through :meth:`call`,
        every filter through its bounded wrapper, ``~`` through the join above and the
        render's pieces through :meth:`concat`.
        """

        intercepted_binops = frozenset({"*", "+", "%", "**"})
        code_generator_class = BoundedCodeGenerator
        concat = staticmethod(_join_bounded)
        join_bounded = staticmethod(_join_bounded)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.filters = _BoundedFilters()
            for name, func in ImmutableSandboxedEnvironment(*args, **kwargs).filters.items():
                self.filters[name] = func

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            result = super().call_binop(context, operator, left, right)
            _check(f"the result of {operator}", _size(result))
            return result

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:  # a string's format or format_map, read as it is reached
                _check_format(value.__self__, f"{value.__name__} of a string")
            return wrapped

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            name = getattr(obj, "__name__", type(obj).__name__)
            _check_method(obj, args)
            result = super().call(context, obj, *args, **kwargs)
            _check(f"the result of {name}", _size(result))
            return result

    return BoundedSandbox


_installed = threading.Lock()


def install_bounds() -> None:
    """Make transformers compile chat templates in :class:`BoundedSandbox` from now on, in
    this process (its compile cache cleared, so no template compiled before is reused).

    transformers builds its sandbox inside ``_cached_compile_jinja_template`` from the name
    ``ImmutableSandboxedEnvironment`` of its ``chat_template_utils`` module, and renders
    with ``apply_chat_template``'s own arguments (special tokens, tools, generation marks),
    which spdrank keeps by giving it the sandbox rather than rendering itself. A
    transformers without that seam is refused, not rendered unbounded.
    """
    from transformers.utils import chat_template_utils as utils

    sandbox = bounded_sandbox()
    with _installed:
        if getattr(utils, "ImmutableSandboxedEnvironment", None) is sandbox:
            return
        if not hasattr(utils, "ImmutableSandboxedEnvironment") or not hasattr(
                utils, "_compile_jinja_template"):
            raise RuntimeError("this transformers compiles chat templates where spdrank cannot "
                               "bound them: install the version spdrank pins")
        utils.ImmutableSandboxedEnvironment = sandbox
        utils._compile_jinja_template.cache_clear()


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
    install_bounds()
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
    except TooLarge as exc:
        raise ValueError(f"{_name(tokenizer)}: its chat template was stopped: {exc}") from None
    except failures as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{_name(tokenizer)}: its chat template failed to render "
                         f"({type(exc).__name__}: {reason[:300]})") from None
    finally:
        sys.settrace(previous)
