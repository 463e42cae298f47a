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
from typing import IO, Optional

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds orchestrator/: the child imports it from here
# Torch reads these at every cache access, so a child already running takes them with its job;
# any other variable a child reads at its start.
CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def spawn(module: str) -> subprocess.Popen[bytes]:
    """`python -m module PARENT_PID`, with pipes for its job and its answer; stderr is the
    parent's, so that torch's and the compilers' output lands in the same run log."""
    path = [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    return subprocess.Popen(
        [sys.executable, "-m", module, str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )


class Spare:
    """One child of `module` started ahead of its job, so that its interpreter's start and its
    imports (torch's: seconds) run beside the parent's own work instead of before the job. A child
    imports first and reads its job after; a spare no job takes exits when the parent does, its
    stdin closing empty."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._child: Optional[subprocess.Popen[bytes]] = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self) -> int:
        """Start the spare unless one is waiting; its pid."""
        with self._lock:
            if self._child is None or self._child.poll() is not None:
                self._child, self._env = spawn(self.module), _start_env()
            return self._child.pid

    def take(self) -> subprocess.Popen[bytes]:
        """The spare, if it still runs and started with the environment a new child would, else a
        new child."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None and child.poll() is None:
            if _start_env() == self._env:
                return child
            child.kill()
            child.wait()
        return spawn(self.module)

    def discard(self) -> None:
        """End the spare, if one waits: its job will not come."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


def gpu_likely(device: str) -> bool:
    """Whether torch will see a GPU for a config's `device`, guessed without importing torch (a
    spare is started before the parent imports it): from the NVIDIA device node."""
    return device != "cpu" and (device == "cuda" or os.path.exists("/dev/nvidiactl"))


def _start_env() -> dict[str, str]:
    """What a child takes from the environment at its start: all but the cache directories (read
    at every access) and Inductor's own private markers for its compile workers (set by a compile
    in this process, meaningless in another)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in CACHE_ENV and not name.startswith("_TORCHINDUCTOR_")
    }


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
