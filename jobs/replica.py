"""A serving replica's model: it answers as soon as the model is built, every bucket on eager,
and switches each bucket to the variant warmup chose for it as soon as that is loaded, in the
background; each call padded up to its bucket and sliced back.

`load_replica` runs two threads from its start:
  - the caller's: build the model, then one eager call per bucket at the bucket's deterministic
    inputs (the outputs' bucket dimensions are found from them, and they are the reference every
    variant is checked against). The replica answers from here on: what an eager process pays
    to serve, and nothing more.
  - the loader's: pull the namespace from the store and read the serving plans, and where a plan
    compiles, hash Triton's build for Inductor's cache (while the model builds: hashing lets go of
    the interpreter lock); then, once the replica answers (nothing more beside the answering
    path: the rest is Python under the same interpreter lock), import the compiler where a plan
    needs it (on the CPU with Inductor's probe of the CPU's vector instructions beside it, on a
    thread of its own: it waits on a child process), and per bucket, largest first (its graphs
    set the size of the memory pool all share): build the planned variant from the cache (`aot`
    loads its saved function, no tracing; `compiled` and `graphed` must find their artifacts
    there: a miss is counted, and refused with require_warm; graphed ones are captured), check
    its output against the eager reference with warmup's correctness gate, and switch the bucket
    to it between two calls. A variant that fails its check, or cannot be built, leaves the bucket
    on eager and says why in `info()`.
`ready="answering"` returns once the replica answers; `"planned"` once every bucket is settled on
its plan (or refused with a reason). A failed pull fails the load either way.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.cache import sync
from orchestrator.cache.local import LocalCache
from orchestrator.cache.manifest import TrustedKeys
from orchestrator.cache.namespace import Platform, namespace
from orchestrator.cache.store import open_store
from orchestrator.jobs import aot, trees
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.collector import defer_full_collections, exit_without_collecting
from orchestrator.jobs.copies import copier, cut_out
from orchestrator.jobs.errors import SetupError, brief
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.graphs import GraphedCall
from orchestrator.jobs.grid import input_padding
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.padding import RequestShaper, output_bucket_dims
from orchestrator.jobs.records import Remote
from orchestrator.jobs.spec import READY_WHEN, ReadyWhen, WarmupSpec
from orchestrator.jobs.timing import process_age_seconds
from orchestrator.jobs.variants import read_plans, replays_into_buffers

COMPILED_VARIANTS = ("compiled", "graphed", "aot")  # what needs Dynamo and Inductor in the replica
# Inductor and Triton find their caches through the environment, one pair per process, while the
# slices of a grid load from directories of their own: a load points them at its own for as long
# as it reads them, one load at a time (Inductor's hit and miss counters are process-wide too).
_CACHE_POINTING = threading.Lock()


@contextlib.contextmanager
def _reading(local: LocalCache) -> Iterator[None]:
    with _CACHE_POINTING:
        ti.point_caches_at(local)
        yield


# what torch.no_grad() calls, without its context manager's cost (BucketedModel.__call__)
_is_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


class NotWarm(SetupError):
    """A compiled variant missed the cache while the caller required a warm start."""


@dataclass
class BucketInfo:
    bucket: int
    point: Optional[str] = field(default=None, kw_only=True)  # a grid's point, as `8x64` (jobs/grid_replica.py)
    variant: str  # what serves it now
    planned: Optional[str]  # what warmup chose (None: no serving plan for the bucket)
    reason: Optional[str]  # why it serves something else than planned, once it is settled
    cache_hits: int = 0
    cache_misses: int = 0
    load_seconds: float = 0.0  # building the variant: compile or cache load, CUDA-graph warm-up
    capture_seconds: float = 0.0  # the CUDA-graph capture alone (graphed variants)
    memory_bytes: Optional[int] = None  # CUDA memory held after loading it (allocator, this bucket's part)
    loading: bool = False  # its planned variant is being loaded in the background: eager serves meanwhile
    on_plan: bool = False  # serving what warmup chose (eager where it chose eager or nothing)
    on_plan_seconds: Optional[float] = None  # load start to on plan


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
    buckets: dict[Any, BucketInfo]  # by bucket; a grid's by point label, `8x64` (jobs/grid_replica.py)
    ready: ReadyWhen  # what `ready_seconds` waited for
    ready_seconds: float  # load_replica's start to its return
    ready_seconds_from_spawn: Optional[float]  # the process's spawn to ready: what a new replica waits
    load_started_from_spawn: Optional[float] = None  # the process's spawn to load start: imports, interpreter
    answering_seconds: float = 0.0  # load start to every bucket answering (eager where not yet on plan)
    answering_seconds_from_spawn: Optional[float] = None
    # load start to every bucket settled: on its plan, or refused with a reason (None while loading)
    on_plan_seconds: Optional[float] = None
    on_plan_seconds_from_spawn: Optional[float] = None
    pull: Optional[sync.Transfer] = None
    dynamo_frames_compiled: int = 0
    # (milestone, seconds from load start): where the replica's start went
    events: list[tuple[str, float]] = field(default_factory=list)
    store: Optional[str] = None  # the store pulled from first (None: none was asked; `pull` None: a miss)
    platform: Optional[Platform] = None  # what the replica runs on: GPU class and versions, for metrics
    # requests served since load by size (`3`; a grid's `3x71`, the bucket dimension first): the
    # traffic `orchestrate plan` plans buckets from
    request_sizes: dict[str, int] = field(default_factory=dict)

    @property
    def gpu(self) -> str:
        """The GPU class, as warmup's metrics name it: the device's name, or `cpu`."""
        return self.platform.gpu_name if self.platform and self.device.startswith("cuda") else "cpu"

    @property
    def loading(self) -> bool:
        return self.on_plan_seconds is None

    @property
    def on_plan(self) -> bool:
        """Every bucket serves what warmup chose."""
        return all(bucket.on_plan for bucket in self.buckets.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loading": self.loading, "on_plan": self.on_plan}


def load_replica(
    spec: WarmupSpec,
    cache_root: Path,
    *,
    remote: Optional[Remote] = None,
    require_warm: bool = False,
    ready: ReadyWhen = "answering",
    model: Optional[torch.nn.Module] = None,
    call_lock: Optional[threading.Lock] = None,
    answered: Optional[threading.Event] = None,
) -> BucketedModel:
    """The replica of one list-form spec (a grid's slices: jobs/grid_replica.py). `model` and
    `call_lock`: a model already built from the same config, and the lock every call of it takes,
    shared by the slices of a grid (one model, one call at a time, traces included). `answered`:
    set once the whole of what this replica is part of answers (a grid: every slice); its loader
    loads nothing before (by default, before this replica answers)."""
    if ready not in READY_WHEN:
        raise ValueError(f"ready={ready!r}: use one of {', '.join(READY_WHEN)}")
    started, age = time.perf_counter(), process_age_seconds()
    device = resolve_device(spec.device)
    platform = ti.current_platform(device)
    local = LocalCache(cache_root, namespace(spec.label, platform, spec.identity_hash())).prepare()
    if call_lock is None:  # a replica of its own: the process's caches are its, for whatever else compiles here
        ti.point_caches_at(local)
    compile_in_this_process()
    exit_without_collecting()
    ti.set_device_guard_from_this_thread()  # before the loader, which traces and then exits
    loader = _Loader(spec, device, require_warm, local, platform, remote, started, call_lock, answered)
    loader.start()
    try:
        model = model if model is not None else build_model(spec, device)
        loader.model_built(model)
        references: dict[int, Any] = {}
        # under the call lock, as every call of the served model: a grid's slices share the model,
        # and another slice's loader may be tracing it already
        with loader.call_lock, torch.no_grad():
            for bucket in sorted(spec.buckets, reverse=True):
                args, kwargs = make_inputs(spec, bucket, device)
                references[bucket] = model(*args, **kwargs)
        shaper = RequestShaper(spec, list(spec.buckets), device, spec.serve.oversize)
        try:
            dims = output_bucket_dims(references, shaper.input_dim)
        except ValueError as exc:  # an output that does not follow the bucket cannot be cut back
            raise SetupError(f"the model's outputs: {exc}") from None
        plans = loader.plans()  # the pull's outcome: a store that failed fails the load here
    except BaseException:
        loader.abandon()  # after its pull: a failed load leaves no pull half done
        local.remove_if_empty()  # nor a namespace directory with no file in it
        raise
    answering = time.perf_counter() - started
    info = ReplicaInfo(
        namespace=local.namespace,
        device=str(device),
        buckets={bucket: initial_row(bucket, plans) for bucket in sorted(spec.buckets)},
        ready=ready,
        load_started_from_spawn=age,
        ready_seconds=answering,
        ready_seconds_from_spawn=None if age is None else age + answering,
        answering_seconds=answering,
        answering_seconds_from_spawn=None if age is None else age + answering,
        pull=loader.pulled,
        store=remote.url if remote else None,
        platform=platform,
    )
    served = BucketedModel(spec, device, model, shaper, dims, info, age, loader.call_lock, loader.events)
    loader.serve(served, references)
    if ready == "planned":
        served.wait_loaded()
        served._ready_at(time.perf_counter() - started)
    return served


def initial_row(bucket: int, plans: dict[int, dict[str, Any]]) -> BucketInfo:
    """A bucket as it starts: answering on eager, its planned variant still to load."""
    planned = (plans.get(bucket) or {}).get("variant")
    reason = None if planned else "no serving plan for this bucket: eager"
    return BucketInfo(bucket, "eager", planned, reason, loading=planned not in (None, "eager"))


def compile_in_this_process() -> None:
    """Inductor's compile-worker pool (one subprocess per core) costs a replica seconds to start and
    seconds more at exit, where Python waits for it, while a replica only loads compiled code: any
    compile it must do runs in this process instead. A setting of the user's own is kept."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # read when Inductor's config is first imported
    config = sys.modules.get("torch._inductor.config")
    if config is not None:  # imported already (by the model's own code): set it there too
        config.compile_threads = 1  # type: ignore[attr-defined]


class BucketedModel:
    """The served model: call it like the original one with any request size along the bucket
    dimension. Model calls are serialized (static buffers and graphs are not reentrant), those of
    a request run in chunks one chunk at a time, and may come from any thread. Outputs are the
    caller's own: nothing a later call writes reaches them. A bucket switches from eager to its
    planned variant between two model calls, never during one."""

    def __init__(
        self,
        spec: WarmupSpec,
        device: torch.device,
        model: torch.nn.Module,
        shaper: RequestShaper,
        dims: Any,
        info: ReplicaInfo,
        process_age: Optional[float] = None,
        call_lock: Optional[threading.Lock] = None,
        events: Optional[_Events] = None,
    ) -> None:
        # the eager module: what `eager` buckets run, and what every variant was built from
        self.model = model
        self.spec, self.device = spec, device
        self._shaper, self._dims, self._info = shaper, dims, info
        self.buckets = sorted(info.buckets)
        self._routes = {bucket: _Route(model) for bucket in self.buckets}
        # one call at a time; a switch waits for the call under way, and so does a Dynamo trace (_Loader)
        self._lock = call_lock or threading.Lock()
        # the calls waiting for the lock, each set once it has the lock (_wait_for_lock)
        self._waiting: deque[threading.Event] = deque()
        self._info_lock = threading.Lock()  # info and usage snapshots never wait for a model call
        self._sizes: Counter[int] = Counter()  # rows of the requests that were checked and padded
        self._loaded = threading.Event()
        self._failure: Optional[BaseException] = None  # what wait_loaded raises: NotWarm
        self._age = process_age
        self._events = events  # the start's milestones, which the loader goes on adding to

    @classmethod
    def serving(
        cls,
        spec: WarmupSpec,
        device: torch.device,
        model: torch.nn.Module,
        bucket: int,
        variant: str,
        runner: Callable[..., Any],
    ) -> BucketedModel:
        """A replica of one bucket that serves `variant` through `runner`, for requests of the
        bucket's exact shapes, called as any replica calls them (the request's lookup, the lock,
        grad mode, the copy out of replay buffers): what warmup times as the bucket's served
        latency. It knows no output's bucket dimensions, so it pads and cuts nothing."""
        row = BucketInfo(bucket, variant, variant, None)
        info = ReplicaInfo("", str(device), {bucket: row}, "answering", 0.0, None)
        shaper = RequestShaper(spec, [bucket], device, spec.serve.oversize)
        served = cls(spec, device, model, shaper, None, info)
        served._switch(row, runner, 0.0)
        return served

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, True)

    def borrow(self, *args: Any, **kwargs: Any) -> Any:
        """As a call, but where the bucket's variant replays a CUDA graph its outputs are the
        graph's own buffers, not copies: valid until the next call of this model, from any
        thread, overwrites them. For a caller that consumes them at once (encodes, reduces or
        copies what it needs) and saves the copy of everything else; one that keeps them, or
        shares the model between threads, calls the model instead."""
        return self._call(args, kwargs, False)

    def _call(self, args: Any, kwargs: dict[str, Any], copies: bool) -> Any:
        # A request of a bucket's own shapes (the usual one behind a batcher) costs one lookup,
        # the lock and a count besides its runner: what the runtime adds to every call. The lookup
        # depends on the request alone and runs before the lock; one try block restores both the
        # lock and grad mode, which is set through torch's functions (no_grad's context manager
        # costs more than all the rest).
        bucket = self._shaper.exact_bucket(args, kwargs)
        if bucket is None:  # checked, then padded or split: the lock is taken per model call
            return self._shaped(args, kwargs, copies)
        grad = _is_grad_enabled()
        lock = self._lock
        if not lock.acquire(False):
            self._wait_for_lock()
        try:
            if grad:
                _set_grad_enabled(False)
            route = self._routes[bucket]
            outputs = route.runner(*args, **kwargs)
            route.exact_calls += 1
            # copied before the lock is released: the next call's replay overwrites these buffers
            copy = route.copy
            return copy(outputs) if copy is not None and copies else outputs
        finally:
            lock.release()
            if grad:
                _set_grad_enabled(True)

    def _shaped(self, args: Any, kwargs: dict[str, Any], copies: bool) -> Any:
        """Any other request: checked, then padded to its bucket, or run in chunks of the largest.
        Each chunk takes the lock on its own, and the calls that waited for it while a chunk ran
        go before the next: a long request holds up a short one by one chunk, not by all of them."""
        n = self._shaper.size(args, kwargs)  # BadRequest before anything runs
        with self._info_lock:  # the sizes `orchestrate plan` reads (request_sizes)
            self._sizes[n] += 1
        with torch.no_grad():
            if n <= self.buckets[-1]:
                return self._run(args, kwargs, n, copies)
            parts = []
            for chunk_args, chunk_kwargs in self._shaper.chunks(args, kwargs):
                for entered in list(self._waiting):
                    entered.wait()
                # each chunk copied: the next one replays into the same buffers
                parts.append(self._run(chunk_args, chunk_kwargs, self._shaper.size(chunk_args, chunk_kwargs), True))
            return self._shaper.concat(parts, self._dims)

    def call_padded(self, args: Any, kwargs: dict[str, Any], rows: int, cut: trees.Cut, copies: bool = True) -> Any:
        """A request of `rows` real rows that its caller has padded to a bucket's exact shapes (a
        grid pads every dimension at once): run as such, counted as padded, its outputs cut back
        by `cut` (views) before they are copied, so a copy holds the real positions only. Inputs
        that are not of a bucket's exact shapes, dtypes and device take the checked path, whose
        BadRequest names what is wrong."""
        bucket = self._shaper.exact_bucket(args, kwargs)
        if bucket is None or rows > bucket:
            return cut(self._call(args, kwargs, copies))
        with torch.no_grad():
            return self._run(args, kwargs, rows, copies, padded_to=bucket, cut=cut)

    def call_short(
        self, args: Any, kwargs: dict[str, Any], rows: int, bucket: int, cut: trees.Cut, copies: bool = True
    ) -> Optional[Any]:
        """A request of `rows` real rows, shorter than `bucket`'s point along padded dimensions and
        not padded: where the bucket's variant replays a graph of the tool's own, written into the
        corners of its inputs (the positions beyond hold the pad values, as padding would make
        them), run, and cut back by `cut` as call_padded does. None, having run nothing, where the
        variant replays no such graph or the request's shapes, dtypes or device are not ones it
        takes: the caller pads it and calls call_padded, whose checks name what is wrong."""
        if rows > bucket:
            return None
        grad = _is_grad_enabled()
        if not self._lock.acquire(False):
            self._wait_for_lock()
        try:
            if grad:
                _set_grad_enabled(False)
            route = self._routes[bucket]
            runner = route.runner
            outputs = runner.replay_short(args, kwargs) if isinstance(runner, GraphedCall) else None
            if outputs is None:
                return None
            route.shaped.count(rows, bucket)
            return cut_out(outputs, cut, route.copy, copies)
        finally:
            self._lock.release()
            if grad:
                _set_grad_enabled(True)

    def _run(
        self,
        args: Any,
        kwargs: dict[str, Any],
        n: int,
        copies: bool,
        padded_to: Optional[int] = None,
        cut: Optional[trees.Cut] = None,
    ) -> Any:
        if not self._lock.acquire(False):
            self._wait_for_lock()
        try:
            bucket = self._shaper.bucket_for(n) if padded_to is None else padded_to
            route = self._routes[bucket]
            runner = route.runner
            # a graph of the tool's own takes the request into its inputs' corners, unpadded
            outputs = (
                runner.replay_short(args, kwargs) if padded_to is None and isinstance(runner, GraphedCall) else None
            )
            if outputs is None:
                padded_args, padded_kwargs = (
                    self._shaper.pad(args, kwargs, bucket) if padded_to is None else (args, kwargs)
                )
                outputs = runner(*padded_args, **padded_kwargs)
            route.shaped.count(n, bucket)
            if cut is None and n < bucket:
                cut = self._shaper.rows_cut(n, self._dims)
            # copied before the lock is released: the next call (another request's, or the next
            # chunk's) replays into the same buffers
            if cut is not None:
                return cut_out(outputs, cut, route.copy, copies)
            return route.copy(outputs) if route.copy is not None and copies else outputs
        finally:
            self._lock.release()

    def _wait_for_lock(self) -> None:
        """Take the call lock, which another call holds. The wait is listed until the lock is
        taken, so that a request running in chunks lets this call go before its next chunk (a
        lock alone is no queue: the thread that releases it often takes it again first)."""
        entered = threading.Event()
        self._waiting.append(entered)
        try:
            self._lock.acquire()
        finally:
            self._waiting.remove(entered)
            entered.set()

    def variant(self, bucket: int) -> str:
        """What serves the bucket now."""
        return self._routes[bucket].variant

    def info(self) -> ReplicaInfo:
        """A snapshot: what each bucket serves now, and how the replica got there."""
        with self._info_lock:
            snapshot = copy.deepcopy(self._info)
        if self._events is not None:
            snapshot.events = self._events.snapshot()
        snapshot.request_sizes = size_labels(self.request_sizes())
        return snapshot

    def usage(self) -> dict[int, BucketUsage]:
        """Per bucket, what it has served since load (a snapshot)."""
        usage = {}
        for bucket, route in self._routes.items():
            exact, shaped = route.exact_calls, route.shaped
            usage[bucket] = BucketUsage(shaped.calls + exact, shaped.rows + exact * bucket, shaped.padded_rows)
        return usage

    def request_sizes(self) -> dict[tuple[int, ...], int]:
        """Every request's rows since load, counted: those of a bucket's exact shapes, and those
        checked and padded (a snapshot; what `orchestrate plan` plans buckets from)."""
        with self._info_lock:
            sizes: Counter[tuple[int, ...]] = Counter({(n,): count for n, count in self._sizes.items()})
        for bucket, route in self._routes.items():
            if route.exact_calls:
                sizes[(bucket,)] += route.exact_calls
        return dict(sizes)

    @property
    def loading(self) -> bool:
        """Whether buckets are still being switched to their planned variants."""
        return not self._loaded.is_set()

    def wait_loaded(self, timeout: Optional[float] = None) -> bool:
        """Block until every bucket is settled on its plan, or refused with a reason (`info()`);
        False if `timeout` seconds passed first. Raises NotWarm where a compiled variant missed
        the cache under require_warm (the bucket itself keeps serving eager)."""
        if not self._loaded.wait(timeout):
            return False
        if self._failure is not None:
            raise self._failure
        return True

    def _switch(self, row: BucketInfo, runner: Callable[..., Any], seconds: float) -> None:
        """Serve the bucket on its planned variant from the next call on."""
        copy = copier(runner, replays_into_buffers(row.variant, self.spec, self.device.type))
        route = self._routes[row.bucket]
        with self._lock:  # after the call under way, before the next
            route.runner, route.variant, route.copy = runner, row.variant, copy
        self._settle(row, seconds)

    def _settle(self, row: BucketInfo, seconds: Optional[float]) -> None:
        row.loading = False
        row.on_plan = row.variant == (row.planned or "eager")
        row.on_plan_seconds = seconds if row.on_plan else None
        with self._info_lock:
            self._info.buckets[row.bucket] = row

    def _ready_at(self, seconds: float) -> None:
        with self._info_lock:
            self._info.ready_seconds = seconds
            self._info.ready_seconds_from_spawn = None if self._age is None else self._age + seconds

    def _loaded_all(self, seconds: float, frames: int, failure: Optional[BaseException]) -> None:
        with self._info_lock:
            self._info.on_plan_seconds = seconds
            self._info.on_plan_seconds_from_spawn = None if self._age is None else self._age + seconds
            self._info.dynamo_frames_compiled = frames
        self._failure = failure
        self._loaded.set()


def size_labels(sizes: dict[tuple[int, ...], int]) -> dict[str, int]:
    """Request sizes as `info()` gives them: `3`, or `3x71` in a grid, smallest first."""
    return {"x".join(map(str, size)): count for size, count in sorted(sizes.items())}


class _Route:
    """How a call reaches a bucket's variant, and what the bucket has served; changed and counted
    under the call lock, read without it by `usage()` (a scrape must not wait for a model call)."""

    __slots__ = ("copy", "exact_calls", "runner", "shaped", "variant")

    def __init__(self, model: Callable[..., Any]) -> None:
        self.runner, self.variant = model, "eager"
        # replays write their outputs into the same buffers: the caller gets copies (jobs/copies.py)
        self.copy: Optional[Callable[[Any], Any]] = None
        self.exact_calls = 0  # calls at the bucket's own size: `bucket` rows each, no padding
        self.shaped = BucketUsage()  # the calls that were checked and padded (chunks included)


class _Events:
    """The milestones of a replica's start, in seconds from its load's start; shared by both threads."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._rows: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def add(self, what: str) -> float:
        seconds = time.perf_counter() - self.started
        with self._lock:
            self._rows.append((what, round(seconds, 4)))
        return seconds

    def snapshot(self) -> list[tuple[str, float]]:
        with self._lock:
            return list(self._rows)


class _Loader:
    """The loader's thread (see the module doc)."""

    def __init__(
        self,
        spec: WarmupSpec,
        device: torch.device,
        require_warm: bool,
        local: LocalCache,
        platform: Platform,
        remote: Optional[Remote],
        started: float,
        call_lock: Optional[threading.Lock] = None,
        answered: Optional[threading.Event] = None,
    ) -> None:
        self.spec, self.device, self.require_warm = spec, device, require_warm
        self._answered = answered  # besides this replica's own answering (`serve`): what loads wait for
        self.local, self.directory, self.platform, self.remote = local, local.path, platform, remote
        self.events = _Events(started)
        # the served model's call lock: while Dynamo traces (and AOTAutograd, on a cache miss,
        # traces again with torch.fx, which patches torch.nn.Module's __call__ for every thread),
        # an eager call on another thread would be caught in that trace, so none runs meanwhile
        self.call_lock = call_lock or threading.Lock()
        self.gate = Gate.from_options(spec.check)
        self.pool: Any = None  # the memory pool every bucket's CUDA graph shares
        self.pulled: Optional[sync.Transfer] = None
        self.model: Optional[torch.nn.Module] = None
        self._compiled: dict[str, Any] = {}
        self._plans: dict[int, dict[str, Any]] = {}
        self._pull_error: Optional[BaseException] = None
        self._pull_done = threading.Event()
        self._serving = threading.Event()
        self._abandoned = False
        self._served: Optional[BucketedModel] = None
        self._references: dict[int, Any] = {}
        # a daemon: a process told to exit while buckets load exits at once
        self._thread = threading.Thread(target=self._run, name="orchestrate-replica-loader", daemon=True)
        self._release_collections: Callable[[], None] = lambda: None

    def start(self) -> None:
        # the load makes most of the objects the process will ever hold: full collections wait
        # for its end (jobs/collector.py), where the loader's thread runs one
        self._release_collections = defer_full_collections()
        self._thread.start()

    def model_built(self, model: torch.nn.Module) -> None:
        """The module the variants load onto; they load once the replica answers (`serve`)."""
        self.events.add("model built")
        self.model = model

    def plans(self) -> dict[int, dict[str, Any]]:
        """The serving plans, once the pull is done; the pull's own error where it failed."""
        self._pull_done.wait()
        if self._pull_error is not None:
            raise self._pull_error
        return self._plans

    def serve(self, served: BucketedModel, references: dict[int, Any]) -> None:
        self._served, self._references = served, references
        self.events.add("answering")
        self._serving.set()

    def abandon(self) -> None:
        """The load failed in the caller's thread: load nothing more, once the pull is over."""
        self._abandoned = True
        self._serving.set()
        self._pull_done.wait()

    def _run(self) -> None:
        try:
            self._load_all()
        finally:
            self._release_collections()

    def _load_all(self) -> None:
        try:
            self._pull()
        except BaseException as exc:  # the caller raises it (plans())
            self._pull_error = exc
            self._pull_done.set()
            return
        self._pull_done.set()
        if self._plans_compile() and ti.hash_triton_build():
            self.events.add("triton's build hashed")
        # the compiler's imports and the loads wait for the replica to answer: beside the model's
        # build and its eager references (Python too, under one interpreter lock) they would slow
        # the answering, which is what a new replica is waited on for
        self._serving.wait()
        if self._answered is not None:
            self._answered.wait()
        if self._abandoned:
            return
        settled: set[int] = set()
        frames: Optional[ti.CounterWindow] = None
        try:
            with self._probing_the_cpu():
                frames = self._import_what_plans_need()
            failure = self._load_buckets(settled)
        except Exception as exc:  # the loader's own fault: every bucket not yet settled stays on eager
            failure = exc
            if self._served is not None and not self._abandoned:
                for bucket in sorted(set(self.spec.buckets) - settled):
                    row = initial_row(bucket, self._plans)
                    row.reason = f"{row.planned or 'eager'} not loaded, serving eager: {brief(exc)}"
                    self._served._settle(row, None)
        self._references.clear()  # the eager outputs: held only to check against
        if self._served is not None and not self._abandoned:
            compiled = frames.stats().frames_compiled if frames else 0
            self._served._loaded_all(self.events.add("settled"), compiled, failure)

    def _served_plans(self) -> dict[int, dict[str, Any]]:
        """The plans of the buckets this replica serves: the namespace may hold others'."""
        return {bucket: self._plans[bucket] for bucket in self.spec.buckets if bucket in self._plans}

    @contextlib.contextmanager
    def _probing_the_cpu(self) -> Iterator[None]:
        """On the CPU, where a plan compiles: Inductor's probe of the host's vector instructions
        runs on a thread of its own while the block runs (imports), and is over when it ends.
        Inductor runs that probe once per process at its first C++ kernel load, and nearly all of
        it waits for a child Python, without the interpreter lock."""
        if self.device.type != "cpu" or not self._plans_compile():
            yield
            return
        probe = ti.cpu_vector_isa_probe()  # its imports on this thread, before the compiler's
        thread = threading.Thread(target=probe, name="orchestrate-isa-probe", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join()  # else the first load would probe again beside it
            self.events.add("cpu probed")

    def _plans_compile(self) -> bool:
        """Whether a bucket this replica serves is planned on a compiled variant."""
        return any(plan["variant"] in COMPILED_VARIANTS for plan in self._served_plans().values())

    def _import_what_plans_need(self) -> ti.CounterWindow:
        planned = {plan["variant"] for plan in self._served_plans().values()}
        if planned & set(COMPILED_VARIANTS):  # else Dynamo is never imported at all
            ti.import_compiler(to_compile=bool(planned & {"compiled", "graphed"}))
            ti.take_torch_key(self.local.inductor_dir)  # else the first kernel's load hashes torch's sources
            ti.allow_recompiles(2 * len(self.spec.buckets))
            self.events.add("compiler imported")
        return ti.CounterWindow()

    def _load_buckets(self, settled: set[int]) -> Optional[BaseException]:
        """Each bucket on its plan, largest first (it sizes the shared pool); NotWarm, where one
        missed the cache under require_warm (nothing loads after it)."""
        failure: Optional[BaseException] = None
        unplanned: Optional[BaseException] = None  # under require_warm: a bucket never warmed here
        for bucket in sorted(self.spec.buckets, reverse=True):
            if self._abandoned:
                return failure or unplanned
            row = initial_row(bucket, self._plans)
            runner = None
            if row.planned is None and self.require_warm:
                unplanned = unplanned or NotWarm(
                    f"bucket {self.spec.point_label(bucket)}: no serving plan in {self.directory}; warm this "
                    "platform first (orchestrate warmup) or pull what was warmed (orchestrate pull), or load "
                    "without require_warm"
                )
                row.reason = f"not warm, serving eager: {unplanned}"
            elif row.planned in (None, "eager"):
                pass
            elif failure is not None:
                row.reason = f"{row.planned} not loaded, serving eager: {failure}"
            else:
                try:
                    runner = self._load(row, self._plans[bucket])
                except NotWarm as exc:
                    failure = exc
                    row.reason = f"{row.planned} refused, serving eager: {exc}"
            served = self._served
            if self._abandoned or served is None:
                return failure or unplanned
            if runner is not None:
                served._switch(row, runner, self.events.add(f"bucket {bucket} on {row.variant}"))
            elif row.planned in (None, "eager"):
                served._settle(row, served._info.answering_seconds)
            else:
                self.events.add(f"bucket {bucket} stays eager")
                served._settle(row, None)
            settled.add(bucket)
        return failure or unplanned

    def _pull(self) -> None:
        if self.remote is not None:
            self.pulled = sync.pull(
                open_store(self.remote.url),
                self.local.namespace,
                self.local.path,
                TrustedKeys.from_pems(self.remote.trusted),  # a replica verifies; it holds no private key
                allow_unsigned=self.remote.allow_unsigned,
            )
            self.events.add("pulled")
        self._plans = read_plans(self.directory)

    def _load(self, row: BucketInfo, plan: dict[str, Any]) -> Optional[Callable[..., Any]]:
        """The bucket's planned variant, built and checked against its eager reference; None with
        `row.reason` where it cannot serve. Raises NotWarm."""
        planned = str(row.planned)
        args, kwargs = make_inputs(self.spec, row.bucket, self.device)
        memory_before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        started = time.perf_counter()
        try:
            # one load at a time reads the caches, so its counters count its own lookups alone
            with _reading(self.local):
                window = ti.CounterWindow()
                runner, capture_seconds = self._build(planned, args, kwargs, plan.get("artifacts", {}))
                stats = window.stats()
            row.cache_hits, row.cache_misses = stats.cache_hits, stats.cache_misses
            if self.require_warm and stats.cache_misses:
                raise NotWarm(
                    f"bucket {row.bucket}: variant {planned} missed the cache {stats.cache_misses} times; "
                    "warm this platform first (orchestrate warmup), or load without require_warm"
                )
            if self._abandoned:
                return None
            expected = snapshot(self._references[row.bucket])
            # under the call lock, as every call of the model: another slice's loader may be
            # tracing it, and a trace records whatever module calls any thread makes meanwhile
            with self.call_lock, torch.no_grad():
                if planned == "compiled":
                    ti.mark_step()
                self.gate.compare(
                    expected,
                    snapshot(runner(*args, **kwargs)),
                    call=f"{planned} at load",
                    bounds=plan.get("load_bounds"),
                )
        except NotWarm:
            raise
        except Exception as exc:  # this bucket serves eager; the replica still serves
            row.reason = f"{planned} unavailable here, serving eager: {brief(exc)}"
            return None
        if isinstance(runner, GraphedCall) and self.pool is None:
            # shared only once a graph that holds it is kept: a graph refused above frees its
            # pool, and a capture into a freed pool fails inside the caching allocator
            self.pool = runner.pool
        row.variant, row.capture_seconds = planned, capture_seconds
        row.load_seconds = time.perf_counter() - started
        if memory_before is not None:
            row.memory_bytes = torch.cuda.memory_allocated(self.device) - memory_before
        return runner

    def _build(
        self, variant: str, args: Any, kwargs: dict[str, Any], artifacts: dict[str, Any]
    ) -> tuple[Callable[..., Any], float]:
        model = self.model
        assert model is not None  # set before serving began
        if variant == "aot":
            saved = artifacts.get("aot")
            if not saved:
                raise aot.Unexportable("the serving plan names no aot function")
            aot.check_platform(saved["platform"], self.platform)
            with ti.compiler_left_out():  # the capture's first calls too (aot.load's docstring)
                loaded = aot.load(self.directory / saved["path"], model)
                if self.device.type != "cuda":
                    return loaded, 0.0
                started = time.perf_counter()
                call = GraphedCall(loaded, args, kwargs, pool=self.pool, padding=input_padding(self.spec))
                return call, time.perf_counter() - started
        if variant == "compiled":
            compiled = self._compile("compiled")

            def run(*a: Any, **k: Any) -> Any:
                ti.cudagraph_trees_on_this_thread()  # whichever thread serves: torch 2.11 has none there
                ti.mark_step()
                return compiled(*a, **k)

            with self.call_lock, torch.no_grad():
                run(*args, **kwargs)  # the trace and the cache load (or the compile)
            # CUDA-graph trees' warm-up and recording (trees are per thread: a serving thread records
            # its own on its first calls)
            with torch.no_grad():
                for _ in range(ti.GRAPH_RECORD_CALLS):
                    run(*args, **kwargs)
            return run, 0.0
        fn = model if variant == "eager-graphed" else self._compile("graphed")
        if variant == "graphed":
            with self.call_lock, torch.no_grad():
                fn(*args, **kwargs)  # the trace and the cache load (or the compile)
        started = time.perf_counter()
        call = GraphedCall(fn, args, kwargs, pool=self.pool, padding=input_padding(self.spec))
        return call, time.perf_counter() - started

    def _compile(self, variant: str) -> Any:
        if variant not in self._compiled:
            ti.match_a_plain_process()
            self._compiled[variant] = torch.compile(self.model, **ti.variant_compile_kwargs(self.spec.compile, variant))
        return self._compiled[variant]
