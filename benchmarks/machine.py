"""What a benchmark report says about the machine it ran on: the CPU and how busy it was.

Figures from this 2-core machine move with its load, so every report names the CPU kind and
the load averages before and after its run.
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name, from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine() -> str:
    """``N CPU cores (model name)``."""
    return f"{os.cpu_count()} CPU cores ({cpu_name()})"


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
