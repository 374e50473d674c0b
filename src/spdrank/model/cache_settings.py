"""How a state cache may be built, and when cached states may stand for a prefill: importable
without torch, so that ``spdrank train`` builds its flags and checks its settings without it.

The cache itself (:mod:`spdrank.model.state_cache`) runs the same check when it is opened, so a
refusal reads alike from the command line and from the library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spdrank.methods.base import RankingMethod

#: How cached states may be stored (``--cache-dtype``).
CACHE_DTYPES = ("float16", "float32")
#: How they are stored unless told: half of float32's disk.
DEFAULT_CACHE_DTYPE = "float16"
#: Slates per prefill while a cache is built, unless told.
DEFAULT_CACHE_BATCH_SIZE = 8


def check_cacheable(
    method: RankingMethod, *, frozen: bool, features_only: bool, dtype: str, batch_size: int,
    split: bool = False,
) -> None:
    """Refuse to cache states that would not stand for the prefill, or to cache them as asked;
    ``frozen``: whether the layers whose output would be cached never change (the whole
    backbone, or the layers below LoRA's top ones); ``split``: the latter, whose cache holds
    the lower layers' states of one prompt a slate.

    Cached states stand for a prefill only when the prefill never changes and is what the
    head reads. A method says why its own heads' states cannot be cached
    (:attr:`~spdrank.methods.base.RankingMethod.cache_refusal`).
    """
    if features_only:
        raise ValueError("--features-only runs no backbone, so it has no states to cache: "
                         "drop --cache-states")
    if method.cache_refusal is not None:
        raise ValueError(method.cache_refusal)
    if split and method.reads == "candidates":
        raise ValueError(f"--cache-states with --lora-layers keeps the lower layers' states of "
                         f"one prompt a slate, and the {method.name} method reads one sequence "
                         "a candidate: cache with --frozen, or drop --cache-states")
    if not frozen:
        raise ValueError("--cache-states needs --frozen, or LoRA on the top layers only "
                         "(--lora-layers N): LoRA on every layer changes all the backbone's "
                         "states at every step, so cached ones would be stale")
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"unknown --cache-dtype {dtype!r}: use one of {list(CACHE_DTYPES)}")
    if batch_size < 1:
        raise ValueError(f"--cache-batch-size must be at least 1, got {batch_size}")
