"""The optional API key: where ``spdrank serve`` reads it, and how a request is checked.

The key comes from the environment (:data:`ENV_VAR`) or a file (``--api-key-file``), never
from the command line, where every user of the machine can read it in the process list.
With a key set, every request needs ``Authorization: Bearer <key>`` except those for the
paths in :func:`is_open`: the liveness probe and the metrics (what an orchestrator or a
Prometheus scraper asks without credentials) and the API's documentation (the schema every
spdrank server shares, which a browser cannot attach a header to). The comparison is
:func:`hmac.compare_digest`, whose time does not depend on where the two keys differ.

Plain Python (no FastAPI): the command reads the key before it loads the model.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from spdrank.serving.routes import (
    DOCS_ASSETS_PATH,
    DOCS_PATH,
    HEALTH_PATH,
    METRICS_PATH,
    OPENAPI_PATH,
    REDOC_PATH,
)

#: The environment variable ``spdrank serve`` reads the API key from.
ENV_VAR = "SPDRANK_API_KEY"
#: The most a key file may hold: a key is a few dozen characters, and a path to something
#: endless (``/dev/zero``) must not be read whole.
MAX_KEY_BYTES = 4096

_OPEN_PATHS = frozenset((HEALTH_PATH, METRICS_PATH, DOCS_PATH, REDOC_PATH, OPENAPI_PATH))


def is_open(path: str) -> bool:
    """Whether a request for ``path`` is served without the key (see the module's docstring)."""
    return path in _OPEN_PATHS or path.startswith((DOCS_PATH + "/", DOCS_ASSETS_PATH + "/"))


def check_key(key: str, source: str) -> str:
    """``key`` without surrounding whitespace (a file's trailing newline); refused, naming
    ``source``, when nothing is left or it holds what an HTTP header cannot carry as is."""
    key = key.strip()
    if not key:
        raise ValueError(f"{source} is empty: write the API key into it, or leave it unset")
    if not all("!" <= c <= "~" for c in key):
        raise ValueError(
            f"{source}: the API key must be printable ASCII without spaces "
            "(it travels in an Authorization header)"
        )
    return key


def read_key_file(path: str | Path) -> str:
    """The key in the file at ``path`` (at most :data:`MAX_KEY_BYTES`), checked."""
    source = f"--api-key-file {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{source}: {exc.strerror or exc}") from None
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"{source} holds more than {MAX_KEY_BYTES} bytes: it is not a key file")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{source}: the API key must be printable ASCII without spaces") from None
    return check_key(text, source)


def load_api_key(key_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key ``spdrank serve`` runs with: from ``key_file``, or from :data:`ENV_VAR`;
    None (no authentication) when neither is set. Both set is refused: which one wins would
    be a guess, and a wrong guess locks clients out or lets them in."""
    environ = os.environ if environ is None else environ
    from_env = environ.get(ENV_VAR)
    if key_file is not None and from_env is not None:
        raise ValueError(f"the API key is set both in {ENV_VAR} and by --api-key-file: keep one")
    if key_file is not None:
        return read_key_file(key_file)
    if from_env is not None:
        return check_key(from_env, ENV_VAR)
    return None


def authorized(headers: Iterable[tuple[bytes, bytes]], key: str) -> bool:
    """Whether the request's ASGI ``headers`` carry ``Authorization: Bearer <key>``."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(
                token.strip(), key.encode("ascii")
            )
    return False
