"""What the serving benchmarks, load.py and soak.py, share: ``spdrank serve`` in a subprocess
on a free loopback port, its memory, latency figures, the served model's facts and the report's
opening lines. Run them as scripts (``python benchmarks/NAME.py``): this folder is then on the
import path.
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
from machine import proc_line

from spdrank.eval.evaluate import percentile as interpolated
from spdrank.model.checkpoint import CONFIG_NAME, model_folder


def model_info(model: str | None) -> dict[str, Any]:
    """The served checkpoint's shape (backbone, head, K, decoder) as its config.json says."""
    if model is None:
        return {}
    info: dict[str, Any] = {"path": str(Path(model).resolve())}
    try:
        cfg = json.loads((model_folder(model) / CONFIG_NAME).read_text())
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
        found = proc_line(f"/proc/{pid}/status", "VmRSS")  # "123456 kB"
        return int(found.split()[0]) * 1024 if found else None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def latency_ms(values: list[float], points: tuple[int, ...], digits: int) -> dict[str, Any]:
    """``p<q>`` for each q of ``points`` (spdrank's percentile; NaN of no values), the mean and
    the max (None of no values), rounded to ``digits``."""
    found = {f"p{q}": interpolated(values, q) for q in points}
    return {**{k: float("nan") if v is None else round(v, digits) for k, v in found.items()},
            "mean": round(sum(values) / len(values), digits) if values else None,
            "max": round(max(values), digits) if values else None}


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
