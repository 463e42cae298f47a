"""A callable captured whole in one CUDA graph of the tool's own, replayed after copying a
request into its static input buffers.

CUDA-graph trees (`mode="reduce-overhead"`) keep a Python bookkeeping layer per call (tens to
hundreds of microseconds); a plain `torch.cuda.CUDAGraph` replay has none. For a bucket whose
shapes never change, the plain replay is all a server needs: the `graphed` and `eager-graphed`
serving variants are built with this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

WARMUP_CALLS = 3  # before capture, on a side stream: lazy init, cuDNN/cuBLAS heuristics, a compile's first call


class CaptureError(RuntimeError):
    """The callable cannot be captured (a host sync such as `.item()`, a CPU tensor, data-dependent
    control flow): the variant is unavailable, the bucket is not failed."""


class GraphedCall:
    """`fn(*args, **kwargs)` captured on the current CUDA device. A call copies its tensors into the
    static inputs, replays the graph and returns the static outputs: the next replay overwrites
    them, so a caller that keeps an output copies it first. Not reentrant: one call at a time."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        *,
        pool: Optional[Any] = None,
    ) -> None:
        # the graph reads fn's parameters and buffers at the addresses they had at capture: they
        # must live as long as the graph, whoever else lets go of the module
        self.fn = fn
        self.args = [_static(a) for a in args]
        self.kwargs = {k: _static(v) for k, v in kwargs.items()}
        # a call's tensors, in order, are copied into these (non-tensor arguments were fixed at capture)
        self._positional = [a for a in self.args if isinstance(a, torch.Tensor)]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(WARMUP_CALLS):
                    fn(*self.args, **self.kwargs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # thread-local: a replica captures on its loader thread while other threads serve eager
            # calls, whose allocations and copies a process-wide capture mode would refuse
            with torch.no_grad(), torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs = fn(*self.args, **self.kwargs)
        except Exception as exc:
            torch.cuda.synchronize()
            raise CaptureError(f"cannot capture in a CUDA graph: {_first_line(exc)}") from exc

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
        self.graph.replay()
        return self.outputs


def _static(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
