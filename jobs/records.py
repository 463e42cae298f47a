"""What the driver and the workers hand each other: torch-free, so the driver can plan, submit
and report without importing torch (seconds that the workers' own start can use instead)."""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

from orchestrator.cache.namespace import Platform
from orchestrator.cache.sync import Transfer


@dataclass
class VariantMeasure:
    """One way of serving a bucket, as warmup measured it (orchestrator.jobs.variants chooses)."""

    ok: bool  # built, captured where it is graphed, and passed the correctness gate
    ms: Optional[float] = None  # median per-call latency, interleaved with the other variants
    p90_ms: Optional[float] = None
    spread_ms: Optional[float] = None  # half the interquartile range of the samples
    # a built variant: its compile (or cache load) and capture (`compiled`: the bucket's compile
    # and graph recording); none for eager, which builds nothing
    build_seconds: Optional[float] = None
    reason: Optional[str] = None  # why it is not ok: unavailable here, not capturable, wrong output
    speedup_interval: Optional[list[float]] = None  # [low, high] 95% of eager ms / this variant's ms
    # every per-call latency in timing order: sample i of each variant is from the same iteration
    # of the interleaved run (a variant timed in fewer rounds has the first ones), which is what
    # the choice's paired intervals rest on (orchestrator.jobs.variants.choose)
    samples_ms: Optional[list[float]] = None


@dataclass
class KernelTime:
    """One kernel (CUDA) or op (CPU) of a profiled variant, summed over the profiled calls."""

    name: str  # shortened for reading (no argument list, namespaces dropped inside templates); the trace has it whole
    kind: Literal["inductor", "aten", "other"]  # orchestrator.jobs.profiling.classify
    total_us: float
    calls: int
    share: float  # of the variant's total time (0..1)


@dataclass
class VariantProfile:
    """A profiler window around one variant of a bucket, after its benchmark (see jobs/profiling.py)."""

    trace: str  # the Chrome trace (gzipped JSON; Perfetto opens it) on the node that ran the variant
    # "cuda": device time of the GPU kernels; "cpu" (no GPU): self CPU time of the ops, where the
    # time of Inductor's C++ kernels is the self time of its compiled graph's call
    time_kind: Literal["cuda", "cpu"]
    calls: int  # calls of the variant in the profiled window
    total_us: float  # time of every kernel (or op) in the window
    per_call_us: float
    inductor_kernels: int  # distinct kernels Inductor generated (Triton, or its C++ on CPU)
    inductor_share: float  # their share of total_us
    aten_kernels: int  # distinct ATen ops and vendor-library kernels (cuBLAS, cuDNN, CUTLASS)
    aten_share: float
    other_kernels: int  # copies, memsets, framework wrappers
    other_share: float
    top: list[KernelTime] = field(default_factory=list)  # the costliest kernels, most time first


@dataclass
class BucketProfile:
    """`warmup --profile DIR`: eager, the config's compiled variant and the served one, each profiled."""

    served: Optional[str]  # BucketResult.variant when profiled
    variants: dict[str, VariantProfile] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # variant -> why it has no profile


@dataclass
class BucketResult:
    bucket: int
    rank: Optional[int] = 0  # None: a compile unit's record, which no rank ran
    node: str = field(default_factory=socket.gethostname)
    gpu: Optional[str] = None
    phase: str = "compile"  # the wave; in one process: "warm" when every cache lookup hit
    cache_state: Optional[str] = None  # "hit" (all lookups hit), "miss" (none hit) or "mixed"
    status: str = "ok"
    stage: str = "pending"  # last stage entered; names where a failed bucket failed
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall time spent in each stage
    error: Optional[str] = None
    error_detail: Optional[str] = None  # the whole exception message, for logs
    compile_seconds: Optional[float] = None
    graph_record_seconds: Optional[float] = None
    cache_hits: Optional[int] = None
    cache_misses: Optional[int] = None
    cache: dict[str, int] = field(default_factory=dict)
    eager_ms: Optional[float] = None
    eager_p90_ms: Optional[float] = None
    compiled_ms: Optional[float] = None
    compiled_p90_ms: Optional[float] = None
    speedup: Optional[float] = None  # median eager / median compiled per-call latency
    eager_throughput_ms: Optional[float] = None  # per call, calls issued back to back
    compiled_throughput_ms: Optional[float] = None
    throughput_speedup: Optional[float] = None
    graph_breaks: Optional[int] = None
    graph_break_reasons: dict[str, int] = field(default_factory=dict)
    frames_compiled: Optional[int] = None
    recompiles: Optional[int] = None
    cudagraphs: Optional[bool] = None
    cudagraph_skip_reasons: list[str] = field(default_factory=list)
    checked_outputs: Optional[int] = None  # output leaves (tensors, other values, containers) the gate compared
    max_abs_error: Optional[float] = None  # worst over floating-point leaves of the first call and a replay
    atol: Optional[float] = None
    rtol: Optional[float] = None
    tolerance_used: Optional[float] = None  # how close the closest output came to failing: at most 1 when ok
    # What the gate judged against (jobs/gate.py): "float64" (a float64 run of the model) or
    # "eager", and why not float64 where it could not be; at the output closest to failing
    # against float64, eager's RMS error and the compiled one's, and the multiple allowed
    gate_reference: Optional[str] = None
    gate_note: Optional[str] = None
    float64_eager_error: Optional[float] = None
    float64_error: Optional[float] = None
    gate_multiple: Optional[float] = None
    numerics: Optional[dict[str, Any]] = None  # the reduced-precision settings in force (TF32 and the like)
    peak_memory_bytes: Optional[int] = None
    peak_memory_kind: Optional[str] = None
    variant: Optional[str] = None  # the variant that serves this bucket: the fastest correct one
    variants: dict[str, VariantMeasure] = field(default_factory=dict)  # every candidate, by name
    # How far to trust the speedups (orchestrator.jobs.stats): 95% intervals by a paired bootstrap
    speedup_interval: Optional[list[float]] = None  # [low, high] of `speedup` (eager / compiled)
    served_ms: Optional[float] = None  # the median per-call latency of `variant` through a replica's call of it
    served_speedup: Optional[float] = None  # median eager / median served: what serving gains
    served_speedup_interval: Optional[list[float]] = None
    noisy: Optional[bool] = None  # the served speedup is too uncertain to quote as a clean figure
    # The host meter (orchestrator.jobs.timing): benchmark rounds timed, retakes included; those
    # timed while the host ran slowed, left out of the samples and retaken; False where the host
    # was slowed for most of the benchmark, every round kept and the figures noisy
    bench_rounds: Optional[int] = None
    host_slowed_rounds: Optional[int] = None
    host_steady: Optional[bool] = None
    # The host's speed the figures were timed at, in µs of the meter's fixed work: the median of
    # the kept rounds' slowest readings, and the best reading of the process (full speed). A
    # host-bound figure timed elsewhere compares with this one only at a like reading.
    host_reading_us: Optional[float] = None
    host_best_us: Optional[float] = None
    choice_reason: Optional[str] = None  # why the fastest variant by median does not serve; None where it does
    profile: Optional[BucketProfile] = None  # with `warmup --profile DIR`; a failure there never fails the bucket
    # A grid's point: its sizes by dimension, the bucket dimension first (None in the list form)
    point: Optional[dict[str, int]] = None
    # What warmup proved there (jobs/grid.py): a shorter request padded up answers as eager does at its size
    padding_proof: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def point_label(record: BucketResult | dict[str, Any]) -> str:
    """How a record's bucket is shown and labelled: `8`, or a grid's point as `8x64`."""
    point = record.get("point") if isinstance(record, dict) else record.point
    bucket = record.get("bucket") if isinstance(record, dict) else record.bucket
    return "x".join(str(size) for size in point.values()) if point else str(bucket)


@dataclass(frozen=True)
class Remote:
    """The shared store a worker pulls from before compiling and publishes to afterwards."""

    url: str
    allow_unsigned: bool = False
    key_file: Optional[str] = None  # the private key a publisher signs with (else the environment's)
    # the public keys (PEM) a reader accepts manifests from: not secret, so they travel to workers
    # on other nodes as they are, where key files named on the driver may not exist
    trusted: tuple[str, ...] = ()


@dataclass
class ProcessRun:
    """A worker process's account of itself, sent with its results."""

    namespace: str
    platform: Platform
    device: str
    node: str
    pull: Optional[Transfer]  # None: nothing published yet (or --fresh)
    publish: Optional[Transfer]
    publish_error: Optional[str]
    cache_bytes: int
    cache_files: int
    setup_seconds: float
    process_age_at_start: Optional[float]
    # wall clock, for the job's timeline: from the process's start to its answer
    process_started_at: float
    ended_at: float
    events: list[tuple[str, float]]  # (what, wall-clock time) of the process's milestones
    gpu_ids: list[str]  # the GPUs the cluster gave the process: ranks must never share one


@dataclass
class WorkerAnswer:
    """What a fleet worker returns: its process's account and its bucket records."""

    run: ProcessRun
    results: list[BucketResult]
