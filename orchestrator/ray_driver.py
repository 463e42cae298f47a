"""Warmup across a Ray cluster: compile each (GPU class, bucket) once, then warm every rank.

Compile wave: one process per (class, bucket), dealt over the ranks' GPUs (reserved in a
placement group) so buckets compile in parallel; each compiles its bucket, checks it and
publishes. Warm wave: one process per rank, seeing one GPU (so artifacts are always for cuda:0),
which it shares with the compile units dealt to it. Both start together:
a rank sets up while the compile wave runs, pulls and loads each bucket (hits only) as soon as
it is published, and records CUDA graphs and benchmarks once compiling has stopped.

Workers keep their cache under `<cache root>/node-<ip>`: nodes of a test cluster share one
filesystem, and without the node key they would never need to pull.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from orchestrator.errors import ClusterUnreachable
from orchestrator.job_env import TORCH_THREADS_ENV, job_env_vars
from orchestrator.jobs.records import BucketResult, Remote
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.plan import (
    RANK_GPU_SHARE,
    CompileUnit,
    Node,
    Target,
    compile_units,
    has_spare_cpu,
    nodes_from_ray,
    targets,
)

if TYPE_CHECKING:  # workers import torch; the driver does not
    from orchestrator.jobs.engine import WarmupRun

TASK_RETRIES = 2  # a worker that dies (OOM, preemption, kill) is restarted, and its call retried, this often
# Every compile unit and every rank is an actor, a process of its own as a new replica's would be:
# a reused worker keeps Dynamo's in-memory code cache, so it would "load" without ever reading the
# cache it is meant to test.
_PROCESS = {"max_restarts": TASK_RETRIES, "max_task_retries": TASK_RETRIES}


@dataclass
class FleetRun:
    nodes: list[Node]
    targets: list[Target]
    units: list[CompileUnit]
    results: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)  # per task: namespace, platform, pull, publish
    wall_seconds: float = 0.0
    address: Optional[str] = None
    # "start": until the plan; "compile": until the last compile task ended; "warm": the rest (the
    # ranks' loads that were left, and the benchmarks)
    wave_seconds: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)  # wall clock, the origin of the timeline
    compile_errors: list[Exception] = field(default_factory=list)


def preflight(spec: WarmupSpec) -> None:
    """Fail in the driver, at once, on what would fail every worker: a factory that is not there.
    Only located, not imported: importing it imports torch, seconds in which the workers could
    already be starting (a factory that is there but fails is still reported, by the workers)."""
    from orchestrator.jobs.errors import SetupError

    ref = spec.model
    if ref.is_file:
        path = (spec.base_dir / ref.target).resolve()
        if not path.is_file():
            raise SetupError(f"model.factory: file {path} does not exist; paths are relative to the config file")
    elif importlib.util.find_spec(ref.target.partition(".")[0]) is None:
        raise SetupError(
            f"model.factory: cannot import module {ref.target!r}: no module named "
            f"{ref.target.partition('.')[0]!r} here; install it or use 'path/to/file.py:callable'"
        )


class FleetObserver(Protocol):
    """What the driver tells the CLI as the job goes (orchestrator.progress.FleetProgress)."""

    def line(self, text: str) -> None: ...

    def planned(self, buckets: list[int], units_per_bucket: int, ranks: int) -> None: ...

    def record(self, record: dict[str, Any]) -> None: ...  # every result record, as it comes

    def loaded(self, rank: int, bucket: int) -> None: ...


class Quiet:
    def line(self, text: str) -> None:
        pass

    def planned(self, buckets: list[int], units_per_bucket: int, ranks: int) -> None:
        pass

    def record(self, record: dict[str, Any]) -> None:
        pass

    def loaded(self, rank: int, bucket: int) -> None:
        pass


def run_on_ray(
    spec: WarmupSpec,
    cache_root: Path,
    remote: Remote,
    *,
    address: Optional[str] = None,
    ranks: Optional[int] = None,
    fresh: bool = False,
    observer: FleetObserver = Quiet(),
) -> FleetRun:
    import ray

    started = time.perf_counter()
    env = job_env_vars()
    owns_cluster = not ray.is_initialized() and address is None
    preflight(spec)
    if address and address != "auto":
        _probe(address)
    _join(ray, address, env)
    try:
        from orchestrator.jobs.errors import SetupError

        nodes = nodes_from_ray(ray.nodes())
        if spec.device == "cuda" and not any(n.gpus for n in nodes):
            raise SetupError("device 'cuda' was requested but the Ray cluster has no GPUs")
        try:
            planned = targets(nodes, ranks)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        units = compile_units(planned, spec.buckets)
        observer.line(
            f"ray: {len(nodes)} nodes, {len(planned)} ranks "
            f"({', '.join(sorted({t.gpu_class for t in planned}))}); compiling {len(units)} (class, bucket) units"
        )
        observer.planned(list(spec.buckets), len(units) // len(spec.buckets), len(planned))
        fleet = FleetRun(nodes, planned, units, _ObservedList(observer.record), address=address)
        fleet.wave_seconds["start"] = time.perf_counter() - started
        wave_started = time.perf_counter()
        _waves(ray, spec, cache_root, remote, fresh, units, planned, fleet, observer)
        fleet.wave_seconds["warm"] = time.perf_counter() - wave_started - fleet.wave_seconds["compile"]
        fleet.wall_seconds = time.perf_counter() - started
        return fleet
    finally:
        if owns_cluster:
            ray.shutdown()


def _join(ray: Any, address: Optional[str], env: dict[str, str]) -> None:
    if ray.is_initialized():
        return
    try:
        # "local": a new instance of our own, even where `ray start` left one running
        # (--ray-address auto joins that one instead)
        # Submitted as a Ray job, the job's own runtime_env already carries our variables, and
        # Ray refuses a second one that repeats them.
        as_job = "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ
        ray.init(
            address=address or "local",
            runtime_env=None if as_job else {"env_vars": env},
            log_to_driver=False,
            include_dashboard=False if address is None else None,
            configure_logging=False,
            # A new instance would start a worker per CPU for its first driver, all importing
            # Ray beside our processes; none would be used (each of ours is an actor of its own).
            _system_config={"prestart_worker_first_driver": False} if address is None else None,
        )
    except (ConnectionError, RuntimeError) as exc:
        raise ClusterUnreachable(
            f"cannot join the Ray cluster at {address or 'a new local instance'}: "
            f"{str(exc).splitlines()[0]}; check --ray-address, and RAY_AUTH_TOKEN where "
            "the cluster uses token authentication"
        ) from None


class _ObservedList(list):
    """The fleet's results; every record appended is also handed to an observer (live metrics)."""

    def __init__(self, observer: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._observer = observer

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        self._observer(record)


def _probe(address: str) -> None:
    """Ray retries an unreachable GCS for minutes; a plain TCP connect says the same in seconds."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        raise ClusterUnreachable(
            f"cannot join the Ray cluster at {address}: {exc}; check --ray-address "
            "(host:port of the head's GCS, or ray://host:10001)"
        ) from None


def _waves(
    ray: Any,
    spec: WarmupSpec,
    cache_root: Path,
    remote: Remote,
    fresh: bool,
    units: list[CompileUnit],
    planned: list[Target],
    fleet: FleetRun,
    observer: FleetObserver,
) -> None:
    """Both waves at once. Rank processes start with the compile units, so their interpreter,
    torch, CUDA and model set-up and the eager references overlap compiling; each rank loads a
    bucket the moment its unit has published it, and benchmarks once its GPU class has no unit
    left (compiling would steal the CPU that launches the kernels being timed)."""
    started = time.perf_counter()
    gpu_ranks = [t for t in planned if t.node.gpus]
    bundle = {t.rank: i for i, t in enumerate(gpu_ranks)}  # a GPU rank's bundle in the placement group
    group, compilers, ranks = None, {}, {}
    try:
        group = _reserve_gpus(gpu_ranks, units) if gpu_ranks else None
        compiler = ray.remote(**_PROCESS)(CompileWorker)
        for unit in units:
            # on its home rank's GPU, in that rank's bundle; without GPUs, spread over the CPUs
            placement = (
                {"num_gpus": unit.num_gpus, "scheduling_strategy": _in_bundle(group, bundle[unit.home])}
                if unit.home is not None
                else {"scheduling_strategy": "SPREAD"}
            )
            compilers[unit] = compiler.options(num_cpus=unit.num_cpus, **placement).remote()
        rank = ray.remote(**_PROCESS)(RankWorker)
        for target in planned:
            placement = (
                {"num_gpus": RANK_GPU_SHARE, "scheduling_strategy": _in_bundle(group, bundle[target.rank])}
                if target.rank in bundle
                else {"scheduling_strategy": _on_node(target.node)}
            )
            # no CPU reserved: a rank mostly waits, and a reserved CPU could starve the compile units
            ranks[target] = rank.options(num_cpus=0, **placement).remote(
                spec, str(cache_root), remote, target.rank, spare_cpu=has_spare_cpu(target, planned, units)
            )
        _drive(ray, spec, cache_root, remote, fresh, compilers, ranks, fleet, observer, started)
    finally:
        for actor in [*compilers.values(), *ranks.values()]:  # each holds a GPU share and memory until killed
            ray.kill(actor, no_restart=True)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)


def _drive(
    ray: Any,
    spec: WarmupSpec,
    cache_root: Path,
    remote: Remote,
    fresh: bool,
    compilers: dict[CompileUnit, Any],
    ranks: dict[Target, Any],
    fleet: FleetRun,
    observer: FleetObserver,
    started: float,
) -> None:
    """Take every answer as it comes. A published bucket is loaded by every rank of its class; a
    bucket whose unit failed is failed on those ranks, for the same reason. Once a class has no
    unit left compiling, its ranks benchmark (its units only ever run on its own nodes)."""
    waiting: dict[Any, tuple[str, Any]] = {
        actor.compile.remote(spec, str(cache_root), remote, fresh, unit.bucket, unit.compile_threads): ("compile", unit)
        for unit, actor in compilers.items()
    }
    waiting.update({actor.prepare.remote(): ("load", (target, None)) for target, actor in ranks.items()})
    compiling = Counter(unit.gpu_class for unit in compilers)
    failed: set[tuple[str, int]] = set()  # (class, bucket)

    def good(gpu_class: str) -> list[int]:
        return [b for b in spec.buckets if (gpu_class, b) not in failed]

    for (kind, what), outcome in _gather(ray, waiting):  # calls added to `waiting` below are waited for too
        if kind == "load":
            _loaded(what, outcome, observer)
            continue
        if kind == "finish":
            _finished(spec, what, outcome, good(what.gpu_class), fleet, observer.line)
            continue
        ray.kill(compilers[what], no_restart=True)  # its answer is in; its teardown need not be waited for
        error = _compiled(spec, what, outcome, fleet, observer.line)
        of_class = [t for t in ranks if t.gpu_class == what.gpu_class]
        for target in of_class:
            if error is None:
                waiting[ranks[target].load.remote(what.bucket)] = ("load", (target, what.bucket))
            else:
                failed.add((what.gpu_class, what.bucket))
                fleet.results.append(
                    _failed_record(spec, what.bucket, target.rank, target.gpu_class, "warm", f"not loaded: {error}")
                )
        compiling[what.gpu_class] -= 1
        if not compiling[what.gpu_class]:  # the class has stopped compiling: its ranks benchmark
            waiting.update({ranks[t].finish.remote(good(what.gpu_class)): ("finish", t) for t in of_class})
        if not +compiling:
            _raise_if_nothing_could_start(fleet, list(compilers))
            fleet.wave_seconds["compile"] = time.perf_counter() - started


def _reserve_gpus(gpu_ranks: list[Target], units: list[CompileUnit]) -> Any:
    """A placement group with one bundle per GPU rank: its GPU, pinned to its node, with the CPUs
    of the compile units dealt to it. A fraction of a bundle's GPU goes only to the actors
    scheduled in that bundle, so a rank and its units share exactly that GPU. Left to itself, Ray
    packs fractions first-fit: on a node with two GPUs the units fill one, the first rank takes the
    other, and the second rank finds no GPU to start on until the units have ended
    (docs/performance.md, "where the time goes: compile threads, GPU placement")."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = []
    for target in gpu_ranks:
        bundle = {"GPU": 1, f"node:{target.node.ip}": 0.001}
        cpus = sum(unit.num_cpus for unit in units if unit.home == target.rank)
        bundles.append({**bundle, "CPU": cpus} if cpus else bundle)
    group = placement_group(bundles, strategy="PACK")
    patience = float(os.environ.get("ORCHESTRATE_GPU_WAIT_SECONDS", "300"))  # other jobs may hold the GPUs
    if not group.wait(timeout_seconds=patience):
        remove_placement_group(group)
        raise ClusterUnreachable(
            f"could not reserve {len(gpu_ranks)} GPUs on the Ray cluster within {patience:g} s: "
            "other jobs hold them; wait for them, pass fewer --ranks, or raise "
            "ORCHESTRATE_GPU_WAIT_SECONDS"
        )
    return group


def _in_bundle(group: Any, index: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def _on_node(node: Node) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node.node_id, soft=False)


def _compiled(
    spec: WarmupSpec, unit: CompileUnit, outcome: Any, fleet: FleetRun, report: Callable[[str], None]
) -> Optional[str]:
    """Record one finished compile task; the error that failed its bucket, if any."""
    if isinstance(outcome, Exception):
        record = _failed_record(spec, unit.bucket, None, unit.gpu_class, "compile", _task_error("compile", outcome))
        fleet.results.append(record)
        fleet.compile_errors.append(outcome)
        report(f"compile bucket {unit.bucket} [{unit.gpu_class}]: FAILED {record['error']}")
        return record["error"]
    fleet.runs.append(
        {**outcome["run"], "wave": "compile", "rank": None, "bucket": unit.bucket, "answered_at": time.time()}
    )
    error = None
    for record in outcome["results"]:
        record.update(phase="compile", rank=None)
        fleet.results.append(record)
        published = outcome["run"]["publish"]
        if record["status"] != "ok":
            error = f"compile task failed at {record['error']}"
        elif not published:
            error = f"compile task could not publish: {outcome['run']['publish_error']}"
        report(
            f"compile bucket {unit.bucket} [{unit.gpu_class}] on {record['node']}: {record['status']}, "
            f"{_seconds(record['compile_seconds'])}, {record['cache_hits']} hits/{record['cache_misses']} misses"
            + (f", published generation {published['generation']}" if published else "")
            + (f" ({record['error']})" if record["error"] else "")
        )
    return error


def _raise_if_nothing_could_start(fleet: FleetRun, units: list[CompileUnit]) -> None:
    from orchestrator.jobs.errors import SetupError

    causes = [getattr(e, "cause", None) for e in fleet.compile_errors]
    setup = [c for c in causes if isinstance(c, SetupError)]
    if setup and len(setup) == len(units):
        raise SetupError(str(setup[0]))  # nothing could run anywhere: a config problem, exit 2


def _loaded(what: tuple[Target, Optional[int]], outcome: Any, observer: FleetObserver) -> None:
    target, bucket = what
    if bucket is None or not isinstance(outcome, dict):
        return  # set-up, or a failure that `finish` reports
    observer.loaded(target.rank, bucket)
    observer.line(
        f"rank {target.rank} ({target.node.ip}) loaded bucket {bucket}: {outcome['status']}, "
        f"{_seconds(outcome['compile_seconds'])}, {outcome['cache_hits']} hits/{outcome['cache_misses']} misses"
    )


def _finished(
    spec: WarmupSpec, target: Target, outcome: Any, buckets: list[int], fleet: FleetRun, report: Callable[[str], None]
) -> None:
    if isinstance(outcome, Exception):
        for bucket in buckets:
            fleet.results.append(
                _failed_record(spec, bucket, target.rank, target.gpu_class, "warm", _task_error("warm", outcome))
            )
        report(f"warm rank {target.rank} ({target.node.ip}): FAILED {outcome}")
        return
    fleet.runs.append(
        {**outcome["run"], "wave": "warm", "rank": target.rank, "bucket": None, "answered_at": time.time()}
    )
    ok = [r for r in outcome["results"] if r["status"] == "ok"]
    for record in outcome["results"]:
        record.update(phase="warm", rank=target.rank)
        fleet.results.append(record)
    pulled = outcome["run"]["pull"]
    speedups = [r["speedup"] for r in ok if r["speedup"]]
    report(
        f"warm rank {target.rank} ({target.node.ip}, {target.gpu_class}): {len(ok)}/{len(buckets)} ok, "
        f"pull {_seconds(pulled['seconds'] if pulled else None)}, "
        f"load {_seconds(sum(r['compile_seconds'] or 0 for r in ok))}, "
        f"misses {sum(r['cache_misses'] or 0 for r in ok)}"
        + (f", speedup {min(speedups):.2f}-{max(speedups):.2f}x" if speedups else "")
    )


def _gather(ray: Any, refs: dict[Any, Any]):
    """Yield (what, result-or-exception) as tasks finish, removing them from `refs`, until none is
    left; what the caller adds to `refs` meanwhile is waited for too. Ctrl-C cancels whatever
    still runs; that is safe for the store: a manifest is only ever created whole, after its shards."""
    try:
        while refs:
            # a bounded wait keeps the driver responsive to Ctrl-C
            done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
            for ref in done:
                what = refs.pop(ref)
                try:
                    yield what, ray.get(ref)
                except Exception as exc:  # the task raised, or its worker died more than TASK_RETRIES times
                    yield what, exc
    except KeyboardInterrupt:
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except ValueError:  # a rank's method: Ray cannot force those; the caller kills the rank
                pass
        raise


def _failed_record(
    spec: WarmupSpec, bucket: int, rank: Optional[int], gpu_class: str, phase: str, error: str
) -> dict[str, Any]:
    return BucketResult(
        bucket=bucket, rank=rank, gpu=gpu_class, phase=phase, status="failed", node="unknown", error=error
    ).to_dict()


def _task_error(phase: str, exc: Exception) -> str:
    from orchestrator.jobs.errors import brief

    return f"{phase} task: {brief(getattr(exc, 'cause', None) or exc)}"


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


# --- what runs on the workers ------------------------------------------------------------------


def _threads_as_a_plain_process() -> None:
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


def node_cache_root(cache_root: str) -> Path:
    import ray

    return Path(cache_root) / f"node-{ray.util.get_node_ip_address()}"


class CompileWorker:
    """One compile unit in a process of its own (a Ray actor), killed by the driver as soon as it
    has answered: an orderly exit (Inductor's worker pool, CUDA graphs, the CUDA context) would
    spend seconds of CPU beside the ranks for nothing."""

    def __init__(self) -> None:
        self._up = time.time()  # Ray's part of this process's start is over; torch is not imported yet
        _threads_as_a_plain_process()

    def compile(
        self, spec: WarmupSpec, cache_root: str, remote: Remote, fresh: bool, bucket: int, compile_threads: int
    ) -> dict[str, Any]:
        """Compile one bucket in a private directory and publish it. Private, because a publish
        snapshots the directory: in a shared one it could catch another compiler's half-written
        file (gcc writes its .so in place) and make it the namespace's permanent copy."""
        import shutil

        # read when torch is first imported, just below: this process is fresh (an actor of its own)
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads))
        from orchestrator.jobs.engine import Session

        root = node_cache_root(cache_root) / f".compile-b{bucket}-{uuid.uuid4().hex[:8]}"
        try:
            # kept on the actor, so that freeing the compiled code and graphs is left to the kill
            self._session = Session(
                spec.replaced(buckets=[bucket]),
                root,
                fresh=fresh,
                remote=remote,
                earlier_events=(("worker up", self._up),),
            )
            self._session.warm(bucket, benchmark=False)
            self._session.publish()
            return _as_dict(self._session.run())
        finally:
            shutil.rmtree(root, ignore_errors=True)


class RankWorker:
    """One rank for the whole job, in a process of its own (a Ray actor): it sets up while the
    compile wave runs, loads each bucket when told it is published, and benchmarks at the end.
    Every method may run in a restarted process (the worker died and Ray restarted it), so each
    one first makes sure what it builds on is there."""

    def __init__(self, spec: WarmupSpec, cache_root: str, remote: Remote, rank: int, spare_cpu: bool) -> None:
        self.spec, self.cache_root, self.remote, self.rank, self.spare_cpu = spec, cache_root, remote, rank, spare_cpu
        self._up = time.time()  # Ray's part of this process's start is over; torch is not imported yet
        # Read when torch is first imported (later, in this fresh process). A rank only loads:
        # Inductor's default would start a pool of a worker per CPU, each importing torch, at the
        # first load, for nothing, and beside the benchmarks.
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        _threads_as_a_plain_process()
        self._session: Any = None
        self._fatal: Optional[Exception] = None  # set-up or store failure: every bucket of the rank fails

    def prepare(self) -> None:
        """Everything that needs no artifact: imports, CUDA, the model, the eager references and,
        with a CPU to spare, each bucket's Dynamo trace and the compiler's own start, so that a
        load after a publish is only a cache hit. Without one (a 2-core CI machine), this work
        would slow down the compile units it shares the CPUs with, so the loads pay for it instead
        (docs/performance.md, "the 2-core CPU machine")."""

        def set_up(session: Any) -> None:
            from orchestrator.jobs import torch_internals as ti

            for bucket in self.spec.buckets:
                session.reference(bucket)
            session.event("references done")
            if self.spare_cpu:
                for bucket in self.spec.buckets:
                    session.trace(bucket)
                ti.prime_compiler(session.device)
                session.event("compiler primed")

        self._step(set_up)

    def load(self, bucket: int) -> Optional[dict[str, Any]]:
        def pull_and_load(session: Any) -> dict[str, Any]:
            session.pull()
            return session.warm(bucket, benchmark=False).to_dict()

        return self._step(pull_and_load)

    def finish(self, buckets: list[int]) -> dict[str, Any]:
        """Benchmark `buckets` (loading any this process has not: after a restart) and report."""
        if self._fatal is not None:
            raise self._fatal
        session = self._ready()
        if any(not session.loaded(b) for b in buckets):
            session.pull()
        for bucket in buckets:  # compiling has stopped: loading what is missing (cache hits) may interleave
            session.warm(bucket)
        return _as_dict(session.run(), buckets)

    def _ready(self) -> Any:
        from orchestrator.jobs.engine import Session

        if self._session is None:
            # Ranks of one node share its cache directory and only read the store: what they
            # load was compiled and published by the compile wave.
            self._session = Session(
                self.spec,
                node_cache_root(self.cache_root),
                rank=self.rank,
                remote=self.remote,
                trace_ahead=self.spare_cpu,
                earlier_events=(("worker up", self._up),),
            )
        return self._session

    def _step(self, work: Callable[[Any], Any]) -> Any:
        if self._fatal is not None:
            return None
        try:
            return work(self._ready())
        except Exception as exc:  # reported by `finish`, where the driver gathers the rank's outcome
            self._fatal = exc
            return None


def _gpu_ids(ray: Any) -> list[str]:
    if not ray.is_initialized():  # called outside a worker: asking would start Ray in this process
        return []
    return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def _as_dict(run: WarmupRun, buckets: Optional[list[int]] = None) -> dict[str, Any]:
    import ray

    ip, now = ray.util.get_node_ip_address(), time.time()
    results = [{**r.to_dict(), "node": ip} for r in run.results if buckets is None or r.bucket in buckets]
    meta = {
        "namespace": run.namespace,
        "platform": asdict(run.platform),
        "device": run.device,
        "node": ip,
        "pull": asdict(run.pull) if run.pull else None,
        "publish": asdict(run.publish) if run.publish else None,
        "publish_error": run.publish_error,
        "cache_bytes": run.cache_bytes,
        "cache_files": run.cache_files,
        "setup_seconds": run.setup_seconds,
        "process_age_at_start": run.process_age_at_start,
        # wall clock, for the job's timeline: from the process's start to its report
        "process_started_at": now - run.wall_seconds - (run.process_age_at_start or 0.0),
        "ended_at": now,
        "events": run.events,
        # the GPUs Ray gave this process (it sees them as cuda:0...): ranks must never share one
        "gpu_ids": _gpu_ids(ray),
    }
    return {"run": meta, "results": results}
