"""A callable captured whole in one CUDA graph of the tool's own, replayed after copying a
request into its static input buffers.

CUDA-graph trees (`mode="reduce-overhead"`) keep a Python bookkeeping layer per call (tens to
hundreds of microseconds); a plain `torch.cuda.CUDAGraph` replay has none. For a bucket whose
shapes never change, the plain replay is all a server needs: the `graphed` and `eager-graphed`
serving variants are built with this.

A request shorter than the capture along a padded dimension (a grid's sequence, a bucket's rows)
is written straight into the corner of the static inputs, every other position holding its
input's pad value (PaddedInputs): the graph then reads exactly the padded request that warmup's
padding proof checked, without a padded copy of each input made first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

WARMUP_CALLS = 3  # before capture, on a side stream: lazy init, cuDNN/cuBLAS heuristics, a compile's first call


class CaptureError(RuntimeError):
    """The callable cannot be captured (a host sync such as `.item()`, a CPU tensor, data-dependent
    control flow): the variant is unavailable, the bucket is not failed."""


@dataclass(frozen=True)
class InputPadding:
    """How a graph's inputs are padded: per input in call order (positional, then keyword inputs
    by `names`), the tensor dimensions a request may be shorter in, and the value that fills them."""

    names: tuple[str, ...]
    dims: tuple[frozenset[int], ...]
    pads: tuple[Any, ...]


class _Unfit:
    """A request's shapes that the static inputs cannot take: a caller pads it."""


_UNFIT = _Unfit()


@dataclass
class _Corner:
    views: list[torch.Tensor]  # each static input's corner of a request's size
    fills: list[torch.Tensor]  # the pad value, broadcast to the same sizes


class PaddedInputs:
    """A graph's static inputs written with a request shorter than them along padded dimensions:
    its values in the corner, each input's pad value at every other position, exactly as padding
    the request would have made them.

    The invariant that makes a write cheap: outside the corner last written, the buffers hold the
    pad values. A request whose corner covers the last one is one copy; a smaller one first
    restores the last corner to the pad values (one more copy). Views are worked out once per
    request shape. Callers hold the graph's call lock."""

    # corners kept, one per request shape: every size a point of 32 rows x 128 positions takes
    CORNERS = 4096

    def __init__(self, statics: Sequence[torch.Tensor], padding: InputPadding) -> None:
        self._statics = list(statics)
        self._dims = padding.dims
        self._types = [(static.dtype, static.device) for static in self._statics]
        self._fills = [
            torch.full((), pad, dtype=static.dtype, device=static.device).expand(static.shape)
            for static, pad in zip(self._statics, padding.pads, strict=True)
        ]
        self._corners: dict[Hashable, _Corner | _Unfit] = {}
        self._written: Optional[tuple[torch.Size, ...]] = None  # None: the buffers were written whole

    def written_whole(self) -> None:
        """A call of the capture's own shapes overwrote every position."""
        self._written = None

    def write(self, values: Sequence[torch.Tensor]) -> bool:
        """Write a request into the corners; False, writing nothing, where the request is not one
        these inputs take (another rank, a larger or different size in a dimension that is not
        padded, another dtype or device): the caller pads it and takes the checked path."""
        if len(values) != len(self._statics):
            return False
        key = tuple(value.shape for value in values)
        corner = self._corners.get(key)
        if corner is None:
            corner = self._corner(key)
            if len(self._corners) < self.CORNERS:
                self._corners[key] = corner
        if isinstance(corner, _Unfit):
            return False
        for value, (dtype, device) in zip(values, self._types, strict=True):
            if value.dtype != dtype or value.device != device:
                return False
        written = self._written
        if written is None:
            _copy(self._statics, self._fills)
        elif written != key and not _covers(key, written):
            last = self._corners.get(written)
            if not isinstance(last, _Corner):  # not kept (CORNERS): worked out again
                last = self._corner(written)
            assert isinstance(last, _Corner)
            _copy(last.views, last.fills)
        _copy(corner.views, values)
        self._written = key
        return True

    def _corner(self, shapes: tuple[torch.Size, ...]) -> _Corner | _Unfit:
        views, fills = [], []
        for shape, static, fill, dims in zip(shapes, self._statics, self._fills, self._dims, strict=True):
            if len(shape) != static.dim():
                return _UNFIT
            for d, (size, full) in enumerate(zip(shape, static.shape, strict=True)):
                if size > full or (size < full and d not in dims):
                    return _UNFIT
            corner = tuple(slice(0, size) for size in shape)
            views.append(static[corner])
            fills.append(fill[corner])
        return _Corner(views, fills)


def _covers(shapes: tuple[torch.Size, ...], other: tuple[torch.Size, ...]) -> bool:
    return all(a >= b for new, old in zip(shapes, other, strict=True) for a, b in zip(new, old, strict=True))


def _copy(targets: list[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    if len(targets) == 1:
        targets[0].copy_(sources[0], non_blocking=True)
    else:  # one call for every input: views and broadcast fills take foreach's per-tensor path, in C++
        torch._foreach_copy_(targets, list(sources), non_blocking=True)


class GraphedCall:
    """`fn(*args, **kwargs)` captured on the current CUDA device. A call copies its tensors into the
    static inputs, replays the graph and returns the static outputs: the next replay overwrites
    them, so a caller that keeps an output copies it first. Not reentrant: one call at a time.
    The static inputs are written by its own calls only: a shorter request's write relies on what
    the last call left in them (PaddedInputs)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        *,
        pool: Optional[Any] = None,
        padding: Optional[InputPadding] = None,
    ) -> None:
        # the graph reads fn's parameters and buffers at the addresses they had at capture: they
        # must live as long as the graph, whoever else lets go of the module
        self.fn = fn
        self.args = [_static(a) for a in args]
        self.kwargs = {k: _static(v) for k, v in kwargs.items()}
        # a call's tensors, in order, are copied into these (non-tensor arguments were fixed at capture)
        self._positional = [a for a in self.args if isinstance(a, torch.Tensor)]
        self.graph, self.outputs = self._capture(pool)
        # shorter requests: where every argument is a tensor the padding describes
        self.short: Optional[PaddedInputs] = None
        self._short_names: tuple[str, ...] = ()
        if (
            padding is not None
            and len(self._positional) == len(self.args)
            and set(padding.names) == set(self.kwargs)
            and all(isinstance(self.kwargs[name], torch.Tensor) for name in padding.names)
            and len(padding.dims) == len(self.args) + len(padding.names)
        ):
            self._short_names = padding.names
            self.short = PaddedInputs(self._positional + [self.kwargs[name] for name in padding.names], padding)

    def _capture(self, pool: Optional[Any]) -> tuple[Any, Any]:
        """The graph of `fn` at the static inputs, and the outputs its replays write into."""
        fn = self.fn
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(WARMUP_CALLS):
                    fn(*self.args, **self.kwargs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread-local: a replica captures on its loader thread while other threads serve eager
            # calls, whose allocations and copies a process-wide capture mode would refuse
            with torch.no_grad(), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                outputs = fn(*self.args, **self.kwargs)
        except Exception as exc:
            torch.cuda.synchronize()
            raise CaptureError(f"cannot capture in a CUDA graph: {_first_line(exc)}") from exc
        return graph, outputs

    @property
    def pool(self) -> Any:
        """The graph's memory pool, for the next capture to share (capture the largest bucket first)."""
        return self.graph.pool()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if isinstance(a, torch.Tensor)]
        if kwargs:
            values += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
            statics = self._positional + [self.kwargs[k] for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        else:
            statics = self._positional
        if len(values) != len(statics):
            raise TypeError(f"the graph was captured with {len(statics)} tensor inputs, not {len(values)}")
        if len(values) == 1:
            statics[0].copy_(values[0], non_blocking=True)
        else:  # one launch for all inputs of a dtype, where a copy each would launch one each
            torch._foreach_copy_(statics, values, non_blocking=True)
        if self.short is not None:
            self.short.written_whole()
        self.graph.replay()
        return self.outputs

    def replay_short(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[Any]:
        """Replay for a request shorter than the capture along padded dimensions, written into the
        corners of the static inputs (PaddedInputs); None, having run nothing, where the graph
        takes no such request or this is not one: the caller pads it and calls the graph."""
        short = self.short
        if short is None or len(args) != len(self._positional) or len(kwargs) != len(self._short_names):
            return None
        try:
            values = [*args, *(kwargs[name] for name in self._short_names)]
        except KeyError:
            return None
        if not all(isinstance(value, torch.Tensor) for value in values) or not short.write(values):
            return None
        self.graph.replay()
        return self.outputs


def _static(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
