"""benchmarks/offline_bundle.sh on a GPU host without network: the large wheels, a tar that
comes in pieces over several transfers, are joined only when every piece has come, checked
against their sha256 before they are installed, and the scripts' BIN runs the host's own Python
(its packages included)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from tests.helpers import ROOT

WHEEL = "bundle_probe-1.0-py3-none-any.whl"
TAR = "large-wheels.tar"


def probe_wheel(path: Path) -> bytes:
    """A minimal pure-Python wheel, its bytes (stored uncompressed, so the parts differ)."""
    files = {
        "bundle_probe/__init__.py": "VALUE = 42\n" + "# padding\n" * 200,
        "bundle_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: bundle-probe\nVersion: 1.0\n",
        "bundle_probe-1.0.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\n"
                                            "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = "".join(f"{name},,\n" for name in files) + "bundle_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, "bundle_probe-1.0.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return path.read_bytes()


def bundle_dir(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """An empty bundle folder on the host (nothing transferred yet), and a tar of the probe
    wheel in two pieces."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    probe_wheel(tmp_path / WHEEL)
    with tarfile.open(tmp_path / TAR, "w") as tar:
        tar.add(tmp_path / WHEEL, arcname=WHEEL)
    data = (tmp_path / TAR).read_bytes()
    half = len(data) // 2
    return bundle, [data[:half], data[half:]]


def transfer(bundle: Path, number: int, data: bytes, whole: bytes) -> None:
    """Piece ``number`` as a transfer brings it: its bytes, with the count of pieces and the
    sha256 of the ``whole`` tar beside it."""
    folder = bundle / f"large-{number}"
    folder.mkdir(exist_ok=True)
    (folder / "part").write_bytes(data)
    (folder / "parts").write_text("2\n")
    (folder / "sha256").write_text(f"{hashlib.sha256(whole).hexdigest()}  {TAR}\n")


def install(tmp_path: Path, bundle: Path) -> subprocess.CompletedProcess:
    """``offline_bundle.sh install`` with no preflight: only the pieces."""
    env = {**os.environ, "SITE": str(tmp_path / "site"), "PY": sys.executable,
           "RESULTS": str(tmp_path / "out"), "BUNDLE_BIN": str(tmp_path / "bin"), "PREFLIGHT": "0"}
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "offline_bundle.sh"), "install", str(bundle)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_wheel_in_pieces_is_joined_when_the_last_piece_comes(tmp_path):
    # Only the pieces' folders travel: the first install knows from its piece alone how many
    # to wait for.
    bundle, parts = bundle_dir(tmp_path)
    transfer(bundle, 1, parts[0], b"".join(parts))
    first = install(tmp_path, bundle)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 of the large wheels' 2 pieces here" in first.stdout
    assert not (tmp_path / "site" / "bundle_probe").exists()
    assert (tmp_path / "out" / "bundle.log").read_text().count("pieces here") == 1
    transfer(bundle, 2, parts[1], b"".join(parts))
    second = install(tmp_path, bundle)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (tmp_path / "site" / "bundle_probe" / "__init__.py").read_text().startswith("VALUE = 42")
    # The scripts' BIN is this interpreter, its own packages found (a link would lose a venv's).
    prefix = subprocess.run([str(tmp_path / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert prefix == sys.prefix


def test_a_damaged_piece_is_refused_before_anything_is_installed(tmp_path):
    bundle, parts = bundle_dir(tmp_path)
    transfer(bundle, 1, parts[0], b"".join(parts))
    transfer(bundle, 2, parts[1][:-1] + bytes([parts[1][-1] ^ 1]), b"".join(parts))
    done = install(tmp_path, bundle)
    assert done.returncode == 1
    said = done.stdout + done.stderr  # the script sends both to its log and to stdout
    assert "do not match" in said and "rerun benchmarks/offline_bundle.sh pack" in said
    assert not (tmp_path / "site" / "bundle_probe").exists()
