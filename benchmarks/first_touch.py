"""What one small tensor operation costs the first time it runs after a pause, on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/first_touch.py [--rounds 30] \\
        [--huge-text libtorch_cpu] [--out FILE]

The work around the prefill is slower right after a prefill than when repeated at once
(``head_after_prefill.py``). This script asks what that penalty is made of. After each pause
it runs a fixed sequence of small operations once each, the kind the head and the decoder are
made of (a product, a layer norm, ReLU, an add, attention, softmax, a numpy reduction, then the
first product again), and times each one. Pauses, run in turn:

- ``none``: the sequence right after itself (warm);
- ``compute``: ~100 ms of float32 products over 16 MB (a prefill's arithmetic and traffic);
- ``sleep``: 100 ms asleep.

A penalty that comes once per pause (a clock ramping up) would fall on the first operation;
one that comes once per piece of code and data touched falls on every distinct operation, and
not on the repeated product. ``--huge-text LIB`` first moves the executable mappings of every
loaded library whose path contains LIB onto anonymous memory advised for transparent huge
pages (the code is copied, then mapped back at the same address, read-only and executable):
if the penalty were the guest's instruction-TLB misses under nested paging, 2 MB pages would
shrink it. Linux only; it needs THP in ``madvise`` or ``always`` mode.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from overhead_micro import write_figures

HUGE = 2 << 20
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x02, 0x10, 0x20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    for name in ("madvise", "mprotect"):
        getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def huge_text(pattern: str) -> int:
    """Move the 2 MB-aligned part of each executable mapping whose file path contains
    ``pattern`` onto anonymous huge pages at the same address; the bytes moved.

    Safe only while no other thread runs that code: call it before any worker starts work.
    """
    libc = _libc()
    moved = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or "x" not in fields[1] or pattern not in fields[5]:
            continue
        lo, hi = (int(v, 16) for v in fields[0].split("-"))
        start, end = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE
        if end <= start:
            continue
        size = end - start
        copy = libc.mmap(None, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if copy in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {size} bytes for a copy of {fields[5]}")
        ctypes.memmove(copy, start, size)
        got = libc.mmap(start, size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        if got != start:
            raise OSError(ctypes.get_errno(), f"mmap over {fields[5]}'s code failed")
        libc.madvise(start, size, MADV_HUGEPAGE)
        ctypes.memmove(start, copy, size)
        libc.madvise(start, size, MADV_COLLAPSE)  # where the kernel has it; khugepaged otherwise
        if libc.mprotect(start, size, PROT_READ | PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), f"mprotect of {fields[5]}'s code failed")
        libc.munmap(copy, size)
        moved += size
    return moved


def anon_huge_kb() -> int:
    """This process's anonymous memory on transparent huge pages, in KiB."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def operations() -> list[tuple[str, Callable[[], object]]]:
    """The sequence timed after each pause: a head's and a decoder's kinds of operation."""
    x, w = torch.randn(50, 128), torch.randn(512, 128)
    gain, shift = torch.ones(128), torch.zeros(128)
    q = torch.randn(1, 4, 50, 32)
    m = np.random.default_rng(0).normal(size=(50, 50))
    return [
        ("linear", lambda: F.linear(x, w)),
        ("layer_norm", lambda: F.layer_norm(x, (128,), gain, shift)),
        ("relu", lambda: torch.relu(x)),
        ("add", lambda: x + x),
        ("attention", lambda: F.scaled_dot_product_attention(q, q, q)),
        ("softmax", lambda: torch.softmax(x, -1)),
        ("numpy", lambda: m.dot(m[0]).sum()),
        ("linear again", lambda: F.linear(x, w)),
    ]


def pauses(seconds: float) -> dict[str, Callable[[], None]]:
    big = torch.randn(2048, 2048)

    def compute() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            big[:256] @ big

    return {"none": lambda: None, "compute": compute, "sleep": lambda: time.sleep(seconds)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30, help="pauses of each kind")
    p.add_argument("--pause-s", type=float, default=0.1)
    p.add_argument("--huge-text", metavar="LIB", help="first move the code of the libraries "
                   "whose path contains LIB onto huge pages")
    p.add_argument("--out", help="also write the figures here as JSON, the table beside it")
    args = p.parse_args()
    torch.set_num_threads(1)
    moved = huge_text(args.huge_text) if args.huge_text else 0
    ops = operations()
    lines = [(f"huge text: {args.huge_text or '-'} ({moved >> 20} MB moved; "
              f"AnonHugePages {anon_huge_kb()} kB); {args.rounds} rounds; median us per call"),
             f"{'pause':<8} " + " ".join(f"{name:>12}" for name, _ in ops) + f" {'total':>8}"]
    print("\n".join(lines), flush=True)
    rows = []
    for kind, pause in pauses(args.pause_s).items():
        times: list[list[float]] = [[] for _ in ops]
        for _ in range(args.rounds):
            pause()
            for k, (_, op) in enumerate(ops):
                t0 = time.perf_counter()
                op()
                times[k].append((time.perf_counter() - t0) * 1e6)
        medians = [statistics.median(t) for t in times]
        rows.append({"pause": kind, **{name: v for (name, _), v in zip(ops, medians)}})
        lines.append(f"{kind:<8} " + " ".join(f"{v:>12.1f}" for v in medians)
                     + f" {sum(medians):>8.0f}")
        print(lines[-1], flush=True)
    if args.out:
        write_figures(args.out, {"huge_text": args.huge_text, "moved_bytes": moved,
                                 "rounds": args.rounds, "pause_s": args.pause_s}, rows, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
