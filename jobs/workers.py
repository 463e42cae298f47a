"""What runs in a fleet's worker processes: a compile unit and a rank. Plain classes; the Ray
driver (orchestrator.fleet.driver) makes each one an actor, a process of its own, so this module
knows nothing of Ray. Where a worker runs (its node's address, its GPUs) comes from the `locate`
function the driver hands it, asked inside the worker's process.

Workers keep their cache under `<cache root>/node-<ip>`: nodes of a test cluster share one
filesystem, and without the node key they would never need to pull.

A store that cannot be read or trusted ends the whole job, as it ends a warmup in one process:
a worker raises it rather than failing its buckets, and the driver stops every worker and runs
`tidy_node` on each node for what the killed ones left.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from orchestrator.cache import sync
from orchestrator.cache.local import LocalCache
from orchestrator.cache.manifest import IntegrityError, KeyConfigError
from orchestrator.cache.namespace import is_namespace, model_prefix
from orchestrator.cache.store import StoreError
from orchestrator.jobs import aot_builds
from orchestrator.jobs.records import BucketResult, ProcessRun, Remote, WorkerAnswer
from orchestrator.jobs.spec import WarmupSpec

if TYPE_CHECKING:  # imported in the worker, after its environment is set: torch reads it once
    from orchestrator.jobs.engine import Session, WarmupRun

# The driver's OMP_NUM_THREADS travels under this name: Ray sets every worker's own
# OMP_NUM_THREADS, and a worker puts this one back before importing torch.
TORCH_THREADS_ENV = "ORCHESTRATE_TORCH_THREADS"

# What ends the job wherever it happens (the exit codes 3, 4 and 2 of an in-process warmup): the
# store is unreachable or refusing, its data is untrusted, or a trusted key is configured wrong.
ENDS_THE_JOB = (StoreError, IntegrityError, KeyConfigError)


@dataclass(frozen=True)
class Host:
    """Where a worker runs, as the cluster names it."""

    ip: str
    gpu_ids: list[str]  # the GPUs the cluster gave this process (it sees them as cuda:0...)


@dataclass(frozen=True)
class FleetJob:
    """What every worker of one fleet warmup shares."""

    spec: WarmupSpec
    cache_root: Path  # the same path on every node; each node keeps its own directory under it
    remote: Remote
    locate: Callable[[], Host]  # called in the worker's process
    # `warmup --profile DIR`: the same path on every node; each rank writes its traces on its own
    profile_dir: Optional[Path] = None
    # names this job's scratch directories, so that tidying up after it touches no other job's
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def node_cache_dir(self) -> Path:
        return self.cache_root / f"node-{self.locate().ip}"

    def compile_dir(self, bucket: int) -> Path:
        """A compile unit's private directory: `.compile-<job>-b<bucket>-<8 hex digits>`."""
        return self.node_cache_dir() / f".compile-{self.job_id}-b{bucket}-{uuid.uuid4().hex[:8]}"

    def compile_dirs(self, bucket: Optional[int] = None) -> list[Path]:
        """This job's compile directories on this node (of one bucket, or all)."""
        pattern = f".compile-{self.job_id}-b{'*' if bucket is None else bucket}-*"
        node = self.node_cache_dir()
        return sorted(node.glob(pattern)) if node.is_dir() else []


def tidy_node(job: FleetJob) -> None:
    """Remove what this job's killed workers left on this node: their compile directories, the
    staging of a pull they did not finish, an empty namespace directory of the model, and the node
    directory itself if that leaves it empty. Run by the driver on every node once a job ends
    early; what holds a file of the cache stays."""
    node = job.node_cache_dir()
    for scratch in job.compile_dirs():
        shutil.rmtree(scratch, ignore_errors=True)
    if not node.is_dir():
        return
    prefix = model_prefix(job.spec.label)
    for path in sorted(node.iterdir()):
        if path.is_dir() and is_namespace(path.name) and path.name.startswith(prefix):
            sync.recover(path)
            LocalCache(node, path.name).remove_if_empty()
    with contextlib.suppress(OSError):  # another job's files, or this job's cache: it stays
        node.rmdir()


def threads_as_a_plain_process() -> None:
    """Ray starts every worker with OMP_NUM_THREADS=max(1, its num_cpus) unless told otherwise;
    torch sizes its intra-op pool from it, and Inductor specialises CPU kernels to that size and
    puts it in their cache key. Artifacts compiled with Ray's count would then miss in a plain
    torch process on the same node (a serving replica), which runs with the node's default. So a
    worker runs with torch's default for the node, as that process does, or with
    ORCHESTRATE_TORCH_THREADS (the driver's OMP_NUM_THREADS) when set. Called before the worker
    imports torch."""
    threads = os.environ.get(TORCH_THREADS_ENV)
    if threads:
        os.environ["OMP_NUM_THREADS"] = threads
    else:
        os.environ.pop("OMP_NUM_THREADS", None)


class CompileWorker:
    """One compile unit in a process of its own, killed by the driver as soon as it has answered:
    an orderly exit (Inductor's worker pool, CUDA graphs, the CUDA context) would spend seconds of
    CPU beside the ranks for nothing."""

    def __init__(self, job: FleetJob) -> None:
        self.job = job
        self._up = time.time()  # the cluster's part of this process's start is over; torch is not imported yet
        self._session: Optional[Session] = None
        threads_as_a_plain_process()

    def compile(self, bucket: int, compile_threads: int, fresh: bool) -> WorkerAnswer:
        """Compile one bucket in a private directory and publish it. Private, because a publish
        snapshots the directory: in a shared one it could catch another compiler's half-written
        file (gcc writes its .so in place) and make it the namespace's permanent copy."""
        # read when torch is first imported, just below: this process is fresh
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads))
        spec = self.job.spec.replaced(buckets=[bucket])
        aot_builds.prestart(spec)  # the bucket's aot builder imports torch beside this process
        from orchestrator.jobs.engine import Session

        for earlier in self.job.compile_dirs(bucket):  # an attempt of this unit killed before its clean-up
            shutil.rmtree(earlier, ignore_errors=True)
        root = self.job.compile_dir(bucket)
        try:
            # kept on the worker, so that freeing the compiled code and graphs is left to the kill
            self._session = Session(
                spec,
                root,
                fresh=fresh,
                remote=self.job.remote,
                earlier_events=(("worker up", self._up),),
                build_ahead=[bucket],
            )
            self._session.warm(bucket, benchmark=False)
            self._session.close()
            self._session.publish()
            return answer(self._session.run(), self.job.locate())
        finally:
            if self._session is not None:
                self._session.close()
            shutil.rmtree(root, ignore_errors=True)


class RankWorker:
    """One rank for the whole job, in a process of its own: it sets up while the compile wave
    runs, loads each bucket when told it is published, and benchmarks at the end. For a grid it
    is the rank of every slice (`jobs`, one per slice): a session per slice, all sharing one model.
    Every method may run in a restarted process (the worker died and the cluster restarted it),
    so each one first makes sure what it builds on is there."""

    def __init__(self, jobs: list[FleetJob], rank: int, spare_cpu: bool, publish_plans: bool = False) -> None:
        # publish_plans: this rank's measurements choose its GPU class's serving variants (one
        # rank per class publishes them; the others' plans stay on their nodes)
        self.jobs, self.rank, self.spare_cpu, self.publish_plans = jobs, rank, spare_cpu, publish_plans
        self._up = time.time()  # the cluster's part of this process's start is over; torch is not imported yet
        # Read when torch is first imported (later, in this fresh process). A rank only loads:
        # Inductor's default would start a pool of a worker per CPU, each importing torch, at the
        # first load, for nothing, and beside the benchmarks.
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        threads_as_a_plain_process()
        self._sessions: dict[int, Session] = {}
        self._fatal: Optional[Exception] = None  # set-up or store failure: every bucket of the rank fails

    def prepare(self) -> None:
        """Everything that needs no artifact: imports, CUDA, the model, the eager references and,
        with a CPU to spare, each bucket's Dynamo trace, the compiler's own start and cuDNN's set-up
        of the convolutions in the compiled graph's layout, so that a load after a publish is only
        a cache hit. Without one (a 2-core CI machine), this work
        would slow down the compile units it shares the CPUs with, so the loads pay for it instead
        (docs/performance.md, "the 2-core CPU machine")."""

        def set_up(session: Session, first: bool) -> None:
            from orchestrator.jobs import torch_internals as ti

            for bucket in session.spec.buckets:
                session.reference(bucket)
            session.event("references done")
            if self.spare_cpu:
                for bucket in session.spec.buckets:
                    session.trace(bucket)
                if first:  # the compiler's one-off start is the process's, not a slice's
                    ti.prime_compiler(session.device)
                    session.event("compiler primed")
                session.warm_layouts(session.spec.buckets)

        for part in range(len(self.jobs)):
            self._step(part, functools.partial(set_up, first=part == 0))

    def load(self, bucket: int, part: int = 0) -> Optional[BucketResult]:
        """Pull what is published and load one bucket of slice `part` (a cache hit); its record,
        or None when the rank has failed (reported by `finish`)."""

        def pull_and_load(session: Session) -> BucketResult:
            session.pull()
            return session.warm(bucket, benchmark=False)

        return self._step(part, pull_and_load)

    def finish(self, buckets: list[list[int]]) -> list[WorkerAnswer]:
        """Benchmark each slice's buckets, `buckets[part]` (loading any this process has not:
        after a restart), one slice after another; an answer per slice."""
        if self._fatal is not None:
            raise self._fatal
        answers = []
        for part, of_part in enumerate(buckets):
            session = self._ready(part)
            if any(not session.loaded(b) for b in of_part):
                session.pull()
            for bucket in of_part:  # compiling has stopped: loading what is missing (cache hits) may interleave
                session.warm(bucket)
            if self.publish_plans:
                session.publish_plans()
            answers.append(answer(session.run(), self.jobs[part].locate(), of_part))
        return answers

    def _ready(self, part: int) -> Session:
        from orchestrator.jobs.engine import Session

        if part not in self._sessions:
            job = self.jobs[part]
            shared = next(iter(self._sessions.values()), None)
            # Ranks of one node share its cache directory and only read the store: what they
            # load was compiled and published by the compile wave.
            self._sessions[part] = Session(
                job.spec,
                job.node_cache_dir(),
                rank=self.rank,
                remote=job.remote,
                trace_ahead=self.spare_cpu,
                earlier_events=(("worker up", self._up),),
                profile_dir=job.profile_dir,
                profile_prefix=f"{job.spec.label}-r{self.rank}",
                model=shared.model if shared is not None else None,
            )
        return self._sessions[part]

    def _step(self, part: int, work: Callable[[Session], Any]) -> Any:
        if self._fatal is not None:
            return None
        try:
            return work(self._ready(part))
        except ENDS_THE_JOB:
            raise  # the driver stops the job at once
        except Exception as exc:  # reported by `finish`, where the driver gathers the rank's outcome
            self._fatal = exc
            return None


def answer(run: WarmupRun, host: Host, buckets: Optional[list[int]] = None) -> WorkerAnswer:
    """A worker's answer to the driver: torch-free records, so that the driver never imports torch."""
    now = time.time()
    return WorkerAnswer(
        run=ProcessRun(
            namespace=run.namespace,
            platform=run.platform,
            device=run.device,
            node=host.ip,
            pull=run.pull,
            publish=run.publish,
            publish_error=run.publish_error,
            cache_bytes=run.cache_bytes,
            cache_files=run.cache_files,
            setup_seconds=run.setup_seconds,
            process_age_at_start=run.process_age_at_start,
            process_started_at=now - run.wall_seconds - (run.process_age_at_start or 0.0),
            ended_at=now,
            events=run.events,
            gpu_ids=host.gpu_ids,
        ),
        results=[replace(r, node=host.ip) for r in run.results if buckets is None or r.bucket in buckets],
    )
