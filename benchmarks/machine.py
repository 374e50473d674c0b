"""What a benchmark report says about where it ran: the machine, how busy it was (figures from
a 2-core machine move with its load), the code; and what the scripts' reports share.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def shown(path: Path) -> str:
    """``path`` as a report or a command line names it: relative to the checkout when in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fmt(value: float | None, spec: str) -> str:
    """``value`` in a report's table: formatted by ``spec``, or "-" when it is not known."""
    return "-" if value is None else format(value, spec)


def run_quiet(cmd: list[str]) -> str:
    """A helper command's stdout, or "" when it is missing or fails."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def proc_line(path: str, prefix: str) -> str | None:
    """The rest of the first line of ``path`` (a /proc file) that starts with ``prefix``."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    return proc_line("/proc/cpuinfo", "model name") or "unknown CPU"


def machine() -> str:
    """``N CPU cores (model name)``."""
    return f"{os.cpu_count()} CPU cores ({cpu_name()})"


def facts() -> dict[str, Any]:
    """CPU, RAM, GPUs and versions, for a report's results.json."""
    memory = proc_line("/proc/meminfo", "MemTotal")
    gpus = (run_quiet(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
            if shutil.which("nvidia-smi") else "")
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    return {"cpus": os.cpu_count(), "cpu": cpu_name(), "platform": platform.platform(),
            "python": platform.python_version(),
            "ram_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
            "gpus": [g.strip() for g in gpus.splitlines() if g.strip()], "torch": torch}


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def code_version() -> str:
    """The commit measured, flagged when src/ differs from it."""
    commit = run_quiet(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "src"],
                           capture_output=True, check=False).returncode
    return (commit or "unknown") + (" (+ uncommitted changes in src/)" if dirty == 1 else "")
