"""Prometheus metrics of a warmup: what it cost to compile, how warm the cache was, what it bought.

A batch job: values are pushed to a Pushgateway at the end (`pushadd`, never a per-rank instance
label), and can be scraped from `--metrics-port` while a long run goes. Every pushed value is a
gauge of the run that pushed it: `pushadd` replaces a whole metric family of its group, so a
counter would restart at every run and `rate()` over it would mean nothing.

Grouping rule (docs/metrics.md): what a run learned on a GPU class is pushed in the group
{job, model, gpu}, one group per class of the run, so warmups of one model on two classes never
overwrite each other. A run that fails before it knows any class (setup or store error) pushes
{job, model, gpu="unknown"}; a run that knows its classes deletes that group (and the class-less
{job, model} group of earlier versions), so a fixed setup failure stops alerting.

Labels are bounded: model, bucket, mode, cache state, GPU class. Across ranks of one bucket the
median is exported; per-rank detail stays in the JSON report.

The Grafana dashboard (k8s/monitoring/dashboard.py) queries these names; a test checks that
every metric it queries is one this module or orchestrator.serving.metrics exports, and that each
panel returns data.
"""

from __future__ import annotations

import importlib.metadata
import platform as host_platform
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any, Optional

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    delete_from_gateway,
    pushadd_to_gateway,
    start_http_server,
)

from orchestrator.jobs.records import BucketResult, point_label

JOB = "orchestrate_warmup"
UNKNOWN_GPU = "unknown"  # the class of a run that failed before it learned one
PACKAGE = "torch-warmup-orchestrator"
# Cold compiles of big models take minutes; the top finite bucket is 20 minutes.
COMPILE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
_BUCKET_LABELS = ("model", "bucket", "mode", "gpu")
_RUN_LABELS = ("model", "gpu")
BUILD_INFO_LABELS = ("model", "version", "torch", "triton", "cuda", "python", "gpu")


class _Group:
    """The values one push sends for one GPU class: a registry of its own, so that each class's
    group on the gateway holds its own values and nothing of another class's."""

    def __init__(self, model: str, mode: str, gpu: str) -> None:
        self.model, self.mode, self.gpu = model, mode, gpu
        self.registry = r = CollectorRegistry()
        self.compile_seconds = Gauge(
            "orchestrate_compile_seconds",
            "First compiled call of a bucket: trace and compile (cold) or cache load (warm); median across ranks",
            (*_BUCKET_LABELS, "cache"),
            registry=r,
        )
        self.compile_duration = Histogram(
            "orchestrate_compile_duration_seconds",
            "First compiled calls of the last run on this GPU class, every rank and bucket (one run's distribution)",
            ("model", "mode", "gpu", "cache"),
            buckets=COMPILE_BUCKETS,
            registry=r,
        )
        self.graph_record_seconds = Gauge(
            "orchestrate_graph_record_seconds",
            "CUDA-graph warm-up and recording calls of a bucket",
            _BUCKET_LABELS,
            registry=r,
        )
        self.latency_seconds = Gauge(
            "orchestrate_latency_seconds", "Median per-call latency", (*_BUCKET_LABELS, "variant"), registry=r
        )
        self.speedup_ratio = Gauge(
            "orchestrate_speedup_ratio", "Median eager latency / median compiled latency", _BUCKET_LABELS, registry=r
        )
        self.cache_hits = Gauge(
            "orchestrate_cache_hits",
            "FX-graph and AOTAutograd cache hits of a bucket's first calls in the last run",
            _BUCKET_LABELS,
            registry=r,
        )
        self.cache_misses = Gauge(
            "orchestrate_cache_misses",
            "FX-graph and AOTAutograd cache misses of a bucket's first calls in the last run",
            _BUCKET_LABELS,
            registry=r,
        )
        self.graph_breaks = Gauge(
            "orchestrate_graph_breaks", "Dynamo graph breaks of a bucket's first call", _BUCKET_LABELS, registry=r
        )
        self.recompiles = Gauge(
            "orchestrate_recompiles", "Dynamo recompiles after a bucket's first call", _BUCKET_LABELS, registry=r
        )
        self.bucket_failures = Gauge(
            "orchestrate_bucket_failures",
            "Bucket records of the last run on this GPU class that failed",
            _RUN_LABELS,
            registry=r,
        )
        self.cache_bytes = Gauge(
            "orchestrate_cache_bytes", "Size of the local cache namespace after the last run", _RUN_LABELS, registry=r
        )
        self.transfer_seconds = Gauge(
            "orchestrate_cache_transfer_seconds",
            "Time the last run took to pull from or publish to the store",
            (*_RUN_LABELS, "direction"),
            registry=r,
        )
        self.transfer_bytes = Gauge(
            "orchestrate_cache_transfer_bytes",
            "Bytes the last run pulled from or published to the store",
            (*_RUN_LABELS, "direction"),
            registry=r,
        )
        self.job_duration = Gauge(
            "orchestrate_job_duration_seconds", "Wall time of the last run", _RUN_LABELS, registry=r
        )
        self.last_run = Gauge(
            "orchestrate_last_run_timestamp_seconds", "When the last run ended", _RUN_LABELS, registry=r
        )
        self.last_run_success = Gauge(
            "orchestrate_last_run_success",
            "1 if every bucket of the last run on this GPU class was ok",
            _RUN_LABELS,
            registry=r,
        )
        # Registered only on success (see success()): pushadd then leaves a failed run's older value alone.
        self.last_success = Gauge(
            "orchestrate_last_success_timestamp_seconds",
            "When a run last succeeded on this GPU class",
            _RUN_LABELS,
            registry=None,
        )
        self.build_info = Gauge(
            "orchestrate_build_info", "1, labelled with the versions the last run used", BUILD_INFO_LABELS, registry=r
        )

    def ended(self, wall_seconds: float, ok: bool, platform: Optional[Mapping[str, Any]], now: float) -> None:
        labels = (self.model, self.gpu)
        self.job_duration.labels(*labels).set(wall_seconds)
        self.last_run.labels(*labels).set(now)
        self.last_run_success.labels(*labels).set(1 if ok else 0)
        self.build_info.labels(**build_info_labels(self.model, self.gpu, platform)).set(1)
        if ok:
            self.registry.register(self.last_success)
            self.last_success.labels(*labels).set(now)

    def buckets(self, records: list[dict[str, Any]]) -> None:
        # a bucket's label: its size, or a grid's point as `8x64`
        by_label: dict[str, list[dict[str, Any]]] = {}
        for r in sorted(records, key=lambda r: tuple((r.get("point") or {"b": r["bucket"]}).values())):
            by_label.setdefault(point_label(r), []).append(r)
        for label, mine in by_label.items():
            self._bucket(label, mine)
        for r in records:
            if r["compile_seconds"] is not None:
                self.compile_duration.labels(self.model, self.mode, self.gpu, _cache(r["cache_state"])).observe(
                    r["compile_seconds"]
                )

    def _bucket(self, bucket: str, records: list[dict[str, Any]]) -> None:
        labels = (self.model, bucket, self.mode, self.gpu)
        ok = [r for r in records if r["status"] == "ok"]
        for cache in ("cold", "warm"):
            seconds = [r["compile_seconds"] for r in ok if _cache(r["cache_state"]) == cache]
            if seconds:
                self.compile_seconds.labels(*labels, cache).set(statistics.median(seconds))
        _set_median(self.graph_record_seconds, labels, [r["graph_record_seconds"] for r in ok])
        _set_median(self.latency_seconds, (*labels, "eager"), [_s(r["eager_ms"]) for r in ok])
        _set_median(self.latency_seconds, (*labels, "compiled"), [_s(r["compiled_ms"]) for r in ok])
        _set_median(self.speedup_ratio, labels, [r["speedup"] for r in ok])
        self.cache_hits.labels(*labels).set(sum(r["cache_hits"] or 0 for r in records))
        self.cache_misses.labels(*labels).set(sum(r["cache_misses"] or 0 for r in records))
        self.graph_breaks.labels(*labels).set(max((r["graph_breaks"] or 0 for r in records), default=0))
        self.recompiles.labels(*labels).set(max((r["recompiles"] or 0 for r in records), default=0))


class WarmupMetrics:
    """`registry`: live progress for --metrics-port. `groups`: what `push` sends, per GPU class,
    filled by `finish` (a report) or `fail` (none)."""

    def __init__(self, model: str, mode: Optional[str]) -> None:
        self.model, self.mode = model, mode or "none"
        self.registry = CollectorRegistry()
        self.buckets_done = Gauge(
            "orchestrate_buckets_done",
            "Bucket records finished so far in the running job",
            ("model",),
            registry=self.registry,
        )
        self.compile_duration = Histogram(
            "orchestrate_compile_duration_seconds",
            "First compiled calls of the running job so far, every rank and bucket",
            ("model", "mode", "gpu", "cache"),
            buckets=COMPILE_BUCKETS,
            registry=self.registry,
        )
        self.groups: dict[str, _Group] = {}

    def serve(self, port: int) -> None:
        start_http_server(port, addr="0.0.0.0", registry=self.registry)

    def fail(self, wall_seconds: float) -> None:
        """The job stopped before it had a report (setup or store error, Ctrl-C): no GPU class is known."""
        group = self.groups[UNKNOWN_GPU] = _Group(self.model, self.mode, UNKNOWN_GPU)
        group.ended(wall_seconds, ok=False, platform=None, now=time.time())

    def observe(self, record: BucketResult) -> None:
        """One finished (rank, bucket) record: live progress for --metrics-port."""
        self.buckets_done.labels(self.model).inc()
        if record.compile_seconds is not None:
            self.compile_duration.labels(self.model, self.mode, _gpu(record.gpu), _cache(record.cache_state)).observe(
                record.compile_seconds
            )

    def finish(self, report: dict[str, Any]) -> None:
        """Per GPU class of the run: per-bucket values (medians across ranks) and the run's own."""
        results = report["results"]
        now = time.time()
        classes = sorted({_gpu(r["gpu"]) for r in results}) or [UNKNOWN_GPU]
        for gpu in classes:
            mine = [r for r in results if _gpu(r["gpu"]) == gpu]
            group = self.groups[gpu] = _Group(self.model, self.mode, gpu)
            group.buckets(mine)
            failed = sum(1 for r in mine if r["status"] != "ok")
            labels = (self.model, gpu)
            group.bucket_failures.labels(*labels).set(failed)
            # one local cache and one pull/publish per run (a Ray report's `remote` sums its tasks' and
            # ranks'): each class's group carries the run's value
            group.cache_bytes.labels(*labels).set(report["summary"]["cache_bytes"] or 0)
            for direction, seconds, size in _transfers(report):
                group.transfer_seconds.labels(*labels, direction).set(seconds)
                group.transfer_bytes.labels(*labels, direction).set(size)
            ok = bool(mine) and not failed
            group.ended(report["summary"]["wall_seconds"], ok, report.get("platform"), now)

    def registries(self) -> list[CollectorRegistry]:
        return [self.registry, *(group.registry for group in self.groups.values())]

    def push(self, gateway: str) -> Optional[str]:
        """pushadd each GPU class's group; a run that knows its classes deletes the class-less
        groups. A failure is returned as a warning, never raised."""
        try:
            # deleted first: the class-less group of earlier versions holds series with the same
            # labels as a class's group, and the gateway refuses a push that would duplicate them
            if self.groups and UNKNOWN_GPU not in self.groups:
                delete_from_gateway(gateway, job=JOB, grouping_key=self.grouping_key(UNKNOWN_GPU), timeout=10)
                delete_from_gateway(gateway, job=JOB, grouping_key={"model": self.model}, timeout=10)
            for gpu, group in self.groups.items():
                pushadd_to_gateway(
                    gateway, job=JOB, grouping_key=self.grouping_key(gpu), registry=group.registry, timeout=10
                )
            return None
        except Exception as exc:  # the job's result stands whatever the gateway does
            return f"could not push metrics to the Pushgateway at {gateway}: {type(exc).__name__}: {exc}"

    def grouping_key(self, gpu: str) -> dict[str, str]:
        return {"model": self.model, "gpu": gpu}


def build_info_labels(model: str, gpu: str, platform: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
    """orchestrate_build_info's labels: versions from the platform a run recorded (cache.namespace.
    Platform as a dict), else what this process has installed, without importing torch."""
    platform = platform or {}
    cuda = platform.get("cuda_version")
    if not platform and "torch" in sys.modules:
        cuda = sys.modules["torch"].version.cuda
    return {
        "model": model,
        "version": _installed(PACKAGE) or _own_version(),
        "torch": platform.get("torch_version") or _installed("torch") or "unknown",
        "triton": platform.get("triton_version") or _installed("triton") or "none",
        "cuda": cuda or ("none" if platform or "torch" in sys.modules else "unknown"),
        "python": platform.get("python_version") or host_platform.python_version(),
        "gpu": gpu,
    }


def exported_names(*registries: CollectorRegistry) -> set[str]:
    """Every sample name the registries expose (histogram _bucket/_sum/_count, counter _total, ...)."""
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names


def _installed(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _own_version() -> str:
    from orchestrator import __version__

    return __version__


def _cache(cache_state: Optional[str]) -> str:
    return "warm" if cache_state == "hit" else "cold"


def _gpu(gpu: Optional[str]) -> str:
    return gpu or "cpu"


def _s(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else ms / 1e3


def _set_median(gauge: Gauge, labels: tuple[str, ...], values: list[Optional[float]]) -> None:
    """The median of the values present; no series at all without one (`labels()` alone would
    export a 0: a failed bucket's speedup of 0 would read as slower than eager)."""
    present = [v for v in values if v is not None]
    if present:
        gauge.labels(*labels).set(statistics.median(present))


def _transfers(report: dict[str, Any]) -> list[tuple[str, float, int]]:
    remote = report.get("remote") or {}
    found = []
    for direction in ("pull", "publish"):
        transfer = remote.get(direction)
        if transfer:
            found.append((direction, transfer["seconds"], transfer["bytes"]))
    return found
