"""What the serving benchmarks share: ``spdrank serve`` in a subprocess on a free loopback
port, its memory, percentiles, the served model's facts every report records (the machine's
and the code's are machine.py's) and the report's opening lines.

Used by ``load.py`` (latency and throughput) and ``soak.py`` (hostile traffic over time);
run them as scripts (``python benchmarks/NAME.py``) so this folder is on the import path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

# -- the served model --------------------------------------------------------------------------


def model_config_path(model: str | Path) -> Path:
    """A checkpoint's config.json, given the checkpoint or a training run's OUT."""
    path = Path(model)
    return path / "config.json" if (path / "config.json").exists() else path / "model" / "config.json"


def model_info(model: str | None) -> dict[str, Any]:
    """The served checkpoint's shape (backbone, head, K, decoder) as its config.json says."""
    if model is None:
        return {}
    info: dict[str, Any] = {"path": str(Path(model).resolve())}
    try:
        cfg = json.loads(model_config_path(model).read_text())
        backbone = cfg["backbone"] or {}  # null in a features-only model's
        info.update(
            backbone=None if cfg.get("features_only") else backbone.get("name_or_path"),
            layers=backbone.get("layers"),
            lora=backbone.get("lora") is not None,
            head=cfg["head"].get("kind"),
            K=cfg["head"].get("positions"),
            max_item_tokens=cfg["prompt"].get("max_item_tokens"),
            decoder=cfg.get("decoder"),
            features=(cfg.get("features") or {}).get("names", []),
        )
    except (OSError, KeyError, ValueError) as exc:
        info["config_error"] = str(exc)
    return info


# -- the server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``spdrank serve`` in a subprocess on loopback (its own session, so stopping it stops
    its children); ``flags`` are passed to ``spdrank serve`` as given."""

    def __init__(self, model: str, flags: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "spdrank", "serve", "--model", model,
            "--host", "127.0.0.1", "--port", str(self.port), *flags, "--log-level", "warning",
        ]  # fmt: skip
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Poll /healthz until it answers 200 (its body), or fail naming the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with status {self.proc.returncode}; see {self.log.name}"
                )
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server was not up after {timeout:.0f} s; see {self.log.name}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_bytes(self) -> int | None:
        """The server process's resident memory now (None once it has exited)."""
        return rss_bytes(self.proc.pid) if self.alive() else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid``: psutil when installed, else Linux's /proc; None if
    neither can tell (the process is gone, or another OS without psutil)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# -- numbers --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# -- the report -----------------------------------------------------------------------------


def report_head(title: str, record: dict[str, Any]) -> list[str]:
    """A serving report's first lines: its title, then the command, date, code and machine
    ``record`` holds."""
    mach = record["machine"]
    return [
        f"# {title}",
        "",
        f"- command: `{record['command']}`",
        f"- date: {record['date']}; code: {record['code']}",
        (f"- machine: {mach.get('cpus')} CPU cores ({mach.get('cpu', '?')}), "
         f"{mach.get('ram_gib', '?')} GiB RAM, GPU: {', '.join(mach.get('gpus') or []) or 'none'}; "
         f"torch {mach.get('torch', '?')}"),
    ]
