"""Launching gloo processes on 127.0.0.1 from tests: a free port and a one-node ``torchrun`` command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# A C++ abort in gloo's threads while a process shuts down (seen in CI now and then, twice in a row once on a loaded
# 2-core host): a launch that fails with it is run again, up to twice more; a real bug fails every time.
TEARDOWN_ABORT = "terminate called without an active exception"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(*args: str, nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``args`` (a script and its arguments, or ``-m module ...``) in
    ``nproc`` processes on one node; the environment carries this interpreter's import path."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", *args]  # fmt: skip
    return cmd, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


def run_torchrun(*args: str, nproc: int = 2, timeout: float = 300, cwd: object = None) -> subprocess.CompletedProcess:
    """Run :func:`torchrun` of ``args`` (output captured as text); again, twice at most, if it failed at teardown."""

    def once() -> subprocess.CompletedProcess:
        cmd, env = torchrun(*args, nproc=nproc)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)

    done = once()
    for _ in range(2):
        if done.returncode == 0 or TEARDOWN_ABORT not in done.stdout + done.stderr:
            break
        done = once()
    return done
