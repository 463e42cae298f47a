"""The worker engine: compile, warm, check and benchmark every bucket of one model in one process.

With a store, the namespace is pulled before anything compiles and what compiled correctly is
published afterwards (a bucket that fails leaves no files behind).

Per bucket, in this order, each timed on its own:
  1. eager reference call (also pays cuBLAS/cuDNN initialisation, so compile timing does not)
     (a process that waits for another to compile may trace the bucket now, and set up its
     convolutions in the layout the compiled graph will use: Session.trace, Session.warm_layouts)
  2. first compiled call: Dynamo trace + Inductor compile or cache load  -> compile_seconds
  3. two more calls: CUDA-graph warm-up run and recording under reduce-overhead -> graph_record_seconds
  4. compiled outputs (first call and a replay) against eager's, through orchestrator.jobs.gate
  5. the `aot` function (found in the namespace, or compiled ahead of time: by a child process
     while this one compiles, where the process asked for them: Session's build_ahead), then
     on CUDA the variants captured whole in a CUDA graph of our own (`eager-graphed`; `graphed`,
     the config's compile with CUDA graphs off, only where aot is not built: it is aot's twin),
     each through the same gate; one that cannot be built or captured is recorded as unavailable
     with its reason, the bucket does not fail
  6. once no bucket compiles or builds any more: latency of eager, compiled and every built
     variant, each timed in its steady state (orchestrator.jobs.timing: blocks of consecutive
     calls, interleaved, rounds the host ran slowed in retaken) -> eager_ms, compiled_ms, speedup,
     variants; the fastest correct variant is chosen to serve (orchestrator.jobs.variants) and
     written into the namespace as the bucket's serving plan
"""

from __future__ import annotations

import copy
import functools
import resource
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from orchestrator.cache import sync
from orchestrator.cache.local import LocalCache
from orchestrator.cache.manifest import IntegrityError, SigningKey, TrustedKeys
from orchestrator.cache.namespace import Platform, namespace
from orchestrator.cache.store import Store, StoreError, open_store
from orchestrator.jobs import aot, copies, fresh_benchmark, grid
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.aot_builds import AheadBuildError, AheadBuilds, processes_for
from orchestrator.jobs.collector import exit_without_collecting
from orchestrator.jobs.errors import OutputMismatch, SetupError, brief
from orchestrator.jobs.gate import Gate, Outputs, snapshot
from orchestrator.jobs.graphs import CaptureError, GraphedCall
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.records import (  # noqa: F401  (Remote: part of this module's interface)
    BucketProfile,
    BucketResult,
    Remote,
    VariantMeasure,
)
from orchestrator.jobs.replica import BucketedModel
from orchestrator.jobs.spec import GRAPHED_VARIANTS, VARIANTS, WarmupSpec
from orchestrator.jobs.stats import PairedBootstrap, is_noisy, paired_scale
from orchestrator.jobs.timing import (
    HOST,
    Clock,
    HostMeter,
    Timed,
    median,
    on_fastest_core,
    p90,
    process_age_seconds,
)
from orchestrator.jobs.variants import (
    MAX_SAMPLES,
    graphed_compile,
    read_plans,
    replays_into_buffers,
    serving_candidates,
    settle,
    spread,
    twin_built,
    write_plan,
)

BACK_TO_BACK_CALLS = 10  # calls per throughput sample


class Progress(Protocol):
    def step(self, name: str) -> None: ...

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None: ...

    def advance(self, bucket: int) -> None: ...

    def finish(self, result: BucketResult) -> None: ...


class NoProgress:
    def step(self, name: str) -> None:
        pass

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None:
        pass

    def advance(self, bucket: int) -> None:
        pass

    def finish(self, result: BucketResult) -> None:
        pass


@dataclass
class WarmupRun:
    platform: Platform
    namespace: str
    device: str
    cache_dir: str
    results: list[BucketResult]
    wall_seconds: float
    setup_seconds: float  # device, model build and torch.compile wrapper, before the first bucket
    process_age_at_start: Optional[float]  # interpreter start and imports before the job began
    cache_bytes: int
    cache_files: int
    remote: Optional[str] = None
    pull: Optional[sync.Transfer] = None  # None: no remote, or the namespace was not published yet
    publish: Optional[sync.Transfer] = None
    publish_error: Optional[str] = None  # the job's results stand; the store did not take them
    # (what, wall-clock time) of the process's milestones: set-up steps, each bucket's load or
    # compile and benchmark, pulls, the publish; a fleet's timeline shows where a process's time went
    events: list[tuple[str, float]] = field(default_factory=list)


def run_warmup(
    spec: WarmupSpec,
    cache_root: Path,
    *,
    fresh: bool = False,
    rank: int = 0,
    remote: Optional[Remote] = None,
    benchmark: bool = True,
    publish: bool = True,
    progress: Progress = NoProgress(),
    profile_dir: Optional[Path] = None,
) -> WarmupRun:
    """Pull, compile, warm and benchmark every bucket of `spec`, then publish what compiled.

    Child processes compile the buckets' aot functions meanwhile (Session's build_ahead).

    Raises SetupError when nothing can run, StoreError/IntegrityError when the store cannot be
    read or is not trusted (before anything touched the local cache)."""
    ti.forget_compiled_frames()  # an earlier run in this process (a grid's slice) compiled for its own namespace
    exit_without_collecting()
    session = Session(
        spec,
        cache_root,
        fresh=fresh,
        rank=rank,
        remote=remote,
        progress=progress,
        profile_dir=profile_dir,
        build_ahead=spec.buckets,
    )
    try:
        # every bucket compiled and its aot function taken before the first benchmark: a build
        # beside a benchmark slows what it times (host-bound calls most), and a replica runs alone
        for bucket in spec.buckets:
            session.warm(bucket, benchmark=False)
        session.close()
        if benchmark:
            session.benchmark_all(spec.buckets)
    finally:
        session.close()
    if publish:
        session.publish()
    return session.run()


class Session:
    """One process's work on one model: set up once, then warm buckets in any order and at any
    pace. `run_warmup` goes straight through; a Ray rank takes each bucket as soon as the compile
    wave has published it and benchmarks them all once compiling has stopped."""

    def __init__(
        self,
        spec: WarmupSpec,
        cache_root: Path,
        *,
        fresh: bool = False,
        rank: int = 0,
        remote: Optional[Remote] = None,
        progress: Progress = NoProgress(),
        trace_ahead: bool = False,
        earlier_events: tuple[tuple[str, float], ...] = (),
        profile_dir: Optional[Path] = None,
        profile_prefix: Optional[str] = None,
        build_ahead: Sequence[int] = (),
        model: Optional[torch.nn.Module] = None,
        loads_only: bool = False,
    ) -> None:
        """build_ahead: buckets whose aot functions child processes compile beside this one's
        compiles (jobs/aot_builds.py), started before the model is built here: for a process that
        compiles (warmup, a compile unit), not one that loads what the compile wave published.
        model: one already built from the same config (a Ray rank's sessions of a grid's slices
        share one), else built here. loads_only: a process that benchmarks what another compiled
        (jobs/fresh_benchmark.py) builds no aot function the namespace lacks."""
        self.started, self.process_age = time.perf_counter(), process_age_seconds()
        self.loads_only = loads_only
        # `warmup --profile DIR`: each benchmarked bucket's variants profiled into DIR, trace
        # files named `<profile_prefix>-b<bucket>-<variant>.json.gz` (jobs/profiling.py)
        self.profile_dir = profile_dir
        self.profile_prefix = profile_prefix or spec.label
        self.spec, self.rank, self.remote, self.progress = spec, rank, remote, progress
        # earlier_events: milestones of this process before it imported torch (a Ray worker's start)
        self.events: list[tuple[str, float]] = [*earlier_events, ("imported", time.time())]
        self.device = resolve_device(spec.device)
        self.platform = ti.current_platform(self.device)
        self.event("device ready")
        self.local = LocalCache(cache_root, namespace(spec.label, self.platform, spec.identity_hash()))
        self.ahead: Optional[AheadBuilds] = None
        try:
            if fresh:
                self.local.wipe()
            ti.point_caches_at(self.local.prepare())
        except OSError as exc:
            raise SetupError(f"cache directory {cache_root}: {brief(exc)}; pass a writable --cache-dir") from None
        try:
            self._set_up(spec, remote, fresh, trace_ahead, build_ahead, model)
        except BaseException:
            self.close()
            self.local.remove_if_empty()  # a model that does not build leaves no empty namespace behind
            raise

    def _set_up(
        self,
        spec: WarmupSpec,
        remote: Optional[Remote],
        fresh: bool,
        trace_ahead: bool,
        build_ahead: Sequence[int],
        model: Optional[torch.nn.Module],
    ) -> None:
        self.store: Optional[Store] = open_store(remote.url) if remote else None
        self.key: Optional[SigningKey] = SigningKey.from_env(remote.key_file) if remote else None
        # a publisher trusts its own key: a worker pulls what it, or one like it, published
        self.trusted = TrustedKeys.from_pems(remote.trusted if remote else ()).plus(
            self.key.public if self.key else None
        )
        self.pulls: list[sync.Transfer] = []
        self.published: Optional[sync.Transfer] = None
        self.publish_error: Optional[str] = None
        self.repaired: Optional[sync.Repair] = None
        self.fresh = fresh
        if remote and not fresh:  # --fresh means a cold compile: the store must not warm us
            self.pull()
        options = spec.compile
        self.candidates, self.unavailable = serving_candidates(spec, self.device.type)
        # `graphed` runs the config's compile with CUDA graphs off: the same compiled function
        # where the config's mode has none, else a second compile (its own Dynamo cache entries)
        uncaptured = graphed_compile(options.mode, options.options)
        second = "graphed" in self.candidates and uncaptured != (options.mode, options.options)
        # the children build their own models: started first, they build them beside this one
        self._build_ahead(build_ahead, twin=second)
        self.model = model if model is not None else build_model(spec, self.device)
        self.event("model built")
        if self.ahead is not None:
            self.ahead.allow(processes_for(self.model, self.device, len(self.ahead.buckets)))
        # the report's variants: eager and compiled always (the warmup's own comparison), then
        # the graphed candidates, then those asked for that cannot run here
        self.measured = [
            v for v in VARIANTS if v in ("eager", "compiled") or v in self.candidates or v in self.unavailable
        ]
        self._layouts_ahead = ti.may_go_channels_last(self.model, self.device, options.backend, options.options)
        self.compiled, self._tracer = ti.compile_model(
            self.model,
            ti.variant_compile_kwargs(options, "compiled"),
            trace_ahead=trace_ahead,
        )
        self.uncaptured: Any = None
        if second:
            self.uncaptured = torch.compile(self.model, **ti.variant_compile_kwargs(options, "graphed"))
        elif "graphed" in self.candidates:
            self.uncaptured = self.compiled
        ti.allow_recompiles(len(spec.buckets) * (2 if second else 1))
        self.setup_seconds = time.perf_counter() - self.started
        self._work: dict[int, _BucketWork] = {}
        self._quarantined: list[str] = []
        # serving plans and aot functions this process wrote, relative to the namespace directory
        self.serving_files: list[str] = []

    def _build_ahead(self, buckets: Sequence[int], *, twin: bool) -> None:
        """Start compiling the aot functions of those `buckets` the namespace does not hold yet.
        twin: where one cannot be built, its child compiles `graphed`'s compile for the parent."""
        missing = [b for b in buckets if _existing_function(self.local.path, b) is None]
        if "aot" in self.candidates and missing:
            self.ahead = AheadBuilds(self.spec, missing, self.local.root, twin=twin)
            self.event("aot builds started")

    def close(self) -> None:
        """Stop the aot builds still running (every bucket that wanted its function took it)."""
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None

    def pull(self) -> Optional[sync.Transfer]:
        """Bring the local directory up to the store's newest generation (None: not published yet,
        or no store)."""
        if self.store is None or self.remote is None:
            return None
        transfer = sync.pull(
            self.store, self.local.namespace, self.local.path, self.trusted, allow_unsigned=self.remote.allow_unsigned
        )
        if transfer:  # said once it happened: a run that pulls nothing and then fails says only why
            self.progress.step(
                f"pulled {self.local.namespace} generation {transfer.generation} from {self.remote.url} "
                f"({transfer.files} files)"
            )
            self.pulls.append(transfer)
            self.event(f"pulled generation {transfer.generation}")
        return transfer

    def loaded(self, bucket: int) -> bool:
        return bucket in self._work and self._work[bucket].compiled

    def reference(self, bucket: int) -> BucketResult:
        """The eager reference call alone: it needs no artifact, so a rank runs it while it waits."""
        work = self._bucket(bucket)
        if work.result.status == "ok" and work.reference is None:
            self._guard(work, work.run_reference)
        return work.result

    def trace(self, bucket: int) -> BucketResult:
        """Dynamo's trace of the bucket, before its artifact exists, so that loading it later is a
        cache hit and no more (needs trace_ahead=True and Inductor; else nothing happens). For a
        rank waiting on the compile wave: its loads are what is left after the last publish."""
        work = self._bucket(bucket)
        self.reference(bucket)
        if self._tracer is not None and work.result.status == "ok" and not work.compiled and work.traced is None:
            self._guard(work, lambda: work.trace(self._tracer))
            if work.result.status == "ok":
                self.event(f"traced bucket {bucket}")
        return work.result

    def warm_layouts(self, buckets: Sequence[int]) -> None:
        """Each bucket's eager call with its convolutions in channels-last layout, where Inductor may
        lay them out so (ti.may_go_channels_last), for a process that waits for another to compile:
        cuDNN sets up a convolution at its first call in a process and layout, seconds for a net of
        many small ones, which the compiled graph's first call would otherwise pay after the
        publish. The seconds count in the bucket's first call, as a trace ahead's do. A failure
        costs only the head start: the event says why, and the buckets load as they would have."""
        if not self._layouts_ahead:
            return
        twin = None
        try:
            for bucket in buckets:
                work = self._bucket(bucket)
                self.reference(bucket)
                if work.result.status == "ok" and not work.compiled and not work.layout_seconds:
                    twin = twin if twin is not None else ti.channels_last_twin(self.model)
                    work.warm_layouts(twin)
        except Exception as exc:  # the head start only: the load sets everything up anyway
            self.event(f"layouts not set up ahead: {brief(exc)}")
            return
        if twin is not None:
            self.event("layouts set up")

    def warm(self, bucket: int, benchmark: bool = True) -> BucketResult:
        """Compile (or load) the bucket, record its CUDA graphs, check it and, if asked, benchmark it."""
        work = self._bucket(bucket)
        self.reference(bucket)
        if work.result.status == "ok" and not work.compiled:
            self._guard(work, work.compile)
            if work.result.status == "ok":
                self.event(f"{'loaded' if work.result.cache_state == 'hit' else 'compiled'} bucket {bucket}")
        if benchmark:
            return self.benchmark(bucket)
        return self._finished(work)

    def benchmark(self, bucket: int) -> BucketResult:
        """Time the bucket's variants (once), after the aot builds still running have finished and
        Inductor's compile workers have started: nothing compiles or starts beside a benchmark in
        this process or its children."""
        work = self._bucket(bucket)
        if work.result.status == "ok" and work.result.speedup is None:
            if self.ahead is not None and self.ahead.wait_idle():
                self.event("aot builds idle")
            if ti.wait_for_compile_workers():
                self.event("compile workers started")
            with on_fastest_core(self.device.type == "cuda") as core:
                self._guard(work, work.benchmark)
            if core is not None:
                self.event(f"bucket {bucket} benchmarked on core {core}")
            if work.result.status == "ok" and self.spec.fixed:
                self._guard(work, work.prove_padding)
            if work.result.status == "ok":
                plan = write_plan(self.local.path, self.spec, work.result, work.artifacts, work.load_bounds)
                if plan is not None:
                    self.serving_files.append(plan)
                self.event(f"benchmarked bucket {bucket}")
                self._profile(work)
        return self._finished(work)

    def benchmark_all(self, buckets: Sequence[int]) -> None:
        """Benchmark `buckets` once nothing compiles any more: here, or in a fresh process that
        loads them from the cache where the config asks for one (jobs/fresh_benchmark.py decides)."""
        records = [self._bucket(bucket).result for bucket in buckets]
        free = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(self.device)
        decision = fresh_benchmark.decide(self.spec.bench.process, self.device.type, records, free)
        pending = [r.bucket for r in records if r.status == "ok" and r.speedup is None]
        if decision.where == "same" or not pending:
            fresh_benchmark.discard_spare()
            self.event(f"benchmark in this process: {decision.why}")
            for bucket in buckets:
                self.benchmark(bucket)
            return
        self.progress.step(f"benchmark in a fresh process: {decision.why}")
        self.event("fresh benchmark process started")
        before = set(sync.scan(self.local.path))
        answer = fresh_benchmark.run(
            self.spec,
            self.local.root,
            pending,
            rank=self.rank,
            progress=self.progress,
            profile_dir=self.profile_dir,
            profile_prefix=self.profile_prefix,
        )
        if answer.error is not None:  # buckets without an answer: what it wrote (plans) must not be published
            self.quarantine(set(sync.scan(self.local.path)) - before)
        self.serving_files += answer.serving_files
        self._quarantined += answer.quarantined
        self.events += [(f"fresh process: {what}", when) for what, when in answer.events]
        for bucket in pending:
            work = self._work[bucket]
            measured = answer.results.get(bucket)
            if measured is None:
                result = work.result
                result.status, result.stage = "failed", "benchmark"
                result.error = f"benchmark: {answer.error}"
                self.progress.finish(result)
                continue
            fresh_benchmark.take_benchmark(work.result, measured)
            if work.result.status == "ok":
                self._finished(work)
            else:
                self.progress.finish(work.result)
        self.event("fresh benchmark process done")

    @property
    def quarantined(self) -> list[str]:
        """Files a failed step compiled and deleted, relative to the namespace directory."""
        return list(self._quarantined)

    def _profile(self, work: _BucketWork) -> None:
        """Profile the bucket's variants once its numbers are taken, so the profiler never touches
        them. A failure is the profile's reason, never the bucket's."""
        if self.profile_dir is None:
            return
        from orchestrator.jobs import profiling

        result = work.result
        work.enter("profile")
        try:
            result.profile = profiling.profile_bucket(
                work.profile_calls(),
                served=result.variant,
                directory=self.profile_dir,
                prefix=self.profile_prefix,
                bucket=result.bucket,
                device=self.device,
            )
        except Exception as exc:  # never the bucket's failure
            asked = dict.fromkeys(["eager", "compiled", result.variant or "eager"])
            result.profile = BucketProfile(served=result.variant, unavailable={name: brief(exc) for name in asked})
        work.pause()
        self.event(f"profiled bucket {result.bucket}")

    def publish_plans(self) -> None:
        """Publish only the serving plans and aot functions this process wrote (a rank: it
        publishes nothing else)."""
        if self.store is None or self.remote is None or not self.serving_files:
            return
        with tempfile.TemporaryDirectory(prefix=".plans-", dir=self.local.root) as staging:
            for rel in self.serving_files:
                (Path(staging) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.local.path / rel, Path(staging) / rel)
            try:
                self.published = sync.publish(
                    self.store,
                    Path(staging),
                    self.local.namespace,
                    self.key,
                    allow_unsigned=self.remote.allow_unsigned,
                    trusted=self.trusted,
                    meta={
                        "model": self.spec.name,
                        "config": self.spec.identity_hash(),
                        "platform": asdict(self.platform),
                    },
                )
            except (StoreError, IntegrityError) as exc:
                self.publish_error = str(exc)
        self.event("published serving plans" if self.published else "publish failed")

    def publish(self) -> None:
        """Publish what compiled correctly; a store failure is kept as publish_error, results stand."""
        ok = [w.result.bucket for w in self._work.values() if w.result.status == "ok"]
        if ok:  # what a replica reads where it would compute or compile, published or not
            ti.save_generated_bytecode(self.local.inductor_dir)
            ti.save_torch_key(self.local.inductor_dir)
        if self.store is None or self.remote is None or not ok:
            return
        self.progress.step(f"publish {self.local.namespace} to {self.remote.url}")
        try:
            if self.fresh and sync.generations(self.store, self.local.namespace):
                # a cold compile's files are what publishing would skip as known: a damaged shard
                # the store holds for them is replaced first, or it would outlive this run
                self.repaired = sync.repair(
                    self.store,
                    self.local.namespace,
                    self.local.path,
                    self.key,
                    allow_unsigned=self.remote.allow_unsigned,
                    trusted=self.trusted,
                )
                if self.repaired.bad:
                    self.event(f"repaired {len(self.repaired.bad)} damaged shards")
            self.published = sync.publish(
                self.store,
                self.local.path,
                self.local.namespace,
                self.key,
                allow_unsigned=self.remote.allow_unsigned,
                trusted=self.trusted,
                buckets=ok,
                meta={"model": self.spec.name, "config": self.spec.identity_hash(), "platform": asdict(self.platform)},
                exclude=self._quarantined,
            )
        except (StoreError, IntegrityError) as exc:
            self.publish_error = str(exc)
        self.event("published" if self.published else "publish failed")

    def run(self) -> WarmupRun:
        """The process's results so far. A namespace left without a file (every bucket failed and
        its files were deleted) is removed: nothing in it can warm anyone."""
        files, size = self.local.usage()
        if not files:
            self.local.remove_if_empty()
        return WarmupRun(
            platform=self.platform,
            namespace=self.local.namespace,
            device=str(self.device),
            cache_dir=str(self.local.path),
            results=[w.result for w in self._work.values()],
            wall_seconds=time.perf_counter() - self.started,
            setup_seconds=self.setup_seconds,
            process_age_at_start=self.process_age,
            cache_bytes=size,
            cache_files=files,
            remote=self.remote.url if self.remote else None,
            pull=sync.combined(self.pulls),
            publish=self.published,
            publish_error=self.publish_error,
            events=list(self.events),
        )

    def event(self, what: str) -> None:
        self.events.append((what, time.time()))

    def _bucket(self, bucket: int) -> _BucketWork:
        # another session of this process (a Ray rank's, for another slice of a grid) may have
        # pointed Inductor's and Triton's caches at its own namespace since
        ti.point_caches_at(self.local)
        if bucket not in self._work:
            result = BucketResult(
                bucket=bucket,
                point=self.spec.point_of(bucket),
                rank=self.rank,
                gpu=self.platform.gpu_name if self.device.type == "cuda" else None,
                variants={name: VariantMeasure(ok=False, reason=why) for name, why in self.unavailable.items()},
            )
            self._work[bucket] = _BucketWork(self, result)
        return self._work[bucket]

    def quarantine(self, created: set[str]) -> None:
        """Delete files a failed step compiled: they must neither be reused here nor published."""
        self._quarantined += _quarantine(self.local.path, created)

    def _finished(self, work: _BucketWork) -> BucketResult:
        if work.result.status == "ok":  # a failed bucket was reported by _guard already
            work.done()
            self.progress.finish(work.result)
        return work.result

    def _guard(self, work: _BucketWork, step: Any) -> None:
        """Run one step of a bucket; an exception fails that bucket only, and deletes what it compiled."""
        before = set(sync.scan(self.local.path))
        try:
            step()
        except (KeyboardInterrupt, SetupError):
            raise
        except Exception as exc:  # one bad bucket must not hide the others
            result = work.result
            result.status = "failed"
            result.error = f"{result.stage}: {brief(exc)}"
            result.error_detail = "".join(traceback.format_exception_only(exc))[-4000:]
            self.quarantine(set(sync.scan(self.local.path)) - before)
            work.pause()
            self.progress.finish(result)


def _quarantine(directory: Path, created: set[str]) -> list[str]:
    """Delete what a failed bucket compiled: it must neither be reused here nor published."""
    for rel in created:
        (directory / rel).unlink(missing_ok=True)
    return sorted(created)


def cache_namespace(spec: WarmupSpec) -> str:
    """The namespace this machine would compile `spec` into (imports torch, asks for the GPU)."""
    return namespace(spec.label, ti.current_platform(resolve_device(spec.device)), spec.identity_hash())


class _BucketWork:
    """The stages of one bucket, each timed on its own (see the module doc). Stages may run far
    apart in time; the waits between them are not counted in any stage."""

    def __init__(self, session: Session, result: BucketResult) -> None:
        self.session = session
        self.spec, self.model, self.compiled_model, self.device = (
            session.spec,
            session.model,
            session.compiled,
            session.device,
        )
        self.result, self.progress = result, session.progress
        self.clock = Clock(self.device)
        self.gate = Gate.from_options(self.spec.check)
        self.reference: Optional[Outputs] = None
        self.float64: Optional[Outputs] = None  # the model's outputs in float64 on the same inputs
        self.float64_proof: Optional[Outputs] = None  # and on the padding proof's request (a grid's point)
        self.load_bounds: dict[str, float] = {}  # what a replica holds a loaded variant to (Gate.load_bounds)
        self.traced: Optional[ti.CompileStats] = None  # what Dynamo did in a trace ahead
        self.trace_seconds = 0.0
        self.layout_seconds = 0.0  # its convolutions set up ahead in the compiled graph's layout
        self.compiled = False
        # the serving variants built beside the compiled one (graphed, eager-graphed, aot), ready to call
        self.graphed: dict[str, Callable[..., Any]] = {}
        self.artifacts: dict[str, dict[str, Any]] = {}  # a variant's files: aot's function and its platform
        self._inputs: Optional[tuple[Any, Any]] = None
        self._stage_started: Optional[float] = None

    def enter(self, stage: str, total: Optional[int] = None) -> None:
        self.pause()
        HOST()  # a reading per stage: what full speed is, learnt over the process's life (timing.py)
        self.result.stage, self._stage_started = stage, time.perf_counter()
        self.progress.phase(self.result.bucket, stage, total)

    def pause(self) -> None:
        if self._stage_started is not None:
            spent = time.perf_counter() - self._stage_started
            self.result.stage_seconds[self.result.stage] = self.result.stage_seconds.get(self.result.stage, 0.0) + spent
            self._stage_started = None

    @property
    def inputs(self) -> tuple[Any, Any]:
        if self._inputs is None:
            raise RuntimeError("the bucket's inputs are made by its eager reference call, which has not run")
        return self._inputs

    def eager(self) -> Any:
        args, kwargs = self.inputs
        return self.model(*args, **kwargs)

    def run_compiled(self) -> Any:
        args, kwargs = self.inputs
        ti.mark_step()
        return self.compiled_model(*args, **kwargs)

    def run_reference(self) -> None:
        self.enter("eager reference")
        self._inputs = make_inputs(self.spec, self.result.bucket, self.device)
        with torch.no_grad():
            _, reference = self.clock.wall(self.eager)
        self.reference = snapshot(reference)
        self.gate.check_reference(self.reference)
        result = self.result
        result.numerics = numerics_in_force(self.device)
        if self.gate.wants_float64:
            self.enter("float64 reference")
            calls = [self.inputs]
            request = grid.proof_request(self.spec, result.bucket)
            if request is not None:
                calls.append(grid.InputShaper(self.spec).cut(*self.inputs, request))
            runs, result.gate_note = float64_outputs(self.model, calls, self.device, self.reference)
            if runs is not None:
                self.float64, self.float64_proof = runs[0], runs[1] if len(runs) > 1 else None
                self.load_bounds = self.gate.load_bounds(self.reference, self.float64)
        else:
            result.gate_note = "explicit check.atol/check.rtol" if self.spec.check.reference == "float64" else None
        self.pause()

    def trace(self, tracer: ti.TraceAhead) -> None:
        with torch.no_grad(), tracer.tracing_only():  # grad mode as in compile(): Dynamo guards on it
            self.enter("trace ahead")
            window = ti.CounterWindow()
            self.trace_seconds, _ = self.clock.wall(self.run_compiled)
            self.traced = window.stats()
        self.pause()

    def warm_layouts(self, twin: torch.nn.Module) -> None:
        self.enter("layouts ahead")
        try:
            args, kwargs = ti.channels_last_inputs(*self.inputs)
            with torch.no_grad():
                self.layout_seconds, _ = self.clock.wall(lambda: twin(*args, **kwargs))
        finally:
            self.pause()

    def compile(self) -> None:
        result = self.result
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with torch.no_grad(), ti.cudagraph_skip_reasons() as skip_reasons:
            self.enter("compile")
            window = ti.CounterWindow()
            result.compile_seconds, first = self.clock.wall(self.run_compiled)
            # a trace ahead and the layouts set up ahead are part of this bucket's first call, done
            # earlier: what a replica pays to warm-start it is all of them, so all count
            # (stage_seconds keeps them apart)
            result.compile_seconds += self.trace_seconds + self.layout_seconds
            first = snapshot(first)
            stats = window.stats() if self.traced is None else self.traced + window.stats()
            _record_compile(result, stats, self.spec, self.device, skip_reasons)

            self.enter("record graphs")
            after_first = ti.CounterWindow()
            replay = None
            start = time.perf_counter()
            for _ in range(ti.GRAPH_RECORD_CALLS):
                _, replay = self.clock.wall(self.run_compiled)
            result.graph_record_seconds = time.perf_counter() - start
            replay = snapshot(replay)
            result.recompiles = after_first.stats().frames_compiled

        self.enter("check")
        if self.reference is None:
            raise RuntimeError("the eager reference call has not run")
        _check(result, self.gate, self.reference, {"first call": first, "replay": replay}, self.float64)
        if "aot" in self.session.candidates:  # first: `graphed` is built only where aot is not (twin_built)
            self.build_aot()
        self.build_graphed_variants()
        result.peak_memory_bytes, result.peak_memory_kind = _peak_memory(self.device)
        self.compiled = True
        self.pause()

    def build_graphed_variants(self) -> None:
        """Capture each graphed serving variant and check a first replay and a second against
        eager. One that cannot be built, captured or checked is recorded as unavailable with its
        reason, and what it compiled is deleted (it must not be published)."""
        graphed = [name for name in self.session.candidates if name in GRAPHED_VARIANTS]
        if not graphed:
            return
        self.enter("graph variants")
        args, kwargs = self.inputs
        for name in graphed:
            twin = twin_built(name, self.result.variants)
            if twin is not None:
                self.result.variants[name] = VariantMeasure(ok=False, reason=twin)
                continue
            fn = self.model if name == "eager-graphed" else self.session.uncaptured
            directory = self.session.local.path
            before = set(sync.scan(directory))
            started = time.perf_counter()
            try:
                call = GraphedCall(fn, args, kwargs, padding=grid.input_padding(self.spec))
                first = snapshot(call(*args, **kwargs))
                replay = snapshot(call(*args, **kwargs))
                for label, outputs in (("first replay", first), ("second replay", replay)):
                    self.gate.compare(self.reference or [], outputs, call=f"{name} {label}", float64=self.float64)
            except Exception as exc:  # unavailable: never a failed bucket
                reason = str(exc) if isinstance(exc, (CaptureError, OutputMismatch)) else brief(exc)
                self.result.variants[name] = VariantMeasure(ok=False, reason=reason)
                self.session.quarantine(set(sync.scan(directory)) - before)
                continue
            self.graphed[name] = call
            self.result.variants[name] = VariantMeasure(ok=True, build_seconds=time.perf_counter() - started)

    def build_aot(self) -> None:
        """The bucket's aot function: the one the namespace already holds (pulled, or built by an
        earlier run: saved functions are not byte-reproducible, so reusing one is what keeps a
        warm rerun from publishing anything new), else compiled ahead of time now; then loaded as
        a replica loads it, captured on CUDA, and checked like every variant."""
        self.enter("aot compile")
        session, bucket = self.session, self.result.bucket
        args, kwargs = self.inputs
        directory = session.local.path
        started = time.perf_counter()
        try:
            rel = _existing_function(directory, bucket)
            if rel is None and session.ahead is not None and bucket in session.ahead.buckets:
                rel, compiled_s = session.ahead.take(bucket, directory)
                session.serving_files.append(rel)
                started = time.perf_counter() - compiled_s  # its build: the child's compile, then the load here
            elif rel is None and session.loads_only:
                raise AheadBuildError("the namespace holds no aot function for this bucket to load")
            elif rel is None:
                options = self.spec.compile
                compile_options = aot.compile_kwargs(options.mode, options.options, options.backend, self.device.type)
                rel = aot.build(self.model, args, kwargs, directory, bucket, compile_options)
                session.serving_files.append(rel)
            loaded = aot.load(directory / rel, self.model)
            padding = grid.input_padding(self.spec)
            call = GraphedCall(loaded, args, kwargs, padding=padding) if self.device.type == "cuda" else loaded
            with torch.no_grad():
                first = snapshot(call(*args, **kwargs))
                replay = snapshot(call(*args, **kwargs))
            for label, outputs in (("first call", first), ("second call", replay)):
                self.gate.compare(self.reference or [], outputs, call=f"aot {label}", float64=self.float64)
        except Exception as exc:  # unavailable: never a failed bucket
            known = (aot.Unexportable, CaptureError, OutputMismatch, AheadBuildError)
            reason = str(exc) if isinstance(exc, known) else brief(exc)
            self.result.variants["aot"] = VariantMeasure(ok=False, reason=reason)
            return
        self.graphed["aot"] = call
        self.artifacts["aot"] = {"path": rel, "platform": asdict(session.platform)}
        self.result.variants["aot"] = VariantMeasure(ok=True, build_seconds=time.perf_counter() - started)

    def benchmark(self) -> None:
        spec, result = self.spec, self.result
        pair = {"eager": self.eager, "compiled": self.run_compiled}
        timed = self.served_calls()
        rounds = max(3, spec.bench.iterations // BACK_TO_BACK_CALLS)
        bucket = result.bucket
        planned = read_plans(self.session.local.path).get(bucket)  # pulled from the store, or this node's

        host = _HostRecord(result, self.clock.host)

        def time_more(names: list[str], iterations: int) -> dict[str, list[float]]:
            """More interleaved rounds of the variants the choice cannot tell apart yet, after one
            untimed call each: they sat idle through the throughput run."""
            self.progress.phase(bucket, f"benchmark: {iterations} more rounds of {', '.join(names)}", iterations + 1)
            more = self.clock.interleaved(
                {name: timed[name] for name in names}, iterations, 1, on_step=lambda: self.progress.advance(bucket)
            )
            return _kept(host.add(more))

        self.enter("benchmark", total=spec.bench.warmup + spec.bench.iterations + rounds)
        with torch.no_grad():
            window = ti.CounterWindow()
            latency = _kept(
                host.add(
                    self.clock.interleaved(
                        timed, spec.bench.iterations, spec.bench.warmup, on_step=lambda: self.progress.advance(bucket)
                    )
                )
            )
            throughput = self.clock.back_to_back(
                pair, rounds, BACK_TO_BACK_CALLS, on_step=lambda: self.progress.advance(bucket)
            )
            settled, choice = settle(
                {name: samples for name, samples in latency.items() if name in self.session.candidates},
                time_more,
                incumbent=planned["variant"] if planned else None,
                # a config that asks for few samples asks for a quick measurement
                max_samples=min(MAX_SAMPLES, 4 * spec.bench.iterations),
            )
            latency.update(settled)
            result.recompiles = (result.recompiles or 0) + window.stats().frames_compiled
        result.eager_ms, result.eager_p90_ms = median(latency["eager"]), p90(latency["eager"])
        result.compiled_ms, result.compiled_p90_ms = median(latency["compiled"]), p90(latency["compiled"])
        result.speedup = _ratio(result.eager_ms, result.compiled_ms)
        paired = PairedBootstrap(latency)
        intervals = {name: paired.interval("eager", name) for name in latency}
        result.speedup_interval = intervals["compiled"]
        result.eager_throughput_ms = median(throughput["eager"])
        result.compiled_throughput_ms = median(throughput["compiled"])
        result.throughput_speedup = _ratio(result.eager_throughput_ms, result.compiled_throughput_ms)
        for name, samples in latency.items():
            built = result.variants.get(name)
            build_seconds = built.build_seconds if built else None
            if name == "compiled" and build_seconds is None and result.compile_seconds is not None:
                # the bucket's own compile (or cache load) and graph recording: what it took to build
                build_seconds = result.compile_seconds + (result.graph_record_seconds or 0.0)
            result.variants[name] = VariantMeasure(
                ok=True,
                ms=median(samples),
                p90_ms=p90(samples),
                spread_ms=spread(samples),
                build_seconds=build_seconds,
                speedup_interval=intervals[name],
                samples_ms=samples,
            )
        result.variants = {name: result.variants[name] for name in self.session.measured if name in result.variants}
        result.variant, result.choice_reason = choice.variant, choice.reason
        served = result.variants[result.variant]
        result.served_ms = self._as_a_replica_serves(result.variant, timed[result.variant], served.ms)
        result.served_speedup = _ratio(result.eager_ms, result.served_ms) if result.served_ms is not None else None
        scale = result.served_ms / served.ms if result.served_ms and served.ms else 1.0
        interval = served.speedup_interval
        result.served_speedup_interval = [bound / scale for bound in interval] if interval else interval
        result.noisy = result.host_steady is False or is_noisy(
            result.served_speedup, result.served_speedup_interval, len(latency["eager"])
        )
        if self.device.type == "cuda":  # benchmarks may allocate more than compiling did
            result.peak_memory_bytes = max(result.peak_memory_bytes or 0, torch.cuda.max_memory_allocated(self.device))
        self.pause()

    def _as_a_replica_serves(
        self, variant: str, call: Callable[[], Any], variant_ms: Optional[float]
    ) -> Optional[float]:
        """The served variant's latency through a replica's call of it (BucketedModel.serving: the
        request's lookup, the lock and the copy out, as every request pays them): timed beside the
        variant's own call, round for round, and given as the variant's figure times the pairs'
        median ratio (stats.paired_scale), so a host slowed for some rounds slows both sides."""
        if variant_ms is None:
            return None
        runner = self._runner(variant)
        replica = BucketedModel.serving(self.spec, self.device, self.model, self.result.bucket, variant, runner)
        args, kwargs = self.inputs
        calls = {"variant": call, "replica": lambda: replica(*args, **kwargs)}
        with torch.no_grad():
            timed = self.clock.interleaved(calls, self.spec.bench.iterations, self.spec.bench.warmup)
        return paired_scale(variant_ms, timed.samples["replica"], timed.samples["variant"])

    def prove_padding(self) -> None:
        """A grid's point: a request one step shorter in every dimension, padded up and run on the
        served variant, answers as eager does at its exact size (jobs/grid.py)."""
        result = self.result
        self.enter("padding proof")
        variant = result.variant or "eager"
        runner = self._runner(variant)
        proof = grid.prove_padding(
            self.spec, result.bucket, self.inputs, self.model, runner, variant, self.gate, self.float64_proof
        )
        if proof is not None:
            proof.padded_ms = self._time_padded(proof, runner)
        result.padding_proof = asdict(proof) if proof is not None else None
        self.pause()

    def _time_padded(self, proof: grid.PaddingProof, runner: Callable[..., Any]) -> float:
        """The latency of the proof's request served as a grid replica serves it: padded in every
        dimension at once, run, cut back, copied out of replay buffers. What the point costs the
        requests it pads, which is what `orchestrate plan` prices it at.

        It is timed beside the served variant at the point's own size, round for round, and
        given as the benchmark's served latency times the median ratio of the two: a slowed host
        that a round of this timing met (and the benchmark's retakes escaped) slows both calls
        of a pair, not the price."""
        shaper = grid.InputShaper(self.spec)
        exact_args, exact_kwargs = shaper.cut(*self.inputs, proof.request)
        dims = {path: {int(d): name for d, name in found.items()} for path, found in proof.output_dims.items()}
        replays = replays_into_buffers(proof.variant, self.spec, self.device.type)
        run = grid.padded_call(runner, shaper, proof.point)

        def request() -> Any:
            outputs = grid.cut_outputs(run(exact_args, exact_kwargs), dims, proof.request)
            return copies.copy_out(outputs) if replays else outputs

        served = self.served_calls().get(proof.variant)
        calls = {"padded": request} if served is None else {"served": served, "padded": request}
        with torch.no_grad():
            timed = self.clock.interleaved(calls, self.spec.bench.iterations, self.spec.bench.warmup)
        if served is None or self.result.served_ms is None:
            return median(timed.samples["padded"])
        return paired_scale(self.result.served_ms, timed.samples["padded"], timed.samples["served"])

    def _runner(self, variant: str) -> Callable[..., Any]:
        """What runs `variant` on a request's inputs, as a replica's route holds it: the model, the
        compiled model, or the variant's built graph."""
        if variant == "eager":
            return self.model
        if variant == "compiled":
            return self._compiled_call
        return self.graphed[variant]

    def _compiled_call(self, *args: Any, **kwargs: Any) -> Any:
        ti.mark_step()
        return self.compiled_model(*args, **kwargs)

    def served_calls(self) -> dict[str, Callable[[], Any]]:
        """Every built variant, called as a server calls it: outputs in CUDA-graph buffers are
        copied out, so the benchmark and the profiler time what a request costs."""
        args, kwargs = self.inputs
        spec, device_type = self.spec, self.device.type
        calls: dict[str, Callable[[], Any]] = {
            "eager": self.eager,
            "compiled": _served(
                self.run_compiled, copies.copier(None, replays_into_buffers("compiled", spec, device_type))
            ),
        }
        for name, call in self.graphed.items():
            copier = copies.copier(call, replays_into_buffers(name, spec, device_type))
            calls[name] = _served(functools.partial(call, *args, **kwargs), copier)
        return calls

    def profile_calls(self) -> dict[str, Callable[[], Any]]:
        """What `--profile` profiles: eager, the config's compiled variant, and the served variant
        where it is another."""
        keep = {"eager", "compiled", self.result.variant}
        return {name: call for name, call in self.served_calls().items() if name in keep}

    def done(self) -> None:
        self.result.stage = "done"


class _HostRecord:
    """What the host meter saw across a bucket's benchmark runs, written into its record."""

    def __init__(self, result: BucketResult, meter: Optional[HostMeter]) -> None:
        self.result, self.meter = result, meter
        self.kept_ms: list[float] = []  # the kept rounds' slowest meter readings, every run's
        result.bench_rounds, result.host_slowed_rounds, result.host_steady = 0, 0, True

    def add(self, timed: Timed) -> dict[str, list[float]]:
        result = self.result
        result.bench_rounds = (result.bench_rounds or 0) + timed.rounds
        result.host_slowed_rounds = (result.host_slowed_rounds or 0) + timed.slowed
        result.host_steady = bool(result.host_steady) and timed.steady
        self.kept_ms += timed.kept_host_ms
        if self.meter is not None and self.kept_ms:
            result.host_reading_us = round(median(self.kept_ms) * 1e3, 2)
            result.host_best_us = round(self.meter.best * 1e6, 2)
        return timed.samples


def _served(call: Callable[[], Any], copier: Optional[copies.Copier]) -> Callable[[], Any]:
    """`call` as the runtime makes it for its caller: outputs copied out of replay buffers."""
    if copier is None:
        return call
    return lambda: copier(call())


def _existing_function(directory: Path, bucket: int) -> Optional[str]:
    """The bucket's aot function of the current format in the namespace directory: the one its
    serving plan names, else any (every one there was built for this namespace's model, config and
    platform). One of an earlier format is left to the replicas whose plans name it."""
    prefix = aot.current_prefix(bucket)
    planned = read_plans(directory).get(bucket, {}).get("artifacts", {}).get("aot")
    if planned and planned["path"].startswith(prefix) and (directory / planned["path"]).is_file():
        return planned["path"]
    found = sorted(directory.glob(f"{prefix}*.bin"))
    return found[0].relative_to(directory).as_posix() if found else None


def _record_compile(
    result: BucketResult, stats: ti.CompileStats, spec: WarmupSpec, device: torch.device, skip_reasons: list[str]
) -> None:
    result.cache_hits, result.cache_misses = stats.cache_hits, stats.cache_misses
    result.cache = {
        "fx_graph_hits": stats.fx_hits,
        "fx_graph_misses": stats.fx_misses,
        "fx_graph_bypasses": stats.fx_bypasses,
        "aot_autograd_hits": stats.aot_hits,
        "aot_autograd_misses": stats.aot_misses,
        "autotuned_kernels": stats.autotuned_kernels,
    }
    result.cache_state = (
        "hit" if stats.cache_misses == 0 and stats.cache_hits > 0 else "miss" if stats.cache_hits == 0 else "mixed"
    )
    result.phase = "warm" if result.cache_state == "hit" else "compile"
    result.graph_breaks, result.graph_break_reasons = stats.graph_break_count, stats.graph_breaks
    result.frames_compiled = stats.frames_compiled
    wants_graphs = spec.compile.mode in ("reduce-overhead", "max-autotune") or bool(
        spec.compile.options.get("triton.cudagraphs")
    )
    if not wants_graphs:
        result.cudagraphs = False
    elif device.type != "cuda":
        result.cudagraphs = False
        result.cudagraph_skip_reasons = ["CUDA graphs need a CUDA device; the model runs on the CPU"]
    else:
        result.cudagraphs = stats.cudagraph_skips == 0
        result.cudagraph_skip_reasons = list(dict.fromkeys(skip_reasons))


def _check(
    result: BucketResult, gate: Gate, reference: Outputs, calls: dict[str, Outputs], float64: Optional[Outputs]
) -> None:
    """Every call against eager (and float64); the report keeps the worst error of all of them."""
    try:
        verdicts = [
            gate.compare(reference, outputs, call=f"compiled {call}", float64=float64)
            for call, outputs in calls.items()
        ]
    except OutputMismatch as mismatch:
        result.max_abs_error = mismatch.max_abs_error
        raise
    measured = [v for v in verdicts if v.max_abs_error is not None]
    worst = max(measured, key=lambda v: v.max_abs_error or 0.0) if measured else None
    result.checked_outputs = verdicts[0].leaves if verdicts else 0
    result.max_abs_error = worst.max_abs_error if worst else None
    result.atol, result.rtol = (worst.atol, worst.rtol) if worst else (None, None)
    closest = max(measured, key=lambda v: v.tolerance_used or 0.0) if measured else None
    result.tolerance_used = closest.tolerance_used if closest else None
    result.gate_reference = "float64" if measured and all(v.reference == "float64" for v in measured) else "eager"
    if closest is not None and closest.multiple is not None:
        result.float64_eager_error, result.float64_error = closest.float64_eager_error, closest.float64_error
        result.gate_multiple = closest.multiple


def numerics_in_force(device: torch.device) -> dict[str, Any]:
    """The reduced-precision settings that make float32 eager itself inexact (TF32 convolutions and
    matmuls, reduced-precision reductions): the report says which were on where the gate judged."""
    if device.type != "cuda":
        return {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    matmul = torch.backends.cuda.matmul
    return {
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
    }


def _free_memory(device: torch.device) -> Optional[int]:
    """Bytes the device has free: the GPU's, or the host's available memory (Linux); None where
    unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Float64Twin:
    """A copy of `model` in float64 (its floating parameters and buffers), called with its
    floating inputs widened to float64: the run the correctness gate judges answers against."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.module = copy.deepcopy(model).to(torch.float64)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*map(_widened, args), **{k: _widened(v) for k, v in kwargs.items()})


def _widened(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def float64_outputs(
    model: torch.nn.Module, calls: list[tuple[Any, Any]], device: torch.device, reference: Outputs
) -> tuple[Optional[list[Outputs]], Optional[str]]:
    """The model's outputs in a float64 run (its floating parameters, buffers and inputs in
    float64) on each call's inputs, the first being those eager's `reference` came from; or None
    and why none: no floating output, too little memory for a float64 copy, an op without a
    float64 kernel, or outputs that differ from eager's in form."""
    if not any(isinstance(leaf.value, torch.Tensor) and leaf.value.is_floating_point() for leaf in reference):
        return None, "no floating-point output"
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_complex() for t in tensors):  # Module.to(float64) would drop their imaginary parts
        return None, "complex parameters: no float64 copy of the model"
    copy_bytes = sum(t.numel() * 8 for t in tensors if t.is_floating_point())
    output_bytes = sum(
        leaf.value.numel() * 8
        for leaf in reference
        if isinstance(leaf.value, torch.Tensor) and leaf.value.is_floating_point()
    )
    # the copy and its activations (as much again), its outputs kept per call, and the gate's
    # float64 temporaries of a comparison
    needed = 2 * copy_bytes + output_bytes * (len(calls) + 3)
    free = _free_memory(device)
    if free is not None and needed > free:
        return None, f"a float64 run of the model needs about {needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"

    twin: Optional[Float64Twin] = None
    try:
        twin = Float64Twin(model)
        with torch.no_grad():
            runs = [snapshot(twin(*args, **kwargs)) for args, kwargs in calls]
    except Exception as exc:  # an op without a float64 kernel, out of memory: the gate judges against eager
        return None, f"no float64 run: {brief(exc)}"
    finally:
        del twin
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if [leaf.path for leaf in runs[0]] != [leaf.path for leaf in reference]:
        return None, "the float64 run's outputs differ in form from eager's"
    return runs, None


def _kept(latency: dict[str, list[float]]) -> dict[str, list[float]]:
    """Samples as records keep them, to 4 significant digits: far finer than the choice's margin
    or a CUDA event's resolution, and a third of the JSON of whole floats."""
    return {name: [float(f"{ms:.4g}") for ms in samples] for name, samples in latency.items()}


def _ratio(eager_ms: float, compiled_ms: float) -> Optional[float]:
    return eager_ms / compiled_ms if compiled_ms > 0 else None


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocated"
    # ru_maxrss is KiB on Linux; a process-wide high-water mark, not per bucket
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"
