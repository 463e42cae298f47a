"""Padding requests to buckets and cutting outputs back (orchestrator.jobs.padding), on CPU tensors
against small eager models: no compile, no Ray.

The rule every round trip holds: for a model whose rows along the bucket dimension do not
interact, pad -> run -> unpad (and split -> run -> concat) gives the model's own output on the
unpadded request, in the same output types."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.model import make_inputs
from orchestrator.jobs.padding import BadRequest, RequestShaper, output_bucket_dims, same_device
from orchestrator.jobs.spec import InputSpec, WarmupSpec

CPU = torch.device("cpu")
HAS_PAD_FIELD = "pad" in InputSpec.model_fields


def spec_of(inputs: list[dict[str, Any]], buckets=(1, 8, 32), symbol: str = "batch") -> WarmupSpec:
    inputs = [dict(item) for item in inputs]
    pads = {} if HAS_PAD_FIELD else {i: item.pop("pad") for i, item in enumerate(inputs) if "pad" in item}
    spec = WarmupSpec.model_validate(
        {"model": {"factory": "m:f"}, "inputs": inputs, "buckets": list(buckets), "bucket_symbol": symbol}
    )
    for i, pad in pads.items():  # an InputSpec without the field: hold the value where the field would
        object.__setattr__(spec.inputs[i], "pad", pad)
    return spec


def assert_same_output(expected: Any, got: Any) -> None:
    """Same tree (container types, sizes, keys), same shapes and dtypes, values within 1e-6."""
    assert type(got) is type(expected)
    Gate(atol=1e-6, rtol=1e-6).compare(snapshot(expected), snapshot(got), call="padded call")


def serve(model: nn.Module, shaper: RequestShaper, dims, args, kwargs) -> Any:
    """What a replica does with one request: pad to its bucket, or split it, and cut back."""

    def run(run_args, run_kwargs):
        n = shaper.size(run_args, run_kwargs)
        padded_args, padded_kwargs = shaper.pad(run_args, run_kwargs, shaper.bucket_for(n))
        return shaper.unpad(model(*padded_args, **padded_kwargs), n, dims)

    if shaper.size(args, kwargs) <= shaper.buckets[-1]:
        return run(args, kwargs)
    return shaper.concat([run(*chunk) for chunk in shaper.chunks(args, kwargs)], dims)


def dims_at_buckets(model: nn.Module, spec: WarmupSpec, shaper: RequestShaper, buckets=None):
    """output_bucket_dims from the model's eager outputs on the config's inputs, as at load."""
    outputs = {}
    for bucket in buckets or shaper.buckets:
        args, kwargs = make_inputs(spec, bucket, CPU)
        outputs[bucket] = model(*args, **kwargs)
    return output_bucket_dims(outputs, shaper.input_dim)


# -- models ---------------------------------------------------------------------------------------


class Rows(nn.Module):
    """Row-independent: each row of x maps to its own row of every bucketed output."""

    def __init__(self, structure: str = "tensor") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)
        self.structure = structure

    def forward(self, x: torch.Tensor) -> Any:
        y = self.linear(x)
        return STRUCTURES[self.structure](y, y.t().contiguous() * 2, self.linear.bias.detach() * 3)


Pair = namedtuple("Pair", ["rows", "columns"])


@dataclass
class ModelOutput(OrderedDict):
    """Behaves as HF's ModelOutput does: a dataclass whose fields that are not None are its keys."""

    logits: Optional[torch.Tensor] = None
    loss: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None
    attentions: Optional[tuple[torch.Tensor, ...]] = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@dataclass(frozen=True)
class Plain:
    rows: torch.Tensor
    constant: torch.Tensor
    label: str
    doubled: torch.Tensor = field(init=False)  # computed by __post_init__
    extra: Optional[torch.Tensor] = field(init=False, default=None)  # set by the model afterwards

    def __post_init__(self) -> None:
        object.__setattr__(self, "doubled", self.rows * 2)


def plain(rows: torch.Tensor, constant: torch.Tensor) -> Plain:
    out = Plain(rows, constant, "label")
    object.__setattr__(out, "extra", rows + 5)
    return out


class Box:
    """A user's own pytree node."""

    def __init__(self, inner: torch.Tensor, tag: str) -> None:
        self.inner, self.tag = inner, tag


pytree.register_pytree_node(Box, lambda b: ([b.inner], b.tag), lambda children, tag: Box(children[0], tag))


class MyDict(dict):
    pass


STRUCTURES = {
    "tensor": lambda rows, columns, constant: rows,
    "tuple": lambda rows, columns, constant: (rows, columns, constant),
    "list": lambda rows, columns, constant: [rows, constant, 7, "text", None],
    "namedtuple": lambda rows, columns, constant: Pair(rows, columns),
    "dict": lambda rows, columns, constant: {"rows": rows, "columns": columns, 0: constant, "count": 2.5},
    "dict subclass": lambda rows, columns, constant: MyDict(rows=rows, columns=columns),
    "OrderedDict": lambda rows, columns, constant: OrderedDict(columns=columns, rows=rows),
    "defaultdict": lambda rows, columns, constant: defaultdict(list, rows=rows, constant=constant),
    "ModelOutput": lambda rows, columns, constant: ModelOutput(
        logits=rows, loss=constant.sum(), hidden_states=(rows, rows + 1)
    ),
    "dataclass": lambda rows, columns, constant: plain(rows, constant),
    "pytree node": lambda rows, columns, constant: Box(rows, "tag"),
    "nested": lambda rows, columns, constant: {
        "pair": Pair(rows, [columns, (constant, rows)]),
        "out": ModelOutput(logits=rows, attentions=(columns,)),
    },
}


# -- batch buckets --------------------------------------------------------------------------------


BATCH = [{"shape": ["batch", 4]}]


@pytest.mark.parametrize("n, bucket", [(1, 1), (2, 8), (5, 8), (8, 8), (9, 32), (31, 32), (32, 32)])
def test_batch_request_is_padded_to_its_bucket_and_cut_back(n, bucket):
    spec = spec_of(BATCH)
    shaper = RequestShaper(spec, spec.buckets, CPU)
    model = Rows("tuple")
    dims = dims_at_buckets(model, spec, shaper)
    x = torch.randn(n, 4)
    before = x.clone()

    assert shaper.size((x,), {}) == n
    assert shaper.bucket_for(n) == bucket
    (padded,), kwargs = shaper.pad((x,), {}, bucket)
    assert kwargs == {}
    assert padded.shape == (bucket, 4)
    assert torch.equal(padded[:n], x)
    assert torch.equal(padded[n:], torch.zeros(bucket - n, 4))
    assert torch.equal(x, before)  # the request's own tensor is not written

    outputs = shaper.unpad(model(padded), n, dims)
    assert_same_output(model(x), outputs)
    assert outputs[0].shape == (n, 3) and outputs[1].shape == (3, n) and outputs[2].shape == (3,)


def test_an_input_already_of_the_bucket_size_is_passed_as_it_is():
    spec = spec_of([{"shape": ["batch", 4]}, {"shape": [4]}, {"shape": ["batch"], "name": "w"}])
    shaper = RequestShaper(spec, spec.buckets, CPU)
    x, fixed, w = torch.randn(8, 4), torch.randn(4), torch.randn(8)
    (padded_x, padded_fixed), padded_kwargs = shaper.pad((x, fixed), {"w": w}, 8)
    assert padded_x is x and padded_fixed is fixed and padded_kwargs["w"] is w
    # an input without the bucket dimension is never padded, whatever the bucket
    (_, padded_fixed), _ = shaper.pad((torch.randn(3, 4), fixed), {"w": torch.randn(3)}, 8)
    assert padded_fixed is fixed


def test_bucket_for_is_the_smallest_bucket_that_holds_the_request():
    shaper = RequestShaper(spec_of(BATCH), [32, 1, 8], CPU)
    assert shaper.buckets == [1, 8, 32]
    assert [shaper.bucket_for(n) for n in (1, 2, 7, 8, 9, 32, 33, 1000)] == [1, 8, 8, 8, 32, 32, 32, 32]


def test_padding_beyond_the_bucket_is_refused():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    with pytest.raises(ValueError, match=r"inputs\[0\] has 9 at dim 0, more than the bucket 8"):
        shaper.pad((torch.randn(9, 4),), {}, 8)


# -- every output structure -----------------------------------------------------------------------


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_every_output_structure_round_trips_in_its_own_types(structure):
    spec = spec_of(BATCH)
    shaper = RequestShaper(spec, spec.buckets, CPU)
    model = Rows(structure)
    dims = dims_at_buckets(model, spec, shaper)
    x = torch.randn(5, 4)
    (padded,), _ = shaper.pad((x,), {}, shaper.bucket_for(5))

    got = shaper.unpad(model(padded), 5, dims)
    expected = model(x)
    assert_same_output(expected, got)
    # what the gate's walk does not see: the rebuilt objects' own behaviour
    if structure == "ModelOutput":
        assert list(got.keys()) == ["logits", "loss", "hidden_states"]  # None fields stay out of the keys
        assert got.logits is got["logits"] and got.attentions is None
    if structure == "dataclass":
        assert torch.equal(got.doubled, expected.doubled) and got.label == "label"
        assert got.extra is not None and torch.equal(got.extra, expected.extra)
    if structure == "pytree node":
        assert got.tag == "tag" and torch.equal(got.inner, expected.inner)
    if structure == "defaultdict":
        assert got.default_factory is list and got["absent"] == []
    if structure == "dict":
        assert list(got) == ["rows", "columns", 0, "count"] and got["count"] == 2.5


def test_cut_outputs_are_views_of_the_padded_outputs():
    """The runtime copies out of CUDA-graph buffers itself; cutting adds no copy of its own."""
    spec = spec_of(BATCH)
    shaper = RequestShaper(spec, spec.buckets, CPU)
    padded_out = (torch.randn(8, 3), torch.randn(3, 8), torch.randn(3))
    dims = {"output[0]": (0,), "output[1]": (1,), "output[2]": ()}
    rows, columns, pooled = shaper.unpad(padded_out, 5, dims)
    assert pooled is padded_out[2]  # no bucket dimension: returned as it is
    assert rows.data_ptr() == padded_out[0].data_ptr() and rows.shape == (5, 3)
    assert columns.data_ptr() == padded_out[1].data_ptr() and columns.shape == (3, 5)


def test_an_output_of_another_structure_than_at_load_is_refused_by_name():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    with pytest.raises(ValueError, match=r"output\.extra is not among the output tensors"):
        shaper.unpad({"rows": torch.randn(8, 3), "extra": torch.randn(8)}, 5, {"output.rows": (0,)})


# -- sequence buckets: the bucket dimension is not dim 0 -----------------------------------------


class Tokens(nn.Module):
    """Position-independent token model: each position's outputs depend on its own token, and a
    pair's score on the two tokens and its own bias entry."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(100, 6)
        self.proj = nn.Linear(6, 5)

    def forward(self, ids: torch.Tensor, bias: torch.Tensor, keep: torch.Tensor) -> ModelOutput:
        hidden = self.embed(ids)  # [2, seq, 6]
        logits = self.proj(hidden) * keep[:, :, None]  # [2, seq, 5]
        scores = hidden @ hidden.transpose(1, 2) + bias  # [2, seq, seq]
        return ModelOutput(
            logits=logits,
            loss=logits.new_tensor(1.5),
            hidden_states=(hidden.transpose(1, 2),),  # [2, 6, seq]
            attentions=(scores,),
        )


SEQUENCE = [
    {"shape": [2, "seq"], "dtype": "int64", "range": [0, 99], "pad": 99},
    {"shape": ["seq", "seq"], "name": "bias", "pad": -0.5},
    {"shape": [2, "seq"], "dtype": "bool", "name": "keep", "pad": 1},
]


def test_sequence_buckets_pad_dim_1_and_cut_outputs_at_dims_1_and_2():
    spec = spec_of(SEQUENCE, buckets=[4, 16], symbol="seq")
    shaper = RequestShaper(spec, spec.buckets, CPU)
    assert shaper.input_dim == 1
    model = Tokens()
    dims = dims_at_buckets(model, spec, shaper)
    assert dims == {
        "output.logits": (1,),
        "output.loss": (),
        "output.hidden_states[0]": (2,),
        "output.attentions[0]": (1, 2),  # an attention map is cut along both of its seq dims
    }

    ids = torch.randint(0, 99, (2, 5))
    bias = torch.randn(5, 5)
    keep = torch.rand(2, 5) > 0.5
    originals = ids.clone(), bias.clone(), keep.clone()
    assert shaper.size((ids,), {"bias": bias, "keep": keep}) == 5
    (padded_ids,), padded = shaper.pad((ids,), {"bias": bias, "keep": keep}, shaper.bucket_for(5))

    assert padded_ids.shape == (2, 16) and padded_ids.dtype == torch.int64
    assert torch.equal(padded_ids[:, :5], ids) and bool((padded_ids[:, 5:] == 99).all())
    assert padded["bias"].shape == (16, 16)
    assert torch.equal(padded["bias"][:5, :5], bias)
    assert bool((padded["bias"][5:, :] == -0.5).all()) and bool((padded["bias"][:, 5:] == -0.5).all())
    assert padded["keep"].dtype == torch.bool and padded["keep"].shape == (2, 16)
    assert torch.equal(padded["keep"][:, :5], keep) and bool(padded["keep"][:, 5:].all())
    for original, now in zip(originals, (ids, bias, keep), strict=True):
        assert torch.equal(original, now)

    got = shaper.unpad(model(padded_ids, **padded), 5, dims)
    assert_same_output(model(ids, bias=bias, keep=keep), got)
    assert got.attentions[0].shape == (2, 5, 5) and got.hidden_states[0].shape == (2, 6, 5)


def test_integer_and_bool_inputs_take_their_pad_value_in_their_dtype():
    spec = spec_of(
        [
            {"shape": ["batch"], "dtype": "int32", "range": [0, 10], "pad": 7},
            {"shape": ["batch", 2], "dtype": "uint8", "range": [0, 10], "name": "small", "pad": 3},
            {"shape": ["batch"], "dtype": "bool", "name": "flag"},
            {"shape": ["batch"], "dtype": "bool", "name": "on", "pad": 1},
            {"shape": ["batch"], "dtype": "bfloat16", "name": "half", "pad": 0.25},
        ]
    )
    shaper = RequestShaper(spec, spec.buckets, CPU)
    ids = torch.tensor([1, 2, 3], dtype=torch.int32)
    kwargs = {
        "small": torch.ones(3, 2, dtype=torch.uint8),
        "flag": torch.ones(3, dtype=torch.bool),
        "on": torch.zeros(3, dtype=torch.bool),
        "half": torch.ones(3, dtype=torch.bfloat16),
    }
    (padded_ids,), padded = shaper.pad((ids,), kwargs, shaper.bucket_for(shaper.size((ids,), kwargs)))
    assert padded_ids.dtype == torch.int32 and padded_ids.tolist() == [1, 2, 3] + [7] * 5
    assert padded["small"].dtype == torch.uint8 and padded["small"].tolist() == [[1, 1]] * 3 + [[3, 3]] * 5
    assert padded["flag"].tolist() == [True] * 3 + [False] * 5
    assert padded["on"].tolist() == [False] * 3 + [True] * 5
    assert padded["half"].dtype == torch.bfloat16 and padded["half"].tolist() == [1.0] * 3 + [0.25] * 5


# -- requests larger than the largest bucket ------------------------------------------------------


class Mixed(nn.Module):
    """A batch model with a keyword input and an input without the bucket dimension."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        rows = self.linear(x) * scale * mask[:, None]
        return {"rows": rows, "columns": rows.t(), "norm": scale.norm(), "name": "mixed"}


MIXED = [
    {"shape": ["batch", 4]},
    {"shape": [3], "name": "scale"},
    {"shape": ["batch"], "dtype": "bool", "name": "mask"},
]


def test_an_oversize_request_runs_in_chunks_of_the_largest_bucket_and_joins_back():
    spec = spec_of(MIXED, buckets=[2, 8])
    shaper = RequestShaper(spec, spec.buckets, CPU)
    model = Mixed()
    dims = dims_at_buckets(model, spec, shaper)
    assert dims == {"output.rows": (0,), "output.columns": (1,), "output.norm": ()}
    x, scale, mask = torch.randn(19, 4), torch.randn(3), torch.rand(19) > 0.3

    assert shaper.size((x,), {"scale": scale, "mask": mask}) == 19
    chunks = shaper.chunks((x,), {"scale": scale, "mask": mask})
    assert [chunk_args[0].shape[0] for chunk_args, _ in chunks] == [8, 8, 3]
    assert [int(kwargs["mask"].shape[0]) for _, kwargs in chunks] == [8, 8, 3]
    assert torch.equal(torch.cat([args[0] for args, _ in chunks]), x)
    assert all(kwargs["scale"] is scale for _, kwargs in chunks)  # no bucket dim: whole in every chunk
    assert chunks[1][0][0].data_ptr() == x[8].data_ptr()  # slices are views, not copies

    got = serve(model, shaper, dims, (x,), {"scale": scale, "mask": mask})
    assert_same_output(model(x, scale=scale, mask=mask), got)
    assert got["rows"].shape == (19, 3) and got["columns"].shape == (3, 19)


def test_a_request_within_the_largest_bucket_is_one_chunk():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    x = torch.randn(6, 4)
    [(args, kwargs)] = shaper.chunks((x,), {})
    assert args[0].shape == (6, 4) and torch.equal(args[0], x) and kwargs == {}


def test_chunks_of_an_input_with_two_bucket_dims_are_its_diagonal_blocks():
    spec = spec_of(SEQUENCE, buckets=[4], symbol="seq")
    shaper = RequestShaper(spec, spec.buckets, CPU)
    bias = torch.arange(36.0).reshape(6, 6)
    chunks = shaper.chunks((torch.zeros(2, 6, dtype=torch.int64),), {"bias": bias, "keep": torch.ones(2, 6).bool()})
    assert [kwargs["bias"].tolist() for _, kwargs in chunks] == [bias[:4, :4].tolist(), bias[4:, 4:].tolist()]


def test_chunks_of_an_output_with_two_bucket_dims_are_not_joined():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    parts = [{"map": torch.randn(8, 8)}, {"map": torch.randn(2, 2)}]
    with pytest.raises(ValueError, match=r"output\.map has the bucket in dims 0, 1; chunks of it cannot be joined"):
        shaper.concat(parts, {"output.map": (0, 1)})


def test_concat_takes_leaves_without_a_bucket_dim_from_the_first_chunk():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    first, second = torch.randn(8, 3), torch.randn(2, 3)
    parts = [(first, torch.tensor(1.0), "a"), (second, torch.tensor(2.0), "b")]
    rows, loss, tag = shaper.concat(parts, {"output[0]": (0,), "output[1]": ()})
    assert torch.equal(rows, torch.cat([first, second])) and float(loss) == 1.0 and tag == "a"
    assert shaper.concat(parts[:1], {}) is parts[0]
    with pytest.raises(ValueError, match="at least one chunk"):
        shaper.concat([], {})


def test_oversize_error_refuses_a_request_larger_than_the_largest_bucket():
    spec = spec_of(BATCH)
    refusing = RequestShaper(spec, spec.buckets, CPU, oversize="error")
    assert refusing.size((torch.randn(32, 4),), {}) == 32
    with pytest.raises(BadRequest) as caught:
        refusing.size((torch.randn(40, 4),), {})
    assert str(caught.value) == (
        "request of 40 is larger than the largest bucket 32; serve.oversize: split would run it in chunks"
    )
    assert RequestShaper(spec, spec.buckets, CPU, oversize="split").size((torch.randn(40, 4),), {}) == 40


def test_the_shaper_refuses_a_bad_oversize_or_bucket_list():
    with pytest.raises(ValueError, match="oversize 'pad' is not one of split, error"):
        RequestShaper(spec_of(BATCH), [8], CPU, oversize="pad")
    with pytest.raises(ValueError, match="must be one or more positive sizes"):
        RequestShaper(spec_of(BATCH), [], CPU)
    with pytest.raises(ValueError, match="must be one or more positive sizes"):
        RequestShaper(spec_of(BATCH), [0, 8], CPU)


# -- bad requests ---------------------------------------------------------------------------------


BAD_SPEC = [
    {"shape": [2], "name": "offset"},
    {"shape": ["batch", 4]},
    {"shape": ["batch"], "dtype": "bool", "name": "mask"},
]
X, MASK, OFFSET = torch.randn(3, 4), torch.ones(3, dtype=torch.bool), torch.randn(2)
GOOD = {"offset": OFFSET, "mask": MASK}


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        pytest.param(
            (X, X), GOOD, r"^expected 1 positional inputs \(inputs\[1\] \(positional argument 0\)\), got 2$", id="count"
        ),
        pytest.param((), GOOD, r"^expected 1 positional inputs .*, got 0$", id="no positional"),
        pytest.param((X,), {"offset": OFFSET}, r"^missing keyword input mask \(inputs\[2\]\)$", id="missing"),
        pytest.param(
            (X,),
            {**GOOD, "masks": MASK},
            r"^unknown keyword input 'masks'; the config names offset, mask$",
            id="unknown",
        ),
        pytest.param(
            (X.tolist(),), GOOD, r"^inputs\[1\] \(positional argument 0\) is a list, not a tensor$", id="not a tensor"
        ),
        pytest.param((X,), {**GOOD, "mask": None}, r"^mask \(inputs\[2\]\) is a NoneType, not a tensor$", id="None"),
        pytest.param((X.double(),), GOOD, r"^inputs\[1\] .* is float64, expected float32$", id="dtype"),
        pytest.param(
            (X,), {**GOOD, "mask": MASK.long()}, r"^mask \(inputs\[2\]\) is int64, expected bool$", id="kw dtype"
        ),
        pytest.param(
            (X[None],), GOOD, r"^inputs\[1\] .* has 3 dimensions \(1, 3, 4\), expected 2: \[batch, 4\]$", id="rank"
        ),
        pytest.param(
            (torch.randn(3, 5),),
            GOOD,
            r"^inputs\[1\] .* has size 5 at dim 1, expected 4: \[batch, 4\]$",
            id="fixed dim",
        ),
        pytest.param(
            (X,),
            {**GOOD, "offset": torch.randn(3)},
            r"^offset \(inputs\[0\]\) has size 3 at dim 0, expected 2: \[2\]$",
            id="fixed input",
        ),
        pytest.param((X.to("meta"),), GOOD, r"^inputs\[1\] .* is on meta, expected cpu$", id="device"),
        pytest.param(
            (torch.randn(0, 4),),
            {**GOOD, "mask": MASK[:0]},
            r"^inputs\[1\] .* has size 0 at dim 0 \(batch\); a request needs at least 1$",
            id="empty",
        ),
        pytest.param(
            (X,),
            {**GOOD, "mask": torch.ones(4, dtype=torch.bool)},
            r"^mask \(inputs\[2\]\) has 4 at dim 0 \(batch\) where inputs\[1\] .* has 3; every input must have the same batch$",
            id="disagree",
        ),
    ],
)
def test_a_bad_request_is_refused_in_one_line_naming_the_input(args, kwargs, message):
    spec = spec_of(BAD_SPEC)
    shaper = RequestShaper(spec, spec.buckets, CPU)
    with pytest.raises(BadRequest, match=message) as caught:
        shaper.size(args, kwargs)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
    assert shaper.size((X,), GOOD) == 3  # the shaper holds no state a bad request could spoil


def test_disagreeing_bucket_dims_within_one_input_are_refused():
    spec = spec_of(SEQUENCE, buckets=[4, 16], symbol="seq")
    shaper = RequestShaper(spec, spec.buckets, CPU)
    ids, keep = torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(BadRequest, match=r"^bias \(inputs\[1\]\) has 6 at dim 1 \(seq\) where inputs\[0\] has 5"):
        shaper.size((ids,), {"bias": torch.randn(5, 6), "keep": keep})


def test_chunks_check_the_request_too():
    shaper = RequestShaper(spec_of(BATCH), [1, 8], CPU)
    with pytest.raises(BadRequest, match=r"inputs\[0\] is int64, expected float32"):
        shaper.chunks((torch.zeros(20, 4, dtype=torch.int64),), {})


def test_devices_are_compared_by_type_and_index(monkeypatch):
    cuda, cuda0, cuda1 = torch.device("cuda"), torch.device("cuda", 0), torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert same_device(cuda0, cuda) and same_device(cuda, cuda0)
    assert not same_device(cuda1, cuda) and not same_device(cuda0, cuda1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device(cuda1, cuda) and not same_device(cuda0, cuda)
    assert same_device(torch.device("cpu"), torch.device("cpu", 0))
    assert not same_device(torch.device("cpu"), cuda0) and not same_device(torch.device("meta"), torch.device("cpu"))


# -- output_bucket_dims ---------------------------------------------------------------------------


def outputs_at(bucket: int) -> dict[str, Any]:
    return {
        "rows": torch.zeros(bucket, 3),
        "columns": torch.zeros(3, bucket),
        "attention": torch.zeros(2, bucket, bucket),
        "loss": torch.zeros(()),
        "pooled": torch.zeros(3),
        "steps": 4,
    }


def test_output_bucket_dims_with_several_buckets():
    dims = output_bucket_dims({bucket: outputs_at(bucket) for bucket in (1, 3, 8)}, 0)
    assert dims == {
        "output.rows": (0,),
        "output.columns": (1,),
        "output.attention": (1, 2),
        "output.loss": (),
        "output.pooled": (),
    }


def test_several_buckets_tell_a_bucket_dim_from_a_dim_as_large_by_chance():
    # at bucket 3 both dims are 3; bucket 8 shows which one follows the bucket
    outputs = {3: (torch.zeros(3, 3),), 8: (torch.zeros(8, 3),)}
    assert output_bucket_dims(outputs, 1) == {"output[0]": (0,)}


def test_output_bucket_dims_with_one_bucket_prefers_the_inputs_bucket_dim():
    outputs = {8: {"square": torch.zeros(8, 8), "wide": torch.zeros(2, 8), "map": torch.zeros(2, 4, 8, 8)}}
    outputs[8]["pooled"] = torch.zeros(5)
    assert output_bucket_dims(outputs, 0) == {
        "output.square": (0,),
        "output.wide": (1,),
        "output.map": (2, 3),
        "output.pooled": (),
    }
    assert output_bucket_dims(outputs, 1)["output.square"] == (1,)


def test_output_bucket_dims_refuses_outputs_that_cannot_be_cut_back():
    squeezed = {1: {"logits": torch.zeros(10)}, 8: {"logits": torch.zeros(8, 10)}}  # .squeeze() at bucket 1
    with pytest.raises(
        ValueError, match=r"output\.logits changes rank with the bucket \(\(10,\) at 1, \(8, 10\) at 8\)"
    ):
        output_bucket_dims(squeezed, 0)
    flattened = {2: (torch.zeros(4),), 8: (torch.zeros(16),)}  # [2 * batch]
    with pytest.raises(ValueError, match=r"output\[0\] changes shape with the bucket .* its dim 0 is not the bucket's"):
        output_bucket_dims(flattened, 0)
    shifted = {2: (torch.zeros(2, 1),), 8: (torch.zeros(8, 7),)}  # [batch, seq - 1] with a seq bucket
    with pytest.raises(ValueError, match=r"output\[0\] .* its dim 1 is not the bucket's size"):
        output_bucket_dims(shifted, 0)


def test_output_bucket_dims_refuses_outputs_whose_tensors_differ_between_buckets():
    with pytest.raises(
        ValueError, match=r"the output at bucket 8 has a tensor output\.extra that the output at bucket 1"
    ):
        output_bucket_dims({1: {"a": torch.zeros(1)}, 8: {"a": torch.zeros(8), "extra": torch.zeros(8)}}, 0)
    with pytest.raises(ValueError, match="at one bucket at least"):
        output_bucket_dims({}, 0)


def test_a_request_of_a_buckets_exact_shapes_is_recognised_and_anything_else_is_left_to_size():
    shaper = RequestShaper(
        spec_of([{"shape": ["batch", 4]}, {"shape": ["batch"], "dtype": "int64", "range": [0, 9], "name": "ids"}]),
        [1, 8],
        CPU,
    )
    ids = {"ids": torch.zeros(8, dtype=torch.int64)}
    assert shaper.exact_bucket((torch.zeros(8, 4),), ids) == 8
    assert shaper.exact_bucket((torch.zeros(1, 4),), {"ids": torch.zeros(1, dtype=torch.int64)}) == 1
    for args, kwargs in [
        ((torch.zeros(5, 4),), {"ids": torch.zeros(5, dtype=torch.int64)}),  # between buckets: padded
        ((torch.zeros(8, 4, dtype=torch.float64),), ids),  # wrong dtype
        ((torch.zeros(8, 4, device="meta"),), ids),  # another device
        ((torch.zeros(8, 5),), ids),  # a fixed dimension off
        ((torch.zeros(8, 4),), {}),  # a keyword missing
        (([[0.0] * 4] * 8,), ids),  # not a tensor
        ((torch.zeros(8, 4), torch.zeros(8)), {}),  # the keyword input passed by position
    ]:
        assert shaper.exact_bucket(args, kwargs) is None
        if args[0].__class__ is torch.Tensor and args[0].shape[0] == 5:
            assert shaper.size(args, kwargs) == 5
        else:
            with pytest.raises(BadRequest):
                shaper.size(args, kwargs)
