"""A backbone's chat template is data: it renders in a child process held in CPU time and
memory and killed at the wall-clock bound, so one that loops for ever (in the template or in
one step in C), allocates gigabytes, is refused by the sandbox (a ``range`` past its limit) or
raises to a power is one line naming its file, never a traceback or a CPU held for good
(:mod:`spdrank.backbone.chat`)."""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest

from spdrank.backbone.chat import SHIPPED, render_chat_template, template_file
from spdrank.backbone.prompt import template_around

NESTED = ("{% for i in range(99999) %}{% for j in range(99999) %}{% for k in range(99999) %}"
          "{% endfor %}{% endfor %}{% endfor %}")


@pytest.fixture
def hostile(tokenizer):
    """The bundled tokenizer with a chat template a test sets."""
    def with_template(template: str):
        tok = copy.copy(tokenizer)
        tok.chat_template = template
        return tok

    return with_template


def test_nested_loops_are_stopped_at_the_time_bound(hostile):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"chat template ran past 0.5 s and was stopped"):
        render_chat_template(hostile(NESTED), [{"role": "user", "content": "x"}], seconds=0.5)
    assert time.monotonic() - t0 < 5


def test_the_bound_holds_on_any_thread(hostile):
    """A server renders off the main thread, where no signal could interrupt it."""
    caught: list[BaseException] = []

    def render() -> None:
        try:
            render_chat_template(hostile(NESTED), [{"role": "user", "content": "x"}],
                                 seconds=0.3)
        except ValueError as exc:
            caught.append(exc)

    worker = threading.Thread(target=render)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive() and len(caught) == 1


def test_a_range_past_the_sandbox_limit_is_one_line(hostile):
    tok = hostile("{% for i in range(100000000) %}{% endfor %}")
    with pytest.raises(ValueError) as raised:
        template_around(tok, [])
    message = str(raised.value)
    assert "\n" not in message and "failed to render" in message and "OverflowError" in message


def test_a_power_of_large_numbers_is_refused_before_it_runs(hostile):
    with pytest.raises(ValueError, match=r"raises to a power"):
        template_around(hostile("{{ 10**(10**10) }}"), [])


def test_a_real_template_renders_as_before(tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    assert render_chat_template(tokenizer, messages, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


# -- size: what a template builds, and its render ---------------------------------------------

#: Each built (or would build) a gigabyte in one step in C, or by doubling in a loop, long
#: before the time bound: transformers' sandbox bounds neither.
TOO_LARGE = {
    "a product": "{{ 'a' * 1000000000 }}",
    "a product of products": "{{ ('a' * 100000) * 100000 }}",
    "a product by a variable": "{% set n = 1000000000 %}{{ 'ab' * n }}",
    "a list product": "{{ ([0] * 100000000)|length }}",
    "doubling by ~": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
    "doubling by +": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}"),
    "doubling by a block": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}"
                            "{% set b %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = b %}"
                            "{% endfor %}"),
    "growing by replace": ("{% set ns = namespace(s='aaaa') %}{% for i in range(30) %}"
                           "{% set ns.s = ns.s.replace('a', 'aaaa') %}{% endfor %}"),
    "a width (method)": "{{ 'a'.center(1000000000) }}",
    "a width (filter)": "{{ 'a'|center(1000000000) }}",
    "an indent of many lines": "{{ ('a\n' * 1000)|indent(1000000) }}",
    "a % width": "{{ '%1000000000d' % 1 }}",
    "a format width": "{{ '{:>1000000000}'.format(1) }}",
    "a format width from the arguments": "{{ '{:{}}'.format(1, 1000000000) }}",
    "a join": "{% set s = 'a' * 1000000 %}{{ ([s] * 1000)|join(',') }}",
    "tojson's indent": "{{ messages|tojson(indent=1000000000) }}",
    "an endless render": ("{% for i in range(99999) %}{% for j in range(99999) %}"
                          "{{ 'x' * 1000 }}{% endfor %}{% endfor %}"),
}


@pytest.mark.parametrize("name", TOO_LARGE)
def test_a_template_that_builds_past_the_bound_is_one_line(hostile, name):
    t0 = time.monotonic()
    with pytest.raises(ValueError) as raised:
        render_chat_template(hostile(TOO_LARGE[name]), [{"role": "user", "content": "x"}],
                             seconds=30)
    message = str(raised.value)
    assert "\n" not in message and "the chat template was stopped" in message, message
    assert "a chat template may build" in message or "not allowed" in message, message
    assert time.monotonic() - t0 < 5  # refused before it allocates, not at the time bound


@pytest.mark.parametrize("template", [
    "{{ '-' * 3 }}{{ ['a', 'b']|join(', ') }}{{ 'a\nb'|indent(2) }}{{ '%05d' % 3 }}",
    ("{% for m in messages %}{% if loop.index0 % 2 == 0 %}{{ m['content'] ~ '!' }}{% endif %}"
    "{% endfor %}{{ '{}-{}'.format(1, 2) }}{{ messages|tojson(indent=2) }}"),
])
def test_templates_within_the_bound_render_as_jinja_renders_them(hostile, template):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [{"role": "user", "content": "hello"}]
    tok = hostile(template)
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    plain.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent)
    expected = plain.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                  **tok.special_tokens_map)
    assert render_chat_template(tok, messages, add_generation_prompt=True) == expected


def test_the_bundled_template_renders_as_jinja_renders_it(tokenizer):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [{"role": "system", "content": "Rank."}, {"role": "user", "content": "hello"}]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    expected = plain.from_string(tokenizer.chat_template).render(
        messages=messages, add_generation_prompt=True, **tokenizer.special_tokens_map)
    assert render_chat_template(tokenizer, messages, add_generation_prompt=True) == expected


# -- the child process: what no check inside the render sees ----------------------------------

#: Each holds the process that renders it: one step in C (a sum of lists), Jinja's own code
#: (lipsum), gigabytes built before the render's bound (the replace filter), a gigabyte of
#: lists each under the bound.
HOLDING = {
    "a sum of lists": "{% set a = range(100000)|list %}{{ ([a] * 1000)|sum(start=[])|length }}",
    "lipsum": "{{ lipsum(n=1000000)|length }}",
    "the replace filter": "{% set a='x'*60000 %}{{ (a|replace('', a))|length }}",
    "many small lists": ("{% set a = range(100000)|list %}"
                         "{{ ([a] * 1000)|map('list')|list|length }}"),
}


@pytest.fixture
def in_folder(tokenizer, tmp_path):
    """The bundled tokenizer read from a folder whose ``chat_template.jinja`` a test writes."""
    def with_template(template: str):
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
        tok = copy.copy(tokenizer)
        tok.chat_template = template
        tok.name_or_path = str(tmp_path)
        return tok

    return with_template


@pytest.mark.parametrize("name", HOLDING)
def test_a_template_that_would_hold_the_process_is_refused_in_bounded_time(in_folder, name):
    tok = in_folder(HOLDING[name])
    t0 = time.monotonic()
    with pytest.raises(ValueError) as raised:
        render_chat_template(tok, [{"role": "user", "content": "x"}], seconds=2)
    message = str(raised.value)
    assert time.monotonic() - t0 < 30
    assert "\n" not in message, message
    assert message.startswith(f"{tok.name_or_path}/chat_template.jinja: the chat template "), message
    assert any(why in message for why in ("ran past 2 s", "a chat template may build",
                                          "ran out of the memory")), message


def test_the_child_renders_while_the_parent_holds_torch_and_threads(in_folder):
    """The child is started by fork and exec: a parent with torch loaded and threads busy
    (a server) renders as any other."""
    import torch

    torch.ones(4) @ torch.ones(4)
    stop = threading.Event()
    busy = [threading.Thread(target=lambda: [stop.wait(0.001) for _ in iter(stop.is_set, True)])
            for _ in range(4)]
    for thread in busy:
        thread.start()
    try:
        tok = in_folder("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
        assert render_chat_template(tok, [{"role": "user", "content": "x"}]) == "[x]"
        with pytest.raises(ValueError, match="ran past 1 s"):
            render_chat_template(in_folder(NESTED), [{"role": "user", "content": "x"}],
                                 seconds=1)
    finally:
        stop.set()
        for thread in busy:
            thread.join()


def test_the_shipped_template_is_known_and_any_other_renders_in_the_child(tokenizer,
                                                                          monkeypatch):
    import hashlib

    from spdrank.backbone import chat

    assert hashlib.sha256(tokenizer.chat_template.encode()).hexdigest() in SHIPPED
    started: list[str] = []
    real = chat._render_isolated
    monkeypatch.setattr(chat, "_render_isolated",
                        lambda *args: started.append(args[0]) or real(*args))
    messages = [{"role": "user", "content": "shipped"}]
    render_chat_template(tokenizer, messages)
    assert started == []
    other = copy.copy(tokenizer)
    other.chat_template = tokenizer.chat_template + "{# a user's copy #}"
    assert render_chat_template(other, messages) == render_chat_template(tokenizer, messages)
    assert started == [other.chat_template]


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}",
    ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
     "{{ bos_token ~ m['role'] ~ ':' ~ m['content'] ~ eos_token }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
     "{{ ns.n }}{{ messages|tojson }}{{ dict(a=1)|tojson }}{{ tools is none }}"),
])
def test_the_child_renders_as_transformers_renders(tokenizer, template):
    """The sandbox is made as transformers makes its own, tags, globals and filters alike."""
    tok = copy.copy(tokenizer)
    tok.chat_template = template
    messages = [{"role": "system", "content": "Rank <b>."}, {"role": "user", "content": "hi"}]
    assert render_chat_template(tok, messages, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                      chat_template=template))


def test_the_file_named_is_the_one_transformers_reads(tmp_path):
    class Tok:
        name_or_path = str(tmp_path)

    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert template_file(Tok()) == str(tmp_path / "tokenizer_config.json")
    (tmp_path / "chat_template.jinja").write_text("")
    assert template_file(Tok()) == str(tmp_path / "chat_template.jinja")
    Tok.name_or_path = "some/hub-id"
    assert "some/hub-id" in template_file(Tok())
