"""What a warmup job is asked to do: the model, its inputs per bucket, how to compile and measure.

The spec lives in `jobs` (not in the CLI) because workers receive it: the orchestrator parses
YAML into it, and every worker builds the same model and inputs from it. It imports no torch,
so the CLI can validate a config before paying for `import torch`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    StrictInt,
    field_validator,
    model_validator,
)

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2}
ITEM_BYTES |= {"int8": 1, "uint8": 1, "bool": 1}
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
DType = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

# `package.module:callable` or `path/to/file.py:callable`
_FACTORY = re.compile(r"^(?P<target>[^:]+):(?P<attr>[A-Za-z_][A-Za-z0-9_.]*)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    factory: str = Field(description="`module:callable` or `path/to/file.py:callable` returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")
    dtype: Optional[Literal["float32", "float16", "bfloat16", "float64"]] = Field(
        default=None, description="cast the built model's parameters to this dtype"
    )

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str) -> str:
        if not _FACTORY.match(value):
            raise ValueError(f"{value!r} is not 'module:callable' or 'path/to/file.py:callable'")
        return value

    @property
    def _parts(self) -> re.Match[str]:
        match = _FACTORY.match(self.factory)
        if match is None:  # the field validator refuses such a factory first
            raise ValueError(f"model.factory {self.factory!r} is not module:callable or file.py:callable")
        return match

    @property
    def is_file(self) -> bool:
        target = self._parts["target"]
        return target.endswith(".py") or "/" in target

    @property
    def target(self) -> str:
        return self._parts["target"]

    @property
    def attribute(self) -> str:
        return self._parts["attr"]


class InputSpec(_Strict):
    shape: list[int | str] = Field(
        description="dimensions; the bucket symbol (e.g. `batch`) marks the bucketed one, a grid's other "
        "dimensions (e.g. `seq`) theirs"
    )
    dtype: DType = "float32"
    range: Optional[tuple[int, int]] = Field(
        default=None, description="[low, high) of integer inputs such as token ids"
    )
    name: Optional[str] = Field(default=None, description="pass as this keyword argument instead of positionally")
    pad: float = Field(
        default=0,
        description="value a serving replica pads this input with, up to its bucket (e.g. the pad token id)",
    )

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: list[int | str]) -> list[int | str]:
        if not shape:
            raise ValueError("a shape needs at least one dimension")
        for dim in shape:
            if isinstance(dim, int) and dim <= 0:
                raise ValueError(f"dimension {dim} must be a positive integer or the bucket symbol")
        return shape

    @model_validator(mode="after")
    def _range_fits_dtype(self) -> InputSpec:
        if self.dtype in INT_DTYPES:
            if self.range is None:
                raise ValueError(
                    f"integer input ({self.dtype}) needs `range: [low, high]`, e.g. [0, 32000] for token ids"
                )
            low, high = self.range
            if low >= high:
                raise ValueError(f"range [{low}, {high}] is empty: low must be below high")
        elif self.range is not None:
            raise ValueError(f"`range` applies to integer inputs only, not {self.dtype}")
        if self.dtype in (*INT_DTYPES, "bool") and self.pad != int(self.pad):
            raise ValueError(f"pad {self.pad} is not a whole number: the input is {self.dtype}")
        if self.dtype == "bool" and self.pad not in (0, 1):
            raise ValueError(f"pad {self.pad} is not 0 or 1: the input is bool")
        return self

    def concrete_shape(self, symbol: str, bucket: int, fixed: Optional[dict[str, int]] = None) -> list[int]:
        """The shape at `bucket`, a grid slice's `fixed` dimensions at their sizes (the spec's
        validator allows no other symbol)."""
        sizes = {**(fixed or {}), symbol: bucket}
        return [sizes[dim] if isinstance(dim, str) else dim for dim in self.shape]

    def host_bytes(self, symbol: str, bucket: int, fixed: Optional[dict[str, int]] = None) -> int:
        """What making this input for `bucket` takes on the host: floating-point inputs are drawn in
        float32 and then cast (jobs/model.make_inputs)."""
        size = ITEM_BYTES[self.dtype]
        shape = self.concrete_shape(symbol, bucket, fixed)
        return math.prod(shape) * (max(size, 4) if self.dtype in FLOAT_DTYPES else size)


class CompileOptions(_Strict):
    mode: Optional[CompileMode] = "reduce-overhead"
    # Static per-bucket graphs by default: a graph specialised to its bucket's shapes runs faster
    # per call than a dynamic one, and torch's default (None) turns the second bucket into a
    # dynamic recompile.
    dynamic: Optional[bool] = False
    fullgraph: bool = False
    backend: str = "inductor"
    options: dict[str, Any] = Field(default_factory=dict, description="Inductor config overrides")


class BenchOptions(_Strict):
    iterations: PositiveInt = Field(default=100, description="timed calls of each variant (eager, compiled)")
    warmup: int = Field(default=10, ge=0, description="untimed calls of each variant before timing")
    process: Literal["same", "fresh"] = Field(
        default="same",
        description="where `warmup --no-ray` times the buckets once all are compiled: `same`, the process that "
        "compiled them; `fresh`, a process of its own that loads them from the warm cache and compiles nothing, as "
        "a replica does (a few seconds more per model)",
    )


class CheckOptions(_Strict):
    atol: Optional[float] = Field(default=None, ge=0, description="absolute tolerance; default by output dtype")
    rtol: Optional[float] = Field(default=None, ge=0, description="relative tolerance; default by output dtype")
    allow_nonfinite: bool = Field(
        default=False,
        description="eager may return NaN/Inf; compiled must match them "
        "in place (else a non-finite eager output fails the bucket)",
    )
    reference: Literal["float64", "eager"] = Field(
        default="float64",
        description="judge floating outputs against a float64 run of the model (its RMS error at most "
        "`multiple` times eager's own), or against eager with tolerances by dtype; explicit atol/rtol "
        "always judge against eager",
    )
    multiple: float = Field(
        default=3.0, gt=1, description="how many times eager's error against float64 a compiled output may have"
    )


# How a bucket may be served (orchestrator.runtime): the model as it is, the config's compile,
# each of those captured whole in one CUDA graph of the tool's own (CUDA only), and a function
# compiled ahead of time (Dynamo's precompile) that a replica loads without tracing
VariantName = Literal["eager", "compiled", "graphed", "eager-graphed", "aot"]
VARIANTS: tuple[VariantName, ...] = ("eager", "compiled", "graphed", "eager-graphed", "aot")
GRAPHED_VARIANTS: tuple[VariantName, ...] = ("graphed", "eager-graphed")
# What a serving replica's "ready" waits for: every bucket answering (eager until its planned
# variant is loaded), or every bucket on its plan (orchestrator.jobs.replica)
ReadyWhen = Literal["answering", "planned"]
READY_WHEN: tuple[ReadyWhen, ...] = ("answering", "planned")


# An output path as the gate names it, without the leading `output`: `logits`, `[0]`,
# `encoder_last_hidden_state`, `hidden_states[2]`
_OUTPUT_PATH = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|\[\d+\])(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*$")


class CallOptions(_Strict):
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="constant keyword arguments of every forward call (e.g. `use_cache: false`); they change "
        "what is compiled, so they are part of the namespace",
    )


# `serve.max_rows` where unset, in largest buckets: a request of more rows holds the replica for
# more than this many of the largest bucket's calls
MAX_ROWS_BUCKETS = 4


class ServeOptions(_Strict):
    outputs: Optional[list[str]] = Field(
        default=None,
        description="the output paths a replica returns and the gate checks (e.g. `[logits]`), returned as a "
        "dict keyed by path; default: the whole output. They change what is compiled (what is left out is "
        "never computed for the answer), so they are part of the namespace",
    )
    variants: Optional[list[VariantName]] = Field(
        default=None,
        description="variants measured at warmup, the fastest correct one serves each bucket; "
        "default: all that apply on the device (on the CPU: eager and compiled; `aot` there only "
        "when listed: its C++ build takes tens of seconds per bucket)",
    )
    oversize: Literal["split", "error"] = Field(
        default="split",
        description="a request larger than the largest bucket: run it in chunks of that bucket, or refuse it",
    )
    max_rows: Optional[NonNegativeInt] = Field(
        default=None,
        description="the most rows (along the bucket dimension) `orchestrate serve` takes in one request, "
        f"answering HTTP 413 above it; default: {MAX_ROWS_BUCKETS} times the largest bucket; 0: no limit",
    )

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, outputs: Optional[list[str]]) -> Optional[list[str]]:
        if outputs is None:
            return None
        if not outputs:
            raise ValueError("list at least one output path, or leave `outputs` out for the whole output")
        for path in outputs:
            if not _OUTPUT_PATH.match(path):
                raise ValueError(f"output path {path!r} is not names and indices as in `logits` or `hidden_states[2]`")
        if len(set(outputs)) != len(outputs):
            raise ValueError("an output path is listed twice")
        return outputs

    @field_validator("variants")
    @classmethod
    def _variants(cls, variants: Optional[list[VariantName]]) -> Optional[list[VariantName]]:
        if variants is None:
            return None
        if not variants:
            raise ValueError("list at least one variant, or leave `variants` out for all that apply")
        if len(set(variants)) != len(variants):
            raise ValueError("a variant is listed twice")
        return [v for v in VARIANTS if v in variants]  # one order everywhere: the report's and the plan's


class PointChoice(_Strict):
    """Which points of a grid of buckets are warmed and served: every one by default."""

    max_product: Optional[PositiveInt] = Field(
        default=None, description="leave out points whose sizes multiply to more (a cap on batch × seq)"
    )
    only: Optional[list[list[PositiveInt]]] = Field(
        default=None,
        description="these points alone, each its sizes in the order of `buckets` (e.g. [[1, 256], [32, 64]])",
    )


# A bucket is a row count: a whole number (YAML's `true` is no bucket), and one a tensor's size
# can hold (torch's sizes are 64-bit; past 2^31 - 1 rows the kernels' own indexing is the limit).
MAX_BUCKET = 2**31 - 1
Bucket = Annotated[StrictInt, Field(gt=0, le=MAX_BUCKET)]


class WarmupSpec(_Strict):
    name: Optional[str] = Field(default=None, description="model name in reports and metrics; default: file stem")
    model: ModelRef
    inputs: list[InputSpec] = Field(min_length=1)
    bucket_symbol: str = "batch"
    device: Literal["auto", "cuda", "cpu"] = "auto"
    call: CallOptions = Field(default_factory=CallOptions)
    compile: CompileOptions = Field(default_factory=CompileOptions)
    buckets: list[Bucket] = Field(
        default_factory=lambda: [1, 8, 32],
        min_length=1,
        description="sizes of the bucket dimension; or a grid, sizes by dimension name "
        "(`{batch: [1, 8], seq: [32, 128]}`), every point of it a bucket",
    )
    # A grid's dimensions besides the bucket dimension, in the config's order: each point of
    # `buckets` x these sizes is warmed and served as a bucket (`slices`). Set from a mapping
    # given as `buckets`.
    grid: Optional[dict[str, list[Bucket]]] = None
    points: Optional[PointChoice] = Field(default=None, description="which points of a grid to warm and serve")
    # A slice of a grid: its other dimensions at one size each (set by `slices`, part of identity)
    fixed: dict[str, Bucket] = Field(default_factory=dict)
    bench: BenchOptions = Field(default_factory=BenchOptions)
    check: CheckOptions = Field(default_factory=CheckOptions)
    serve: ServeOptions = Field(default_factory=ServeOptions)
    seed: int = 0
    cache_dir: Optional[str] = Field(
        default=None, description="local cache root; default $ORCHESTRATE_CACHE_DIR or ~/.cache/orchestrate"
    )
    remote: Optional[str] = Field(
        default=None, description="shared store URL (s3://bucket/prefix, file:///dir, any fsspec URL)"
    )

    # Directory relative factory paths are resolved against (the config file's); not part of identity.
    _base_dir: Optional[str] = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _label_safe(cls, name: Optional[str]) -> Optional[str]:
        if name is not None and not _NAME.match(name):
            raise ValueError(f"{name!r} may hold only letters, digits, '_', '.', '-' (it becomes a metric label)")
        return name

    @model_validator(mode="before")
    @classmethod
    def _grid_from_buckets(cls, data: Any) -> Any:
        """`buckets: {batch: [...], seq: [...]}`: the bucket dimension's sizes stay `buckets`, the
        other dimensions become `grid`, in the config's order."""
        if not isinstance(data, dict) or not isinstance(data.get("buckets"), dict):
            return data
        if data.get("grid") is not None:
            raise ValueError("give a grid's dimensions once, as the mapping `buckets`")
        dims = dict(data["buckets"])
        symbol = data.get("bucket_symbol", "batch")
        if symbol not in dims:
            raise ValueError(
                f"buckets: a grid needs the bucket dimension {symbol!r} (the one a request is split along), "
                f"as in `buckets: {{{symbol}: [1, 8], seq: [32, 128]}}`"
            )
        sizes = dims.pop(symbol)
        if not dims:
            raise ValueError(f"buckets: a grid of {symbol!r} alone is the list form: write `buckets: {sizes}`")
        return {**data, "buckets": sizes, "grid": dims}

    @field_validator("buckets")
    @classmethod
    def _unique_buckets(cls, buckets: list[int]) -> list[int]:
        return validate_buckets(buckets)

    @field_validator("grid")
    @classmethod
    def _grid_sizes(cls, grid: Optional[dict[str, list[int]]]) -> Optional[dict[str, list[int]]]:
        if grid is None:
            return None
        for dim, sizes in grid.items():
            if not isinstance(sizes, list) or not sizes:
                raise ValueError(f"{dim}: list one size or more, e.g. [32, 128]")
            try:
                grid[dim] = validate_buckets(sizes)
            except ValueError as exc:
                raise ValueError(f"{dim}: {exc}") from None
        return grid

    @model_validator(mode="after")
    def _symbol_used(self) -> WarmupSpec:
        used = False
        others = {**(self.grid or {}), **self.fixed}
        if self.bucket_symbol in others:
            raise ValueError(f"{self.bucket_symbol!r} is the bucket dimension; it cannot also be fixed")
        if self.grid and self.fixed:
            raise ValueError("a grid slice has no grid of its own")
        seen: set[str] = set()
        for i, spec in enumerate(self.inputs):
            for dim in spec.shape:
                if isinstance(dim, str) and dim != self.bucket_symbol and dim not in others:
                    known = ", ".join(repr(d) for d in (self.bucket_symbol, *others))
                    raise ValueError(f"inputs[{i}].shape: unknown symbol {dim!r}; the dimensions are {known}")
                used = used or dim == self.bucket_symbol
                seen.add(str(dim))
        if not used:
            raise ValueError(
                f"no input shape contains the bucket symbol {self.bucket_symbol!r}, so buckets would change nothing"
            )
        for dim in others:
            if dim not in seen:
                raise ValueError(f"buckets: no input shape contains {dim!r}, so its sizes would change nothing")
        if self.points is not None:
            if not self.grid:
                raise ValueError("`points` chooses points of a grid: give `buckets` as a mapping of dimensions")
            self._check_points(self.points)
        named = {spec.name for spec in self.inputs if spec.name}
        for name in self.call.kwargs:
            if name in named:
                raise ValueError(f"call.kwargs.{name} is also an input's name; keep it in one of the two")
        return self

    def _check_points(self, choice: PointChoice) -> None:
        grid = self.grid or {}
        if choice.only is not None:
            dims = self.grid_dims
            for point in choice.only:
                if len(point) != len(dims):
                    raise ValueError(f"points.only: {point} is not one size per dimension ({', '.join(dims)})")
                for dim, size in zip(dims, point, strict=True):
                    sizes = self.buckets if dim == self.bucket_symbol else grid[dim]
                    if size not in sizes:
                        raise ValueError(f"points.only: {point}: {dim} {size} is not one of the grid's {sizes}")
        if not self.grid_points():
            raise ValueError("points: no point of the grid is left to warm; loosen max_product or list points")

    @property
    def grid_dims(self) -> list[str]:
        """A grid's dimensions, the bucket dimension first: the order of a point's sizes."""
        return [self.bucket_symbol, *(self.grid or {})]

    def grid_points(self) -> list[tuple[int, ...]]:
        """Every point of the grid that `points` keeps, sizes in `grid_dims` order; one point per
        bucket for the list form."""
        if not self.grid:
            return [(bucket,) for bucket in self.buckets]
        kept = []
        only = {tuple(p) for p in self.points.only} if self.points and self.points.only is not None else None
        cap = self.points.max_product if self.points else None
        for point in itertools.product(self.buckets, *self.grid.values()):
            if only is not None and point not in only:
                continue
            if cap is not None and math.prod(point) > cap:
                continue
            kept.append(point)
        return kept

    def slices(self) -> list[WarmupSpec]:
        """A grid as list-form specs: one per size of its other dimensions, those dimensions fixed
        there, the bucket dimension's sizes those of its points. Each is warmed, published and
        served as a list-form config is, under a namespace of its own. A list-form spec is its
        own one slice."""
        if not self.grid:
            return [self]
        by_rest: dict[tuple[int, ...], list[int]] = {}
        for point in self.grid_points():
            by_rest.setdefault(point[1:], []).append(point[0])
        data = self.model_dump(exclude={"grid", "points", "fixed"})
        return [
            WarmupSpec.model_validate(
                {**data, "buckets": buckets, "fixed": dict(zip(self.grid, rest, strict=True))}
            ).with_base_dir(self.base_dir)
            for rest, buckets in by_rest.items()
        ]

    def shape_of(self, item: InputSpec) -> list[int | str]:
        """An input's shape with a slice's fixed dimensions at their sizes: the bucket symbol, and
        a grid's other symbols, stay."""
        return [self.fixed.get(dim, dim) if isinstance(dim, str) else dim for dim in item.shape]

    def point_of(self, bucket: int) -> Optional[dict[str, int]]:
        """A grid's slice's point at `bucket`, its sizes by dimension, the bucket dimension first
        (what a record's `point` holds); None in the list form."""
        return {self.bucket_symbol: bucket, **self.fixed} if self.fixed else None

    def point_label(self, bucket: int) -> str:
        """How reports, metrics and `info()` name a bucket: `8` in the list form, `8x64` (the
        bucket dimension first, then the fixed ones in order) in a grid's slice."""
        return "x".join(str(size) for size in (bucket, *self.fixed.values()))

    @property
    def label(self) -> str:
        """The model's name: `name`, which loading a config file sets to the file's stem if absent."""
        return self.name or "model"

    @property
    def max_request_rows(self) -> Optional[int]:
        """The most rows a served request may have: `serve.max_rows`, MAX_ROWS_BUCKETS times the
        largest bucket where unset, None (no limit) where 0."""
        if self.serve.max_rows is None:
            return MAX_ROWS_BUCKETS * max(self.buckets)
        return self.serve.max_rows or None

    @property
    def base_dir(self) -> Path:
        return Path(self._base_dir or ".")

    def with_base_dir(self, base_dir: Path) -> WarmupSpec:
        self._base_dir = str(base_dir)
        return self

    def replaced(self, **changes: Any) -> WarmupSpec:
        """A validated copy with top-level fields replaced (CLI overrides)."""
        data = self.model_dump()
        data.update(changes)
        return WarmupSpec.model_validate(data).with_base_dir(self.base_dir)

    def identity(self) -> dict[str, Any]:
        """What makes compiled artifacts differ between configs (buckets, bench, serving choices,
        pad values and paths do not). The call's keyword arguments and the served outputs count
        only where set, so configs without them keep the namespaces they had."""
        identity = self.model_dump(
            include={"model", "inputs", "bucket_symbol", "compile"},
            exclude={"inputs": {"__all__": {"pad"}}},
            mode="json",
        )
        if self.call.kwargs:
            identity["call"] = self.model_dump(include={"call"}, mode="json")["call"]
        if self.serve.outputs is not None:
            identity["outputs"] = list(self.serve.outputs)
        if self.fixed:
            identity["fixed"] = dict(self.fixed)
        return identity

    def identity_hash(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def check_inputs_fit(spec: WarmupSpec, host_bytes: Optional[int] = None) -> None:
    """Refuse, before anything is built, buckets whose inputs alone take more than half of this
    host's memory (`host_bytes`: its RAM): they are made on the host first, and such a bucket would
    fail minutes later, allocating its eager reference. Raises SetupError naming the largest."""
    from orchestrator.jobs.errors import SetupError

    if host_bytes is None:
        host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed, bucket = max(
        (sum(item.host_bytes(part.bucket_symbol, b, part.fixed) for item in part.inputs), part.point_label(b))
        for part in spec.slices()
        for b in part.buckets
    )
    if needed > host_bytes // 2:
        raise SetupError(
            f"bucket {bucket}: its inputs take {needed / 1e9:.1f} GB, more than half of this host's "
            f"{host_bytes / 1e9:.1f} GB of memory; pick smaller buckets"
        )


def validate_buckets(buckets: list[int]) -> list[int]:
    seen: set[int] = set()
    for bucket in buckets:
        if bucket in seen:
            raise ValueError(f"bucket {bucket} is listed twice")
        seen.add(bucket)
    return sorted(buckets)
