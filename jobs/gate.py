"""The correctness gate: a compiled variant's outputs against eager's, leaf by leaf.

A bucket is published only if every output of every checked call passes. The gate knows nothing
of how the candidate was produced, so every serving variant is held to the same rules:

- Outputs are walked as trees (orchestrator.jobs.trees): tensors anywhere in tuples, lists,
  named tuples, dicts (HF `ModelOutput` included), dataclasses, torch pytree nodes and Hugging
  Face caches. Every container's type and size, and every leaf's path, must match eager's.
- Tensors: shape, dtype and device must match. Integer and bool tensors must be equal.
- Floating (and complex) tensors, given a float64 run of the same model on the same inputs (as
  PyTorch's own accuracy checks do): the compiled output's RMS error against float64 must be at
  most `multiple` times eager's own, plus a floor of a few units in the last place of the output's
  dtype at its RMS size. Eager is no exact reference: TF32 convolutions and matmuls, and reduced-
  precision reductions, put two correct float32 computations about 1e-3 apart, which a fixed
  tolerance either refuses or, widened, lets a wrong kernel through. The RMS error (not the
  largest) is the measure: the largest of many rounding errors is a noisy figure.
- Without a float64 run (none possible, or `check.reference: eager`), or with `check.atol` or
  `check.rtol` set (explicit tolerances): |compiled - eager| <= atol + rtol * |eager| wherever
  eager is finite, with defaults by dtype. Either way a NaN or Inf in the compiled output where
  eager is finite fails.
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
# Against float64: the compiled RMS error may be this many times eager's (PyTorch's accuracy
# checks allow 2-3), plus FLOOR_ULPS units in the last place at the output's RMS size, so that an
# output eager computes exactly is not held to exactly zero error
MULTIPLE = 3.0
FLOOR_ULPS = 4.0


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
    max_abs_error: Optional[float]  # None: no floating-point leaf; |compiled - eager|
    atol: Optional[float]  # the tolerance in force where the worst error is (None against float64)
    rtol: Optional[float]
    # how close the closest leaf came to failing (at most 1 for a pass): the largest
    # |compiled - eager| / (atol + rtol*|eager|), or against float64, the compiled RMS error over
    # what its rule allows
    tolerance_used: Optional[float]
    # "float64" where every floating leaf was judged against the float64 run, else "eager"
    reference: str = "eager"
    # at the leaf closest to failing against float64: eager's RMS error and the compiled one's
    float64_eager_error: Optional[float] = None
    float64_error: Optional[float] = None
    multiple: Optional[float] = None


@dataclass(frozen=True)
class _Measured:
    """One floating-point leaf's figures."""

    error: float  # max |compiled - eager|
    atol: Optional[float]
    rtol: Optional[float]
    fraction: float  # of what the rule allows
    float64: Optional[tuple[float, float]] = None  # (eager's RMS error, the compiled one's) against float64


def snapshot(output: Any) -> Outputs:
    """`output` flattened into leaves by path, tensors copied: a CUDA-graph replay or the next
    call may overwrite the buffers the model returned."""
    return [
        Leaf(path, value.detach().clone() if isinstance(value, torch.Tensor) else value)
        for path, value in _walk(output, "output")
    ]


class Gate:
    def __init__(
        self,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        allow_nonfinite: bool = False,
        reference: str = "float64",
        multiple: float = MULTIPLE,
    ) -> None:
        self.atol, self.rtol, self.allow_nonfinite = atol, rtol, allow_nonfinite
        self.multiple = multiple
        # explicit tolerances are a statement about eager: they keep their meaning
        self.wants_float64 = reference == "float64" and atol is None and rtol is None

    @classmethod
    def from_options(cls, check: Any) -> Gate:
        """From the config's `check` section (`orchestrator.jobs.spec.CheckOptions`)."""
        return cls(check.atol, check.rtol, check.allow_nonfinite, check.reference, check.multiple)

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

    def load_bounds(self, reference: Outputs, float64: Optional[Outputs]) -> dict[str, float]:
        """What a replica, which has eager but no float64 run, holds a loaded variant to: for each
        floating leaf this gate judges against float64, the RMS distance from eager that a variant
        passing here can have at most, (multiple + 1) times eager's own error plus the floor (the
        triangle inequality). Every variant this gate passes stays within it; a variant far off
        (a corrupted artifact, kernels for another platform) does not."""
        if float64 is None or not self.wants_float64:
            return {}
        high = {leaf.path: leaf.value for leaf in float64}
        bounds = {}
        for leaf in reference:
            expected = _numeric(leaf.value)
            exact = _exact(expected, high.get(leaf.path))
            if expected is None or exact is None:
                continue
            eager_error = _rms(_as_real_double(expected) - exact.to(expected.device))
            bounds[leaf.path] = (self.multiple + 1) * eager_error + _floor(expected.dtype, exact)
        return bounds

    def compare(
        self,
        reference: Outputs,
        candidate: Outputs,
        *,
        call: str,
        float64: Optional[Outputs] = None,
        bounds: Optional[Mapping[str, float]] = None,
    ) -> Verdict:
        """Raise OutputMismatch naming the first leaf of `candidate` (the output of `call`) that
        fails. Containers carry their sizes, so outputs of different lengths differ at a container.
        `float64`: the model's outputs in a float64 run on the same inputs (float64_reference),
        which floating leaves are judged against unless explicit tolerances are set. `bounds`:
        where there is no float64 run (a replica), the RMS distance from eager each floating leaf
        may have, as warmup's `load_bounds` gave them; explicit tolerances override them too."""
        high = {leaf.path: leaf.value for leaf in float64} if float64 is not None and self.wants_float64 else {}
        bounds = bounds if bounds and self.wants_float64 else {}
        worst: Optional[_Measured] = None  # the largest error against eager
        closest: Optional[_Measured] = None  # the largest fraction of what the rule allows
        judged = []
        for want, got in zip_longest(reference, candidate, fillvalue=_NOTHING):
            if want.path != got.path:
                raise OutputMismatch(f"the {call} returned {got.path} where eager returned {want.path}")
            measured = self._leaf(want, got, call, high.get(want.path), bounds.get(want.path))
            if measured is None:
                continue
            judged.append(measured.float64 is not None)
            if worst is None or measured.error > worst.error:
                worst = measured
            if closest is None or measured.fraction > closest.fraction:
                closest = measured
        against = closest.float64 if closest is not None else None
        return Verdict(
            leaves=len(reference),
            max_abs_error=worst.error if worst else None,
            atol=worst.atol if worst else None,
            rtol=worst.rtol if worst else None,
            tolerance_used=closest.fraction if closest else None,
            reference="float64" if judged and all(judged) else "eager",
            float64_eager_error=against[0] if against else None,
            float64_error=against[1] if against else None,
            multiple=self.multiple if any(judged) else None,
        )

    def _leaf(
        self, want: Leaf, got: Leaf, call: str, high: Any = None, bound: Optional[float] = None
    ) -> Optional[_Measured]:
        """The figures of a floating-point leaf (judged against `high`, its float64 value, where
        that can judge it, else within `bound` of eager where given), else None."""
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
        exact = _exact(expected, high)
        if exact is not None:
            return self._close_to_float64(expected, actual, exact, where)
        if bound is not None and bool(torch.isfinite(_as_real_double(expected)).all()):
            return self._within(expected, actual, bound, where)
        return self._close(expected, actual, where)

    def _close_to_float64(
        self, expected: torch.Tensor, actual: torch.Tensor, exact: torch.Tensor, where: str
    ) -> _Measured:
        """The compiled RMS error against float64 within `multiple` times eager's, plus a floor."""
        floor = _floor(expected.dtype, exact)
        expected, actual, exact = _as_real_double(expected), _as_real_double(actual), exact.to(expected.device)
        _refuse_nonfinite(where, actual)
        error = float((expected - actual).abs().max()) if expected.numel() else 0.0
        eager_error, compiled_error = _rms(expected - exact), _rms(actual - exact)
        allowed = self.multiple * eager_error + floor
        if compiled_error > allowed:
            raise OutputMismatch(
                f"{where} is further from a float64 run than eager is: RMS error {compiled_error:.3g} against "
                f"eager's {eager_error:.3g} (at most {self.multiple:g}x that + {floor:.2g}); set "
                "check.reference: eager, or check.atol/check.rtol, if this is expected",
                max_abs_error=error,
            )
        return _Measured(error, None, None, compiled_error / allowed, (eager_error, compiled_error))

    def _within(self, expected: torch.Tensor, actual: torch.Tensor, bound: float, where: str) -> _Measured:
        """The RMS distance from eager within the bound warmup's float64 check set (load_bounds)."""
        expected, actual = _as_real_double(expected), _as_real_double(actual)
        _refuse_nonfinite(where, actual)
        error = float((expected - actual).abs().max()) if expected.numel() else 0.0
        distance = _rms(actual - expected)
        if distance > bound:
            raise OutputMismatch(
                f"{where} is further from eager than warmup's float64 check allows: RMS distance "
                f"{distance:.3g}, at most {bound:.3g}; warm this platform again (orchestrate warmup), "
                "or set check.reference: eager if this is expected",
                max_abs_error=error,
            )
        return _Measured(error, None, None, distance / bound)

    def _close(self, expected: torch.Tensor, actual: torch.Tensor, where: str) -> _Measured:
        atol, rtol = self.tolerance(expected.dtype)
        expected, actual = _as_real_double(expected), _as_real_double(actual)
        finite = torch.isfinite(expected)
        _refuse_nonfinite(where, actual, finite)
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
        return _Measured(worst, atol, rtol, float(fraction.max()) if fraction.numel() else 0.0)


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


def _exact(expected: Optional[torch.Tensor], high: Any) -> Optional[torch.Tensor]:
    """A floating leaf's float64 value as float64, where it can judge the leaf: of its shape, and
    finite where eager is finite everywhere (NaN and Inf are judged against eager itself)."""
    exact = _numeric(high)
    if expected is None or not _is_floating(expected) or exact is None:
        return None
    if exact.shape != expected.shape or not _is_floating(exact):
        return None
    exact = _as_real_double(exact)
    if not bool(torch.isfinite(exact).all()) or not bool(torch.isfinite(_as_real_double(expected)).all()):
        return None
    return exact


def _floor(dtype: torch.dtype, exact: torch.Tensor) -> float:
    """FLOOR_ULPS units in the last place of `dtype` at the float64 output's RMS size."""
    return FLOOR_ULPS * _epsilon(dtype) * max(_rms(exact), torch.finfo(torch.float64).tiny)


def _refuse_nonfinite(where: str, actual: torch.Tensor, finite: Optional[torch.Tensor] = None) -> None:
    """NaN or Inf in the compiled output where eager's values are finite (`finite`; None: all of
    them) fail."""
    broken = ~torch.isfinite(actual) if finite is None else finite & ~torch.isfinite(actual)
    if bool(broken.any()):
        nan = int((broken & torch.isnan(actual)).sum())
        raise OutputMismatch(
            f"{where} holds {nan} NaN and {int(broken.sum()) - nan} Inf where eager's "
            f"values are finite ({int(broken.sum())} of {actual.numel()})"
        )


def _rms(values: torch.Tensor) -> float:
    return float(values.square().mean().sqrt()) if values.numel() else 0.0


def _epsilon(dtype: torch.dtype) -> float:
    """The spacing of `dtype` at 1 (a complex dtype's parts')."""
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    return float(torch.finfo(dtype).eps)


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
