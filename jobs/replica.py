"""A serving replica's model: every bucket loaded on the variant warmup chose for it, ready when
`load_replica` returns; each call padded up to its bucket and sliced back.

Per bucket, largest first (so that its graphs set the size of the memory pool all share):
  1. eager reference call at the bucket's deterministic inputs (also what the outputs' bucket
     dimensions are found from),
  2. the chosen variant built from the cache: `compiled` and `graphed` must find their artifacts
     there (a miss is counted, and refused with require_warm), `aot` loads its saved function (no
     tracing, no Inductor cache; refused when built for another platform), the graphed ones captured,
  3. its output checked against eager with the warmup's correctness gate; a bucket whose variant
     fails the check, or cannot be built, serves eager instead, and says why in `info()`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.cache import sync
from orchestrator.cache.local import LocalCache
from orchestrator.cache.manifest import TrustedKeys
from orchestrator.cache.namespace import Platform, namespace
from orchestrator.cache.store import open_store
from orchestrator.jobs import aot
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.engine import GRAPH_RECORD_CALLS, point_caches_at
from orchestrator.jobs.errors import SetupError, brief
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.graphs import GraphedCall
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.padding import RequestShaper, copy_out, output_bucket_dims
from orchestrator.jobs.records import Remote
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.jobs.timing import process_age_seconds
from orchestrator.jobs.variants import graphed_compile, read_plans, replays_into_buffers


class NotWarm(SetupError):
    """A compiled variant missed the cache while the caller required a warm start."""


@dataclass
class BucketInfo:
    bucket: int
    variant: str  # what serves it
    planned: Optional[str]  # what warmup chose (None: no serving plan for the bucket)
    reason: Optional[str]  # why it serves something else than planned
    cache_hits: int = 0
    cache_misses: int = 0
    load_seconds: float = 0.0  # building the variant: compile or cache load, CUDA-graph warm-up
    capture_seconds: float = 0.0  # the CUDA-graph capture alone (graphed variants)
    memory_bytes: Optional[int] = None  # CUDA memory held after loading it (allocator, this bucket's part)


@dataclass
class BucketUsage:
    """What a bucket has served since load: model calls, the request rows in them, and the rows of
    padding added to reach the bucket (rows + padded_rows = calls * bucket)."""

    calls: int = 0
    rows: int = 0
    padded_rows: int = 0

    def count(self, rows: int, bucket: int) -> None:
        self.calls += 1
        self.rows += rows
        self.padded_rows += bucket - rows


@dataclass
class ReplicaInfo:
    namespace: str
    device: str
    buckets: dict[int, BucketInfo]
    ready_seconds: float  # load_replica's start to its return
    ready_seconds_from_spawn: Optional[float]  # the process's spawn to ready: what a new replica waits
    pull: Optional[sync.Transfer] = None
    dynamo_frames_compiled: int = 0
    events: list[tuple[str, float]] = field(default_factory=list)
    store: Optional[str] = None  # the store pulled from first (None: none was asked; `pull` None: a miss)
    platform: Optional[Platform] = None  # what the replica runs on: GPU class and versions, for metrics

    @property
    def gpu(self) -> str:
        """The GPU class, as warmup's metrics name it: the device's name, or `cpu`."""
        return self.platform.gpu_name if self.platform and self.device.startswith("cuda") else "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_replica(
    spec: WarmupSpec,
    cache_root: Path,
    *,
    remote: Optional[Remote] = None,
    require_warm: bool = False,
) -> BucketedModel:
    started, age = time.perf_counter(), process_age_seconds()
    device = resolve_device(spec.device)
    platform = ti.current_platform(device)
    local = LocalCache(cache_root, namespace(spec.label, platform, spec.identity_hash())).prepare()
    point_caches_at(local)
    pulled = None
    if remote is not None:
        pulled = sync.pull(
            open_store(remote.url),
            local.namespace,
            local.path,
            TrustedKeys.from_pems(remote.trusted),  # a replica verifies; it holds no private key
            allow_unsigned=remote.allow_unsigned,
        )
    plans = read_plans(local.path)
    model = build_model(spec, device)
    frames = ti.CounterWindow()
    loader = _Loader(spec, model, device, require_warm, local.path, platform)
    if any(plan["variant"] in ("compiled", "graphed") for plan in plans.values()):  # else no Dynamo import
        ti.allow_recompiles(2 * len(spec.buckets))
    runners: dict[int, Callable[..., Any]] = {}
    infos: dict[int, BucketInfo] = {}
    references: dict[int, Any] = {}
    for bucket in sorted(spec.buckets, reverse=True):  # the largest first: it sizes the shared pool
        plan = plans.get(bucket)
        runners[bucket], infos[bucket], references[bucket] = loader.load(bucket, plan)
    shaper = RequestShaper(spec, list(spec.buckets), device, spec.serve.oversize)
    try:
        dims = output_bucket_dims(references, shaper.input_dim)
    except ValueError as exc:  # an output that does not follow the bucket cannot be cut back
        raise SetupError(f"the model's outputs: {exc}") from None
    ready = time.perf_counter() - started
    info = ReplicaInfo(
        namespace=local.namespace,
        device=str(device),
        buckets=dict(sorted(infos.items())),
        ready_seconds=ready,
        ready_seconds_from_spawn=None if age is None else age + ready,
        pull=pulled,
        dynamo_frames_compiled=frames.stats().frames_compiled,
        store=remote.url if remote else None,
        platform=platform,
    )
    return BucketedModel(spec, device, model, runners, {b: i.variant for b, i in infos.items()}, shaper, dims, info)


class BucketedModel:
    """The served model: call it like the original one with any request size along the bucket
    dimension. Calls are serialized (static buffers and graphs are not reentrant) and may come
    from any thread. Outputs are the caller's own: nothing a later call writes reaches them."""

    def __init__(
        self,
        spec: WarmupSpec,
        device: torch.device,
        model: torch.nn.Module,
        runners: dict[int, Callable[..., Any]],
        variants: dict[int, str],
        shaper: RequestShaper,
        dims: Any,
        info: ReplicaInfo,
    ) -> None:
        # the eager module: what `eager` buckets run, and what every variant was built from
        self.model = model
        self.spec, self.device, self._runners, self._variants = spec, device, runners, variants
        self._shaper, self._dims, self._info = shaper, dims, info
        # replays write their outputs into the same buffers: the caller gets copies
        self._copies = {
            bucket: replays_into_buffers(variant, spec, device.type) for bucket, variant in variants.items()
        }
        self._lock = threading.Lock()
        self._no_grad = torch.no_grad()  # one for every call: calls are serialized by the lock
        self.buckets = sorted(runners)
        # counted under the call lock; read without it (a scrape must not wait for a model call)
        self._usage = {bucket: BucketUsage() for bucket in self.buckets}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock, self._no_grad:
            exact = self._shaper.exact_bucket(args, kwargs)
            if exact is not None:  # a bucket's own shapes: nothing to check, pad or cut
                outputs = self._runners[exact](*args, **kwargs)
                self._usage[exact].count(exact, exact)
                return copy_out(outputs) if self._copies[exact] else outputs
            n = self._shaper.size(args, kwargs)  # BadRequest before anything runs
            if n <= self.buckets[-1]:
                return self._run(args, kwargs, n)
            parts = []
            for chunk_args, chunk_kwargs in self._shaper.chunks(args, kwargs):
                parts.append(self._run(chunk_args, chunk_kwargs, self._shaper.size(chunk_args, chunk_kwargs)))
            return self._shaper.concat(parts, self._dims)

    def _run(self, args: Any, kwargs: dict[str, Any], n: int) -> Any:
        bucket = self._shaper.bucket_for(n)
        padded_args, padded_kwargs = self._shaper.pad(args, kwargs, bucket)
        outputs = self._runners[bucket](*padded_args, **padded_kwargs)
        self._usage[bucket].count(n, bucket)
        if n < bucket:
            outputs = self._shaper.unpad(outputs, n, self._dims)
        return copy_out(outputs) if self._copies[bucket] else outputs

    def variant(self, bucket: int) -> str:
        return self._variants[bucket]

    def info(self) -> ReplicaInfo:
        return self._info

    def usage(self) -> dict[int, BucketUsage]:
        """Per bucket, what it has served since load (a snapshot)."""
        return {bucket: BucketUsage(u.calls, u.rows, u.padded_rows) for bucket, u in self._usage.items()}


class _Loader:
    def __init__(
        self,
        spec: WarmupSpec,
        model: torch.nn.Module,
        device: torch.device,
        require_warm: bool,
        directory: Path,
        platform: Platform,
    ) -> None:
        self.spec, self.model, self.device, self.require_warm = spec, model, device, require_warm
        self.directory, self.platform = directory, platform
        self.gate = Gate.from_options(spec.check)
        self.pool: Any = None  # the memory pool every bucket's CUDA graph shares
        self._compiled: dict[str, Any] = {}

    def load(self, bucket: int, plan: Optional[dict[str, Any]]) -> tuple[Callable[..., Any], BucketInfo, Any]:
        planned = plan["variant"] if plan else None
        args, kwargs = make_inputs(self.spec, bucket, self.device)
        with torch.no_grad():
            reference = self.model(*args, **kwargs)
        expected = snapshot(reference)
        info = BucketInfo(bucket, "eager", planned, None if planned else "no serving plan for this bucket: eager")
        if planned in (None, "eager"):
            return self.model, info, reference
        memory_before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        window = ti.CounterWindow()
        started = time.perf_counter()
        try:
            runner, capture_seconds = self._build(planned, args, kwargs, (plan or {}).get("artifacts", {}))
            stats = window.stats()
            info.cache_hits, info.cache_misses = stats.cache_hits, stats.cache_misses
            if self.require_warm and stats.cache_misses:
                raise NotWarm(
                    f"bucket {bucket}: variant {planned} missed the cache {stats.cache_misses} times; "
                    "warm this platform first (orchestrate warmup), or load without require_warm"
                )
            with torch.no_grad():
                if planned == "compiled":
                    ti.mark_step()
                self.gate.compare(expected, snapshot(runner(*args, **kwargs)), call=f"{planned} at load")
        except NotWarm:
            raise
        except Exception as exc:  # this bucket serves eager; the replica still starts
            info.reason = f"{planned} unavailable here, serving eager: {brief(exc)}"
            return self.model, info, reference
        info.variant, info.capture_seconds = planned, capture_seconds
        info.load_seconds = time.perf_counter() - started
        if memory_before is not None:
            info.memory_bytes = torch.cuda.memory_allocated(self.device) - memory_before
        return runner, info, reference

    def _build(
        self, variant: str, args: Any, kwargs: dict[str, Any], artifacts: dict[str, Any]
    ) -> tuple[Callable[..., Any], float]:
        if variant == "aot":
            saved = artifacts.get("aot")
            if not saved:
                raise aot.Unexportable("the serving plan names no aot function")
            aot.check_platform(saved["platform"], self.platform)
            loaded = aot.load(self.directory / saved["path"], self.model)
            if self.device.type != "cuda":
                return loaded, 0.0
            started = time.perf_counter()
            call = GraphedCall(loaded, args, kwargs, pool=self.pool)
            self.pool = self.pool or call.pool
            return call, time.perf_counter() - started
        if variant == "compiled":
            compiled = self._compile("compiled")

            def run(*a: Any, **k: Any) -> Any:
                ti.mark_step()
                return compiled(*a, **k)

            with torch.no_grad():
                for _ in range(1 + GRAPH_RECORD_CALLS):  # load, then CUDA-graph trees' warm-up and recording
                    run(*args, **kwargs)
            return run, 0.0
        fn = self.model if variant == "eager-graphed" else self._compile("graphed")
        started = time.perf_counter()
        call = GraphedCall(fn, args, kwargs, pool=self.pool)
        self.pool = self.pool or call.pool
        return call, time.perf_counter() - started

    def _compile(self, variant: str) -> Any:
        if variant not in self._compiled:
            options = self.spec.compile
            mode, extra = (
                (options.mode, options.options)
                if variant == "compiled"
                else graphed_compile(options.mode, options.options)
            )
            ti.match_a_plain_process()
            self._compiled[variant] = torch.compile(
                self.model, **ti.compile_kwargs(mode, options.dynamic, options.fullgraph, options.backend, extra)
            )
        return self._compiled[variant]
