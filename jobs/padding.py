"""Requests of any size on a model captured for a few bucket sizes: pad up, run, cut back.

A model compiled and CUDA-graph-captured per bucket accepts exactly the bucket's shapes. A request
of size n (along the bucket dimension, the one whose config shape entry is the bucket symbol, at
any position in the shape) is padded to the smallest bucket >= n with each input's pad value,
and every output tensor is cut back to n along its own bucket dimension. A request larger than
the largest bucket is either refused or run in chunks of the largest bucket whose outputs are
joined again (`serve.oversize`). This module only shapes tensors; it never runs the model.

    shaper = RequestShaper(spec, buckets, device, oversize)
    dims = output_bucket_dims({b: eager(b) for b in buckets}, shaper.input_dim)   # once, at load
    n = shaper.size(args, kwargs)                       # BadRequest for a malformed request
    if n <= shaper.buckets[-1]:
        padded_args, padded_kwargs = shaper.pad(args, kwargs, shaper.bucket_for(n))
        result = shaper.unpad(model(*padded_args, **padded_kwargs), n, dims)
    else:
        parts = []
        for chunk_args, chunk_kwargs in shaper.chunks(args, kwargs):
            m = shaper.size(chunk_args, chunk_kwargs)
            padded_args, padded_kwargs = shaper.pad(chunk_args, chunk_kwargs, shaper.bucket_for(m))
            outputs = shaper.unpad(model(*padded_args, **padded_kwargs), m, dims)
            parts.append(copy_out(outputs))   # jobs/copies.py: out of the buffers the next chunk reuses
        result = shaper.concat(parts, dims)

Output trees are walked as the correctness gate walks them (orchestrator.jobs.trees): tuples,
lists, named tuples, mappings (HF `ModelOutput` included), dataclasses, torch pytree nodes and
Hugging Face caches, and each container is rebuilt with its own type. Only tensors are cut or
joined; any other leaf passes through unchanged.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from orchestrator.jobs import trees
from orchestrator.jobs.spec import FLOAT_DTYPES, WarmupSpec

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Request = tuple[Args, Kwargs]

# Each output tensor's bucket dimensions by its path in the output tree ("output.logits",
# "output[0]", as in the correctness gate's messages). Usually one dimension; none for a tensor
# whose shape does not follow the bucket (a scalar loss, a pooled vector), which is returned as
# it is; several for one such as a [seq, seq] attention map, which is cut along each.
OutputDims = dict[str, tuple[int, ...]]

# a request larger than the largest bucket: run it in chunks of that bucket, or refuse it
Oversize = Literal["split", "error"]
OVERSIZE: tuple[Oversize, ...] = ("split", "error")


class BadRequest(ValueError):
    """One clear line naming the input and what is wrong; the model stays usable."""


@dataclass(frozen=True)
class _Input:
    """One configured input, with what checking and padding a request's tensor need of it."""

    label: str  # how messages name it: `inputs[i]`, with its keyword or positional place
    dtype: torch.dtype
    shape: tuple[int | str, ...]  # as configured, the bucket symbol in the bucket dimensions
    bucket_dims: tuple[int, ...]
    pad: bool | int | float  # the pad value in the input dtype's Python type

    def show_shape(self) -> str:
        return "[" + ", ".join(str(dim) for dim in self.shape) + "]"


class RequestShaper:
    """Checks requests against the config's inputs and shapes them to the captured buckets.

    `pad` and `unpad` run on every request, so they trust what `size` checked: call `size`
    first. Padded inputs are new tensors; inputs already of the bucket's size and every cut
    output are the caller's tensors or views of them, never copies."""

    def __init__(
        self, spec: WarmupSpec, buckets: Sequence[int], device: torch.device | str, oversize: Oversize = "split"
    ) -> None:
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize {oversize!r} is not one of {', '.join(OVERSIZE)}")
        if not buckets or any(bucket < 1 for bucket in buckets):
            raise ValueError(f"buckets {list(buckets)} must be one or more positive sizes")
        self.buckets: list[int] = sorted(set(buckets))
        self.device = _resolved(torch.device(device))
        self.oversize = oversize
        self.symbol = spec.bucket_symbol
        self._positional: list[_Input] = []
        self._named: dict[str, _Input] = {}
        # the first input's bucket dimension (in config order) is the likeliest bucket dimension
        # of the outputs too (output_bucket_dims); the spec requires an input with the symbol
        self.input_dim: int = next(item.shape.index(self.symbol) for item in spec.inputs if self.symbol in item.shape)
        for i, item in enumerate(spec.inputs):
            shape = spec.shape_of(item)  # a grid slice's fixed dimensions at their sizes
            label = f"inputs[{i}]"
            if item.name:
                label = f"{item.name} ({label})"
            elif len(self._positional) != i:  # named inputs before it: its argument position differs
                label = f"{label} (positional argument {len(self._positional)})"
            dtype = getattr(torch, item.dtype)
            entry = _Input(
                label=label,
                dtype=dtype,
                shape=tuple(shape),
                bucket_dims=tuple(d for d, dim in enumerate(shape) if dim == self.symbol),
                pad=pad_value(getattr(item, "pad", 0), item.dtype),
            )
            if item.name:
                self._named[item.name] = entry
            else:
                self._positional.append(entry)
        # a request already shaped exactly as a bucket (the common case behind a batcher) is
        # recognised by one lookup instead of the checks `size` makes input by input
        self._exact: dict[tuple[Any, ...], int] = {self._bucket_shapes(b): b for b in self.buckets}

    def exact_bucket(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
        """The bucket whose shapes the request has exactly (every input of the right dtype, on
        the right device, its bucket dimensions of that bucket's size), else None: then `size`
        checks it. Keywords count in the config's order only; any other order takes `size`."""
        # every call of the served model runs this: the usual request, one tensor, is keyed by its
        # own (shape, dtype, device) without a tuple around it; list comprehensions build the
        # others' keys (a generator's frame costs more than the key itself)
        try:
            if len(args) == 1 and not kwargs:
                a = args[0]
                key: tuple[Any, ...] = (a.shape, a.dtype, a.device)
            else:
                key = (
                    tuple([(a.shape, a.dtype, a.device) for a in args]),
                    tuple([(k, v.shape, v.dtype, v.device) for k, v in kwargs.items()]),
                )
        except AttributeError:  # not a tensor: `size` names it
            return None
        return self._exact.get(key)

    def _bucket_shapes(self, bucket: int) -> tuple[Any, ...]:
        """The key `exact_bucket` makes of a request of the bucket's exact shapes."""

        def shape(entry: _Input) -> torch.Size:
            return torch.Size(bucket if dim == self.symbol else int(dim) for dim in entry.shape)

        positional = tuple((shape(e), e.dtype, self.device) for e in self._positional)
        named = tuple((name, shape(e), e.dtype, self.device) for name, e in self._named.items())
        return positional[0] if len(positional) == 1 and not named else (positional, named)

    # -- checking -------------------------------------------------------------------------------

    def size(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        """The request's size n along the bucket dimension, after checking every input against
        the config: count, keywords, type, dtype, rank, fixed dimensions, device, n >= 1 and the
        same n in every input; with oversize "error", also n <= the largest bucket."""
        n = self._measure(args, kwargs)
        if self.oversize == "error" and n > self.buckets[-1]:
            raise BadRequest(
                f"request of {n} is larger than the largest bucket {self.buckets[-1]}; "
                "serve.oversize: split would run it in chunks"
            )
        return n

    def _measure(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        if len(args) != len(self._positional):
            expected = ", ".join(entry.label for entry in self._positional) or "none"
            raise BadRequest(f"expected {len(self._positional)} positional inputs ({expected}), got {len(args)}")
        for name in kwargs:
            if name not in self._named:
                known = ", ".join(self._named) or "no keyword inputs"
                raise BadRequest(f"unknown keyword input {name!r}; the config names {known}")
        for name, entry in self._named.items():
            if name not in kwargs:
                raise BadRequest(f"missing keyword input {entry.label}")
        n: int | None = None
        first = ""  # the label of the input n was read from
        for entry, value in zip(self._inputs(), [*args, *(kwargs[name] for name in self._named)], strict=True):
            for dim in self._check(entry, value):
                size = value.shape[dim]
                if size == 0:
                    raise BadRequest(
                        f"{entry.label} has size 0 at dim {dim} ({self.symbol}); a request needs at least 1"
                    )
                if n is None:
                    n, first = size, entry.label
                elif size != n:
                    raise BadRequest(
                        f"{entry.label} has {size} at dim {dim} ({self.symbol}) where {first} has {n}; "
                        f"every input must have the same {self.symbol}"
                    )
        assert n is not None  # the spec requires an input with the bucket symbol
        return n

    def _inputs(self) -> Iterator[_Input]:
        yield from self._positional
        yield from self._named.values()

    def _check(self, entry: _Input, value: Any) -> tuple[int, ...]:
        """`value` against its input's config: its bucket dimensions if it passes."""
        if not isinstance(value, torch.Tensor):
            raise BadRequest(f"{entry.label} is a {type(value).__name__}, not a tensor")
        if value.dtype != entry.dtype:
            raise BadRequest(f"{entry.label} is {_dtype_name(value.dtype)}, expected {_dtype_name(entry.dtype)}")
        if value.dim() != len(entry.shape):
            raise BadRequest(
                f"{entry.label} has {value.dim()} dimensions {tuple(value.shape)}, "
                f"expected {len(entry.shape)}: {entry.show_shape()}"
            )
        for dim, want in enumerate(entry.shape):
            if isinstance(want, int) and value.shape[dim] != want:
                raise BadRequest(
                    f"{entry.label} has size {value.shape[dim]} at dim {dim}, expected {want}: {entry.show_shape()}"
                )
        if value.device != self.device and not same_device(
            value.device, self.device
        ):  # the first test is the cheap one
            raise BadRequest(f"{entry.label} is on {value.device}, expected {self.device}")
        return entry.bucket_dims

    # -- shaping inputs -------------------------------------------------------------------------

    def bucket_for(self, n: int) -> int:
        """The smallest bucket >= n; the largest bucket when n is larger (see `chunks`)."""
        at = bisect.bisect_left(self.buckets, n)
        return self.buckets[min(at, len(self.buckets) - 1)]

    def pad(self, args: Sequence[Any], kwargs: Mapping[str, Any], bucket: int) -> Request:
        """The request with every input padded to `bucket` along its bucket dimensions with the
        input's pad value. An input already of the bucket's size, or without a bucket dimension,
        is passed on as it is."""
        padded_args = tuple(_pad(entry, value, bucket) for entry, value in zip(self._positional, args, strict=True))
        padded_kwargs = {name: _pad(self._named[name], value, bucket) for name, value in kwargs.items()}
        return padded_args, padded_kwargs

    def chunks(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Request]:
        """The request as consecutive slices of the largest bucket's size along the bucket
        dimension, the last one shorter; inputs without a bucket dimension go whole into every
        chunk. Slices are views. A request no larger than the largest bucket is one chunk.

        Chunks are only equivalent to the whole request for a model whose rows along the bucket
        dimension do not interact (a batch of independent requests): `serve.oversize` says so."""
        n = self._measure(args, kwargs)
        step = self.buckets[-1]
        return [
            (
                tuple(_slice(entry, value, start, step) for entry, value in zip(self._positional, args, strict=True)),
                {name: _slice(self._named[name], value, start, step) for name, value in kwargs.items()},
            )
            for start in range(0, n, step)
        ]

    # -- shaping outputs ------------------------------------------------------------------------

    @staticmethod
    def unpad(outputs: Any, n: int, dims: OutputDims) -> Any:
        """`outputs` of a padded call with every tensor cut to n along its bucket dimensions
        (views: outputs in CUDA-graph buffers must be copied before the next replay)."""
        return RequestShaper.rows_cut(n, dims)(outputs)

    @staticmethod
    def rows_cut(n: int, dims: OutputDims) -> trees.Cut:
        """How `unpad` cuts outputs to n rows."""

        def cut(path: str, leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return leaf
            for dim in _dims_at(dims, path):
                leaf = leaf.narrow(dim, 0, n)
            return leaf

        return trees.Cut(("rows", n), cut)

    @staticmethod
    def concat(parts: Sequence[Any], dims: OutputDims) -> Any:
        """The outputs of consecutive chunks joined along each tensor's bucket dimension; a
        tensor without one, and any other leaf, is the first chunk's. The parts must be copies
        that later calls do not overwrite."""
        if not parts:
            raise ValueError("concat needs the outputs of at least one chunk")
        if len(parts) == 1:
            return parts[0]
        rest = [dict(trees.leaves(part)) for part in parts[1:]]

        def join(path: str, leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return leaf
            bucket_dims = _dims_at(dims, path)
            if not bucket_dims:
                return leaf
            if len(bucket_dims) > 1:
                raise ValueError(
                    f"{path} has the bucket in dims {', '.join(map(str, bucket_dims))}; "
                    "chunks of it cannot be joined into one tensor"
                )
            pieces = [leaf]
            for i, leaves in enumerate(rest, start=1):
                if path not in leaves:
                    raise ValueError(f"chunk {i} of the outputs has no {path}, chunk 0 has")
                pieces.append(leaves[path])
            return torch.cat(pieces, dim=bucket_dims[0])

        return trees.map_leaves(parts[0], join)


def output_bucket_dims(outputs_by_bucket: Mapping[int, Any], input_dim: int) -> OutputDims:
    """Each output tensor's bucket dimensions, from the model's outputs at one or more buckets.

    With several buckets, a tensor's bucket dimensions are those whose size equals the bucket at
    every bucket; a tensor of the same shape at every bucket has none. A tensor whose shape
    changes with the bucket in any other way (its rank, or a dimension of 2 * bucket) cannot be
    cut back to a request's size: ValueError naming it. With one bucket, sizes cannot tell a
    bucket dimension from one that happens to be as large, so `input_dim` (the inputs' bucket
    dimension) is taken when it matches, and otherwise every dimension of the bucket's size."""
    if not outputs_by_bucket:
        raise ValueError("output_bucket_dims needs the model's outputs at one bucket at least")
    shapes: dict[int, dict[str, tuple[int, ...]]] = {
        bucket: {path: tuple(leaf.shape) for path, leaf in trees.leaves(outputs) if isinstance(leaf, torch.Tensor)}
        for bucket, outputs in sorted(outputs_by_bucket.items())
    }
    (first, paths), *others = shapes.items()
    for bucket, other in others:
        if other.keys() != paths.keys():
            only = sorted(other.keys() ^ paths.keys())[0]
            where, absent = (bucket, first) if only in other else (first, bucket)
            raise ValueError(
                f"the output at bucket {where} has a tensor {only} that the output at bucket {absent} has not"
            )
    dims: OutputDims = {}
    for path, shape in paths.items():
        if not others:
            matches = tuple(d for d, size in enumerate(shape) if size == first)
            dims[path] = (input_dim,) if input_dim in matches else matches
            continue
        by_bucket = {bucket: shapes[bucket][path] for bucket in shapes}
        shown = ", ".join(f"{tuple(s)} at {bucket}" for bucket, s in by_bucket.items())
        if len({len(s) for s in by_bucket.values()}) > 1:
            raise ValueError(
                f"{path} changes rank with the bucket ({shown}), so it cannot be cut back to a request's size"
            )
        varying = tuple(d for d in range(len(shape)) if len({s[d] for s in by_bucket.values()}) > 1)
        matches = tuple(d for d in varying if all(s[d] == bucket for bucket, s in by_bucket.items()))
        stray = [d for d in varying if d not in matches]
        if stray:
            raise ValueError(
                f"{path} changes shape with the bucket ({shown}) but its dim {stray[0]} is not the "
                "bucket's size, so it cannot be cut back to a request's size"
            )
        dims[path] = matches
    return dims


def same_device(actual: torch.device, expected: torch.device) -> bool:
    """Whether two devices are one: "cuda" is the current CUDA device, "cpu" is "cpu:0"."""
    return actual.type == expected.type and _index(actual) == _index(expected)


def _resolved(device: torch.device) -> torch.device:
    """`device` with its index: what a tensor on it reports as its `.device`."""
    if device.type != "cuda" or device.index is not None or not torch.cuda.is_available():
        return device
    return torch.device("cuda", torch.cuda.current_device())


def _index(device: torch.device) -> int:
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if device.type == "cuda" else 0


def pad_value(value: float, dtype: str) -> bool | int | float:
    """The pad value as the input's type (the spec allows whole numbers for integer inputs and 0
    or 1 for bool ones)."""
    if dtype == "bool":
        return bool(value)
    if dtype in FLOAT_DTYPES:
        return float(value)
    return int(value)


def _pad(entry: _Input, value: torch.Tensor, bucket: int) -> torch.Tensor:
    for dim in entry.bucket_dims:
        if value.shape[dim] > bucket:
            raise ValueError(
                f"{entry.label} has {value.shape[dim]} at dim {dim}, more than the bucket {bucket}; "
                "split the request with chunks()"
            )
    return pad_end(value, {dim: bucket for dim in entry.bucket_dims}, entry.pad)


def pad_end(value: torch.Tensor, sizes: Mapping[int, int], fill: Any) -> torch.Tensor:
    """`value` filled with `fill` at the end of each dimension in `sizes` up to the size there; the
    tensor itself where no dimension is short (the caller refuses one that is too long)."""
    widths = [0] * (2 * value.dim())  # F.pad lists (before, after) pairs from the last dimension backwards
    short = False
    for dim, size in sizes.items():
        if size > value.shape[dim]:
            widths[2 * (value.dim() - 1 - dim) + 1] = size - value.shape[dim]
            short = True
    return F.pad(value, widths, value=fill) if short else value


def _slice(entry: _Input, value: torch.Tensor, start: int, length: int) -> torch.Tensor:
    for dim in entry.bucket_dims:
        value = value.narrow(dim, start, min(length, value.shape[dim] - start))
    return value


def _dims_at(dims: OutputDims, path: str) -> tuple[int, ...]:
    try:
        return dims[path]
    except KeyError:
        raise ValueError(
            f"{path} is not among the output tensors output_bucket_dims was given; "
            "the model's outputs must keep one structure at every size"
        ) from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
