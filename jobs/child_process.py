"""The plumbing of the warmup's helper processes (jobs/aot_builds.py, jobs/fresh_benchmark.py):
each a fresh interpreter running one of this package's modules, its job pickled on stdin, its
answer written as lines to stdout, anything torch prints going to the parent's stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds orchestrator/: the child imports it from here


def spawn(module: str) -> subprocess.Popen[bytes]:
    """`python -m module PARENT_PID`, with pipes for its job and its answer; stderr is the
    parent's, so that torch's and the compilers' output lands in the same run log."""
    path = [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    return subprocess.Popen(
        [sys.executable, "-m", module, str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )


def become_child(parent: int) -> IO[str]:
    """In the child, first: the parent stops it (Ctrl-C included), and one killed outright takes it
    along; the answer's pipe is returned, and whatever else writes to stdout goes to stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return answer


def end_child(code: int) -> None:
    """The answer is written and every file it names is on disk: the process ends here. A normal
    exit would first collect every object the compile or the loads made and shut Inductor's
    worker pool down (seconds), and the parent waits for this exit."""
    sys.stderr.flush()
    os._exit(code)


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)
