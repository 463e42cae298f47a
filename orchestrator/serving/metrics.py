"""Prometheus metrics of a serving replica, read from its BucketedModel at every scrape.

How the replica started (gauges): seconds until it answered, and until every bucket was on its
plan; per bucket, whether it is on plan and since when, and the variant serving it now (eager
until its planned variant is swapped in); cache hits and misses at load, the buckets that started
cold (compiled at load: a cache miss) or serve another variant than warmup chose, and what its own
pull from the store did. What it has served since (a long-running process, so counters): model calls per
bucket, the request rows in them and the rows of padding added to reach the bucket; and a histogram
of every request's size in each bucketed dimension (`orchestrate plan` reads it).

    registry = runtime.metrics_registry(model)                # model = runtime.load(...)
    prometheus_client.start_http_server(9400, registry=registry)

`orchestrate serve --metrics-port` does this in the replica's own process (docs/metrics.md).
Labels: model, gpu (the GPU class as warmup's metrics name it, or `cpu`), bucket, variant.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from orchestrator.reports.metrics import BUILD_INFO_LABELS, build_info_labels

if TYPE_CHECKING:
    from orchestrator.jobs.grid_replica import GridModel
    from orchestrator.jobs.replica import BucketedModel


class ReplicaCollector(Collector):
    def __init__(self, model: BucketedModel | GridModel, name: str) -> None:
        self.model, self.name = model, name

    def collect(self) -> Iterator[Any]:
        info, usage = self.model.info(), self.model.usage()
        gpu = info.gpu
        run = [self.name, gpu]

        def gauge(metric: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(metric, doc, labels=["model", "gpu", *labels])

        ready = gauge(
            "orchestrate_replica_ready_seconds",
            "Load start to ready, as --ready chose: every bucket answering, or every bucket on its plan",
        )
        ready.add_metric(run, info.ready_seconds)
        answering = gauge(
            "orchestrate_replica_answering_seconds", "Load start to every bucket answering (eager until on plan)"
        )
        answering.add_metric(run, info.answering_seconds)
        yield from (ready, answering)
        if info.on_plan_seconds is not None:
            planned = gauge(
                "orchestrate_replica_on_plan_seconds",
                "Load start to every bucket settled: on its plan, or refused with a reason (absent while loading)",
            )
            planned.add_metric(run, info.on_plan_seconds)
            yield planned
        if info.ready_seconds_from_spawn is not None:
            spawn = gauge("orchestrate_replica_ready_from_spawn_seconds", "Process spawn to ready")
            spawn.add_metric(run, info.ready_seconds_from_spawn)
            yield spawn
        variant = gauge("orchestrate_replica_variant", "1 for the variant serving a bucket", ("bucket", "variant"))
        hits = gauge("orchestrate_replica_cache_hits", "Cache hits while loading a bucket", ("bucket",))
        misses = gauge(
            "orchestrate_replica_cache_misses", "Cache misses (compiles) while loading a bucket", ("bucket",)
        )
        load = gauge("orchestrate_replica_bucket_load_seconds", "Building a bucket's variant at load", ("bucket",))
        on_plan = gauge(
            "orchestrate_replica_bucket_on_plan", "1 while a bucket serves the variant warmup chose", ("bucket",)
        )
        since = gauge("orchestrate_replica_bucket_on_plan_seconds", "Load start to the bucket on its plan", ("bucket",))
        for bucket, row in info.buckets.items():
            variant.add_metric([*run, str(bucket), row.variant], 1)
            hits.add_metric([*run, str(bucket)], row.cache_hits)
            misses.add_metric([*run, str(bucket)], row.cache_misses)
            load.add_metric([*run, str(bucket)], row.load_seconds)
            on_plan.add_metric([*run, str(bucket)], 1 if row.on_plan else 0)
            if row.on_plan_seconds is not None:
                since.add_metric([*run, str(bucket)], row.on_plan_seconds)
        yield from (variant, hits, misses, load, on_plan, since)
        cold = gauge("orchestrate_replica_cold_buckets", "Buckets that missed the cache at load and compiled")
        cold.add_metric(run, sum(1 for row in info.buckets.values() if row.cache_misses))
        fallback = gauge(
            "orchestrate_replica_fallback_buckets",
            "Buckets settled on another variant than warmup chose (no serving plan, or the plan's unavailable here)",
        )
        fallback.add_metric(
            run, sum(1 for row in info.buckets.values() if not row.loading and (row.planned is None or not row.on_plan))
        )
        yield from (cold, fallback)
        if info.store is not None:
            hit = gauge("orchestrate_replica_pull_hit", "1 if the replica's pull found its namespace in the store")
            hit.add_metric(run, 1 if info.pull else 0)
            yield hit
        if info.pull is not None:
            seconds = gauge("orchestrate_replica_pull_seconds", "The replica's own pull from the store")
            size = gauge("orchestrate_replica_pull_bytes", "Bytes the replica's own pull fetched")
            seconds.add_metric(run, info.pull.seconds)
            size.add_metric(run, info.pull.bytes)
            yield from (seconds, size)
        calls = CounterMetricFamily(
            "orchestrate_replica_calls",
            "Model calls per bucket (a batch of requests is one call)",
            labels=["model", "gpu", "bucket"],
        )
        rows = CounterMetricFamily(
            "orchestrate_replica_rows", "Request rows served per bucket", labels=["model", "gpu", "bucket"]
        )
        padded = CounterMetricFamily(
            "orchestrate_replica_padded_rows",
            "Rows of padding added to reach the bucket",
            labels=["model", "gpu", "bucket"],
        )
        for bucket, used in usage.items():
            calls.add_metric([*run, str(bucket)], used.calls)
            rows.add_metric([*run, str(bucket)], used.rows)
            padded.add_metric([*run, str(bucket)], used.padded_rows)
        yield from (calls, rows, padded)
        yield self._request_sizes(run)
        build = GaugeMetricFamily(
            "orchestrate_build_info", "1, labelled with the versions the replica runs", labels=list(BUILD_INFO_LABELS)
        )
        platform = vars(info.platform) if info.platform else None
        labels = build_info_labels(self.name, gpu, platform)
        build.add_metric([labels[key] for key in BUILD_INFO_LABELS], 1)
        yield build

    def _request_sizes(self, run: list[str]) -> HistogramMetricFamily:
        """Every request's size in each bucketed dimension: what `orchestrate plan --traffic URL`
        plans buckets from."""
        spec = self.model.spec
        dims = spec.grid_dims
        largest = [
            spec.max_request_rows or 4 * max(spec.buckets),
            *(max(sizes) for sizes in (spec.grid or {}).values()),
        ]
        family = HistogramMetricFamily(
            "orchestrate_replica_request_size",
            "Requests by their size in a bucketed dimension (rows; a grid's other dimensions too)",
            labels=["model", "gpu", "dim"],
        )
        sizes = self.model.request_sizes()
        for d, dim in enumerate(dims):
            edges = size_edges(largest[d])
            counts = [0] * (len(edges) + 1)
            total = 0
            for request, count in sizes.items():
                n = request[d]
                counts[bisect.bisect_left(edges, n)] += count
                total += n * count
            cumulative, buckets = 0, []
            for edge, count in zip([*map(str, edges), "+Inf"], counts, strict=True):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric([*run, dim], buckets, total)
        return family


def size_edges(largest: int) -> list[int]:
    """A request-size histogram's bin edges: every size to 16, then about 19% apart (a fourth
    root of two), past `largest`: the sizes a plan can choose are these edges."""
    edges = list(range(1, 17))
    while edges[-1] < largest:
        edges.append(max(edges[-1] + 1, math.ceil(edges[-1] * 2**0.25)))
    return edges


def metrics_registry(model: BucketedModel | GridModel, name: Optional[str] = None) -> CollectorRegistry:
    """A registry with the replica's metrics, read from `model` at every scrape; `name`: the model
    label (default: the config's name)."""
    registry = CollectorRegistry()
    registry.register(ReplicaCollector(model, name or model.spec.name or model.spec.label))
    return registry
