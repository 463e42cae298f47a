"""The correctness gate: a compiled variant's outputs against eager's, leaf by leaf.

A bucket is published only if every output of every checked call passes. The gate knows nothing
of how the candidate was produced, so every serving variant is held to the same rules:

- Outputs are walked as trees (orchestrator.jobs.trees): tensors anywhere in tuples, lists,
  named tuples, dicts (HF `ModelOutput` included), dataclasses, torch pytree nodes and Hugging
  Face caches. Every container's type and size, and every leaf's path, must match eager's.
- Tensors: shape, dtype and device must match. Integer and bool tensors must be equal.
  Floating (and complex) tensors must satisfy |compiled - eager| <= atol + rtol * |eager|
  wherever eager is finite; a NaN or Inf in the compiled output where eager is finite fails.
- Eager's own NaN or Inf fails the bucket before anything compiles, unless the config allows
  non-finite outputs; then the compiled output must hold the same NaN and Inf at the same places.
- Python floats are compared like float64 scalars; any other leaf (int, str, None, ...) by `==`.
  A leaf of a type the walk does not know, whose `==` does not say equal (most objects compare
  by identity), cannot be compared: its message names the path and the config that leaves it out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any, Optional

import torch

from orchestrator.jobs import trees
from orchestrator.jobs.errors import NonFiniteOutput, OutputMismatch

# Default (atol, rtol) by dtype: Inductor fuses and reorders reductions.
TOLERANCE = {
    torch.float64: (1e-6, 1e-6),
    torch.float32: (1e-3, 1e-3),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex128: (1e-6, 1e-6),
    torch.complex64: (1e-3, 1e-3),
}
OTHER_FLOAT_TOLERANCE = (1e-1, 1e-1)  # float8 and anything newer: coarser than bfloat16


@dataclass(frozen=True)
class Container:
    """Where a leaf-less tree node stands in a flattened output: its type and size must match."""

    kind: str
    size: int


@dataclass(frozen=True)
class Leaf:
    path: str
    value: Any  # a detached copy of a tensor, a Container, or any other leaf as returned


Outputs = list[Leaf]
_NOTHING = Leaf("nothing", None)  # what one side has where the other's output goes on


@dataclass(frozen=True)
class Verdict:
    """What the gate compared and the worst floating-point error it saw."""

    leaves: int
    max_abs_error: Optional[float]  # None: no floating-point leaf
    atol: Optional[float]  # the tolerance in force where the worst error is
    rtol: Optional[float]
    # the largest |compiled - eager| / (atol + rtol*|eager|) over every value: how close the
    # closest call came to failing (at most 1 for a pass)
    tolerance_used: Optional[float]


def snapshot(output: Any) -> Outputs:
    """`output` flattened into leaves by path, tensors copied: a CUDA-graph replay or the next
    call may overwrite the buffers the model returned."""
    return [
        Leaf(path, value.detach().clone() if isinstance(value, torch.Tensor) else value)
        for path, value in _walk(output, "output")
    ]


class Gate:
    def __init__(
        self, atol: Optional[float] = None, rtol: Optional[float] = None, allow_nonfinite: bool = False
    ) -> None:
        self.atol, self.rtol, self.allow_nonfinite = atol, rtol, allow_nonfinite

    @classmethod
    def from_options(cls, check: Any) -> Gate:
        """From the config's `check` section (`orchestrator.jobs.spec.CheckOptions`)."""
        return cls(check.atol, check.rtol, check.allow_nonfinite)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        atol, rtol = TOLERANCE.get(dtype, OTHER_FLOAT_TOLERANCE)
        return (atol if self.atol is None else self.atol, rtol if self.rtol is None else self.rtol)

    def check_reference(self, reference: Outputs) -> None:
        """Eager's output itself: NaN or Inf in it make every comparison meaningless."""
        if self.allow_nonfinite:
            return
        for leaf in reference:
            values = _numeric(leaf.value)
            if values is None or not _is_floating(values):
                continue
            values = _as_real_double(values)
            finite = torch.isfinite(values)
            if not bool(finite.all()):
                nan = int(torch.isnan(values).sum())
                raise NonFiniteOutput(
                    f"eager output is not finite: {leaf.path} holds {nan} NaN and {int((~finite).sum()) - nan} Inf "
                    f"of {values.numel()} values; fix the model or its inputs, or set check.allow_nonfinite: true "
                    "if they are expected"
                )

    def compare(self, reference: Outputs, candidate: Outputs, *, call: str) -> Verdict:
        """Raise OutputMismatch naming the first leaf of `candidate` (the output of `call`) that
        fails. Containers carry their sizes, so outputs of different lengths differ at a container."""
        worst: Optional[tuple[float, float, float]] = None  # (error, atol, rtol)
        used: Optional[float] = None
        for want, got in zip_longest(reference, candidate, fillvalue=_NOTHING):
            if want.path != got.path:
                raise OutputMismatch(f"the {call} returned {got.path} where eager returned {want.path}")
            measured = self._leaf(want, got, call)
            if measured is None:
                continue
            error, fraction = measured
            if worst is None or error[0] > worst[0]:
                worst = error
            used = fraction if used is None else max(used, fraction)
        return Verdict(
            leaves=len(reference),
            max_abs_error=worst[0] if worst else None,
            atol=worst[1] if worst else None,
            rtol=worst[2] if worst else None,
            tolerance_used=used,
        )

    def _leaf(self, want: Leaf, got: Leaf, call: str) -> Optional[tuple[tuple[float, float, float], float]]:
        """((max abs error, atol, rtol), tolerance used) if the leaf is floating point, else None."""
        where = f"{want.path} of the {call}"
        if type(want.value) is not type(got.value) or isinstance(want.value, Container) and want.value != got.value:
            raise OutputMismatch(f"{where} is {_show(got.value)}, eager's is {_show(want.value)}")
        expected, actual = _numeric(want.value), _numeric(got.value)
        if expected is None:  # a container (equal, above) or a value that is neither tensor nor float
            if not _equal(want.value, got.value):
                if not isinstance(want.value, (Container, *_PLAIN)):
                    raise OutputMismatch(_incomparable(where, want.value))
                raise OutputMismatch(f"{where} is {_show(got.value)}, eager's is {_show(want.value)}")
            return None
        assert actual is not None  # of expected's type
        if (expected.shape, expected.dtype, expected.device.type) != (actual.shape, actual.dtype, actual.device.type):
            raise OutputMismatch(f"{where} is {_signature(actual)}, eager's is {_signature(expected)}")
        if not _is_floating(expected):
            differ = int(torch.ne(expected, actual).sum())
            if differ:
                raise OutputMismatch(
                    f"{where}: {differ} of {expected.numel()} {_dtype(expected)} values "
                    "differ from eager's (integer and bool outputs must be equal)"
                )
            return None
        return self._close(expected, actual, where)

    def _close(
        self, expected: torch.Tensor, actual: torch.Tensor, where: str
    ) -> tuple[tuple[float, float, float], float]:
        atol, rtol = self.tolerance(expected.dtype)
        expected, actual = _as_real_double(expected), _as_real_double(actual)
        finite = torch.isfinite(expected)
        broken = finite & ~torch.isfinite(actual)
        if bool(broken.any()):
            nan = int((broken & torch.isnan(actual)).sum())
            raise OutputMismatch(
                f"{where} holds {nan} NaN and {int(broken.sum()) - nan} Inf where eager's "
                f"values are finite ({int(broken.sum())} of {expected.numel()})"
            )
        # eager's NaN and Inf (where allowed): the same ones at the same places
        same = (torch.isnan(expected) == torch.isnan(actual)) & (finite | torch.isnan(expected) | (expected == actual))
        if not bool(same.all()):
            raise OutputMismatch(
                f"{where}: {int((~same).sum())} of eager's NaN/Inf are not at the same places in the compiled output"
            )
        error = torch.where(finite, (expected - actual).abs(), torch.zeros_like(expected))
        worst = float(error.max()) if error.numel() else 0.0
        allowed = atol + rtol * expected.abs()  # infinite or NaN only where error is 0
        beyond = error > allowed
        if bool(beyond.any()):
            raise OutputMismatch(
                f"{where} differs from eager: max abs error {worst:.3g} exceeds atol={atol:g} "
                f"+ rtol={rtol:g}*|eager| at {int(beyond.sum())} of {expected.numel()} values; "
                "set check.atol/check.rtol if this is expected",
                max_abs_error=worst,
            )
        fraction = torch.where(error > 0, error / allowed, torch.zeros_like(error))  # 0/0 (exact at atol=0) is 0
        return (worst, atol, rtol), float(fraction.max()) if fraction.numel() else 0.0


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs in a stable order, each container announced by a Container leaf.
    Mapping keys are taken in sorted order: a dict's order is not part of what it says."""
    split = trees.children(node)
    if split is None:  # a tensor, or any other value
        yield path, node
        return
    items = sorted(split.items, key=lambda item: repr(item[0])) if isinstance(node, Mapping) else split.items
    yield path, Container(trees.type_name(node), len(items))
    for key, child in items:
        yield from _walk(child, trees.path_of(path, key))


# leaves whose `==` compares values: any other type's may compare identities
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _incomparable(where: str, value: Any) -> str:
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    return (
        f"{where} is a {name}, which the gate cannot compare (not a tensor, a container or a "
        "registered pytree node); set serve.outputs to the outputs to serve (e.g. [logits]), or "
        f"register {kind.__qualname__} with torch.utils._pytree"
    )


def _numeric(value: Any) -> Optional[torch.Tensor]:
    """A tensor, or a Python float as a float64 scalar (so NaN and tolerance rules apply)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    return None


def _is_floating(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def _as_real_double(tensor: torch.Tensor) -> torch.Tensor:
    """float64 (complex as pairs of them): exact for every float dtype, and float8 has no isfinite."""
    return (torch.view_as_real(tensor) if tensor.is_complex() else tensor).double()


def _equal(want: Any, got: Any) -> bool:
    if want is got:
        return True
    try:
        return bool(want == got)
    except Exception:  # an == that is not a yes or no (an array's): not shown to be equal
        return False


def _signature(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} {_dtype(tensor)} on {tensor.device.type}"


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _show(value: Any) -> str:
    if isinstance(value, Container):
        return f"a {value.kind} of {value.size}"
    if isinstance(value, torch.Tensor):
        return f"a tensor {_signature(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
