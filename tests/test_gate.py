"""The correctness gate, rule by rule, on CPU tensors: no compile, no process start.

Each test names the rule it holds; together they fail if any rule of orchestrator.jobs.gate is loosened."""

from __future__ import annotations

import math
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from orchestrator.jobs.errors import NonFiniteOutput, OutputMismatch
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.spec import CheckOptions


def compare(eager, compiled, gate: Optional[Gate] = None):
    gate = gate or Gate()
    reference = snapshot(eager)
    gate.check_reference(reference)
    return gate.compare(reference, snapshot(compiled), call="compiled first call")


def refused(eager, compiled, match: str, gate: Optional[Gate] = None) -> str:
    with pytest.raises(OutputMismatch, match=match) as caught:
        compare(eager, compiled, gate)
    return str(caught.value)


X = torch.linspace(-2.0, 2.0, 64).reshape(8, 8)


# -- floating-point tolerance --------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, atol", [(torch.float64, 1e-6), (torch.float32, 1e-3), (torch.float16, 1e-2), (torch.bfloat16, 5e-2)]
)
def test_default_tolerance_by_dtype_is_exact_at_both_sides(dtype, atol):
    """On a zero output, rtol plays no part: 0.9*atol passes and 1.1*atol fails, per dtype."""
    zeros = torch.zeros(16, dtype=torch.float64)
    inside, outside = (zeros + 0.9 * atol).to(dtype), (zeros + 1.1 * atol).to(dtype)
    verdict = compare(zeros.to(dtype), inside)
    assert verdict.atol == atol and verdict.rtol == atol
    assert verdict.max_abs_error == pytest.approx(float(inside[0].double()), rel=1e-6)
    refused(zeros.to(dtype), outside, "differs from eager: max abs error")


def test_relative_tolerance_scales_with_eager_values():
    """|got - want| <= atol + rtol*|want|: at 1000 the fp32 bound is 1.001, so 0.5 passes, 1.5 fails."""
    big = torch.full((4,), 1000.0)
    verdict = compare(big, big + 0.5)
    assert verdict.max_abs_error == pytest.approx(0.5)
    assert verdict.tolerance_used == pytest.approx(0.5 / 1.001, rel=1e-4)
    refused(big, big + 1.5, r"max abs error 1\.5 exceeds atol=0\.001 \+ rtol=0\.001")


def test_tolerance_used_is_the_worst_fraction_of_the_bound_over_all_values():
    """Not the fraction at the largest error: 0.5 at 1000 uses half the bound, 9e-4 at 0 uses 90%."""
    eager = torch.tensor([1000.0, 0.0])
    verdict = compare(eager, eager + torch.tensor([0.5, 9e-4]))
    assert verdict.max_abs_error == pytest.approx(0.5)
    assert verdict.tolerance_used == pytest.approx(0.9, rel=1e-3)
    assert compare((eager, torch.arange(3)), (eager, torch.arange(3))).tolerance_used == 0.0
    assert compare(torch.arange(3), torch.arange(3)).tolerance_used is None
    exact = Gate(atol=0.0, rtol=0.0)  # a zero bound: equal values use none of it
    assert compare(eager, eager.clone(), exact).tolerance_used == 0.0
    refused(eager, eager + torch.tensor([0.0, 1e-30]), "max abs error 1e-30", exact)


def test_config_tolerances_replace_the_defaults():
    gate = Gate.from_options(CheckOptions(atol=0.5, rtol=0.0))
    verdict = compare(X, X + 0.4, gate)
    assert (verdict.atol, verdict.rtol) == (0.5, 0.0)
    assert verdict.max_abs_error == pytest.approx(0.4, rel=1e-5)
    refused(X, X + 0.6, "atol=0.5 ", gate)
    # tighter than the default as well: 5e-4 passes fp32's default, not atol=1e-4
    tight = Gate.from_options(CheckOptions(atol=1e-4, rtol=0.0))
    compare(torch.zeros(4), torch.full((4,), 5e-4))
    refused(torch.zeros(4), torch.full((4,), 5e-4), "atol=0.0001", tight)


def test_reported_error_is_the_largest_over_every_leaf():
    eager = (X, X * 2, {"z": X})
    compiled = (X + 1e-4, X * 2 + 3e-4, {"z": X + 2e-4})
    assert compare(eager, compiled).max_abs_error == pytest.approx(3e-4, rel=1e-3)


def test_tolerance_of_the_worst_leaf_is_reported():
    eager = (X.double(), X.half())
    verdict = compare(eager, (X.double() + 1e-7, X.half() + 4e-3))
    assert verdict.atol == 1e-2 and verdict.max_abs_error == pytest.approx(4e-3, rel=0.1)


# -- NaN and Inf ---------------------------------------------------------------------------------


def test_nan_in_compiled_output_where_eager_is_finite_fails_and_says_nan():
    compiled = X.clone()
    compiled[0, :3] = float("nan")
    message = refused(
        X, compiled, "output of the compiled first call holds 3 NaN and 0 Inf where eager's values are finite"
    )
    assert "max abs error 0" not in message


def test_inf_in_compiled_output_where_eager_is_finite_fails():
    compiled = X.clone()
    compiled[1, 1] = float("-inf")
    refused(X, compiled, "holds 0 NaN and 1 Inf where eager's values are finite")


def test_eager_nan_fails_the_bucket_before_any_comparison():
    nan = torch.full((4, 4), float("nan"))
    with pytest.raises(
        NonFiniteOutput,
        match="eager output is not finite: output holds 16 NaN and 0 Inf of 16 values.*check.allow_nonfinite: true",
    ):
        Gate().check_reference(snapshot(nan))
    # all-NaN eager beside an off-by-one compiler: refused, not passed with error 0
    with pytest.raises(NonFiniteOutput):
        compare(nan, nan + 1.0)


def test_eager_inf_inside_a_structure_is_named_by_path():
    eager = {"logits": X, "scale": torch.tensor([1.0, float("inf")])}
    with pytest.raises(NonFiniteOutput, match=r"output\.scale holds 0 NaN and 1 Inf of 2 values"):
        Gate().check_reference(snapshot(eager))


def test_python_float_leaves_follow_the_nan_rule():
    with pytest.raises(NonFiniteOutput, match=r"output\[1\]"):
        Gate().check_reference(snapshot((X, float("nan"))))
    refused((X, 1.0), (X, float("nan")), r"output\[1\] of the compiled first call holds 1 NaN")
    refused((X, 1.0), (X, 1.5), r"output\[1\] of the compiled first call differs from eager")
    assert compare((X, 0.25), (X, 0.25)).max_abs_error == 0.0


def test_allowed_nonfinite_values_must_match_in_place_and_kind():
    allow = Gate.from_options(CheckOptions(allow_nonfinite=True))
    eager = torch.tensor([1.0, float("nan"), float("inf"), float("-inf")])
    verdict = compare(eager, torch.tensor([1.0005, float("nan"), float("inf"), float("-inf")]), allow)
    assert verdict.max_abs_error == pytest.approx(5e-4, rel=1e-3)  # the finite values only
    for wrong in (
        [1.0, 0.0, float("inf"), float("-inf")],  # eager's NaN became a number
        [1.0, float("nan"), float("-inf"), float("-inf")],  # +Inf became -Inf
        [1.0, float("inf"), float("nan"), float("-inf")],
    ):  # NaN and Inf swapped
        refused(eager, torch.tensor(wrong), "of eager's NaN/Inf are not at the same places", allow)
    # finite positions still follow the tolerance and the compiled-NaN rule
    refused(eager, torch.tensor([1.5, float("nan"), float("inf"), float("-inf")]), "differs from eager", allow)
    refused(
        eager,
        torch.tensor([float("nan")] * 2 + [float("inf"), float("-inf")]),
        "where eager's values are finite",
        allow,
    )


def test_allow_nonfinite_is_off_by_default_in_the_config():
    assert CheckOptions().allow_nonfinite is False
    with pytest.raises(NonFiniteOutput):
        Gate.from_options(CheckOptions()).check_reference(snapshot(torch.tensor([float("inf")])))
    Gate.from_options(CheckOptions(allow_nonfinite=True)).check_reference(snapshot(torch.tensor([float("inf")])))


def test_complex_outputs_are_compared_by_real_and_imaginary_parts():
    z = torch.complex(X, -X)
    assert compare(z, z + 5e-4j).max_abs_error == pytest.approx(5e-4, rel=1e-3)
    refused(z, z + 5e-3j, "differs from eager")


# -- exact leaves -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_outputs_must_be_equal(dtype):
    eager = torch.arange(16).remainder(2).to(dtype)
    compiled = eager.clone()
    compiled[3] = ~compiled[3] if dtype == torch.bool else compiled[3] + 1
    assert compare(eager, eager.clone()).max_abs_error is None
    refused(eager, compiled, f"1 of 16 {str(dtype).removeprefix('torch.')} values differ from eager's")


def test_integer_outputs_get_no_tolerance_even_when_configured():
    tokens = torch.arange(8)
    refused(tokens, tokens + 1, "8 of 8 int64 values differ", Gate(atol=10.0, rtol=10.0))


@pytest.mark.parametrize(
    "eager, compiled, match",
    [
        (3, 4, r"output\[1\] of the compiled first call is int 4, eager's is int 3"),
        ("argmax", "argmin", "is str 'argmin', eager's is str 'argmax'"),
        (None, 0, "is int 0, eager's is NoneType None"),
        (True, 1, "is int 1, eager's is bool True"),
    ],
)
def test_non_tensor_leaves_must_be_equal(eager, compiled, match):
    compare((X, eager), (X, eager))
    refused((X, eager), (X, compiled), match)


# -- shape, dtype, device, count and structure ---------------------------------------------------


def test_shape_must_match_even_when_values_broadcast():
    refused(X[:1], X[:1].expand(2, 8), r"is \(2, 8\) float32 on cpu, eager's is \(1, 8\) float32 on cpu")


def test_dtype_must_match_even_when_values_are_equal():
    refused(X, X.double(), r"float64 on cpu, eager's is \(8, 8\) float32 on cpu")


def test_tensor_against_non_tensor_fails():
    refused((X, X), (X, 1.0), r"output\[1\] of the compiled first call is float 1\.0, eager's is a tensor")


def test_number_of_outputs_must_match():
    refused((X, X), (X, X, X), "output of the compiled first call is a tuple of 3, eager's is a tuple of 2")
    refused((X, X), (X,), "is a tuple of 1, eager's is a tuple of 2")
    refused([X], [X, torch.zeros(0)], "is a list of 2, eager's is a list of 1")  # an empty extra tensor counts
    refused({"a": X}, {"a": X, "b": X}, "is a dict of 2, eager's is a dict of 1")


def test_outputs_of_different_lengths_are_refused_whatever_the_containers_say():
    """Should a container's size ever fail to tell, the gate still walks both outputs to the end."""
    reference, candidate = snapshot((X, X)), snapshot((X, X))
    with pytest.raises(OutputMismatch, match=r"the replay returned nothing where eager returned output\[1\]"):
        Gate().compare(reference, candidate[:-1], call="replay")
    with pytest.raises(OutputMismatch, match=r"the replay returned output\[1\] where eager returned nothing"):
        Gate().compare(reference[:-1], candidate, call="replay")


def test_container_type_must_match():
    refused((X,), [X], "output of the compiled first call is a list of 1, eager's is a tuple of 1")
    refused({"a": X}, (X,), "is a tuple of 1, eager's is a dict of 1")


def test_dict_keys_must_match():
    refused({"a": X, "b": X}, {"a": X, "c": X}, r"returned output\.c where eager returned output\.b")
    assert compare({"b": X, "a": X * 2}, {"a": X * 2, "b": X}).leaves == 3  # order is not a difference


@dataclass
class Prediction:
    logits: torch.Tensor
    labels: torch.Tensor
    note: str = "ok"


class ModelOutputLike(OrderedDict):
    """What transformers' ModelOutput is: an OrderedDict (and a dataclass) of its non-None fields."""


Pair = namedtuple("Pair", "mean std")


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda t, i: Prediction(t, i), id="dataclass"),
        pytest.param(lambda t, i: ModelOutputLike(logits=t, labels=i), id="ModelOutput-like"),
        pytest.param(lambda t, i: Pair(t, i), id="namedtuple"),
        pytest.param(lambda t, i: [{"deep": (t,)}, i], id="nested"),
    ],
)
def test_tensors_inside_any_structure_are_compared(wrap):
    labels = torch.arange(8)
    verdict = compare(wrap(X, labels), wrap(X + 5e-4, labels))
    assert verdict.max_abs_error == pytest.approx(5e-4, rel=1e-3) and verdict.leaves >= 3
    refused(wrap(X, labels), wrap(X + 1.0, labels), "differs from eager: max abs error 1 ")
    refused(wrap(X, labels), wrap(X, labels + 1), "8 of 8 int64 values differ")


def test_dataclass_fields_are_paths_and_plain_fields_compared():
    refused(Prediction(X, X), Prediction(X, X + 1), r"output\.labels of the compiled first call differs")
    refused(Prediction(X, X), Prediction(X, X, note="changed"), r"output\.note .* is str 'changed'")


def test_registered_pytree_nodes_are_walked():
    from torch.utils import _pytree as pytree

    class Boxed:
        def __init__(self, inner):
            self.inner = inner

    pytree.register_pytree_node(Boxed, lambda b: ([b.inner], None), lambda children, _: Boxed(children[0]))
    try:
        assert compare(Boxed(X), Boxed(X)).leaves == 2
        refused(Boxed(X), Boxed(X + 1.0), r"output\[0\] of the compiled first call differs")
    finally:
        pytree.SUPPORTED_NODES.pop(Boxed)


def test_snapshot_copies_so_a_later_call_cannot_overwrite_the_reference():
    """Under CUDA graphs a replay writes into the buffers the last call returned."""
    out = X.clone()
    reference = snapshot((out,))
    out.add_(1.0)
    refused((X,), (out,), "differs from eager")
    assert Gate().compare(reference, snapshot((X,)), call="replay").max_abs_error == 0.0


def test_verdict_counts_every_leaf_and_container():
    verdict = compare({"a": (X, X), "b": 3}, {"a": (X, X), "b": 3})
    assert verdict.leaves == 5  # dict, tuple, two tensors, the int
    assert verdict.max_abs_error == 0.0 and math.isfinite(verdict.max_abs_error)


def test_outputs_without_floating_point_report_no_error_or_tolerance():
    verdict = compare((torch.arange(4), "x"), (torch.arange(4), "x"))
    assert (verdict.max_abs_error, verdict.atol, verdict.rtol, verdict.tolerance_used) == (None, None, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gate_on_cuda_tensors():
    on_gpu = X.cuda()
    assert compare((on_gpu, on_gpu.half()), (on_gpu + 5e-4, on_gpu.half())).max_abs_error == pytest.approx(
        5e-4, rel=1e-2
    )
    broken = on_gpu.clone()
    broken[2, 2] = float("nan")
    refused(on_gpu, broken, "holds 1 NaN and 0 Inf where eager's values are finite")
    refused(on_gpu, X, "on cpu, eager's is .* on cuda")
    with pytest.raises(NonFiniteOutput):
        Gate().check_reference(snapshot(on_gpu / 0))


# -- what each rule reports ------------------------------------------------------------------------


def test_messages_name_the_fix():
    with pytest.raises(OutputMismatch) as caught:
        compare(X, X + 1.0)
    assert str(caught.value) == (
        "output of the compiled first call differs from eager: max abs error 1 exceeds "
        "atol=0.001 + rtol=0.001*|eager| at 64 of 64 values; set check.atol/check.rtol "
        "if this is expected"
    )
    assert caught.value.max_abs_error == pytest.approx(1.0)
    with pytest.raises(NonFiniteOutput) as caught:
        Gate().check_reference(snapshot(torch.tensor([float("nan"), 1.0])))
    assert str(caught.value) == (
        "eager output is not finite: output holds 1 NaN and 0 Inf of 2 values; fix the "
        "model or its inputs, or set check.allow_nonfinite: true if they are expected"
    )


def test_a_mismatch_that_is_not_about_values_carries_no_error():
    with pytest.raises(OutputMismatch) as caught:
        compare((X,), [X])
    assert caught.value.max_abs_error is None


def test_nonfinite_mismatch_counts_the_misplaced_values():
    allow = Gate(allow_nonfinite=True)
    eager = torch.tensor([float("nan"), float("inf"), 1.0, 2.0, 3.0])
    refused(eager, torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0]), "2 of eager's NaN/Inf are not at the same places", allow)


def test_python_floats_are_held_to_float64_tolerance():
    refused((X, 1.0), (X, 1.0 + 1e-4), r"output\[1\] .* exceeds atol=1e-06")
    assert compare((X, 1.0), (X, 1.0 + 1e-7)).max_abs_error == pytest.approx(1e-7, rel=1e-3)


def test_dtypes_without_a_default_get_the_coarsest_tolerance():
    eight = torch.zeros(4).to(torch.float8_e4m3fn)
    assert Gate().tolerance(torch.float8_e4m3fn) == (0.1, 0.1)
    verdict = compare(eight, (torch.zeros(4) + 0.0625).to(torch.float8_e4m3fn))
    assert verdict.max_abs_error == 0.0625 and verdict.atol == 0.1
    refused(eight, (torch.zeros(4) + 0.125).to(torch.float8_e4m3fn), "atol=0.1 ")
    with pytest.raises(NonFiniteOutput):
        Gate().check_reference(snapshot(torch.tensor([float("nan")]).to(torch.float8_e4m3fn)))


def test_empty_tensors_compare_with_no_error():
    verdict = compare(torch.zeros(0, 8), torch.zeros(0, 8))
    assert (verdict.max_abs_error, verdict.tolerance_used) == (0.0, 0.0)


def test_worst_error_and_fraction_are_taken_over_leaves_not_the_last_one():
    verdict = compare((X, X), (X + 9e-4, X + 1e-4))
    assert verdict.max_abs_error == pytest.approx(9e-4, rel=1e-3)
    # the first leaf's, at the eager value nearest 0 (the second leaf's is 9 times smaller)
    assert verdict.tolerance_used == pytest.approx(float((9e-4 / (1e-3 + 1e-3 * X.abs())).max()), rel=1e-3)
    tied = compare((X.double(), X), (X.double(), X))  # equal errors: the first leaf's tolerance is kept
    assert (tied.max_abs_error, tied.atol) == (0.0, 1e-6)


def test_leaves_whose_equality_is_not_a_yes_or_no():
    class Ambiguous:
        def __eq__(self, other):
            raise ValueError("the truth value is ambiguous")

    same = Ambiguous()
    compare((X, same), (X, same))  # the very same object
    refused(
        (X, Ambiguous()),
        (X, Ambiguous()),
        r"output\[1\] of the compiled first call is a [\w.<>]*Ambiguous, which the gate cannot compare \(not a "
        r"tensor, a container or a registered pytree node\); set serve\.outputs to the outputs to serve \(e\.g\. "
        r"\[logits\]\), or register [\w.<>]*Ambiguous with torch\.utils\._pytree$",
    )


def test_long_values_are_shortened_in_messages():
    message = refused(("a" * 30 + "b" * 30,), ("c" * 60,), "is str 'ccc")
    assert f"is str '{'c' * 36}..., eager's is str '{'a' * 30}{'b' * 6}..." in message
    refused(("x" * 38,), ("y" * 38,), f"is str '{'y' * 38}', eager's")  # 40 characters with quotes: in full
    refused(("x" * 39,), ("y" * 39,), f"is str '{'y' * 36}..., eager's")  # 41: shortened


def test_paths_name_keys_and_fields():
    refused({0: X, "two words": X, "plain": X}, {0: X + 1, "two words": X, "plain": X}, r"output\[0\] of")
    refused({"two words": X}, {"two words": X + 1}, r"output\['two words'\] of")
    refused({"plain": X}, {"plain": X + 1}, r"output\.plain of")
    refused(Pair(X, X), Pair(X, X + 1), r"output\.std of the compiled")
    assert compare({1: X, "a": X}, {"a": X, 1: X}).leaves == 3  # keys of mixed types sort


@dataclass
class OtherPrediction:
    logits: torch.Tensor
    labels: torch.Tensor
    note: str = "ok"


Other = namedtuple("Other", "mean std")


def test_container_classes_must_match_not_just_their_fields():
    refused(Prediction(X, X), OtherPrediction(X, X), "is a OtherPrediction of 3, eager's is a Prediction of 3")
    refused(Pair(X, X), Other(X, X), "is a Other of 2, eager's is a Pair of 2")
    refused(Pair(X, X), (X, X), "is a tuple of 2, eager's is a Pair of 2")


def test_registered_pytree_nodes_are_compared_by_class_and_size():
    from torch.utils import _pytree as pytree

    class Bag:
        def __init__(self, *items):
            self.items = items

    class Sack(Bag):
        pass

    for cls in (Bag, Sack):
        pytree.register_pytree_node(cls, lambda b: (list(b.items), None), lambda children, _, cls=cls: cls(*children))
    try:
        refused(Bag(X), Bag(X, X), "is a .*Bag of 2, eager's is a .*Bag of 1")
        refused(Bag(X), Sack(X), "Sack of 1, eager's is a .*Bag of 1")
    finally:
        pytree.SUPPORTED_NODES.pop(Bag)
        pytree.SUPPORTED_NODES.pop(Sack)


# -- against a float64 run -----------------------------------------------------------------------


class ConvNet(torch.nn.Module):
    """A small float32 conv net with a bias-carrying head: what the seeded wrong kernels break."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(4, 16, 5, padding=2)
        self.norm = torch.nn.GroupNorm(4, 16)
        self.head = torch.nn.Linear(16 * 64, 96)

    def forward(self, x):  # logits of magnitude ~10, as a classifier's are
        return 10 * self.head(torch.nn.functional.gelu(self.norm(self.conv(x))).flatten(1))


def tf32(t: torch.Tensor, nearest: bool = True) -> torch.Tensor:
    """`t` rounded to TF32's 10 mantissa bits (to nearest, or toward zero): what a TF32 kernel
    reads of it."""
    bits = t.contiguous().view(torch.int32)
    return (((bits + 0x1000) if nearest else bits) & ~0x1FFF).view(torch.float32)


def run(x: torch.Tensor, rounding: Optional[bool] = None, wide: bool = False) -> torch.Tensor:
    """The model in float32 (rounding None), as a TF32 kernel computes it (operands rounded to
    nearest: True, toward zero: False), or in float64."""
    model = ConvNet().eval()
    with torch.no_grad():
        if wide:
            return model.double()(x.double())
        if rounding is None:
            return model(x)
        for p in model.parameters():
            p.copy_(tf32(p, rounding))
        return model(tf32(x, rounding))


def judged(eager, compiled, wide, gate: Optional[Gate] = None):
    gate = gate or Gate()
    return gate.compare(snapshot(eager), snapshot(compiled), call="compiled first call", float64=snapshot(wide))


X1 = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(1))


def test_a_correct_kernel_at_eagers_own_error_passes_where_a_fixed_tolerance_refuses_it():
    # eager's TF32 kernels against compiled ones that round their operands another way: both
    # about 1e-4 (RMS) from float64, so as far from each other, beyond float32's tolerances
    eager, compiled, wide = run(X1, rounding=True), run(X1, rounding=False), run(X1, wide=True)
    refused(eager, compiled, "exceeds atol=0.001", Gate(reference="eager"))
    verdict = judged(eager, compiled, wide)
    assert verdict.reference == "float64" and verdict.multiple == 3.0 and verdict.atol is None
    assert verdict.float64_eager_error == pytest.approx(float((eager.double() - wide).square().mean().sqrt()))
    assert verdict.float64_eager_error < verdict.float64_error <= 3.0 * verdict.float64_eager_error
    assert 0 < verdict.tolerance_used <= 1
    # a compiled kernel in full float32: far closer to float64 than TF32 eager
    assert judged(eager, run(X1), wide).tolerance_used < 0.01


def seeded(eager: torch.Tensor, model_bias: torch.Tensor) -> dict[str, torch.Tensor]:
    one = eager.clone()
    one[1, 7] *= 1.01
    shifted = eager.clone()
    shifted[:, 32:64] = eager[:, 33:65]
    return {"sign flip": -eager, "dropped bias": eager - model_bias, "wrong slice": shifted, "1% in one element": one}


@pytest.mark.parametrize("wrong", ["sign flip", "dropped bias", "wrong slice", "1% in one element"])
def test_seeded_wrong_kernels_fail_against_float64(wrong):
    eager, wide = run(X1), run(X1, wide=True)
    candidate = seeded(eager, 10 * ConvNet().head.bias.detach())[wrong]
    with pytest.raises(OutputMismatch, match="is further from a float64 run than eager is: RMS error"):
        judged(eager, candidate, wide)


def test_an_exact_output_is_held_to_a_few_units_in_the_last_place():
    x = torch.linspace(1.0, 2.0, 1000)
    judged(x, x * (1 + 2 * torch.finfo(torch.float32).eps), x.double())
    with pytest.raises(OutputMismatch, match="further from a float64 run"):
        judged(x, x * (1 + 64 * torch.finfo(torch.float32).eps), x.double())


def test_explicit_tolerances_judge_against_eager_as_before():
    eager, wide = run(X1), run(X1, wide=True)
    off = eager + 5e-4
    verdict = judged(eager, off, wide, Gate(atol=1e-3, rtol=0.0))
    assert verdict.reference == "eager" and verdict.atol == 1e-3 and verdict.multiple is None
    with pytest.raises(OutputMismatch, match="further from a float64 run"):
        judged(eager, off, wide)  # 5e-4 is far beyond float32 eager's own error


def test_float64_judges_floating_leaves_only_and_nonfinite_is_still_refused():
    eager, wide = run(X1), run(X1, wide=True)
    labels = eager.argmax(-1)
    verdict = Gate().compare(snapshot((eager, labels)), snapshot((eager, labels)), call="c",
                             float64=snapshot((wide, labels)))  # fmt: skip
    assert verdict.reference == "float64" and verdict.float64_error == pytest.approx(verdict.float64_eager_error)
    with pytest.raises(OutputMismatch, match="differ from eager's"):
        judged((eager, labels), (eager, labels + 1), (wide, labels))
    broken = eager.clone()
    broken[0, 0] = float("nan")
    with pytest.raises(OutputMismatch, match="holds 1 NaN and 0 Inf"):
        judged(eager, broken, wide)


def test_a_leaf_the_float64_run_cannot_judge_falls_back_to_tolerances():
    eager, wide = run(X1), run(X1, wide=True)
    verdict = judged(eager, eager + 1e-5, wide[:, :10])  # another shape: no judge for it
    assert verdict.reference == "eager" and verdict.atol == 1e-3


def test_the_configs_multiple_and_reference_reach_the_gate():
    gate = Gate.from_options(CheckOptions(multiple=2.0))
    assert gate.wants_float64 and gate.multiple == 2.0
    assert not Gate.from_options(CheckOptions(reference="eager")).wants_float64
    assert not Gate.from_options(CheckOptions(atol=1e-2)).wants_float64
    assert CheckOptions().multiple == 3.0 == Gate().multiple


# -- at a replica's load: eager at hand, no float64 run -------------------------------------------


def test_a_replica_holds_a_variant_to_the_bound_warmups_float64_check_sets():
    # eager's TF32 kernels against compiled ones that round another way: passed against float64,
    # refused by float32's tolerances against eager alone, kept within the bound from warmup
    eager, compiled, wide = run(X1, rounding=True), run(X1, rounding=False), run(X1, wide=True)
    judged(eager, compiled, wide)
    gate = Gate()
    bounds = gate.load_bounds(snapshot(eager), snapshot(wide))
    eager_error = float((eager.double() - wide).square().mean().sqrt())
    assert set(bounds) == {"output"} and 4 * eager_error < bounds["output"] < 4 * eager_error * 1.01
    refused(eager, compiled, "exceeds atol=0.001", gate)
    verdict = gate.compare(snapshot(eager), snapshot(compiled), call="graphed at load", bounds=bounds)
    assert verdict.reference == "eager" and 0 < verdict.tolerance_used <= 1
    # explicit tolerances, or a leaf the bounds do not name, are judged as before
    assert Gate(atol=1e-3).load_bounds(snapshot(eager), snapshot(wide)) == {}
    assert gate.load_bounds(snapshot(eager), None) == {}
    with pytest.raises(OutputMismatch, match="exceeds atol=0.001"):
        Gate(atol=1e-3).compare(snapshot(eager), snapshot(compiled), call="c", bounds=bounds)
    with pytest.raises(OutputMismatch, match="exceeds atol=0.001"):
        gate.compare(snapshot(eager), snapshot(compiled), call="c", bounds={"output.logits": 1.0})


@pytest.mark.parametrize("wrong", ["sign flip", "dropped bias", "wrong slice", "1% in one element"])
def test_seeded_wrong_kernels_fail_the_bound_at_load(wrong):
    eager, wide = run(X1), run(X1, wide=True)
    bounds = Gate().load_bounds(snapshot(eager), snapshot(wide))
    candidate = seeded(eager, 10 * ConvNet().head.bias.detach())[wrong]
    with pytest.raises(OutputMismatch, match="is further from eager than warmup's float64 check allows: RMS"):
        Gate().compare(snapshot(eager), snapshot(candidate), call="graphed at load", bounds=bounds)
    broken = eager.clone()
    broken[0, 0] = float("inf")
    with pytest.raises(OutputMismatch, match="holds 0 NaN and 1 Inf"):
        Gate().compare(snapshot(eager), snapshot(broken), call="graphed at load", bounds=bounds)


def test_against_float64_the_report_keeps_the_largest_difference_from_eager_and_the_full_line():
    eager, wide = run(X1), run(X1, wide=True)
    near = eager + 2e-7 * torch.randn(eager.shape, generator=torch.Generator().manual_seed(2))
    verdict = judged(eager, near, wide)
    assert verdict.max_abs_error == pytest.approx(float((near - eager).abs().max()))
    floor = 4 * torch.finfo(torch.float32).eps * float(wide.square().mean().sqrt())
    allowed = 3 * verdict.float64_eager_error + floor
    assert verdict.tolerance_used == pytest.approx(verdict.float64_error / allowed)
    off = eager.clone()
    off[2, 5] += 0.5
    with pytest.raises(OutputMismatch) as caught:
        judged(eager, off, wide)
    assert caught.value.max_abs_error == pytest.approx(0.5, rel=1e-5)
    assert str(caught.value).startswith("output of the compiled first call is further from a float64 run than eager")
    assert str(caught.value).endswith("; set check.reference: eager, or check.atol/check.rtol, if this is expected")
    broken = eager.clone()
    broken[0, 1] = float("nan")
    with pytest.raises(OutputMismatch, match=r"^output of the compiled first call holds 1 NaN"):
        judged(eager, broken, wide)


def test_at_load_the_line_names_the_call_and_the_fix_and_keeps_the_difference():
    eager, wide = run(X1), run(X1, wide=True)
    bounds = Gate().load_bounds(snapshot(eager), snapshot(wide))
    near = eager + 2e-7 * torch.randn(eager.shape, generator=torch.Generator().manual_seed(3))
    verdict = Gate().compare(snapshot(eager), snapshot(near), call="graphed at load", bounds=bounds)
    assert verdict.max_abs_error == pytest.approx(float((near - eager).abs().max()))
    distance = float((near.double() - eager.double()).square().mean().sqrt())
    assert verdict.tolerance_used == pytest.approx(distance / bounds["output"])
    # exactly at the bound passes; the bound is the largest distance allowed
    Gate().compare(snapshot(eager), snapshot(near), call="graphed at load", bounds={"output": distance})
    off = eager.clone()
    off[1, 1] += 0.25
    with pytest.raises(OutputMismatch) as caught:
        Gate().compare(snapshot(eager), snapshot(off), call="graphed at load", bounds=bounds)
    assert caught.value.max_abs_error == pytest.approx(0.25, rel=1e-5)
    line = str(caught.value)
    assert line.startswith("output of the graphed at load is further from eager than warmup's float64 check allows")
    assert line.endswith(
        "; warm this platform again (orchestrate warmup), or set check.reference: eager if this is expected"
    )
    broken = eager.clone()
    broken[0, 1] = float("nan")
    with pytest.raises(OutputMismatch, match=r"^output of the graphed at load holds 1 NaN"):
        Gate().compare(snapshot(eager), snapshot(broken), call="graphed at load", bounds=bounds)


def test_bounds_name_every_floating_leaf_float64_judges_and_nothing_else():
    eager, wide = run(X1), run(X1, wide=True)
    labels = eager.argmax(-1)
    bounds = Gate().load_bounds(snapshot((eager, labels, 2 * eager)), snapshot((wide, labels, 2 * wide)))
    assert set(bounds) == {"output[0]", "output[2]"}
    assert bounds["output[2]"] == pytest.approx(2 * bounds["output[0]"])


def test_an_empty_output_has_no_error():
    empty = torch.zeros(0, 4)
    verdict = judged(empty, empty.clone(), empty.double())
    assert verdict.reference == "float64" and verdict.max_abs_error == 0.0
    assert verdict.float64_eager_error == 0.0 == verdict.float64_error
    bounds = Gate().load_bounds(snapshot(empty), snapshot(empty.double()))
    assert Gate().compare(snapshot(empty), snapshot(empty), call="c", bounds=bounds).max_abs_error == 0.0


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_complex_outputs_floor_is_its_parts_units_in_the_last_place(dtype):
    part = torch.float32 if dtype == torch.complex64 else torch.float64
    eps = torch.finfo(part).eps
    exact = torch.polar(torch.ones(256, dtype=torch.float64), torch.linspace(0, 6, 256, dtype=torch.float64))
    eager = exact.to(dtype)
    judged(eager, eager * (1 + 2 * eps), exact)  # within 4 units of the part's last place
    with pytest.raises(OutputMismatch, match="further from a float64 run"):
        judged(eager, eager * (1 + 64 * eps), exact)


def test_a_float64_run_with_inf_where_eager_is_finite_cannot_judge():
    eager, wide = run(X1), run(X1, wide=True)
    wide[0, 0] = float("inf")
    refused(eager, eager + 0.5, "exceeds atol=0.001")  # against eager, as without a float64 run
    with pytest.raises(OutputMismatch, match="exceeds atol=0.001"):
        judged(eager, eager + 0.5, wide)


def test_a_list_is_walked_in_its_own_order():
    paths = [leaf.path for leaf in snapshot([torch.zeros(1)] * 12)]
    assert paths == ["output"] + [f"output[{i}]" for i in range(12)]
