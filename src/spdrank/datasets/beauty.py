"""The bundled Amazon Beauty 2014 (5-core): the SPD paper's setup, from files in the package.

``spdrank/data/beauty/`` holds ``user_sequence.txt`` (``reviewerID asin asin ...`` in time
order), ``item_id_to_int.json`` (``{asin: int}``) and ``products_lookup.csv``
(``,global_product_id,name``); see its ``PROVENANCE.md``. Titles are joined as
``asin -> item_id_to_int.json -> products_lookup.csv name`` and the slates are built by the
generic :mod:`spdrank.datasets.build` builder: item ids are ASINs, query ids reviewer ids.
With the defaults that gives 21,245 train and 1,118 eval slates of 50 candidates.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from importlib.resources import files
from importlib.resources.abc import Traversable

from spdrank.core.slates import SlateError
from spdrank.datasets.build import BuildResult, build_slates
from spdrank.datasets.log import InteractionLog, parse_sequences
from spdrank.datasets.options import BuildOptions
from spdrank.datasets.titles import clean_title

SEQUENCES = "user_sequence.txt"
ITEM_MAP = "item_id_to_int.json"
LOOKUP = "products_lookup.csv"

#: Users, items and interactions of the bundled log (checked in PROVENANCE.md).
USERS, ITEMS, INTERACTIONS = 22_363, 12_101, 198_502


def resource(name: str) -> Traversable:
    """A bundled Beauty file, through importlib.resources (works from a wheel or a zip)."""
    return files("spdrank") / "data" / "beauty" / name


def _where(name: str) -> str:
    return f"spdrank/data/beauty/{name}"


def load_log() -> InteractionLog:
    """The bundled interaction sequences, one user a line, ASINs in time order."""
    text = resource(SEQUENCES).read_text(encoding="utf-8")
    return parse_sequences(enumerate(io.StringIO(text), start=1), _where(SEQUENCES))


def load_titles() -> dict[str, str]:
    """ASIN -> cleaned title (``""`` where the product has an empty name)."""
    try:
        asin_to_int = json.loads(resource(ITEM_MAP).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SlateError(f"invalid JSON ({exc.msg})", f"{_where(ITEM_MAP)}:{exc.lineno}") from None
    if not isinstance(asin_to_int, dict):
        raise SlateError("expected a JSON object {asin: int}", _where(ITEM_MAP))
    names: dict[int, str] = {}
    reader = csv.reader(io.StringIO(resource(LOOKUP).read_text(encoding="utf-8"), newline=""))
    header = next(reader, None)
    if header is None or header[1:] != ["global_product_id", "name"]:
        raise SlateError(
            f"expected the header ',global_product_id,name', got {header!r}", f"{_where(LOOKUP)}:1"
        )
    for row in reader:
        where = f"{_where(LOOKUP)}:{reader.line_num}"
        if len(row) != 3:
            raise SlateError(f"expected 3 fields, got {len(row)}", where)
        try:
            pid = int(row[1])
        except ValueError:
            raise SlateError(f"global_product_id {row[1]!r} is not an integer", where) from None
        if pid in names:
            raise SlateError(f"global_product_id {pid} appears twice", where)
        names[pid] = row[2]
    return {
        asin: clean_title(names[pid])
        for asin, pid in sorted(asin_to_int.items())
        if pid in names
    }


def input_digests() -> dict[str, dict[str, str]]:
    """The bundled files and their sha256, for the manifest."""
    return {
        name: {
            "path": _where(name),
            "sha256": hashlib.sha256(resource(name).read_bytes()).hexdigest(),
        }
        for name in (SEQUENCES, ITEM_MAP, LOOKUP)
    }


def build_beauty(
    out_dir: str | os.PathLike[str],
    options: BuildOptions | None = None,
    progress: bool | None = None,
) -> BuildResult:
    """Write Beauty's ``train.jsonl`` / ``eval.jsonl`` / ``manifest.json`` into ``out_dir``."""
    return build_slates(
        load_log(),
        load_titles(),
        out_dir,
        options,
        inputs=input_digests(),
        command="beauty",
        progress=progress,
    )
