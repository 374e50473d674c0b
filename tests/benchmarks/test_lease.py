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
    """An empty .lease folder on the lent machine (nothing carried yet), and the probe wheel in
    two parts."""
    lease = tmp_path / "lease"
    lease.mkdir()
    data = probe_wheel(tmp_path / WHEEL)
    half = len(data) // 2
    return lease, [data[:half], data[half:]]


def carry(lease: Path, number: int, data: bytes, whole: bytes) -> None:
    """Part ``number`` as a call carries it: its bytes, with the count of parts and the sha256
    of the ``whole`` wheel beside it."""
    folder = lease / f"backbone-{number}"
    folder.mkdir(exist_ok=True)
    (folder / "part").write_bytes(data)
    (folder / "parts").write_text("2\n")
    (folder / "sha256").write_text(f"{hashlib.sha256(whole).hexdigest()}  {WHEEL}\n")


def call(tmp_path: Path, lease: Path) -> subprocess.CompletedProcess:
    """One call: no preflight, no run; only the parts."""
    env = {**os.environ, "LEASE": str(lease), "SITE": str(tmp_path / "site"), "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "LEASE_BIN": str(tmp_path / "bin"), "PREFLIGHT": "0",
           "RUN": "0"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "lease.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_wheel_in_parts_is_joined_when_the_last_part_comes(tmp_path):
    # Only the parts' folders travel: the first call knows from its part alone how many to wait for.
    lease, parts = lease_dir(tmp_path)
    carry(lease, 1, parts[0], b"".join(parts))
    first = call(tmp_path, lease)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 of the backbone's 2 parts here" in first.stdout
    assert not (tmp_path / "site" / "lease_probe").exists()
    assert (tmp_path / "out" / "lease.log").read_text().count("parts here") == 1
    carry(lease, 2, parts[1], b"".join(parts))
    second = call(tmp_path, lease)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (tmp_path / "site" / "lease_probe" / "__init__.py").read_text().startswith("VALUE = 42")
    # The scripts' BIN is this interpreter, its own packages found (a link would lose a venv's).
    prefix = subprocess.run([str(tmp_path / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert prefix == sys.prefix


def test_a_damaged_part_is_refused_before_anything_is_installed(tmp_path):
    lease, parts = lease_dir(tmp_path)
    carry(lease, 1, parts[0], b"".join(parts))
    carry(lease, 2, parts[1][:-1] + bytes([parts[1][-1] ^ 1]), b"".join(parts))
    done = call(tmp_path, lease)
    assert done.returncode == 1
    said = done.stdout + done.stderr  # the script sends both to its log and to stdout
    assert "does not match" in said and "rerun benchmarks/lease_pack.sh" in said
    assert not (tmp_path / "site" / "lease_probe").exists()
