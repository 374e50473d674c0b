"""Whether this CPU multiplies bfloat16 matrices in hardware: what ``--dtype auto`` asks.

A CPU with native bfloat16 matrix units (Intel AMX ``amx_bf16``, or ``avx512_bf16`` on Intel
and AMD) runs oneDNN's bfloat16 matmuls several times faster than float32 ones, and a
ranking there is as good in either dtype (``benchmarks/bf16_agreement.py`` checks it for a
checkpoint); elsewhere bfloat16 is emulated and slower. The answer comes from torch's own
capability query (what its kernels dispatch on), or, for a torch without one, from the
``flags`` of ``/proc/cpuinfo``. ``SPDRANK_CPU_BF16=1`` or ``0`` overrides the detection (a
machine whose flags mislead, a test that needs one answer on every machine).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

#: The CPU features of a native bfloat16 matrix product.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: The environment variable that overrides the detection: ``1`` (has the units) or ``0``.
ENV = "SPDRANK_CPU_BF16"
CPUINFO = Path("/proc/cpuinfo")


def native_bf16() -> bool:
    """Whether this CPU has native bfloat16 matrix units (``SPDRANK_CPU_BF16`` first)."""
    override = os.environ.get(ENV)
    if override is not None:
        if override.strip() not in ("0", "1"):
            raise ValueError(f"{ENV} must be 1 or 0, got {override!r}")
        return override.strip() == "1"
    return detected_bf16()


@functools.cache
def detected_bf16() -> bool:
    """What the hardware says, once a process: torch's query, else ``/proc/cpuinfo``."""
    capabilities = torch_capabilities()
    if capabilities is not None:
        return any(bool(capabilities.get(flag)) for flag in BF16_FLAGS)
    return bool(cpuinfo_flags() & set(BF16_FLAGS))


def torch_capabilities() -> dict[str, object] | None:
    """``torch.cpu.get_capabilities()``, or None for a torch without it (or where it fails)."""
    import torch

    query = getattr(torch.cpu, "get_capabilities", None)
    if query is None:
        return None
    try:
        return dict(query())
    except (RuntimeError, OSError):
        return None


def cpuinfo_flags(path: Path | None = None) -> frozenset[str]:
    """The feature flags ``path`` (default :data:`CPUINFO`, Linux's ``/proc/cpuinfo``) lists;
    none where it is absent (another system)."""
    try:
        text = (CPUINFO if path is None else path).read_text(errors="replace")
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)
