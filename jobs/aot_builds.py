"""The `aot` functions of a process's buckets, each compiled ahead of time in a fresh child process
of its own while the process itself compiles the config's variant.

On torch 2.11 to 2.13 an aot function cannot reuse the config's compile: it is compiled without
Inductor's CUDA graphs, and `triton.cudagraphs` is part of Inductor's cache key
(docs/architecture.md). What it can do is run beside it: Dynamo's trace, AOTAutograd and Inductor's
lowering are single-threaded Python, so a second compile in a second process costs the wall clock
little more than its own start while cores are free, and it shares the Triton kernels both
compiles generate through the on-disk caches.

A process per bucket, because one process's second ahead-of-time compile of a Hugging Face model
fails where a fresh process's succeeds (torch 2.11: "ID_MATCH guard cannot be serialized" for
every bucket after the first); the buckets' builds then also run side by side where the host has
the cores and the GPU the memory for more than one model (`allow`).

Each child builds the model from the spec (the function is bound to whatever module a process
hands it at load, so its own random weights do not matter), compiles its bucket and saves the
function into the staging directory beside the namespace. The parent takes each bucket's file when
it reaches that bucket, moving it into the namespace: the namespace changes only inside the
parent's own steps, so what a failed step quarantines is always its own. Closing kills the
children still running and removes the staging directory.

    python -m orchestrator.jobs.aot_builds PARENT_PID   (staging, spec, bucket, twin pickled on stdin)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from orchestrator.jobs import child_process
from orchestrator.jobs.spec import WarmupSpec

STAGING_PREFIX = ".aot-build-"  # + the parent's pid: a directory whose parent is gone is stale
NAMESPACE = "ns"  # the staging directory's stand-in for the namespace directory
CORES_PER_BUILD = 4
BUILD_OVERHEAD_BYTES = 2 << 30  # a child's CUDA context and compile beside its model's weights


class AheadBuildError(RuntimeError):
    """The child built no function for a bucket: torch's reason, or how the child ended."""


@dataclass(frozen=True)
class Built:
    """One bucket's function, as its child reported it: the file relative to the namespace
    directory, and its compile's seconds; or the reason there is none."""

    bucket: int
    path: Optional[str] = None
    seconds: float = 0.0
    error: Optional[str] = None


class AheadBuilds:
    """The aot functions of `buckets`, each compiled by a child process of its own, started in
    that order with at most `processes` running at once. With `twin`, where a bucket has no
    function its child compiles the `graphed` variant's compile there before it says so: the parent
    builds `graphed` in aot's place (variants.twin_built), and then finds it in the on-disk
    caches."""

    def __init__(
        self, spec: WarmupSpec, buckets: Sequence[int], root: Path, *, twin: bool = False, processes: int = 1
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        remove_stale(root)
        self.buckets = list(buckets)
        self.staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        self._spec, self._twin = spec, twin
        self._waiting = deque(self.buckets)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self._built: dict[int, Built] = {}
        self._processes = max(1, processes)
        self._closed = False
        self._changed = threading.Condition()
        with self._changed:
            self._start_waiting()

    def running(self) -> list[int]:
        """The pids of the children running now."""
        with self._changed:
            return [child.pid for child in self._children.values()]

    def allow(self, processes: int) -> None:
        """Let up to `processes` children run at once from now on (never fewer than before)."""
        with self._changed:
            self._processes = max(self._processes, processes)
            self._start_waiting()

    def _start_waiting(self) -> None:
        """Start the next waiting buckets' children while there is room. Holds the lock."""
        while self._waiting and not self._closed and len(self._children) < self._processes:
            self._start(self._waiting.popleft())

    def _start(self, bucket: int) -> None:
        child = _SPARE.take()
        assert child.stdin is not None
        try:
            where = {name: os.environ.get(name) for name in child_process.CACHE_ENV}
            child.stdin.write(pickle.dumps((self.staging, self._spec, bucket, self._twin, where)))
            child.stdin.close()
        except OSError:  # the child died at once: its exit is read by its reader, as any other
            pass
        self._children[bucket] = child
        reader = threading.Thread(target=self._read, args=(bucket, child), name=f"aot-build-{bucket}", daemon=True)
        self._readers.append(reader)
        reader.start()

    def _read(self, bucket: int, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        built: Optional[Built] = None
        for line in child.stdout:
            try:
                built = Built(**json.loads(line))
            except (ValueError, TypeError):
                continue
        code = child.wait()
        if built is None or built.bucket != bucket:
            why = f"the aot build process exited with code {code} (its output is in the run log)"
            built = Built(bucket=bucket, error=why)
        with self._changed:
            self._built[bucket] = built
            self._children.pop(bucket, None)
            self._start_waiting()
            self._changed.notify_all()

    def take(self, bucket: int, directory: Path) -> tuple[str, float]:
        """Wait for the bucket's function and move it into the namespace `directory`: its path
        relative to it and the seconds its compile took. Raises AheadBuildError with the child's
        reason where it has none."""
        with self._changed:
            self._changed.wait_for(lambda: bucket in self._built or self._closed)
            built = self._built.get(bucket)
        if built is None:
            raise AheadBuildError("the aot builds were stopped before this bucket's was done")
        if built.error is not None or built.path is None:
            raise AheadBuildError(built.error or "the aot build process named no file")
        target = directory / built.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staging / NAMESPACE / built.path, target)
        return built.path, built.seconds

    def wait_idle(self) -> bool:
        """Wait until no child runs or waits to start (their functions stay ready to take);
        whether any was running or waiting."""
        with self._changed:
            busy = bool(self._children or self._waiting)
            self._changed.wait_for(lambda: self._closed or not (self._children or self._waiting))
        return busy

    def close(self) -> None:
        """Stop the children still running and remove what they staged."""
        with self._changed:
            self._closed = True
            self._waiting.clear()
            running = list(self._children.values())
            self._changed.notify_all()
        for child in running:
            if child.poll() is None:
                child.kill()
        for reader in self._readers:
            reader.join(timeout=5)
        shutil.rmtree(self.staging, ignore_errors=True)


_SPARE = child_process.Spare("orchestrator.jobs.aot_builds")


def prestart(spec: WarmupSpec) -> Optional[int]:
    """Start the process the first bucket's build will use, now, where `spec` will likely want
    aot functions here: called before this process imports torch, the child's interpreter start
    and torch's import (seconds) run beside this process's own instead of before the first
    bucket's build. A spare that no build takes exits when this process does: its stdin closes
    empty. Whether torch sees a GPU is guessed from the NVIDIA device node, without importing it.
    Returns the spare's pid, if there is one."""
    from orchestrator.jobs.variants import serving_candidates

    candidates, _ = serving_candidates(spec, "cuda" if child_process.gpu_likely(spec.device) else "cpu")
    return _SPARE.start() if "aot" in candidates else None


def processes_for(model: Any, device: Any, buckets: int) -> int:
    """How many builds may run at once beside this process's own compile. Each keeps a core busy
    with Python and bursts onto more for its Triton or C++ kernel builds: one per four cores leaves
    the parent's compile and those bursts room. On a GPU each holds a copy of the model's weights,
    its CUDA context and its compile's working memory: all of them together within half of what is
    free once the parent's model is built."""
    import torch

    allowed = min(buckets, max(1, len(os.sched_getaffinity(0)) // CORES_PER_BUILD))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        allowed = min(allowed, max(1, (free // 2) // (weights + BUILD_OVERHEAD_BYTES)))
    return allowed


def remove_stale(root: Path) -> None:
    """Staging directories whose process is gone (killed before it could close them)."""
    for staged in root.glob(f"{STAGING_PREFIX}*"):
        pid = staged.name[len(STAGING_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(staged, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(parent: int) -> int:
    results = child_process.become_child(parent)
    # imported before the job is read: a spare (prestart) has torch loaded by the time it comes
    from orchestrator.jobs import aot
    from orchestrator.jobs.model import build_model, make_inputs, resolve_device

    job = sys.stdin.buffer.read()
    if not job:  # a spare no build took
        return 0
    staging, spec, bucket, with_twin, where = pickle.loads(job)
    for name, value in where.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    device = resolve_device(spec.device)
    model = build_model(spec, device)
    options = spec.compile
    compile_options = aot.compile_kwargs(options.mode, options.options, options.backend, device.type)
    started = time.perf_counter()
    args, kwargs = make_inputs(spec, bucket, device)
    try:
        rel = aot.build(model, args, kwargs, staging / NAMESPACE, bucket, compile_options)
        line = {"bucket": bucket, "path": rel, "seconds": time.perf_counter() - started}
    except aot.Unexportable as exc:
        line = {"bucket": bucket, "error": str(exc)}
        if with_twin:
            _fill_caches(_twin(spec, model), args, kwargs)
    results.write(json.dumps(line) + "\n")
    results.flush()
    return 0


def _twin(spec: WarmupSpec, model: Any) -> Any:
    """The `graphed` variant's compile, as the parent makes it (engine.Session)."""
    import torch

    from orchestrator.jobs import torch_internals as ti

    ti.sizes_apart_in_dynamic_graphs()  # as the parent traces, so that its keys find what this compiles
    return torch.compile(model, **ti.variant_compile_kwargs(spec.compile, "graphed"))


def _fill_caches(twin: Any, args: Any, kwargs: Any) -> None:
    """Compile the twin at this bucket, so that the parent's own compile of it, once it knows it
    needs one, loads from Inductor's on-disk caches instead of compiling. Only a head start: a
    failure here is the parent's to meet and report."""
    import torch

    try:
        with torch.no_grad():
            twin(*args, **kwargs)
    except Exception:  # noqa: S110  (the parent compiles it again and reports what fails)
        pass


if __name__ == "__main__":
    child_process.end_child(main(int(sys.argv[1])))
