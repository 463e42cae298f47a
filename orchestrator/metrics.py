"""Prometheus metrics of a warmup: what it cost to compile, how warm the cache was, what it bought.

A batch job: values are pushed to a Pushgateway at the end (`pushadd`, grouping key job + model,
never a per-rank instance label), and can be scraped from `--metrics-port` while a long run
goes. Labels are bounded: model, bucket, mode, cache state, GPU class. Across ranks of one bucket
the median is exported; per-rank detail stays in the JSON report.

The Grafana dashboard (k8s/monitoring/dashboard.py) queries these names; a test checks that
every metric it queries is one this module exports, and that each panel returns data.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, pushadd_to_gateway, start_http_server

from orchestrator.jobs.records import BucketResult

JOB = "orchestrate_warmup"
# Cold compiles of big models take minutes; the top finite bucket is 20 minutes.
COMPILE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
_BUCKET_LABELS = ("model", "bucket", "mode", "gpu")


class WarmupMetrics:
    def __init__(self, model: str, mode: Optional[str]) -> None:
        self.model, self.mode = model, mode or "none"
        self.registry = CollectorRegistry()
        r = self.registry
        self.compile_seconds = Gauge(
            "orchestrate_compile_seconds",
            "First compiled call of a bucket: trace and compile (cold) or cache load (warm); median across ranks",
            (*_BUCKET_LABELS, "cache"),
            registry=r,
        )
        self.compile_duration = Histogram(
            "orchestrate_compile_duration_seconds",
            "First compiled calls of this run, every rank and bucket",
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
        self.cache_hits = Counter(
            "orchestrate_cache_hits", "FX-graph and AOTAutograd cache hits of first calls", _BUCKET_LABELS, registry=r
        )
        self.cache_misses = Counter(
            "orchestrate_cache_misses",
            "FX-graph and AOTAutograd cache misses of first calls",
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
            "orchestrate_bucket_failures", "Bucket records of the last run that failed", ("model",), registry=r
        )
        self.cache_bytes = Gauge("orchestrate_cache_bytes", "Size of the local cache namespace", ("model",), registry=r)
        self.transfer_seconds = Gauge(
            "orchestrate_cache_transfer_seconds",
            "Time to pull from or publish to the store",
            ("model", "direction"),
            registry=r,
        )
        self.transfer_bytes = Gauge(
            "orchestrate_cache_transfer_bytes",
            "Bytes pulled from or published to the store",
            ("model", "direction"),
            registry=r,
        )
        self.job_duration = Gauge(
            "orchestrate_job_duration_seconds", "Wall time of the last run", ("model",), registry=r
        )
        self.last_run = Gauge(
            "orchestrate_last_run_timestamp_seconds", "When the last run ended", ("model",), registry=r
        )
        self.last_run_success = Gauge(
            "orchestrate_last_run_success", "1 if every bucket of the last run was ok", ("model",), registry=r
        )
        self.buckets_done = Gauge(
            "orchestrate_buckets_done", "Bucket records finished so far in the running job", ("model",), registry=r
        )
        # Registered only on success (see finish): pushadd then leaves a failed run's older value alone.
        self.last_success = Gauge(
            "orchestrate_last_success_timestamp_seconds", "When a run last succeeded", ("model",), registry=None
        )

    def serve(self, port: int) -> None:
        start_http_server(port, addr="0.0.0.0", registry=self.registry)

    def fail(self, wall_seconds: float) -> None:
        """The job stopped before it had a report (setup or store error, Ctrl-C)."""
        self.job_duration.labels(self.model).set(wall_seconds)
        self.last_run.labels(self.model).set(time.time())
        self.last_run_success.labels(self.model).set(0)

    def observe(self, record: BucketResult) -> None:
        """One finished (rank, bucket) record: live progress for --metrics-port."""
        self.buckets_done.labels(self.model).inc()
        if record.compile_seconds is not None:
            self.compile_duration.labels(self.model, self.mode, _gpu(record.gpu), _cache(record.cache_state)).observe(
                record.compile_seconds
            )

    def finish(self, report: dict[str, Any]) -> None:
        """Per-bucket values of the whole run (medians across ranks) and the job-level ones."""
        results = report["results"]
        for bucket in sorted({r["bucket"] for r in results}):
            for gpu in sorted({_gpu(r["gpu"]) for r in results}):
                mine = [r for r in results if r["bucket"] == bucket and _gpu(r["gpu"]) == gpu]
                self._bucket(str(bucket), gpu, mine)
        model = self.model
        failed = sum(1 for r in results if r["status"] != "ok")
        self.bucket_failures.labels(model).set(failed)
        self.cache_bytes.labels(model).set(report["summary"]["cache_bytes"] or 0)
        self.job_duration.labels(model).set(report["summary"]["wall_seconds"])
        for direction, seconds, size in _transfers(report):
            self.transfer_seconds.labels(model, direction).set(seconds)
            self.transfer_bytes.labels(model, direction).set(size)
        now = time.time()
        self.last_run.labels(model).set(now)
        self.last_run_success.labels(model).set(0 if failed else 1)
        if not failed:
            self.registry.register(self.last_success)
            self.last_success.labels(model).set(now)

    def _bucket(self, bucket: str, gpu: str, records: list[dict[str, Any]]) -> None:
        labels = (self.model, bucket, self.mode, gpu)
        ok = [r for r in records if r["status"] == "ok"]
        for cache in ("cold", "warm"):
            seconds = [r["compile_seconds"] for r in ok if _cache(r["cache_state"]) == cache]
            if seconds:
                self.compile_seconds.labels(*labels, cache).set(statistics.median(seconds))
        _set_median(self.graph_record_seconds.labels(*labels), [r["graph_record_seconds"] for r in ok])
        _set_median(self.latency_seconds.labels(*labels, "eager"), [_s(r["eager_ms"]) for r in ok])
        _set_median(self.latency_seconds.labels(*labels, "compiled"), [_s(r["compiled_ms"]) for r in ok])
        _set_median(self.speedup_ratio.labels(*labels), [r["speedup"] for r in ok])
        self.cache_hits.labels(*labels).inc(sum(r["cache_hits"] or 0 for r in records))
        self.cache_misses.labels(*labels).inc(sum(r["cache_misses"] or 0 for r in records))
        self.graph_breaks.labels(*labels).set(max((r["graph_breaks"] or 0 for r in records), default=0))
        self.recompiles.labels(*labels).set(max((r["recompiles"] or 0 for r in records), default=0))

    def push(self, gateway: str) -> Optional[str]:
        """pushadd to the gateway; a failure is returned as a warning, never raised."""
        try:
            pushadd_to_gateway(gateway, job=JOB, grouping_key={"model": self.model}, registry=self.registry, timeout=10)
            return None
        except Exception as exc:  # the job's result stands whatever the gateway does
            return f"could not push metrics to the Pushgateway at {gateway}: {type(exc).__name__}: {exc}"


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry exposes (histogram _bucket/_sum/_count, counter _total, ...)."""
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def _cache(cache_state: Optional[str]) -> str:
    return "warm" if cache_state == "hit" else "cold"


def _gpu(gpu: Optional[str]) -> str:
    return gpu or "cpu"


def _s(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else ms / 1e3


def _set_median(gauge: Any, values: list[Optional[float]]) -> None:
    present = [v for v in values if v is not None]
    if present:
        gauge.set(statistics.median(present))


def _transfers(report: dict[str, Any]) -> list[tuple[str, float, int]]:
    remote = report.get("remote") or {}
    found = []
    for direction in ("pull", "publish"):
        transfer = remote.get(direction)
        if transfer:
            found.append((direction, transfer["seconds"], transfer["bytes"]))
    return found
