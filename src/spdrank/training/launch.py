"""Run an ``spdrank`` command as N data-parallel processes on this machine.

This is what ``torchrun --standalone --nproc-per-node N -m spdrank ...`` does (and what
``accelerate launch`` does for several GPUs): torch.distributed's launcher starts the
processes with their rank and a local rendezvous in the environment, and accelerate reads
them there. On CPU the processes talk over gloo; on GPUs each takes one device and NCCL.
If one process fails, the launcher stops the others.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

#: Set in every launched process; a launched command must not launch again.
LAUNCHED_ENV = "LOCAL_RANK"


def launched() -> bool:
    """Whether this process is one of a launched group (by us, torchrun or accelerate)."""
    return LAUNCHED_ENV in os.environ


def launch(argv: list[str], processes: int) -> int:
    """Run ``spdrank *argv`` in ``processes`` processes: 0, or the exit code of the first to fail."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if processes < 2:
        raise ValueError(f"launching needs at least 2 processes, got {processes}")
    # The cores are shared: without this, each process would start one thread per core.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    # The elastic agent's progress messages say nothing a user of spdrank needs.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={processes}", "--max-restarts=0", "--module",
         "spdrank", *argv]
    )
    try:
        run(args)
    except ChildFailedError as exc:
        first = min(exc.failures.values(), key=lambda failure: failure.timestamp)
        # A negative exit code is a signal; report it the way a shell does.
        return first.exitcode if first.exitcode > 0 else 128 - first.exitcode
    return 0


def exit_launched(code: int) -> NoReturn:
    """End a launched process with ``code``, without finalizing the interpreter.

    A gloo process group runs each collective on a worker thread, which drops its reference
    to the collective's tensors a moment after the collective completes. Dropping a tensor
    made in Python takes the GIL; a thread that asks for the GIL once the interpreter has
    begun to finalize is ended with ``pthread_exit``, and unwinding gloo's C++ frames that
    way aborts the whole process (SIGABRT, "terminate called without an active exception").
    A process that leaves right after its last collective (a non-main process, which writes
    nothing) can lose that race, and the launcher then reports the run as failed. By the time
    ``main`` returns every file is written and closed, so the process flushes what it printed
    and logged and leaves with ``os._exit``, which skips finalization and the race with it.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)
