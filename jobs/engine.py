"""The worker engine: compile, warm, check and benchmark every bucket of one model in one process.

With a store, the namespace is pulled before anything compiles and what compiled correctly is
published afterwards (a bucket that fails leaves no files behind).

Per bucket, in this order, each timed on its own:
  1. eager reference call (also pays cuBLAS/cuDNN initialisation, so compile timing does not)
  2. first compiled call: Dynamo trace + Inductor compile or cache load  -> compile_seconds
  3. two more calls: CUDA-graph warm-up run and recording under reduce-overhead -> graph_record_seconds
  4. compiled outputs (first call and a replay) against eager, tolerance by dtype
  5. interleaved eager/compiled latency                                  -> eager_ms, compiled_ms, speedup
"""

from __future__ import annotations

import os
import resource
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from cache import sync
from cache.local import LocalCache
from cache.manifest import IntegrityError, SigningKey
from cache.namespace import Platform, namespace
from cache.store import StoreError, open_store
from jobs import torch_internals as ti
from jobs.errors import OutputMismatch, SetupError, brief
from jobs.model import build_model, make_inputs, resolve_device
from jobs.spec import WarmupSpec
from jobs.timing import Clock, median, p90, process_age_seconds

# Default tolerances by output dtype (atol, rtol): Inductor fuses and reorders reductions.
TOLERANCE = {
    torch.float64: (1e-6, 1e-6),
    torch.float32: (1e-3, 1e-3),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
GRAPH_RECORD_CALLS = 2  # cudagraph trees: call 1 warms up (with the compile), 2 records, 3 replays
BACK_TO_BACK_CALLS = 10  # calls per throughput sample


class Progress(Protocol):
    def step(self, name: str) -> None: ...

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None: ...

    def advance(self, bucket: int) -> None: ...

    def finish(self, result: "BucketResult") -> None: ...


class NoProgress:
    def step(self, name: str) -> None:
        pass

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None:
        pass

    def advance(self, bucket: int) -> None:
        pass

    def finish(self, result: "BucketResult") -> None:
        pass


@dataclass
class BucketResult:
    bucket: int
    rank: int = 0
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
    max_abs_error: Optional[float] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    peak_memory_kind: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Remote:
    """The shared store a worker pulls from before compiling and publishes to afterwards."""

    url: str
    allow_unsigned: bool = False
    key_file: Optional[str] = None


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


def run_warmup(spec: WarmupSpec, cache_root: Path, *, fresh: bool = False, rank: int = 0,
               remote: Optional[Remote] = None, benchmark: bool = True, publish: bool = True,
               progress: Progress = NoProgress()) -> WarmupRun:
    """Pull, compile, warm and benchmark every bucket of `spec`, then publish what compiled.

    Raises SetupError when nothing can run, StoreError/IntegrityError when the store cannot be
    read or is not trusted (before anything touched the local cache)."""
    started, process_age = time.perf_counter(), process_age_seconds()
    device = resolve_device(spec.device)
    platform = ti.current_platform(device)
    local = LocalCache(cache_root, namespace(spec.name, platform, spec.identity_hash()))
    try:
        if fresh:
            local.wipe()
        _point_caches_at(local.prepare())
    except OSError as exc:
        raise SetupError(f"cache directory {cache_root}: {brief(exc)}; pass a writable --cache-dir") from None
    store, key, pulled = None, None, None
    if remote:
        store, key = open_store(remote.url), SigningKey.from_env(remote.key_file)
        if not fresh:  # --fresh means a cold compile: the store must not warm us
            progress.step(f"pull {local.namespace} from {remote.url}")
            pulled = sync.pull(store, local.namespace, local.path, key, allow_unsigned=remote.allow_unsigned)

    model = build_model(spec, device)
    ti.allow_recompiles(len(spec.buckets))
    options = spec.compile
    compiled = torch.compile(model, **ti.compile_kwargs(options.mode, options.dynamic, options.fullgraph,
                                                        options.backend, options.options))
    setup_seconds = time.perf_counter() - started
    gpu = platform.gpu_name if device.type == "cuda" else None
    results, quarantined = [], []
    for bucket in spec.buckets:
        result = BucketResult(bucket=bucket, rank=rank, gpu=gpu)
        before = set(sync.scan(local.path))
        try:
            _warm_bucket(spec, model, compiled, device, result, progress, benchmark)
        except (KeyboardInterrupt, SetupError):
            raise
        except Exception as exc:  # one bad bucket must not hide the others
            result.status = "failed"
            result.error = f"{result.stage}: {brief(exc)}"
            result.error_detail = "".join(traceback.format_exception_only(exc))[-4000:]
            quarantined += _quarantine(local.path, set(sync.scan(local.path)) - before)
        progress.finish(result)
        results.append(result)
    published, publish_error = None, None
    if publish and store is not None and any(r.status == "ok" for r in results):
        progress.step(f"publish {local.namespace} to {remote.url}")
        try:
            published = sync.publish(store, local.path, local.namespace, key, allow_unsigned=remote.allow_unsigned,
                                     buckets=[r.bucket for r in results if r.status == "ok"],
                                     meta={"model": spec.name, "platform": asdict(platform)}, exclude=quarantined)
        except (StoreError, IntegrityError) as exc:
            publish_error = str(exc)
    files, size = local.usage()
    return WarmupRun(platform=platform, namespace=local.namespace, device=str(device), cache_dir=str(local.path),
                     results=results, wall_seconds=time.perf_counter() - started, setup_seconds=setup_seconds,
                     process_age_at_start=process_age,
                     cache_bytes=size, cache_files=files,
                     remote=remote.url if remote else None, pull=pulled, publish=published,
                     publish_error=publish_error)


def _quarantine(directory: Path, created: set[str]) -> list[str]:
    """Delete what a failed bucket compiled: it must neither be reused here nor published."""
    for rel in created:
        (directory / rel).unlink(missing_ok=True)
    return sorted(created)


def cache_namespace(spec: WarmupSpec) -> str:
    """The namespace this machine would compile `spec` into (imports torch, asks for the GPU)."""
    return namespace(spec.name, ti.current_platform(resolve_device(spec.device)), spec.identity_hash())


def _point_caches_at(local: LocalCache) -> None:
    # Inductor reads these on every cache access and compile workers inherit them, so setting
    # them before the first torch.compile call is enough even though torch is imported already.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local.inductor_dir)
    os.environ["TRITON_CACHE_DIR"] = str(local.triton_dir)


def _warm_bucket(spec: WarmupSpec, model: torch.nn.Module, compiled: Any, device: torch.device,
                 result: BucketResult, progress: Progress, benchmark: bool = True) -> None:
    bucket = result.bucket
    clock = Clock(device)

    stage_started = time.perf_counter()

    def enter(stage: str, total: Optional[int] = None) -> None:
        nonlocal stage_started
        now = time.perf_counter()
        if result.stage != "pending":
            result.stage_seconds[result.stage] = now - stage_started
        result.stage, stage_started = stage, now
        if stage != "done":
            progress.phase(bucket, stage, total)

    args, kwargs = make_inputs(spec, bucket, device)

    def eager() -> Any:
        return model(*args, **kwargs)

    def run_compiled() -> Any:
        ti.mark_step()
        return compiled(*args, **kwargs)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad(), ti.cudagraph_skip_reasons() as skip_reasons:
        enter("eager reference")
        _, reference = clock.wall(eager)
        reference = [t.detach().clone() for t in ti.flatten(reference)]

        enter("compile")
        window = ti.CounterWindow()
        result.compile_seconds, first = clock.wall(run_compiled)
        first = [t.detach().clone() for t in ti.flatten(first)]
        compile_stats = window.stats()
        _record_compile(result, compile_stats, spec, device, skip_reasons)

        enter("record graphs")
        after_first = ti.CounterWindow()
        replay = None
        start = time.perf_counter()
        for _ in range(GRAPH_RECORD_CALLS):
            _, replay = clock.wall(run_compiled)
        result.graph_record_seconds = time.perf_counter() - start
        replay = [t.detach().clone() for t in ti.flatten(replay)]

        enter("check")
        _check(result, reference, [first, replay], spec)
        if not benchmark:  # a compile-only worker: correct is all it must prove before publishing
            result.recompiles = after_first.stats().frames_compiled
            result.peak_memory_bytes, result.peak_memory_kind = _peak_memory(device)
            enter("done")
            return

        variants = {"eager": eager, "compiled": run_compiled}
        rounds = max(3, spec.bench.iterations // BACK_TO_BACK_CALLS)
        enter("benchmark", total=spec.bench.warmup + spec.bench.iterations + rounds)
        latency = clock.interleaved(variants, spec.bench.iterations, spec.bench.warmup,
                                    on_step=lambda: progress.advance(bucket))
        throughput = clock.back_to_back(variants, rounds, BACK_TO_BACK_CALLS, on_step=lambda: progress.advance(bucket))
        result.recompiles = after_first.stats().frames_compiled

    result.eager_ms, result.eager_p90_ms = median(latency["eager"]), p90(latency["eager"])
    result.compiled_ms, result.compiled_p90_ms = median(latency["compiled"]), p90(latency["compiled"])
    result.speedup = _ratio(result.eager_ms, result.compiled_ms)
    result.eager_throughput_ms = median(throughput["eager"])
    result.compiled_throughput_ms = median(throughput["compiled"])
    result.throughput_speedup = _ratio(result.eager_throughput_ms, result.compiled_throughput_ms)
    result.peak_memory_bytes, result.peak_memory_kind = _peak_memory(device)
    enter("done")


def _record_compile(result: BucketResult, stats: ti.CompileStats, spec: WarmupSpec, device: torch.device,
                    skip_reasons: list[str]) -> None:
    result.cache_hits, result.cache_misses = stats.cache_hits, stats.cache_misses
    result.cache = {"fx_graph_hits": stats.fx_hits, "fx_graph_misses": stats.fx_misses,
                    "fx_graph_bypasses": stats.fx_bypasses, "aot_autograd_hits": stats.aot_hits,
                    "aot_autograd_misses": stats.aot_misses}
    result.cache_state = ("hit" if stats.cache_misses == 0 and stats.cache_hits > 0 else
                          "miss" if stats.cache_hits == 0 else "mixed")
    result.phase = "warm" if result.cache_state == "hit" else "compile"
    result.graph_breaks, result.graph_break_reasons = stats.graph_break_count, stats.graph_breaks
    result.frames_compiled = stats.frames_compiled
    wants_graphs = spec.compile.mode in ("reduce-overhead", "max-autotune") or \
        bool(spec.compile.options.get("triton.cudagraphs"))
    if not wants_graphs:
        result.cudagraphs = False
    elif device.type != "cuda":
        result.cudagraphs = False
        result.cudagraph_skip_reasons = ["CUDA graphs need a CUDA device; the model runs on the CPU"]
    else:
        result.cudagraphs = stats.cudagraph_skips == 0
        result.cudagraph_skip_reasons = list(dict.fromkeys(skip_reasons))


def _check(result: BucketResult, reference: list[torch.Tensor], candidates: list[list[torch.Tensor]],
           spec: WarmupSpec) -> None:
    worst = 0.0
    for outputs in candidates:
        if len(outputs) != len(reference):
            raise OutputMismatch(f"compiled model returned {len(outputs)} tensors, eager {len(reference)}")
        for want, got in zip(reference, outputs):
            if want.shape != got.shape or want.dtype != got.dtype:
                raise OutputMismatch(f"compiled output {tuple(got.shape)} {got.dtype} differs from eager "
                                     f"{tuple(want.shape)} {want.dtype}")
            if not want.is_floating_point():
                mismatched = int((want != got).sum())
                if mismatched:
                    raise OutputMismatch(f"{mismatched} of {want.numel()} {want.dtype} outputs differ from eager")
                continue
            atol, rtol = _tolerance(want.dtype, spec)
            result.atol, result.rtol = atol, rtol
            error = (want.double() - got.double()).abs()
            worst = max(worst, float(error.max()) if error.numel() else 0.0)
            if not torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol, equal_nan=True):
                result.max_abs_error = worst
                raise OutputMismatch(f"compiled output differs from eager: max abs error {worst:.3g} "
                                     f"exceeds atol={atol:g} + rtol={rtol:g}*|eager|; set check.atol/check.rtol "
                                     "if this is expected")
    result.max_abs_error = worst


def _tolerance(dtype: torch.dtype, spec: WarmupSpec) -> tuple[float, float]:
    atol, rtol = TOLERANCE.get(dtype, (1e-3, 1e-3))
    return (spec.check.atol if spec.check.atol is not None else atol,
            spec.check.rtol if spec.check.rtol is not None else rtol)


def _ratio(eager_ms: float, compiled_ms: float) -> Optional[float]:
    return eager_ms / compiled_ms if compiled_ms > 0 else None


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocated"
    # ru_maxrss is KiB on Linux; a process-wide high-water mark, not per bucket
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"
