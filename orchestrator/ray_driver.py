"""Warmup across a Ray cluster: compile each (GPU class, bucket) once, then warm every rank.

Compile wave: one task per (class, bucket), spread over distinct workers so buckets compile in
parallel; each pulls what the store has, compiles its bucket, checks it and publishes. Warm
wave: one task per rank, pinned to its node with one whole GPU (so artifacts are always for
cuda:0); it pulls, loads (hits only), records CUDA graphs and benchmarks every bucket.

Workers keep their cache under `<cache root>/node-<ip>`: nodes of a test cluster share one
filesystem, and without the node key they would never need to pull.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from jobs.engine import Remote, WarmupRun
from jobs.spec import WarmupSpec
from orchestrator.errors import ClusterUnreachable
from orchestrator.plan import CompileUnit, Node, Target, compile_units, nodes_from_ray, targets

TASK_RETRIES = 2  # a worker that dies (OOM, preemption, kill) is retried this often
# Every task in a fresh process, as a new replica would be: a reused worker keeps Dynamo's
# in-memory code cache, so it would "load" without ever reading the cache it is meant to test.
_TASK = {"max_retries": TASK_RETRIES, "retry_exceptions": False, "max_calls": 1}
# Variables a worker needs to reach and trust the store; passed through runtime_env
_PASS_ENV = ("ORCHESTRATE_", "AWS_", "TORCHINDUCTOR_", "TRITON_")


@dataclass
class FleetRun:
    nodes: list[Node]
    targets: list[Target]
    units: list[CompileUnit]
    results: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)  # per task: namespace, platform, pull, publish
    wall_seconds: float = 0.0
    address: Optional[str] = None
    wave_seconds: dict[str, float] = field(default_factory=dict)  # "start", "compile", "warm" wall times


def preflight(spec: WarmupSpec, *, local_cluster: bool) -> None:
    """Fail in the driver, in a second, on what would fail every worker: an unimportable
    factory, or `device: cuda` on a local machine without a GPU."""
    from jobs.errors import SetupError
    from jobs.model import load_factory

    load_factory(spec.model, spec.base_dir)
    if local_cluster and spec.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SetupError("device 'cuda' was requested but torch sees no CUDA GPU here; "
                             "use --device cpu or auto, or --ray-address of a GPU cluster")


def run_on_ray(spec: WarmupSpec, cache_root: Path, remote: Remote, *, address: Optional[str] = None,
               ranks: Optional[int] = None, fresh: bool = False,
               report: Callable[[str], None] = lambda line: None,
               on_plan: Callable[[int, int], None] = lambda units, records: None,
               on_record: Callable[[dict[str, Any]], None] = lambda record: None) -> FleetRun:
    import ray

    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k.startswith(_PASS_ENV)}
    owns_cluster = not ray.is_initialized() and address is None
    if address and address != "auto":
        _probe(address)
    if not ray.is_initialized():
        try:
            # "local": a new instance of our own, even where `ray start` left one running
            # (--ray-address auto joins that one instead)
            # Submitted as a Ray job, the job's own runtime_env already carries our variables, and
            # Ray refuses a second one that repeats them.
            as_job = "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ
            ray.init(address=address or "local", runtime_env=None if as_job else {"env_vars": env},
                     log_to_driver=False, include_dashboard=False if address is None else None,
                     configure_logging=False)
        except (ConnectionError, RuntimeError) as exc:
            raise ClusterUnreachable(f"cannot join the Ray cluster at {address or 'a new local instance'}: "
                                     f"{str(exc).splitlines()[0]}; check --ray-address, and RAY_AUTH_TOKEN where "
                                     "the cluster uses token authentication") from None
    try:
        from jobs.errors import SetupError

        nodes = nodes_from_ray(ray.nodes())
        if spec.device == "cuda" and not any(n.gpus for n in nodes):
            raise SetupError("device 'cuda' was requested but the Ray cluster has no GPUs")
        try:
            planned = targets(nodes, ranks)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        units = compile_units(planned, spec.buckets)
        report(f"ray: {len(nodes)} nodes, {len(planned)} ranks "
               f"({', '.join(sorted({t.gpu_class for t in planned}))}); compiling {len(units)} (class, bucket) units")
        on_plan(len(units), len(planned) * len(spec.buckets))
        fleet = FleetRun(nodes, planned, units, _ObservedList(on_record), address=address)
        fleet.wave_seconds["start"] = time.perf_counter() - started
        wave_started = time.perf_counter()
        _compile_wave(ray, spec, cache_root, remote, fresh, units, fleet, report)
        fleet.wave_seconds["compile"] = time.perf_counter() - wave_started
        wave_started = time.perf_counter()
        _warm_wave(ray, spec, cache_root, remote, planned, fleet, report)
        fleet.wave_seconds["warm"] = time.perf_counter() - wave_started
        fleet.wall_seconds = time.perf_counter() - started
        return fleet
    finally:
        if owns_cluster:
            ray.shutdown()


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
        raise ClusterUnreachable(f"cannot join the Ray cluster at {address}: {exc}; check --ray-address "
                                 "(host:port of the head's GCS, or ray://host:10001)") from None


def _compile_wave(ray: Any, spec: WarmupSpec, cache_root: Path, remote: Remote, fresh: bool,
                  units: list[CompileUnit], fleet: FleetRun, report: Callable[[str], None]) -> None:
    task = ray.remote(**_TASK)(compile_bucket)
    refs = {}
    for unit in units:
        options: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
        if unit.num_gpus:
            options["num_gpus"] = unit.num_gpus
        if unit.gpu_class not in ("gpu", "cpu"):
            options["resources"] = {f"accelerator_type:{unit.gpu_class}": 0.001}
        refs[task.options(name=f"compile-{unit.gpu_class}-b{unit.bucket}", **options).remote(
            spec, str(cache_root), remote, fresh, unit.bucket)] = unit
    setup_errors = []
    for unit, outcome in _gather(ray, refs):
        if isinstance(outcome, Exception):
            if _is_setup_error(outcome):
                setup_errors.append(getattr(outcome, "cause", outcome))
            record = _failed_record(spec, unit.bucket, None, unit.gpu_class, "compile", outcome)
            fleet.results.append(record)
            report(f"compile bucket {unit.bucket} [{unit.gpu_class}]: FAILED {record['error']}")
            continue
        fleet.runs.append({**outcome["run"], "wave": "compile", "rank": None})
        for record in outcome["results"]:
            record.update(phase="compile", rank=None)
            fleet.results.append(record)
            published = outcome["run"]["publish"]
            report(f"compile bucket {unit.bucket} [{unit.gpu_class}] on {record['node']}: {record['status']}, "
                   f"{_seconds(record['compile_seconds'])}, {record['cache_hits']} hits/{record['cache_misses']} misses"
                   + (f", published generation {published['generation']}" if published else "")
                   + (f" ({record['error']})" if record["error"] else ""))
    if setup_errors and len(setup_errors) == len(units):
        from jobs.errors import SetupError

        raise SetupError(str(setup_errors[0]))  # nothing could run anywhere: a config problem, exit 2


def _is_setup_error(exc: Exception) -> bool:
    from jobs.errors import SetupError

    return isinstance(getattr(exc, "cause", None), SetupError)


def _warm_wave(ray: Any, spec: WarmupSpec, cache_root: Path, remote: Remote, planned: list[Target],
               fleet: FleetRun, report: Callable[[str], None]) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(**_TASK)(warm_rank)
    refs = {}
    for target in planned:
        options: dict[str, Any] = {
            "num_cpus": 1, "scheduling_strategy": NodeAffinitySchedulingStrategy(target.node.node_id, soft=False)}
        if target.node.gpus:
            options["num_gpus"] = 1  # one visible device per process: artifacts for cuda:0
        refs[task.options(name=f"warm-rank{target.rank}", **options).remote(
            spec, str(cache_root), remote, target.rank)] = target
    for target, outcome in _gather(ray, refs):
        if isinstance(outcome, Exception):
            for bucket in spec.buckets:
                fleet.results.append(_failed_record(spec, bucket, target.rank, target.gpu_class, "warm", outcome))
            report(f"warm rank {target.rank} ({target.node.ip}): FAILED {outcome}")
            continue
        fleet.runs.append({**outcome["run"], "wave": "warm", "rank": target.rank})
        ok = [r for r in outcome["results"] if r["status"] == "ok"]
        for record in outcome["results"]:
            record.update(phase="warm", rank=target.rank)
            fleet.results.append(record)
        pulled = outcome["run"]["pull"]
        speedups = [r["speedup"] for r in ok if r["speedup"]]
        report(f"warm rank {target.rank} ({target.node.ip}, {target.gpu_class}): {len(ok)}/{len(spec.buckets)} ok, "
               f"pull {_seconds(pulled['seconds'] if pulled else None)}, "
               f"load {_seconds(sum(r['compile_seconds'] or 0 for r in ok))}, "
               f"misses {sum(r['cache_misses'] or 0 for r in ok)}"
               + (f", speedup {min(speedups):.2f}-{max(speedups):.2f}x" if speedups else ""))


def _gather(ray: Any, refs: dict[Any, Any]):
    """Yield (what, result-or-exception) as tasks finish; Ctrl-C cancels whatever still runs.
    Cancelling is safe for the store: a manifest is only ever created whole, after its shards."""
    pending = list(refs)
    try:
        while pending:
            # a bounded wait keeps the driver responsive to Ctrl-C
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in done:
                try:
                    yield refs[ref], ray.get(ref)
                except Exception as exc:  # the task raised, or its worker died more than TASK_RETRIES times
                    yield refs[ref], exc
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _failed_record(spec: WarmupSpec, bucket: int, rank: Optional[int], gpu_class: str, phase: str,
                   exc: Exception) -> dict[str, Any]:
    from jobs.engine import BucketResult
    from jobs.errors import brief

    cause = getattr(exc, "cause", None) or exc
    record = BucketResult(bucket=bucket, rank=rank, gpu=gpu_class, phase=phase, status="failed", node="unknown",
                          error=f"{phase} task: {brief(cause)}").to_dict()
    return record


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


# --- what runs on the workers ------------------------------------------------------------------


def node_cache_root(cache_root: str) -> Path:
    import ray

    return Path(cache_root) / f"node-{ray.util.get_node_ip_address()}"


def compile_bucket(spec: WarmupSpec, cache_root: str, remote: Remote, fresh: bool, bucket: int) -> dict[str, Any]:
    """Compile one bucket in a private directory and publish it. Private, because a publish
    snapshots the directory: in a shared one it could catch another compiler's half-written
    file (gcc writes its .so in place) and make it the namespace's permanent copy."""
    import shutil

    from jobs.engine import run_warmup

    root = node_cache_root(cache_root) / f".compile-b{bucket}-{uuid.uuid4().hex[:8]}"
    try:
        return _as_dict(run_warmup(spec.replaced(buckets=[bucket]), root, fresh=fresh, remote=remote,
                                   benchmark=False))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def warm_rank(spec: WarmupSpec, cache_root: str, remote: Remote, rank: int) -> dict[str, Any]:
    from jobs.engine import run_warmup

    # Ranks of one node share its cache directory and only read the store: what they load was
    # compiled and published by the compile wave.
    return _as_dict(run_warmup(spec, node_cache_root(cache_root), rank=rank, remote=remote, publish=False))


def _as_dict(run: WarmupRun) -> dict[str, Any]:
    import ray

    ip = ray.util.get_node_ip_address()
    results = [{**r.to_dict(), "node": ip} for r in run.results]
    meta = {"namespace": run.namespace, "platform": asdict(run.platform), "device": run.device, "node": ip,
            "pull": asdict(run.pull) if run.pull else None, "publish": asdict(run.publish) if run.publish else None,
            "publish_error": run.publish_error, "cache_bytes": run.cache_bytes, "cache_files": run.cache_files,
            "setup_seconds": run.setup_seconds, "process_age_at_start": run.process_age_at_start}
    return {"run": meta, "results": results}
