"""A grid of buckets over named dimensions (batch x seq): padding that is proven harmless.

A config whose `buckets` is a mapping (`{batch: [1, 8], seq: [32, 128]}`) is warmed and served as
slices (WarmupSpec.slices): one list-form spec per size of the other dimensions, those fixed
there. This module holds what crosses slices: which dimensions of each input and output follow
which grid dimension, padding a request up to a point and cutting its outputs back, and the proof
that doing so leaves the answer unchanged.

The proof (warmup, per point): a request one row and one step shorter than the point in every
padded dimension is made from the point's own inputs, padded back up with each input's `pad`
value, run through the variant that serves the point, cut back, and held against eager at the
request's exact size with the correctness gate. Eager calls one step shorter in each dimension
alone say which output dimensions follow it: an output whose size follows a dimension in any other
way cannot be cut back, and is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from orchestrator.jobs import trees
from orchestrator.jobs.gate import Gate, Outputs, snapshot
from orchestrator.jobs.graphs import GraphedCall, InputPadding
from orchestrator.jobs.padding import pad_end, pad_value
from orchestrator.jobs.spec import WarmupSpec

Args = Sequence[Any]
Kwargs = Mapping[str, Any]
# Each output tensor's grid dimensions, by its path in the output tree ("output.logits"): tensor
# dimension -> grid dimension name. A tensor with none (a pooled vector over seq) is returned whole.
GridDims = dict[str, dict[int, str]]


class PaddingUnsafe(ValueError):
    """Padding a request up to a point changes its answer, or an output cannot be cut back."""


@dataclass
class PaddingProof:
    """What warmup proved at one point: the request it padded, and how closely the answer held."""

    request: dict[str, int]  # the exact request's sizes by dimension, padded up to the point
    point: dict[str, int]
    variant: str
    max_abs_error: Optional[float]
    tolerance_used: Optional[float]
    output_dims: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> {tensor dim: grid dim}
    # the median latency of that request served as a replica serves it (padded, run, cut, copied)
    padded_ms: Optional[float] = None
    reference: str = "eager"  # what the answer was judged against: "float64" or "eager" (jobs/gate.py)


def input_dims(spec: WarmupSpec) -> list[dict[int, str]]:
    """Per input, in call order (positional then keyword, as make_inputs returns them), its
    tensor dimensions that follow a grid dimension: the bucket dimension's and the fixed ones'."""
    named = [spec.bucket_symbol, *spec.fixed, *(spec.grid or {})]
    positional = [item for item in spec.inputs if not item.name]
    keyword = [item for item in spec.inputs if item.name]
    return [
        {d: dim for d, dim in enumerate(item.shape) if isinstance(dim, str) and dim in named}
        for item in (*positional, *keyword)
    ]


def input_padding(spec: WarmupSpec) -> InputPadding:
    """How a graph captured at one of `spec`'s buckets takes a shorter request (GraphedCall): per
    input in call order, the dimensions that follow a bucket or grid dimension, and its pad value."""
    shaper = InputShaper(spec)
    return InputPadding(
        names=tuple(shaper.names),
        dims=tuple(frozenset(dims) for dims in shaper.dims),
        pads=tuple(shaper.pads),
    )


def padded_call(runner: Callable[..., Any], shaper: InputShaper, point: Mapping[str, int]) -> Callable[..., Any]:
    """`runner` called as a replica calls it with a request shorter than `point`: written into
    the corners of the inputs of the graph it replays, where it replays one that takes it, else
    padded with each input's pad value. Both leave the same inputs before the model."""

    def call(args: Args, kwargs: Kwargs) -> Any:
        if isinstance(runner, GraphedCall):
            outputs = runner.replay_short(args, dict(kwargs))
            if outputs is not None:
                return outputs
        padded_args, padded_kwargs = shaper.pad(args, kwargs, point)
        return runner(*padded_args, **padded_kwargs)

    return call


class InputShaper:
    """Cuts and pads one slice's (or grid's) inputs along named dimensions."""

    def __init__(self, spec: WarmupSpec) -> None:
        self.dims = input_dims(spec)
        # in call order, as make_inputs returns them: positional, then keyword
        self.items = [item for item in spec.inputs if not item.name] + [item for item in spec.inputs if item.name]
        self.pads = [pad_value(item.pad, item.dtype) for item in self.items]
        self.positional = sum(1 for item in spec.inputs if not item.name)
        self.names = [item.name for item in self.items if item.name]

    def _map(self, args: Args, kwargs: Kwargs, fn: Callable[[torch.Tensor, dict[int, str], Any], torch.Tensor]):
        values = [*args, *(kwargs[name] for name in self.names)]
        out = [fn(value, dims, pad) for value, dims, pad in zip(values, self.dims, self.pads, strict=True)]
        return tuple(out[: self.positional]), dict(zip(self.names, out[self.positional :], strict=True))

    def cut(self, args: Args, kwargs: Kwargs, sizes: Mapping[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The inputs cut to `sizes` along their named dimensions (views)."""

        def cut_one(value: torch.Tensor, dims: dict[int, str], pad: Any) -> torch.Tensor:
            for d, name in dims.items():
                if name in sizes:
                    value = value.narrow(d, 0, sizes[name])
            return value

        return self._map(args, kwargs, cut_one)

    def pad(self, args: Args, kwargs: Kwargs, sizes: Mapping[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The inputs padded up to `sizes` along their named dimensions with each input's pad
        value; an input already of those sizes is passed on as it is."""

        def pad_one(value: torch.Tensor, dims: dict[int, str], pad: Any) -> torch.Tensor:
            wanted = {d: sizes[name] for d, name in dims.items() if name in sizes}
            for d, size in wanted.items():
                if value.shape[d] > size:
                    raise ValueError(f"an input has {value.shape[d]} at dim {d} ({dims[d]}), more than {size}")
            return pad_end(value, wanted, pad)

        return self._map(args, kwargs, pad_one)


def cut_outputs(outputs: Any, dims: GridDims, sizes: Mapping[str, int]) -> Any:
    """Every output tensor cut to `sizes` along its grid dimensions (views)."""
    return output_cut(dims, sizes)(outputs)


def output_cut(dims: GridDims, sizes: Mapping[str, int]) -> trees.Cut:
    """How `cut_outputs` cuts outputs to `sizes`."""

    def cut(path: str, leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        for d, name in dims.get(path, {}).items():
            if name in sizes and leaf.shape[d] != sizes[name]:
                leaf = leaf.narrow(d, 0, sizes[name])
        return leaf

    return trees.Cut(("sizes", *sorted(sizes.items())), cut)


def learn_output_dims(point: Mapping[str, int], at_point: Any, shorter: Mapping[str, Any]) -> GridDims:
    """Each output tensor's grid dimensions: `at_point` is eager's output at the point, `shorter`
    eager's output one step shorter in one dimension, by that dimension's name. A tensor dimension
    that is the point's size there and one less in the shorter call follows that grid dimension;
    one that changes in any other way cannot be cut back: PaddingUnsafe naming it."""
    full = {path: leaf for path, leaf in trees.leaves(at_point) if isinstance(leaf, torch.Tensor)}
    dims: GridDims = {path: {} for path in full}
    for name, output in shorter.items():
        size = point[name]
        other = {path: leaf for path, leaf in trees.leaves(output) if isinstance(leaf, torch.Tensor)}
        if other.keys() != full.keys():
            only = sorted(other.keys() ^ full.keys())[0]
            raise PaddingUnsafe(f"{only} is an output at one size of {name} and not at another")
        for path, leaf in full.items():
            a, b = tuple(leaf.shape), tuple(other[path].shape)
            if len(a) != len(b):
                raise PaddingUnsafe(f"{path} changes rank with {name} ({a} at {size}, {b} at {size - 1})")
            for d, (x, y) in enumerate(zip(a, b, strict=True)):
                if x == y:
                    continue
                if x == size and y == size - 1 and d not in dims[path]:
                    dims[path][d] = name
                else:
                    raise PaddingUnsafe(
                        f"{path} is {a} at {name} {size} and {b} at {size - 1}: its dim {d} does not follow "
                        f"{name} one for one, so it cannot be cut back to a request's size"
                    )
    return dims


def prove_padding(
    spec: WarmupSpec,
    bucket: int,
    inputs: tuple[Args, Kwargs],
    eager: Callable[..., Any],
    served: Callable[..., Any],
    variant: str,
    gate: Gate,
    float64: Optional[Outputs] = None,
) -> Optional[PaddingProof]:
    """Prove at the point (`bucket` of a grid slice `spec`) that padding a shorter request up to
    it and cutting the answer back gives eager's answer at the request's exact size (judged, as
    the gate judges, against `float64`: the model's float64 run of that request, where there is
    one). `inputs` are the point's; `served` runs the variant that serves it, and is given the
    request as a replica gives it (padded_call). None where no
    dimension can be padded (every size 1). Raises PaddingUnsafe with one line naming the output
    and what to do."""
    request = proof_request(spec, bucket)
    if request is None:
        return None
    point = {spec.bucket_symbol: bucket, **spec.fixed}
    shorter_by = [name for name, size in point.items() if size > 1]
    shaper = InputShaper(spec)
    args, kwargs = inputs
    with torch.no_grad():
        at_point = eager(*args, **kwargs)
        shorter = {}
        for name in shorter_by:
            cut_args, cut_kwargs = shaper.cut(args, kwargs, {name: point[name] - 1})
            shorter[name] = snapshot_tree(eager(*cut_args, **cut_kwargs))
        dims = learn_output_dims(point, at_point, shorter)
        exact_args, exact_kwargs = shaper.cut(args, kwargs, request)
        expected = snapshot(eager(*exact_args, **exact_kwargs))
        answer = snapshot(cut_outputs(padded_call(served, shaper, point)(exact_args, exact_kwargs), dims, request))
    shown = "x".join(str(request[name]) for name in point)
    try:
        verdict = gate.compare(expected, answer, call=f"{variant} padded from {shown}", float64=float64)
    except Exception as exc:
        raise PaddingUnsafe(
            f"padding changes the answer: a request of {shown} padded to {spec.point_label(bucket)}: {exc}; "
            "the model reads the padded positions: give it a mask input that is `pad: 0` where padded "
            "(e.g. attention_mask), or leave this dimension out of the grid"
        ) from None
    return PaddingProof(
        request=request,
        point=point,
        variant=variant,
        max_abs_error=verdict.max_abs_error,
        tolerance_used=verdict.tolerance_used,
        reference=verdict.reference,
        output_dims={path: {str(d): name for d, name in found.items()} for path, found in dims.items() if found},
    )


def proof_request(spec: WarmupSpec, bucket: int) -> Optional[dict[str, int]]:
    """The request the padding proof pads up to the point: one step shorter in every dimension
    above 1, by dimension name; None where nothing can be padded (not a grid, or every size 1)."""
    point = {spec.bucket_symbol: bucket, **spec.fixed}
    if not spec.fixed or all(size == 1 for size in point.values()):
        return None
    return {name: size - 1 if size > 1 else size for name, size in point.items()}


def snapshot_tree(output: Any) -> Any:
    """`output` with every tensor copied, its structure kept (a replay may overwrite buffers)."""
    return trees.map_leaves(output, lambda _, leaf: leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf)
