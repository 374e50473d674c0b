"""A backbone's chat template is data: one that loops for ever is stopped at a time bound,
one the sandbox refuses (a ``range`` past its limit) or that raises to a power is one line,
never a traceback or a CPU held for good (:mod:`spdrank.backbone.chat`)."""

from __future__ import annotations

import copy
import threading
import time

import pytest

from spdrank.backbone.chat import render_chat_template
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
    tok = hostile("{% for i in range(10**8) %}{% endfor %}".replace("10**8", "100000000"))
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
