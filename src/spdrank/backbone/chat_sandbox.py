"""A chat template rendered in Jinja's sandbox with every value it builds held to a bound:
the renderer :mod:`spdrank.backbone.chat` runs in a child process (``python -m
spdrank.backbone.chat_sandbox``), or in-process for a template spdrank ships.

The environment is the one transformers renders chat templates in (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, the ``generation`` tag, ``tojson`` without HTML escapes,
``raise_exception``, ``strftime_now``, a ``namespace`` that takes no underscored name), made
here so the child imports Jinja alone: a child that imports transformers starts in about a
second, one that imports Jinja in a tenth of that.

The bounds inside the render give a refusal its reason before anything is spent:

- the power operator is refused before the template runs: one ``**`` of large numbers is a
  single step in C, and no chat template needs it;
- every string or list a template builds (by ``*``, ``+``, ``~``, ``%`` formatting, a method
  such as ``center`` or ``replace``, a filter such as ``indent``, ``join``, ``replace`` or
  ``sum``) is held to :data:`~spdrank.core.defaults.CHAT_TEMPLATE_CHARS`, checked before the
  step allocates where its size can be known beforehand and on its result otherwise, and so
  is the render.

What these cannot see (a loop in Jinja's own code, such as ``lipsum``; a value built from
many small ones) the child's limits stop: :func:`main` sets its CPU time and address space
(``RLIMIT_CPU``, ``RLIMIT_AS``) before it reads the template, and the parent kills it at the
wall-clock bound.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from spdrank.core.defaults import CHAT_TEMPLATE_CHARS


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
    widths, ``indent``'s width on every line, ``replace``'s every match, ``sum``'s lists or
    strings (joined by ``start``), ``join``'s items."""
    first = values[0] if values else None
    if name == "format" and isinstance(first, str):
        _check_format(first, "the format filter")
    elif name == "indent" and isinstance(first, str):
        width = values[1] if len(values) > 1 else kwargs.get("width", 4)
        per_line = width if isinstance(width, int) else _size(width)
        _check("the indent filter", len(first) + (first.count("\n") + 1) * per_line)
    elif name == "replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
        text, old, new = values[0], values[1], values[2]
        count = text.count(old) if old else len(text) + 1
        _check("the replace filter", len(text) + count * max(0, len(new) - len(old)))
    elif name == "sum" and isinstance(first, (list, tuple)):
        start = values[2] if len(values) > 2 else kwargs.get("start", 0)
        if isinstance(start, (str, list, tuple)):
            _check("the sum filter", _size(start) + sum(map(_size, first)))
    elif name == "join" and first is not None and not isinstance(first, str):
        items = list(first)
        glue = values[1] if len(values) > 1 else kwargs.get("d", "")
        _check("the join filter", sum(map(_size, items)) + _size(glue) * len(items))


def _is_jinja(value: Any) -> bool:
    """Whether a filter's argument is what Jinja passes it (a context, an evaluation context,
    the environment), not a value the template gave."""
    return hasattr(value, "environment") or hasattr(value, "filters")


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter held to the bound: its numbers before it runs (a width), its result after."""

    @functools.wraps(func)  # keeps the filter's pass_context / pass_eval_context mark
    def bounded(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not _is_jinja(a)]
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


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' ``tojson``: no HTML escapes, its options exposed."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(format)


@functools.cache
def environment() -> Any:
    """The sandbox a chat template is compiled in, made once."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``, which marks an assistant's text for a
        training mask and renders its body as it is."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class TemplateDict:
        """``dict(...)`` and ``dict.fromkeys`` without the type itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):  # type: ignore[misc]
        """A namespace that stores no underscored attribute."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not store {name!r} on a namespace")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = bounded_sandbox()(trim_blocks=True, lstrip_blocks=True,
                            extensions=[Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _check_operators(source: str) -> None:
    """Refuse a template that raises to a power (found by Jinja's lexer, outside strings)."""
    tokens = environment().lex(source)
    if any(kind == "operator" and value == "**" for _, kind, value in tokens):
        raise TooLarge("it raises to a power (**), which no chat template needs and no bound "
                       "stops before it has run")


def render(source: str, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> str:
    """``source`` rendered around ``messages`` as transformers' ``apply_chat_template``
    renders it (``kwargs``: the special tokens, ``add_generation_prompt`` and the template's
    own options), held to the bounds above."""
    _check_operators(source)
    template = environment().from_string(source)
    options = dict(kwargs)
    return template.render(messages=[dict(m) for m in messages],
                           tools=options.pop("tools", None),
                           documents=options.pop("documents", None),
                           add_generation_prompt=options.pop("add_generation_prompt", False),
                           **options)


def failure(exc: BaseException) -> str:
    """Why a render failed, in one line."""
    from jinja2 import TemplateSyntaxError

    if isinstance(exc, TooLarge):
        return f"was stopped: {exc}"
    if isinstance(exc, TemplateSyntaxError):
        return f"does not parse ({exc.message}, line {exc.lineno})"
    if isinstance(exc, MemoryError):
        return "ran out of the memory a render may take and was stopped"
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return f"failed to render ({type(exc).__name__}: {reason[:300]})"


def _vm_bytes() -> int:
    """This process's address space now, in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _limit(cpu_seconds: float, memory_bytes: int) -> None:
    """Hold this process to ``cpu_seconds`` of CPU time (SIGXCPU ends it past them) and its
    address space to ``memory_bytes`` beyond what it holds now (an allocation past it fails)."""
    import resource

    cpu = max(1, math.ceil(cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    vm = _vm_bytes()
    if vm:
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory_bytes, vm + memory_bytes))


def main() -> None:
    """The child: one request on stdin (``source``, ``messages``, ``kwargs``, ``seconds``,
    ``memory``), one answer on stdout (``{"text": ...}`` or ``{"error": ...}``)."""
    environment()  # Jinja imported and the sandbox made before the limits are set
    request = json.loads(sys.stdin.buffer.read())
    _limit(request["seconds"], request["memory"])
    try:
        answer = {"text": render(request["source"], request["messages"], request["kwargs"])}
    except Exception as exc:  # noqa: BLE001 - a template's failure of any kind is its answer
        answer = {"error": failure(exc)}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
