"""The `aot` functions of a process's buckets, compiled ahead of time in a child process while the
process itself compiles the config's variant.

On torch 2.11 to 2.13 an aot function cannot reuse the config's compile: it is compiled without
Inductor's CUDA graphs, and `triton.cudagraphs` is part of Inductor's cache key
(docs/architecture.md). What it can do is run beside it: Dynamo's trace, AOTAutograd and Inductor's
lowering are single-threaded Python, so a second compile in a second process costs the wall clock
little more than its own start while cores are free, and it shares the Triton kernels both
compiles generate through the on-disk caches.

The child builds the model from the spec (the function is bound to whatever module a process hands
it at load, so its own random weights do not matter), compiles each bucket in order and saves its
function into a staging directory of its own beside the namespace. The parent takes each bucket's
file when it reaches that bucket, moving it into the namespace: the namespace changes only inside
the parent's own steps, so what a failed step quarantines is always its own. Closing kills the
child if it still runs and removes the staging directory.

    python -m orchestrator.jobs.aot_builds STAGING PARENT_PID   (spec and buckets pickled on stdin)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from orchestrator.jobs.spec import WarmupSpec

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds orchestrator/: the child imports it from here
STAGING_PREFIX = ".aot-build-"  # + the parent's pid: a directory whose parent is gone is stale
NAMESPACE = "ns"  # the staging directory's stand-in for the namespace directory


class AheadBuildError(RuntimeError):
    """The child built no function for a bucket: torch's reason, or how the child ended."""


@dataclass(frozen=True)
class Built:
    """One bucket's function, as the child reported it: the file relative to the namespace
    directory, and its compile's seconds; or the reason there is none."""

    bucket: int
    path: Optional[str] = None
    seconds: float = 0.0
    error: Optional[str] = None


class AheadBuilds:
    """A child process compiling the aot functions of `buckets`, in that order. With `twin`, where
    a bucket has no function the child compiles the `graphed` variant's compile there before it
    says so: the parent builds `graphed` in aot's place (variants.twin_built), and then finds it in
    the on-disk caches."""

    def __init__(self, spec: WarmupSpec, buckets: Sequence[int], root: Path, *, twin: bool = False) -> None:
        root.mkdir(parents=True, exist_ok=True)
        remove_stale(root)
        self.buckets = list(buckets)
        self.staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        self._built: dict[int, Built] = {}
        self._ended: Optional[str] = None  # why no more buckets will come
        self._changed = threading.Condition()
        path = [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
        # stderr is the parent's: torch's and the compilers' output lands in the same run log
        self._child = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.jobs.aot_builds", str(self.staging), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self._child.stdin is not None
        try:
            self._child.stdin.write(pickle.dumps((spec, self.buckets, twin)))
            self._child.stdin.close()
        except OSError:  # the child died at once: its exit is read below, as any other
            pass
        self._reader = threading.Thread(target=self._read, name="aot-builds", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._child.stdout is not None
        for line in self._child.stdout:
            try:
                built = Built(**json.loads(line))
            except (ValueError, TypeError):
                continue
            with self._changed:
                self._built[built.bucket] = built
                self._changed.notify_all()
        code = self._child.wait()
        with self._changed:
            self._ended = f"the aot build process exited with code {code} (its output is in the run log)"
            self._changed.notify_all()

    def take(self, bucket: int, directory: Path) -> tuple[str, float]:
        """Wait for the bucket's function and move it into the namespace `directory`: its path
        relative to it and the seconds its compile took. Raises AheadBuildError with the child's
        reason where it has none."""
        with self._changed:
            self._changed.wait_for(lambda: bucket in self._built or self._ended is not None)
            built = self._built.get(bucket)
        if built is None:
            raise AheadBuildError(self._ended or "the aot build process did not build this bucket")
        if built.error is not None or built.path is None:
            raise AheadBuildError(built.error or "the aot build process named no file")
        target = directory / built.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staging / NAMESPACE / built.path, target)
        return built.path, built.seconds

    def close(self) -> None:
        """Stop the child if it still runs and remove what it staged."""
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        self._reader.join(timeout=5)
        shutil.rmtree(self.staging, ignore_errors=True)


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


def main(staging: Path, parent: int) -> int:
    # the parent stops this process (Ctrl-C included); one killed outright takes it along
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    # results go to the pipe the parent reads; anything torch or a compiler prints goes to stderr
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    spec, buckets, with_twin = pickle.load(sys.stdin.buffer)

    from orchestrator.jobs import aot
    from orchestrator.jobs.model import build_model, make_inputs, resolve_device

    device = resolve_device(spec.device)
    model = build_model(spec, device)
    options = spec.compile
    compile_options = aot.compile_kwargs(options.mode, options.options, options.backend, device.type)
    twin = _twin(spec, model) if with_twin else None
    for bucket in buckets:
        started = time.perf_counter()
        args, kwargs = make_inputs(spec, bucket, device)
        try:
            rel = aot.build(model, args, kwargs, staging / NAMESPACE, bucket, compile_options)
            line = {"bucket": bucket, "path": rel, "seconds": time.perf_counter() - started}
        except aot.Unexportable as exc:
            line = {"bucket": bucket, "error": str(exc)}
            if twin is not None:
                _fill_caches(twin, args, kwargs)
        results.write(json.dumps(line) + "\n")
    return 0


def _twin(spec: WarmupSpec, model: Any) -> Any:
    """The `graphed` variant's compile, as the parent makes it (engine.Session)."""
    import torch

    from orchestrator.jobs import torch_internals as ti
    from orchestrator.jobs.variants import graphed_compile

    options = spec.compile
    mode, graph_options = graphed_compile(options.mode, options.options)
    ti.allow_recompiles(len(spec.buckets))
    return torch.compile(
        model, **ti.compile_kwargs(mode, options.dynamic, options.fullgraph, options.backend, graph_options)
    )


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


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
