"""benchmarks/lease.sh on a lent machine: a wheel that comes in parts over several calls is
joined only when every part has come, checked against its sha256 before it is installed, and
the scripts' BIN runs the machine's own Python (its packages included)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import ROOT

WHEEL = "lease_probe-1.0-py3-none-any.whl"


def probe_wheel(path: Path) -> bytes:
    """A minimal pure-Python wheel, its bytes (stored uncompressed, so the parts differ)."""
    files = {
        "lease_probe/__init__.py": "VALUE = 42\n" + "# padding\n" * 200,
        "lease_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: lease-probe\nVersion: 1.0\n",
        "lease_probe-1.0.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\n"
                                            "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = "".join(f"{name},,\n" for name in files) + "lease_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, "lease_probe-1.0.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return path.read_bytes()


def lease_dir(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A .lease folder as lease_pack.sh writes it, with the probe wheel in two parts (neither
    carried yet), and the parts."""
    lease = tmp_path / "lease"
    lease.mkdir()
    data = probe_wheel(tmp_path / WHEEL)
    (lease / "backbone.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {WHEEL}\n")
    (lease / "backbone.parts").write_text("2\n")
    half = len(data) // 2
    return lease, [data[:half], data[half:]]


def carry(lease: Path, number: int, data: bytes) -> None:
    (lease / f"backbone-{number}").mkdir(exist_ok=True)
    (lease / f"backbone-{number}" / "part").write_bytes(data)


def call(tmp_path: Path, lease: Path) -> subprocess.CompletedProcess:
    """One call: no preflight, no run; only the parts."""
    env = {**os.environ, "LEASE": str(lease), "SITE": str(tmp_path / "site"), "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "LEASE_BIN": str(tmp_path / "bin"), "PREFLIGHT": "0",
           "RUN": "0"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "lease.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_wheel_in_parts_is_joined_when_the_last_part_comes(tmp_path):
    lease, parts = lease_dir(tmp_path)
    carry(lease, 1, parts[0])
    first = call(tmp_path, lease)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 of the backbone's 2 parts here" in first.stdout
    assert not (tmp_path / "site" / "lease_probe").exists()
    assert (tmp_path / "out" / "lease.log").read_text().count("parts here") == 1
    carry(lease, 2, parts[1])
    second = call(tmp_path, lease)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (tmp_path / "site" / "lease_probe" / "__init__.py").read_text().startswith("VALUE = 42")
    # The scripts' BIN is this interpreter, its own packages found (a link would lose a venv's).
    prefix = subprocess.run([str(tmp_path / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert prefix == sys.prefix


def test_a_damaged_part_is_refused_before_anything_is_installed(tmp_path):
    lease, parts = lease_dir(tmp_path)
    carry(lease, 1, parts[0])
    carry(lease, 2, parts[1][:-1] + bytes([parts[1][-1] ^ 1]))
    done = call(tmp_path, lease)
    assert done.returncode == 1
    said = done.stdout + done.stderr  # the script sends both to its log and to stdout
    assert "does not match" in said and "rerun benchmarks/lease_pack.sh" in said
    assert not (tmp_path / "site" / "lease_probe").exists()
