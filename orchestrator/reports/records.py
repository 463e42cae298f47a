"""The warmup report's fields, as typed records: the one definition of the JSON report.

orchestrator.reports.report builds these and writes `dataclasses.asdict` of them; the JSON Schema in
docs/schemas/report.schema.json is generated from them (orchestrator.reports.schemas). Field order is the
order of the keys in the JSON. Torch-free: the driver of a Ray run builds its report without torch.

Typed all the way down except where a part is free-form on purpose (dict[str, Any]): `platform`
(orchestrator.cache.namespace.Platform's fields in a process report, {} for a fleet none of whose tasks answered)
and `compile` (the config's `compile` section, whose schema is the config schema's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from orchestrator.cache.sync import Transfer
from orchestrator.jobs.records import BucketResult

SCHEMA_VERSION: Literal[1] = 1  # keys are only ever added within a schema version


@dataclass
class Spread:
    min: float
    median: float
    max: float


@dataclass
class Summary:
    buckets_ok: int
    buckets_failed: int
    cache_state: Literal["warm", "cold", "partial"]  # warm: every bucket loaded without a single miss
    cache_hits: int
    cache_misses: int
    compile_seconds_total: float
    graph_record_seconds_total: float
    # from job start (model built, nothing compiled) to every bucket compiled and its graphs recorded
    ready_seconds: Optional[float]
    # the same counted from process spawn (imports, CUDA init): what a new replica waits
    process_seconds_to_ready: Optional[float]
    speedup_min: Optional[float]
    speedup_median: Optional[float]
    speedup_max: Optional[float]
    throughput_speedup_median: Optional[float]
    graph_breaks: int
    recompiles: int
    cache_bytes: int
    cache_files: int
    wall_seconds: float


@dataclass
class BucketFleetStats:
    """One bucket across the fleet."""

    cold_compile_seconds: Optional[float]
    warm_load_seconds: Optional[Spread]
    speedup: Optional[Spread]
    ranks_ok: int
    ranks_failed: int
    # What serves the bucket across its ok warm ranks: the table's row for it
    cache_state: Optional[str] = None  # "hit", "miss" or "mixed" (the ranks disagree or one was mixed)
    eager_ms: Optional[Spread] = None
    served_ms: Optional[Spread] = None
    served_speedup: Optional[Spread] = None
    # [median of the ranks' lows, median of their highs]: a typical rank's 95% interval
    served_speedup_interval: Optional[list[float]] = None
    served_variants: list[str] = field(default_factory=list)  # sorted; more than one: the ranks disagree
    ranks_noisy: int = 0  # ok ranks whose served speedup is noisy (orchestrator.jobs.stats)
    noisy: Optional[bool] = None  # the median's interval is too wide, or half the ranks or more are noisy


@dataclass
class Deviation:
    """A rank that failed a bucket, or whose served speedup is far from the other ranks'."""

    rank: Optional[int]
    bucket: int
    why: Optional[str]


@dataclass
class FleetStats:
    buckets: dict[str, BucketFleetStats]  # keyed by the bucket, as a string
    deviating_ranks: list[Deviation]
    pull_seconds: Optional[Spread]  # the warm ranks' pulls


@dataclass
class FleetSummary(Summary):
    """A Ray run's summary: the warm wave's (or, with none, every) record, plus the fleet's view."""

    fleet: FleetStats


@dataclass
class ProcessExecutor:
    kind: Literal["process"]


@dataclass
class TimelineRow:
    """One task, in seconds from the start of the waves (clocks of other nodes are trusted to be NTP-close)."""

    wave: Literal["compile", "warm"]
    bucket: Optional[int]  # a compile task's bucket; None for a rank
    rank: Optional[int]  # None for a compile task
    node: str
    gpu_ids: list[str]
    started_s: float  # the task's process started
    ended_s: float  # it had its answer
    answered_s: float  # the driver had it
    # [what, seconds] where the process's time went: "worker up" (interpreter and Ray), "imported"
    # (torch), "device ready", "model built", each bucket "compiled"/"loaded"/"benchmarked", pulls,
    # "published"
    events: list[list[str | float]]


@dataclass
class RayExecutor:
    kind: Literal["ray"]
    address: str  # "local" when Ray started in this process
    nodes: int
    ranks: int
    compile_units: int
    # "start": until the plan; "compile": until the last compile task ended; "warm": the rest
    wave_seconds: dict[str, float]
    timeline: list[TimelineRow]


@dataclass
class ProcessRemote:
    url: str
    pull: Optional[Transfer]  # None: nothing published yet (or --fresh)
    publish: Optional[Transfer]
    publish_error: Optional[str]  # the job's results stand; the store did not take them


@dataclass
class FleetRemote:
    url: str
    published_generations: list[int]  # where each publish left its namespace, new or not
    publish_errors: list[str]
    # every task's and rank's pulls (publishes) as one: counts and seconds summed, the highest
    # generation; None when no process pulled (published)
    pull: Optional[Transfer]
    publish: Optional[Transfer]


@dataclass
class ReportHeader:
    """What every report starts with."""

    schema_version: Literal[1]
    model: str
    namespace: Optional[str]
    torch_version: Optional[str]
    device: Optional[str]  # "cuda:0" or "cpu"
    gpu: Optional[str]
    platform: dict[str, Any]  # free-form: see the module's docstring
    config_hash: str
    compile: dict[str, Any]  # free-form: the config's `compile` section
    buckets: list[int]
    started_at: str
    finished_at: str
    results: list[BucketResult]


@dataclass
class ProcessReport(ReportHeader):
    """One process that compiled, warmed and benchmarked every bucket itself (--no-ray)."""

    executor: ProcessExecutor
    cache_dir: str
    summary: Summary
    remote: Optional[ProcessRemote]  # None without a store


@dataclass
class FleetReport(ReportHeader):
    """A Ray warmup: the compile-wave and warm-wave records of every rank, one summary."""

    namespaces: list[str]
    executor: RayExecutor
    summary: FleetSummary
    remote: FleetRemote


Report = ProcessReport | FleetReport
