"""A serving replica of a grid of buckets (batch x seq): one model, one replica per slice.

A grid config is served as its slices (WarmupSpec.slices), each a list-form replica
(jobs/replica.py) that pads and cuts the bucket dimension; all of them share the one model
built here and one call lock. A request of any size goes to the point where it costs least by
warmup's measured latency of the variant serving each point (the padded positions it would
compute, where a point has no measurement), is padded up to that point along every other grid
dimension with each input's `pad` value, and its outputs are cut back along the dimensions that
follow them (learnt at load as warmup's padding proof learns them, jobs/grid.py). A request
longer than the grid's largest size in a dimension other than the bucket dimension is refused
(BadRequest); one of more rows is split, or refused, as `serve.oversize` says.

    grid = load_grid(spec, cache_root, remote=..., ready="answering")
    grid(input_ids=ids, attention_mask=mask)   # any batch x seq; answers as eager at that size
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.cache import sync
from orchestrator.cache.local import LocalCache
from orchestrator.cache.namespace import namespace
from orchestrator.jobs import grid as grid_shapes
from orchestrator.jobs import routing, trees
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.errors import SetupError
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.padding import BadRequest
from orchestrator.jobs.records import Remote
from orchestrator.jobs.replica import BucketedModel, BucketUsage, ReplicaInfo, load_replica, size_labels
from orchestrator.jobs.spec import ReadyWhen, WarmupSpec
from orchestrator.jobs.timing import process_age_seconds
from orchestrator.jobs.variants import read_plans


@dataclass(frozen=True)
class _GridRoute:
    """Where a request of one shape goes."""

    size: tuple[int, ...]  # rows, then each other grid dimension: what `request_sizes` counts
    rows: int
    sizes: dict[str, int]  # the other grid dimensions
    index: int  # the slice
    bucket: Optional[int]  # the slice's bucket; None: more rows than any, run in chunks
    point: dict[str, int]  # the point's size in every grid dimension
    cut: Optional[trees.Cut]  # how outputs are cut back; None: the point's own shapes


class GridModel:
    """The served grid: call it as the model with any size in every grid dimension."""

    ROUTES = 65536  # request shapes whose route is kept

    def __init__(
        self,
        spec: WarmupSpec,
        slices: list[tuple[WarmupSpec, BucketedModel]],
        dims: grid_shapes.GridDims,
        costs: list[dict[int, Optional[float]]],
        timing: _GridTiming,
    ) -> None:
        self.spec = spec
        # when the grid's load began and answered, and when each slice's began: a slice's own
        # figures count from its start, after the model's build and the slices before it
        self._timing = timing
        self.slices = slices
        first = slices[0][1]
        self.model, self.device = first.model, first.device
        self.dims = dims  # output path -> {tensor dim: grid dimension}, the bucket dimension's left to each slice
        # the same with the bucket dimension's too (the slices learnt them alike): how a request
        # padded in every dimension at once is cut back
        self._all_dims: grid_shapes.GridDims = {path: dict(found) for path, found in dims.items()}
        for path, bucket_dims in first._dims.items():
            self._all_dims.setdefault(path, {}).update(dict.fromkeys(bucket_dims, spec.bucket_symbol))
        self._shaper = grid_shapes.InputShaper(spec)
        # per input in call order: how messages name it, and its shape
        self._inputs = [(item.name or f"inputs[{i}]", item.shape) for i, item in enumerate(self._shaper.items)]
        self._other = list(spec.grid or {})
        self._largest = {dim: max(sizes) for dim, sizes in (spec.grid or {}).items()}
        self._costs = costs  # per slice: batch bucket -> ms of the variant serving it (None: not measured)
        self._measured = all(ms is not None for by_bucket in costs for ms in by_bucket.values())
        self._routes: dict[tuple[torch.Size, ...], _GridRoute] = {}  # by the request's shapes
        self._requests: Counter[tuple[int, ...]] = Counter()  # (rows, sizes...) -> requests
        self._counted = threading.Lock()
        self.buckets = [part.point_label(b) for part, _ in slices for b in part.buckets]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, borrow=False)

    def borrow(self, *args: Any, **kwargs: Any) -> Any:
        """As BucketedModel.borrow: outputs may be the graph's own buffers, valid until the next call."""
        return self._call(args, kwargs, borrow=True)

    def _call(self, args: Sequence[Any], kwargs: dict[str, Any], borrow: bool) -> Any:
        route = self._route(args, kwargs)
        with self._counted:
            self._requests[route.size] += 1
        part, served = self.slices[route.index]
        if route.bucket is None:  # more rows than any bucket: the slice runs them in chunks (serve.oversize)
            if route.cut is not None:
                args, kwargs = self._shaper.pad(args, kwargs, part.fixed)
            outputs = (served.borrow if borrow else served)(*args, **kwargs)
            return route.cut(outputs) if route.cut is not None else outputs
        if route.cut is None:  # the point's own shapes
            return (served.borrow if borrow else served)(*args, **kwargs)
        # into the corners of the point's graph inputs where it replays one; else padded once in
        # every dimension. Cut once either way (each padding of an input is a new tensor and, on a
        # GPU, kernels launched; each cut a walk of the output tree).
        outputs = served.call_short(args, kwargs, route.rows, route.bucket, route.cut, not borrow)
        if outputs is not None:
            return outputs
        args, kwargs = self._shaper.pad(args, kwargs, route.point)
        return served.call_padded(args, kwargs, route.rows, route.cut, not borrow)

    def _route(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _GridRoute:
        """Where a request goes, worked out once per request shape: its sizes, and with them every
        check `_sizes` makes, follow from the shapes of its tensors alone."""
        shaper, key = self._shaper, None
        if len(args) == shaper.positional and len(kwargs) == len(shaper.names):
            values = [*args, *(kwargs.get(name) for name in shaper.names)]
            if all(type(value) is torch.Tensor for value in values):
                key = tuple(value.shape for value in values)
                found = self._routes.get(key)
                if found is not None:
                    return found
        rows, sizes = self._sizes(args, kwargs)
        index = self._choose(rows, sizes)
        part = self.slices[index][0]
        buckets = part.buckets
        short = any(sizes[dim] != part.fixed[dim] for dim in self._other)
        bucket = buckets[bisect.bisect_left(buckets, rows)] if rows <= buckets[-1] else None
        point = {part.bucket_symbol: bucket or buckets[-1], **part.fixed}
        cut = None
        if bucket is None:
            cut = grid_shapes.output_cut(self.dims, sizes) if short else None
        elif short or rows != bucket:
            cut = grid_shapes.output_cut(self._all_dims, {part.bucket_symbol: rows, **sizes})
        route = _GridRoute((rows, *sizes.values()), rows, sizes, index, bucket, point, cut)
        if key is not None and len(self._routes) < self.ROUTES:
            self._routes[key] = route
        return route

    def _sizes(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
        """The request's rows and its size in each other grid dimension, after checking that every
        input agrees on them and none is larger than the grid allows; the slice's replica checks
        everything else (dtypes, fixed dimensions, devices) once padded."""
        shaper = self._shaper
        if len(args) != shaper.positional or set(kwargs) != set(shaper.names):
            named = ", ".join(shaper.names) or "none"
            raise BadRequest(
                f"expected {shaper.positional} positional inputs and the keyword inputs {named}; "
                f"got {len(args)} positional and {', '.join(kwargs) or 'no keywords'}"
            )
        values = [*args, *(kwargs[name] for name in shaper.names)]
        found: dict[str, tuple[int, str]] = {}
        for value, dims, (label, shape) in zip(values, shaper.dims, self._inputs, strict=True):
            if not isinstance(value, torch.Tensor):
                raise BadRequest(f"{label} is a {type(value).__name__}, not a tensor")
            if value.dim() != len(shape):
                raise BadRequest(
                    f"{label} has {value.dim()} dimensions {tuple(value.shape)}, expected {len(shape)}: "
                    f"[{', '.join(map(str, shape))}]"
                )
            for d, name in dims.items():
                size = value.shape[d]
                if size == 0:
                    raise BadRequest(f"{label} has size 0 at dim {d} ({name}); a request needs at least 1")
                if name in found and found[name][0] != size:
                    raise BadRequest(
                        f"{label} has {size} at dim {d} ({name}) where {found[name][1]} has {found[name][0]}; "
                        f"every input needs the same {name}"
                    )
                found.setdefault(name, (size, label))
        sizes = {name: found[name][0] for name in self._other}
        for name, size in sizes.items():
            if size > self._largest[name]:
                raise BadRequest(
                    f"request has {size} at {name}, more than the grid's largest {name} {self._largest[name]}; "
                    f"send at most {self._largest[name]}, or add a larger size to `buckets.{name}`"
                )
        return found[self.spec.bucket_symbol][0], sizes

    def _choose(self, rows: int, sizes: dict[str, int]) -> int:
        """The slice that serves this request for least (routing.cheapest: whole where a point holds
        its rows, split along the batch only where none does), by measured milliseconds where every
        point has them, else by computed positions (padding included)."""
        holding = [
            index
            for index, (part, _) in enumerate(self.slices)
            if all(part.fixed[dim] >= size for dim, size in sizes.items())
        ]
        if not holding:  # the grid leaves out every point large enough (points.max_product)
            shown = ", ".join(f"{name} {size}" for name, size in sizes.items())
            raise BadRequest(f"no point of the grid takes {rows} rows at {shown}; the config's `points` leave them out")

        def price(at: int, bucket: int) -> float:
            index = holding[at]
            if self._measured:
                return float(self._costs[index][bucket] or 0.0)
            return float(bucket * math.prod(self.slices[index][0].fixed.values()))

        at, _, _ = routing.cheapest(rows, [self.slices[index][0].buckets for index in holding], price)
        return holding[at]

    def info(self) -> ReplicaInfo:
        """Every slice's info as one: buckets keyed by point (`8x64`), every time counted from the
        grid's load start (a slice's own count from its start)."""
        timing = self._timing
        infos = [
            (part, served.info(), offset) for (part, served), offset in zip(self.slices, timing.slices, strict=True)
        ]
        buckets = {}
        for part, info, offset in infos:
            for bucket, row in info.buckets.items():
                label = part.point_label(bucket)
                on_plan = None if row.on_plan_seconds is None else offset + row.on_plan_seconds
                buckets[label] = replace(row, point=label, on_plan_seconds=on_plan)
        slice_on_plan = [
            None if info.on_plan_seconds is None else offset + info.on_plan_seconds for _, info, offset in infos
        ]
        on_plan_seconds = None if None in slice_on_plan else max(slice_on_plan)  # type: ignore[type-var]
        ready = timing.ready if timing.ready is not None else timing.answering

        def from_spawn(seconds: Optional[float]) -> Optional[float]:
            return None if seconds is None or timing.age is None else timing.age + seconds

        return replace(
            infos[0][1],
            namespace=", ".join(info.namespace for _, info, _ in infos),
            buckets=buckets,
            ready_seconds=ready,
            ready_seconds_from_spawn=from_spawn(ready),
            load_started_from_spawn=timing.age,
            answering_seconds=timing.answering,
            answering_seconds_from_spawn=from_spawn(timing.answering),
            on_plan_seconds=on_plan_seconds,
            on_plan_seconds_from_spawn=from_spawn(on_plan_seconds),
            pull=sync.combined(info.pull for _, info, _ in infos if info.pull),
            dynamo_frames_compiled=sum(info.dynamo_frames_compiled for _, info, _ in infos),
            events=sorted(
                (
                    (f"{_fixed(part)}: {what}", round(offset + at, 4))
                    for part, info, offset in infos
                    for what, at in info.events
                ),
                key=lambda event: event[1],
            ),
            request_sizes=size_labels(self.request_sizes()),
        )

    def usage(self) -> dict[str, BucketUsage]:
        return {part.point_label(b): used for part, served in self.slices for b, used in served.usage().items()}

    def request_sizes(self) -> dict[tuple[int, ...], int]:
        """Every request's size since load, in the grid's dimensions (the bucket dimension first),
        counted (a snapshot; what `orchestrate plan` plans a grid from)."""
        with self._counted:
            return dict(self._requests)

    def variant(self, point: str) -> str:
        for part, served in self.slices:
            for b in part.buckets:
                if part.point_label(b) == point:
                    return served.variant(b)
        raise KeyError(point)

    @property
    def loading(self) -> bool:
        return any(served.loading for _, served in self.slices)

    def wait_loaded(self, timeout: Optional[float] = None) -> bool:
        return all(served.wait_loaded(timeout) for _, served in self.slices)

    def output_dims(self) -> dict[str, set[int]]:
        """Every output tensor's dimensions that follow the request's size, any grid dimension."""
        dims: dict[str, set[int]] = {path: set(found) for path, found in self.dims.items()}
        for path, found in self.slices[0][1]._dims.items():
            dims.setdefault(path, set()).update(found)
        return dims


def load_grid(
    spec: WarmupSpec,
    cache_root: Path,
    *,
    remote: Optional[Remote] = None,
    require_warm: bool = False,
    ready: ReadyWhen = "answering",
) -> GridModel:
    """Every slice of the grid loaded as a replica sharing one model and one call lock; `ready`
    as for load_replica, over all of them."""
    started, age = time.perf_counter(), process_age_seconds()
    device = resolve_device(spec.device)
    parts = spec.slices()
    lock = threading.Lock()
    # the slices' loaders load nothing until every slice answers: beside the later slices' eager
    # references they would slow the grid's answering (jobs/replica.py, _Loader)
    answered = threading.Event()
    model = build_model(parts[0], device)
    slices = []
    offsets = []  # each slice's load start, from the grid's
    try:
        for part in parts:
            offsets.append(time.perf_counter() - started)
            slices.append(
                (
                    part,
                    load_replica(
                        part, cache_root, remote=remote, require_warm=require_warm, ready="answering", model=model,
                        call_lock=lock, answered=answered,
                    ),
                )
            )  # fmt: skip
        with lock:
            dims = _learn_dims(parts, model, device)
    finally:  # a failed load leaves no loader waiting: the slices that answer go on to their plans
        answered.set()
    platform = ti.current_platform(device)
    costs = []
    for part in parts:
        directory = LocalCache(cache_root, namespace(part.label, platform, part.identity_hash())).path
        plans = read_plans(directory) if directory.is_dir() else {}
        costs.append({b: _served_ms(plans.get(b)) for b in part.buckets})
    timing = _GridTiming(age, time.perf_counter() - started, offsets)
    grid = GridModel(spec, slices, dims, costs, timing)
    if ready == "planned":
        grid.wait_loaded()
        timing.ready = time.perf_counter() - started
    return grid


@dataclass
class _GridTiming:
    """A grid's load in seconds from its start: when it answered (every slice, and the outputs'
    grid dimensions learnt), when it returned where that differs (ready="planned"), and when
    each slice's load began. `age`: the process's age at the start (None where unknown)."""

    age: Optional[float]
    answering: float
    slices: list[float]
    ready: Optional[float] = None


def _fixed(part: WarmupSpec) -> str:
    return ", ".join(f"{name} {size}" for name, size in part.fixed.items())


def _served_ms(plan: Optional[dict[str, Any]]) -> Optional[float]:
    if not plan:
        return None
    measure = (plan.get("variants") or {}).get(plan.get("variant")) or {}
    ms = measure.get("ms")
    return float(ms) if isinstance(ms, (int, float)) and ms > 0 else None


def _learn_dims(parts: list[WarmupSpec], model: torch.nn.Module, device: torch.device) -> grid_shapes.GridDims:
    """The outputs' dimensions that follow each grid dimension (not the bucket dimension's, which
    each slice learns), from eager at a point and one step shorter there; a dimension whose every
    size is 1 is never padded and needs none."""
    dims: grid_shapes.GridDims = {}
    shaper = grid_shapes.InputShaper(parts[0])
    for name in parts[0].fixed:
        part = next((p for p in parts if p.fixed[name] > 1), None)
        if part is None:
            continue
        bucket = part.buckets[0]
        point = {part.bucket_symbol: bucket, **part.fixed}
        args, kwargs = make_inputs(part, bucket, device)
        with torch.no_grad():
            at_point = grid_shapes.snapshot_tree(model(*args, **kwargs))
            cut_args, cut_kwargs = shaper.cut(args, kwargs, {name: point[name] - 1})
            shorter = model(*cut_args, **cut_kwargs)
        try:
            learned = grid_shapes.learn_output_dims(point, at_point, {name: shorter})
        except grid_shapes.PaddingUnsafe as exc:
            raise SetupError(f"the model's outputs: {exc}") from None
        for path, found in learned.items():
            dims.setdefault(path, {}).update(found)
    return dims
