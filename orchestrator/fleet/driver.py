"""Warmup across a Ray cluster: compile each (GPU class, bucket) once, then warm every rank.
A grid's points fan out the same way, every point of every slice at once.

Compile wave: one process per (class, bucket), dealt over the ranks' GPUs (reserved in a
placement group) so buckets compile in parallel; each compiles its bucket, checks it and
publishes. Warm wave: one process per rank, seeing one GPU (so artifacts are always for cuda:0),
which it shares with the compile units dealt to it. Both start together:
a rank sets up while the compile wave runs, pulls and loads each bucket (hits only) as soon as
it is published, and records CUDA graphs and benchmarks once compiling has stopped.

The workers themselves (orchestrator.jobs.workers) are plain classes; this module makes each an
actor, and gathers their answers into a FleetRun for the report.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import logging.handlers
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, Protocol

from orchestrator.errors import ClusterUnreachable
from orchestrator.fleet.job_env import job_env_vars, note_withheld, send_the_ray_token_given
from orchestrator.fleet.plan import (
    RANK_GPU_SHARE,
    CompileUnit,
    Node,
    Target,
    compile_units,
    has_spare_cpu,
    nodes_from_ray,
    targets,
)
from orchestrator.fleet.run import FleetRun, TaskRun
from orchestrator.jobs.records import BucketResult, Remote, WorkerAnswer
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.jobs.workers import ENDS_THE_JOB, CompileWorker, FleetJob, Host, RankWorker, tidy_node

TASK_RETRIES = 2  # a worker that dies (OOM, preemption, kill) is restarted, and its call retried, this often
# Every compile unit and every rank is an actor, a process of its own as a new replica's would be:
# a reused worker keeps Dynamo's in-memory code cache, so it would "load" without ever reading the
# cache it is meant to test.
_PROCESS = {"max_restarts": TASK_RETRIES, "max_task_retries": TASK_RETRIES}
TIDY_SECONDS = 30  # for killed workers to be gone, then for each node's tidy_node


def preflight(spec: WarmupSpec) -> None:
    """Fail in the driver, at once, on what would fail every worker: a factory that is not there.
    Only located, not imported: importing it imports torch, seconds in which the workers could
    already be starting (a factory that is there but fails is still reported, by the workers)."""
    from orchestrator.jobs.errors import SetupError, install_hint
    from orchestrator.jobs.spec import check_inputs_fit

    check_inputs_fit(spec)
    ref = spec.model
    if ref.is_file:
        path = (spec.base_dir / ref.target).resolve()
        if not path.is_file():
            raise SetupError(f"model.factory: file {path} does not exist; paths are relative to the config file")
    elif importlib.util.find_spec(ref.target.partition(".")[0]) is None:
        raise SetupError(
            f"model.factory: cannot import module {ref.target!r}: no module named "
            f"{ref.target.partition('.')[0]!r} here; {install_hint(ref.target)}"
        )


class FleetObserver(Protocol):
    """What the driver tells the CLI as the job goes (orchestrator.progress.FleetProgress)."""

    def line(self, text: str) -> None: ...

    # points: each bucket's label (`8`), or each point's of a grid (`8x64`)
    def planned(self, points: list[str], units_per_point: int, ranks: int) -> None: ...

    def record(self, record: BucketResult) -> None: ...  # every bucket record, as it comes

    def loaded(self, rank: int, point: str) -> None: ...


class Quiet:
    def line(self, text: str) -> None:
        pass

    def planned(self, points: list[str], units_per_point: int, ranks: int) -> None:
        pass

    def record(self, record: BucketResult) -> None:
        pass

    def loaded(self, rank: int, point: str) -> None:
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
    profile_dir: Optional[Path] = None,
) -> list[FleetRun]:
    """One FleetRun per slice of the spec (WarmupSpec.slices: the list form is its own one), all
    from one run of both waves."""
    import ray

    started = time.perf_counter()
    env = job_env_vars()
    # a connection of our own (a new local instance, or a cluster joined) ends with the job: left
    # open, Ray's messages about the killed workers would reach the screen after the run's log
    connects = not ray.is_initialized()
    preflight(spec)
    if address and address != "auto":
        _probe(address)
    _join(ray, address, env, observer.line)
    try:
        from orchestrator.jobs.errors import SetupError

        nodes = nodes_from_ray(ray.nodes())
        if spec.device == "cuda" and not any(n.gpus for n in nodes):
            raise SetupError("device 'cuda' was requested but the Ray cluster has no GPUs")
        try:
            planned = targets(nodes, ranks)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        parts = spec.slices()
        units = compile_units(planned, spec.buckets, [part.buckets for part in parts] if spec.grid else None)
        observer.line(
            f"ray: {len(nodes)} nodes, {len(planned)} ranks "
            f"({', '.join(sorted({t.gpu_class for t in planned}))}); compiling {len(units)} "
            f"(class, {'point' if spec.grid else 'bucket'}) units"
        )
        points = [part.point_label(bucket) for part in parts for bucket in part.buckets]
        observer.planned(points, len(units) // len(points), len(planned))
        fleets = [
            FleetRun(nodes, planned, [u for u in units if u.part == i], address=address) for i in range(len(parts))
        ]
        start_seconds = time.perf_counter() - started
        wave_started = time.perf_counter()
        jobs = [FleetJob(part, Path(cache_root), remote, ray_host, profile_dir=profile_dir) for part in parts]
        driver = FleetDriver(ray, jobs, fresh, observer, fleets)
        driver.run()
        ended = time.perf_counter()
        for fleet in fleets:  # one run: every slice's waves are the same
            fleet.wave_seconds.update(
                start=start_seconds, compile=driver.compile_seconds, warm=ended - wave_started - driver.compile_seconds
            )
            fleet.wall_seconds = ended - started
        return fleets
    finally:
        if connects:
            ray.shutdown()


@contextlib.contextmanager
def joined(address: Optional[str], say: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Ray started or joined once for several runs (a grid's slices); left as found at the end."""
    import ray

    connects = not ray.is_initialized()
    if connects and address and address != "auto":
        _probe(address)
    _join(ray, address, job_env_vars(), say)
    try:
        yield
    finally:
        if connects:
            ray.shutdown()


def ray_host() -> Host:
    """Where the calling worker runs, as Ray names it; handed to the workers as their `locate`."""
    import ray

    gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return Host(ray.util.get_node_ip_address(), [str(i) for i in gpu_ids])


DRIVER_LOG = "orchestrate-driver.log"  # in the Ray session's logs directory, beside Ray's own


def _join(ray: Any, address: Optional[str], env: dict[str, str], say: Optional[Callable[[str], None]] = None) -> None:
    """Start or join Ray; `say` names, once, the file its log records go to (default: stderr)."""
    if ray.is_initialized():
        return
    send_the_ray_token_given()
    with _ray_logs_held() as held:
        _init(ray, address, env)
    _write_ray_logs_to_session(ray, held, say)


def _init(ray: Any, address: Optional[str], env: dict[str, str]) -> None:
    try:
        # "local": a new instance of our own, even where `ray start` left one running
        # (--ray-address auto joins that one instead)
        # Submitted as a Ray job, the job's own runtime_env already carries our variables, and
        # Ray refuses a second one that repeats them.
        as_job = "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ
        # A local instance of our own starts its raylet from this process, so its workers inherit
        # our environment, credentials included; the runtime_env carries only job_env's
        # allow-list, which Ray keeps in its records. A cluster's workers are not our children:
        # what job_env withholds, they get from their own nodes.
        if address is not None and not as_job:
            note_withheld()
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


@contextlib.contextmanager
def _ray_logs_held() -> Iterator[logging.handlers.MemoryHandler]:
    """Ray's Python loggers (the token-authentication banner at init, task retries, dead workers)
    would print to stderr, burying the progress lines with what means nothing to the user. While
    Ray starts they are held in memory: `ray.init(configure_logging=False)` clears the "ray"
    logger's handlers (the one `import ray` gave it prints to stderr) and its records then fall
    to logging.lastResort, which is the holder for that time. Once the session exists they go to
    a file in its logs directory (_write_ray_logs_to_session)."""
    held = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        ray_logger.removeHandler(handler)
    ray_logger.addHandler(held)
    ray_logger.propagate = False
    saved, logging.lastResort = logging.lastResort, held
    try:
        yield held
    finally:
        logging.lastResort = saved
        ray_logger.removeHandler(held)


def _write_ray_logs_to_session(
    ray: Any, held: logging.handlers.MemoryHandler, say: Optional[Callable[[str], None]]
) -> None:
    """Send what Ray logged so far, and all it logs from now, to the session's DRIVER_LOG, and name
    that file once on stderr. A session without a local directory keeps them in a temporary file."""
    import tempfile

    node = getattr(ray._private.worker, "_global_node", None)
    logs = Path(node.get_logs_dir_path()) if node is not None else Path(tempfile.gettempdir())
    path = logs / DRIVER_LOG
    try:
        to_file: logging.Handler = logging.FileHandler(path)
    except OSError:  # the records stay in memory: off the screen either way
        logging.getLogger("ray").addHandler(held)
        return
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    held.setTarget(to_file)
    held.flush()
    logging.getLogger("ray").addHandler(to_file)
    line = f"Ray's log records: {path}"
    if say:
        say(line)
    else:
        print(f"orchestrate: {line}", file=sys.stderr, flush=True)


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


class FleetDriver:
    """One fleet warmup on a joined cluster, from the planned units and ranks to the last answer.
    `jobs` and `fleets`: one per slice of a grid (one for the list form); the units and ranks are
    the first fleet's, every slice's units together."""

    def __init__(
        self, ray: Any, jobs: list[FleetJob], fresh: bool, observer: FleetObserver, fleets: list[FleetRun]
    ) -> None:
        self.ray, self.jobs, self.fresh, self.observer, self.fleets = ray, jobs, fresh, observer, fleets
        self.nodes, self.targets = fleets[0].nodes, fleets[0].targets  # the same in every slice's run
        self.units = [unit for fleet in fleets for unit in fleet.units]
        self.compile_errors: list[Exception] = []
        self.compile_seconds = 0.0

    def run(self) -> None:
        """Both waves at once. Rank processes start with the compile units, so their interpreter,
        torch, CUDA and model set-up and the eager references overlap compiling; each rank loads a
        bucket the moment its unit has published it, and benchmarks once its GPU class has no unit
        left (compiling would steal the CPU that launches the kernels being timed)."""
        ray, units, planned = self.ray, self.units, self.targets
        started = time.perf_counter()
        gpu_ranks = [t for t in planned if t.node.gpus]
        bundle = {t.rank: i for i, t in enumerate(gpu_ranks)}  # a GPU rank's bundle in the placement group
        group, compilers, ranks = None, {}, {}
        self.lost_a_worker = False  # a call ended in an exception: its worker may have died before its clean-up
        ended = False
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
                compilers[unit] = compiler.options(num_cpus=unit.num_cpus, **placement).remote(self.jobs[unit.part])
            rank = ray.remote(**_PROCESS)(RankWorker)
            for target in planned:
                placement = (
                    {"num_gpus": RANK_GPU_SHARE, "scheduling_strategy": _in_bundle(group, bundle[target.rank])}
                    if target.rank in bundle
                    else {"scheduling_strategy": _on_node(target.node)}
                )
                # no CPU reserved: a rank mostly waits, and a reserved CPU could starve the compile units
                ranks[target] = rank.options(num_cpus=0, **placement).remote(
                    self.jobs,
                    target.rank,
                    spare_cpu=has_spare_cpu(target, planned, units),
                    publish_plans=target.rank == min(t.rank for t in planned if t.gpu_class == target.gpu_class),
                )
            self._drive(compilers, ranks, started)
            ended = True
        finally:
            actors = [*compilers.values(), *ranks.values()]
            for actor in actors:  # each holds a GPU share and memory until killed
                ray.kill(actor, no_restart=True)
            if actors and (not ended or self.lost_a_worker):
                self._tidy(actors)
            if group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(group)

    def _drive(self, compilers: dict[CompileUnit, Any], ranks: dict[Target, Any], started: float) -> None:
        """Take every answer as it comes. A published bucket is loaded by every rank of its class; a
        bucket whose unit failed is failed on those ranks, for the same reason. Once a class has no
        unit left compiling, its ranks benchmark (its units only ever run on its own nodes)."""
        waiting: dict[Any, tuple[str, Any]] = {
            actor.compile.remote(unit.bucket, unit.compile_threads, self.fresh): ("compile", unit)
            for unit, actor in compilers.items()
        }
        waiting.update({actor.prepare.remote(): ("load", (target, 0, None)) for target, actor in ranks.items()})
        compiling = Counter(unit.gpu_class for unit in compilers)
        failed: set[tuple[str, int, int]] = set()  # (class, slice, bucket)

        def good(gpu_class: str) -> list[list[int]]:
            return [
                [b for b in job.spec.buckets if (gpu_class, part, b) not in failed]
                for part, job in enumerate(self.jobs)
            ]

        for (kind, what), outcome in _gather(self.ray, waiting):  # calls added to `waiting` below are waited for too
            if isinstance(outcome, Exception):
                self.lost_a_worker = True
                cause = getattr(outcome, "cause", None)
                if isinstance(cause, ENDS_THE_JOB):  # as in one process: the job stops, with the store's one line
                    raise cause
            if kind == "load":
                target, part, bucket = what
                self._loaded(target, part, bucket, outcome)
                continue
            if kind == "finish":
                self._finished(what, outcome, good(what.gpu_class))
                continue
            self.ray.kill(compilers[what], no_restart=True)  # its answer is in; its teardown need not be waited for
            error = self._compiled(what, outcome)
            of_class = [t for t in ranks if t.gpu_class == what.gpu_class]
            for target in of_class:
                if error is None:
                    load = ranks[target].load.remote(what.bucket, what.part)
                    waiting[load] = ("load", (target, what.part, what.bucket))
                else:
                    failed.add((what.gpu_class, what.part, what.bucket))
                    self._result(
                        what.part,
                        self._failed_record(
                            what.part, what.bucket, target.rank, target.gpu_class, "warm", f"not loaded: {error}",
                            target.node.ip,
                        ),
                    )  # fmt: skip
            compiling[what.gpu_class] -= 1
            if not compiling[what.gpu_class]:  # the class has stopped compiling: its ranks benchmark
                waiting.update({ranks[t].finish.remote(good(what.gpu_class)): ("finish", t) for t in of_class})
            if not +compiling:
                self._raise_if_nothing_could_start(list(compilers))
                self.compile_seconds = time.perf_counter() - started

    def _tidy(self, actors: list[Any]) -> None:
        """Once the killed workers are gone, remove what they left on each node (tidy_node). Best
        effort and bounded: what is left is scratch, never a cache entry (those are whole or absent)."""
        ray = self.ray
        try:
            gone = [actor.__ray_ready__.remote() for actor in actors]  # fails once the actor is dead
            ray.wait(gone, num_returns=len(gone), timeout=TIDY_SECONDS)
            tidy = ray.remote(num_cpus=0, max_retries=0)(tidy_node)
            done = [
                tidy.options(scheduling_strategy=_on_node(node)).remote(job) for node in self.nodes for job in self.jobs
            ]
            ray.wait(done, num_returns=len(done), timeout=TIDY_SECONDS)
        except Exception as exc:  # the job's own outcome matters more than its scratch
            logging.getLogger("ray").warning("tidying the nodes after the job failed: %s", exc)

    def _result(self, part: int, record: BucketResult) -> None:
        self.fleets[part].results.append(record)
        self.observer.record(record)

    def _failed_record(
        self, part: int, bucket: int, rank: Optional[int], gpu_class: str, phase: str, error: str, node: str = "unknown"
    ) -> BucketResult:
        """A record the driver writes for a task that gave none: a rank's node is known, a compile
        task's (placed by Ray) is not."""
        return BucketResult(
            bucket=bucket,
            point=self.jobs[part].spec.point_of(bucket),
            rank=rank,
            gpu=gpu_class,
            phase=phase,
            status="failed",
            node=node,
            error=error,
        )

    def _label(self, part: int, bucket: int) -> str:
        """`bucket 8`, or a grid's `point 8x64`, for the progress lines."""
        spec = self.jobs[part].spec
        return f"point {spec.point_label(bucket)}" if spec.fixed else f"bucket {bucket}"

    def _compiled(self, unit: CompileUnit, outcome: WorkerAnswer | Exception) -> Optional[str]:
        """Record one finished compile task; the error that failed its bucket, if any."""
        report = self.observer.line
        name = self._label(unit.part, unit.bucket)
        if isinstance(outcome, Exception):
            record = self._failed_record(
                unit.part, unit.bucket, None, unit.gpu_class, "compile", _task_error("compile", outcome)
            )
            self._result(unit.part, record)
            self.compile_errors.append(outcome)
            report(f"compile {name} [{unit.gpu_class}]: FAILED {record.error}")
            return record.error
        run = outcome.run
        self.fleets[unit.part].runs.append(TaskRun(run, "compile", None, unit.bucket, time.time()))
        error = None
        for record in outcome.results:
            record.phase, record.rank = "compile", None
            self._result(unit.part, record)
            if record.status != "ok":
                error = f"compile task failed at {record.error}"
            elif not run.publish:
                error = f"compile task could not publish: {run.publish_error}"
            report(
                f"compile {name} [{unit.gpu_class}] on {record.node}: {record.status}, "
                f"{_seconds(record.compile_seconds)}, {_lookups(record)}"
                + (_published(run.publish) if run.publish else "")
                + (f" ({record.error})" if record.error else "")
            )
        return error

    def _raise_if_nothing_could_start(self, units: list[CompileUnit]) -> None:
        from orchestrator.jobs.errors import SetupError

        causes = [getattr(e, "cause", None) for e in self.compile_errors]
        setup = [c for c in causes if isinstance(c, SetupError)]
        if setup and len(setup) == len(units):
            raise SetupError(str(setup[0]))  # nothing could run anywhere: a config problem, exit 2

    def _loaded(self, target: Target, part: int, bucket: Optional[int], outcome: Any) -> None:
        if bucket is None or not isinstance(outcome, BucketResult):
            return  # set-up, or a failure that `finish` reports
        self.observer.loaded(target.rank, self.jobs[part].spec.point_label(bucket))
        self.observer.line(
            f"rank {target.rank} ({target.node.ip}) loaded {self._label(part, bucket)}: {outcome.status}, "
            f"{_seconds(outcome.compile_seconds)}, {_lookups(outcome)}"
        )

    def _finished(self, target: Target, outcome: list[WorkerAnswer] | Exception, buckets: list[list[int]]) -> None:
        report = self.observer.line
        if isinstance(outcome, Exception):
            for part, of_part in enumerate(buckets):
                for bucket in of_part:
                    self._result(
                        part,
                        self._failed_record(
                            part, bucket, target.rank, target.gpu_class, "warm", _task_error("warm", outcome),
                            target.node.ip,
                        ),
                    )  # fmt: skip
            report(f"warm rank {target.rank} ({target.node.ip}): FAILED {outcome}")
            return
        ok: list[BucketResult] = []
        pulls = []
        for part, answered in enumerate(outcome):
            run = answered.run
            self.fleets[part].runs.append(TaskRun(run, "warm", target.rank, None, time.time()))
            pulls.append(run.pull.seconds if run.pull else None)
            ok += [r for r in answered.results if r.status == "ok"]
            for record in answered.results:
                record.phase, record.rank = "warm", target.rank
                self._result(part, record)
        speedups = [r.served_speedup for r in ok if r.served_speedup]
        pulled = [p for p in pulls if p is not None]
        report(
            f"warm rank {target.rank} ({target.node.ip}, {target.gpu_class}): "
            f"{len(ok)}/{sum(len(b) for b in buckets)} ok, "
            f"pull {_seconds(sum(pulled) if pulled else None)}, "
            f"load {_seconds(sum(r.compile_seconds or 0 for r in ok))}, "
            f"misses {sum(r.cache_misses or 0 for r in ok)}"
            + (f", served {min(speedups):.2f}-{max(speedups):.2f}x eager" if speedups else "")
        )


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


def _lookups(record: BucketResult) -> str:
    """The cache counts of a record, or that it made no lookup (it failed before compiling)."""
    if record.cache_hits is None or record.cache_misses is None:
        return "no cache lookups"
    return f"{record.cache_hits} hits/{record.cache_misses} misses"


def _task_error(phase: str, exc: Exception) -> str:
    from orchestrator.jobs.errors import brief

    return f"{phase} task: {brief(getattr(exc, 'cause', None) or exc)}"


def _published(transfer: Any) -> str:
    """A compile unit's publish: a new generation, or the one that stands where it added nothing
    (the report's "nothing new to publish" then agrees)."""
    if transfer.files == 0:
        return f", nothing new to publish (generation {transfer.generation} stands)"
    return f", published generation {transfer.generation}"


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"
