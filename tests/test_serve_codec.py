"""orchestrate serve's request handling without Ray: JSON to checked tensors, requests joined into
one call and the call's outputs cut back per request (orchestrator.serving.codec), and the replica
answering a batch whose joined call fails (orchestrator.serving.server.ModelServer, its class run directly)."""

from __future__ import annotations

import io
import json
import textwrap
import threading
import time
import zipfile
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.jobs.spec import WarmupSpec
from orchestrator.serving.codec import JSON, NPZ, OutputError, RequestCodec, RequestError, TooManyRows, to_json

Pair = namedtuple("Pair", "left right")


def make_spec(inputs: list[dict], **extra) -> WarmupSpec:
    return WarmupSpec.model_validate(
        {"model": {"factory": "models.py:mlp"}, "inputs": inputs, "buckets": [1, 8], **extra}
    )


FEATURES = {"shape": ["batch", 4], "dtype": "float32"}
IDS = {"shape": ["batch"], "dtype": "int64", "range": [0, 10], "name": "ids"}


@pytest.fixture
def codec() -> RequestCodec:
    return RequestCodec(make_spec([FEATURES, IDS]), "cpu")


def body(*inputs) -> str:
    return json.dumps({"inputs": list(inputs)})


def rows(n: int, start: float = 0.0) -> list[list[float]]:
    return [[start + i + j / 4 for j in range(4)] for i in range(n)]


def test_a_request_becomes_the_models_arguments(codec):
    request = codec.decode(body(rows(3), [1, 2, 3]))
    assert request.size == 3
    (features,) = request.args
    assert features.dtype == torch.float32 and features.shape == (3, 4)
    assert torch.equal(features, torch.tensor(rows(3)))
    assert request.kwargs["ids"].dtype == torch.int64 and request.kwargs["ids"].tolist() == [1, 2, 3]


def test_named_inputs_may_be_given_by_name():
    named = RequestCodec(make_spec([{**FEATURES, "name": "x"}, IDS]), "cpu")
    request = named.decode(json.dumps({"inputs": {"ids": [4], "x": rows(1)}}))
    assert request.args == () and set(request.kwargs) == {"x", "ids"} and request.size == 1


def test_whole_floats_are_accepted_for_integer_inputs_exactly():
    spec = make_spec([FEATURES, {**IDS, "range": [0, 2**40]}])
    request = RequestCodec(spec, "cpu").decode(body(rows(2), [2.0**25 + 1, 3]))
    assert request.kwargs["ids"].tolist() == [2**25 + 1, 3]


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{", "the body is not valid JSON"),
        ("[1]", "the body is a JSON array"),
        ('{"input": []}', 'the body has no "inputs"'),
        (json.dumps({"inputs": [rows(1), [1]], "extra": 1}), "unknown key 'extra'"),
        (body(rows(1)), '"inputs" has 1 arrays, the model takes 2: inputs[0], inputs[1] (ids)'),
        (json.dumps({"inputs": {"ids": [1]}}), "inputs[0] has no name in the config"),
        (body([[1.0, 2.0, 3.0]], [1]), "inputs[0] has size 3 at dim 1, expected 4: [batch, 4]"),
        (body([1.0, 2.0, 3.0, 4.0], [1]), "inputs[0] has 1 dimensions [4], expected 2: [batch, 4]"),
        (body([[1.0, "a", 3.0, 4.0]], [1]), 'inputs[0][0][1] is "a", not a number'),
        (body([[1.0, None, 3.0, 4.0]], [1]), "inputs[0][0][1] is null, not a number"),
        (body([[1.0, 2.0, 3.0, 4.0], [1.0]], [1, 2]), "inputs[0] is not a rectangular array of numbers"),
        ('{"inputs": [[[NaN, 1, 2, 3]], [1]]}', "NaN is not a JSON number"),
        (body([], []), "inputs[0] has 1 dimensions [0], expected 2"),
        (body([[1e39, 0, 0, 0]], [1]), "inputs[0] holds values too large for float32"),
        (body(rows(2), [1]), "inputs[1] (ids) has 1 at dim 0 (batch) where inputs[0] has 2"),
        (body(rows(1), [1.5]), "inputs[1] (ids) holds numbers with a fraction; it is int64"),
        (body(rows(1), [True]), "inputs[1] (ids) holds true/false; it is int64"),
        (body(rows(2), [3, 10]), "inputs[1] (ids) holds 10, outside its range [0, 10)"),
        (body(rows(1), [-1]), "inputs[1] (ids) holds -1, outside its range [0, 10)"),
    ],
)
def test_a_bad_request_is_one_line_naming_what_to_fix(codec, raw, message):
    with pytest.raises(RequestError) as caught:
        codec.decode(raw)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_oversize_error_refuses_what_the_model_would_refuse():
    spec = make_spec([FEATURES], serve={"oversize": "error"})
    codec = RequestCodec(spec, "cpu")
    with pytest.raises(RequestError, match="larger than the largest bucket 8"):
        codec.decode(body(rows(9)))
    assert codec.decode(body(rows(8))).size == 8


def test_joined_requests_answer_as_each_alone(codec):
    """One call for three requests, cut back: each request's answer is what a call of its own gives."""

    def model(x, ids):
        return {
            "scaled": x * 2,
            "pair": Pair(x.sum(dim=1), ids + 1),
            "seq": [x[:, :2], x.t()],  # x.t(): the batch in dim 1
            "total": x.sum(),  # no batch dimension: every request gets the call's value
            "label": "mlp",
        }

    requests = [codec.decode(body(rows(n, 10.0 * n), list(range(n)))) for n in (1, 5, 2)]
    assert codec.groups(requests) == [[0, 1, 2]]
    args, kwargs = codec.join(requests)
    assert args[0].shape == (8, 4) and kwargs["ids"].shape == (8,)
    answers = [json.loads(a.body)["outputs"] for a in codec.split(model(*args, **kwargs), requests)]
    for request, answer in zip(requests, answers, strict=True):
        alone = to_json(model(*request.args, **request.kwargs))
        alone["total"] = answers[0]["total"]
        assert _close(answer, alone), (answer, alone)
    assert answers[1]["pair"]["right"] == [1, 2, 3, 4, 5]
    assert answers[2]["label"] == "mlp"


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == pytest.approx(b)


def test_an_output_square_in_the_batch_is_cut_along_the_inputs_bucket_dimension(codec):
    square = torch.arange(16.0).reshape(4, 4)  # two requests of 2: both dimensions have the call's size
    requests = [codec.decode(body(rows(2), [0, 1])) for _ in range(2)]
    first, second = (json.loads(a.body)["outputs"] for a in codec.split(square, requests))
    assert first == square[:2].tolist() and second == square[2:].tolist()


def test_groups_fit_the_largest_bucket_when_the_model_refuses_larger_calls():
    codec = RequestCodec(make_spec([FEATURES], serve={"oversize": "error"}), "cpu")
    requests = [codec.decode(body(rows(n))) for n in (3, 4, 2, 8, 1)]
    assert codec.groups(requests) == [[0, 1], [2], [3], [4]]


def test_inputs_without_one_bucket_dimension_run_each_request_alone():
    spec = make_spec([FEATURES, {"shape": [4], "dtype": "float32"}])
    codec = RequestCodec(spec, "cpu")
    assert not codec.joinable
    requests = [codec.decode(body(rows(1), [0, 0, 0, 0])) for _ in range(3)]
    assert codec.groups(requests) == [[0], [1], [2]]


@pytest.mark.parametrize(
    "outputs, message",
    [
        (torch.tensor([1.0, float("nan")]), "output holds NaN or Inf"),
        ({"a": [torch.tensor([1j])]}, "output.a[0] is a complex tensor"),
        ((1, object()), "output[1] is a object"),
        (float("inf"), "output is inf"),
    ],
)
def test_outputs_json_cannot_carry_are_refused(outputs, message):
    with pytest.raises(OutputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        to_json(outputs)


PICKY = """\
import torch
from torch import nn


class Picky(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        if (x > 1000).any():
            raise ValueError("a value above 1000\\nsecond line")
        if (x < -1000).any():
            return self.linear(x) * float("nan")
        return self.linear(x)


def picky():
    return Picky()
"""


def test_a_request_that_fails_the_joined_call_fails_alone(tmp_path: Path, monkeypatch):
    """The replica's own class, outside Ray, on a model that refuses some rows and answers NaN for
    others: the call joining four requests fails, each is then run alone, and only the ones at
    fault get an error."""
    from orchestrator.config import load_spec
    from orchestrator.serving.server import ModelServer

    (tmp_path / "picky.py").write_text(PICKY)
    (tmp_path / "picky.yaml").write_text(
        textwrap.dedent(
            """\
            model: {factory: picky.py:picky}
            inputs: [{shape: [batch, 4]}]
            device: cpu
            buckets: [1, 8]
            """
        )
    )
    spec = load_spec(tmp_path / "picky.yaml").replaced(cache_dir=str(tmp_path / "cache"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the constructor sets the replica's own
    server = ModelServer.func_or_class(spec, None, False, 8, 0.005)
    good, poison, nan = rows(2), [[1.0, 2.0, 3000.0, 4.0]], [[-3000.0, 0.0, 0.0, 0.0]]
    requests = [server.codec.decode(body(x)) for x in (good, poison, good, nan)]
    assert server.codec.groups(requests) == [[0, 1, 2, 3]]
    answers = server._answer_all(requests)
    assert [a.status for a in answers] == [200, 500, 200, 422]  # NaN: the JSON asked for cannot carry it
    assert {a.media_type for a in answers} == {JSON}
    bodies = [json.loads(a.body) for a in answers]
    assert bodies[1] == {"error": "the model failed on this request: ValueError: a value above 1000"}
    assert bodies[3] == {
        "error": "the model's output cannot be sent: output holds NaN or Inf, which JSON cannot carry; "
        "ask for application/x-npz, which does"
    }
    expected = to_json(server.model(torch.tensor(good)))
    assert bodies[0] == bodies[2] == {"outputs": expected}
    assert json.dumps(server.info())  # the load report as JSON: GET /info


def test_the_replica_trusts_serve_s_trust_keys_for_the_store_beside_the_cache(tmp_path: Path, monkeypatch):
    """`serve --trust KEY.pub` without --remote: the store beside the cache holds a namespace a
    warmup signed with a configured key (not the store's own). The key reaches the replica as it
    reaches `pull --trust`, which takes the store."""
    import torch
    from test_cache_protocol import KEY

    from orchestrator.cache import sync
    from orchestrator.cache.manifest import IntegrityError
    from orchestrator.cache.namespace import namespace
    from orchestrator.cache.store import open_store
    from orchestrator.config import load_spec
    from orchestrator.jobs import torch_internals as ti
    from orchestrator.serving.server import ModelServer

    (tmp_path / "picky.py").write_text(PICKY)
    (tmp_path / "picky.yaml").write_text(
        "model: {factory: picky.py:picky}\ninputs: [{shape: [batch, 4]}]\ndevice: cpu\n"
    )
    spec = load_spec(tmp_path / "picky.yaml").replaced(cache_dir=str(tmp_path / "cache"), buckets=[1])
    name = namespace(spec.label, ti.current_platform(torch.device("cpu")), spec.identity_hash())
    published = tmp_path / "published" / name
    (published / "inductor").mkdir(parents=True)
    (published / "inductor" / "entry").write_bytes(b"artifact")
    (tmp_path / "cache" / "store").mkdir(parents=True)
    sync.publish(open_store(f"file://{tmp_path / 'cache' / 'store'}"), published, name, KEY, allow_unsigned=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(IntegrityError, match="not trusted"):
        ModelServer.func_or_class(spec, None, False, 8, 0.005)
    server = ModelServer.func_or_class(spec, None, False, 8, 0.005, None, "answering", (KEY.public.pem(),))
    assert (tmp_path / "cache" / name / "inductor" / "entry").read_bytes() == b"artifact"
    assert server.info()["buckets"]


TRACEBACK = """The deployment failed to start 1 times in a row. See controller logs for details. Error:
ray::ServeReplica:orchestrate-mlp:ModelServer.initialize_and_get_metadata() (pid=1, ip=127.0.0.1)
  File "/venv/lib/python3.11/site-packages/ray/serve/_private/replica.py", line 1928, in initialize
    raise RuntimeError(traceback.format_exc()) from None
RuntimeError: Traceback (most recent call last):
  File "/src/orchestrator/cache/store.py", line 80, in get
orchestrator.cache.store.StoreUnreachable: s3://bucket/cache: connection refused
after 3 attempts: retries exhausted
"""


@pytest.mark.parametrize(
    "message, line, kind",
    [
        (TRACEBACK, "StoreUnreachable: s3://bucket/cache: connection refused", "StoreUnreachable"),
        ("Deploying application x failed: no replica", "Deploying application x failed: no replica", ""),
        ("the replica died", "the replica died", ""),
    ],
)
def test_a_replica_that_fails_to_load_is_one_line_naming_its_exception(message, line, kind):
    from orchestrator.serving.server import _failure

    failure = _failure(message)
    assert str(failure) == f"the model server did not start: {line}" and failure.kind == kind


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_an_npz_request_holds_the_same_request_as_its_json(codec):
    x = np.asarray(rows(3), dtype=np.float32)
    from_npz = codec.decode(npz(arr_0=x, ids=np.array([1, 2, 3])), NPZ)
    from_json = codec.decode(body(rows(3), [1, 2, 3]))
    assert from_npz.wire == NPZ and from_json.wire == JSON and from_npz.size == 3
    assert torch.equal(from_npz.args[0], from_json.args[0]) and from_npz.args[0].dtype == torch.float32
    assert torch.equal(from_npz.kwargs["ids"], from_json.kwargs["ids"])
    # float64 and big-endian arrays are numbers too: converted as JSON's doubles are
    other = codec.decode(npz(arr_0=x.astype(">f8"), ids=np.array([1, 2, 3], dtype=">i4")), NPZ)
    assert torch.equal(other.args[0], from_json.args[0]) and torch.equal(other.kwargs["ids"], from_json.kwargs["ids"])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: b"not a zip", "not an .npz"),
        (lambda: npz(arr_0=np.zeros((2, 4), np.float32)), "lacks inputs[1] (ids) (array 'ids')"),
        (lambda: npz(arr_0=np.zeros((2, 4)), ids=np.zeros(2, np.int64), x=np.zeros(1)), "unknown array 'x'"),
        (lambda: npz(arr_0=np.zeros((2, 5)), ids=np.zeros(2, np.int64)), "inputs[0] has size 5 at dim 1"),
        (lambda: npz(arr_0=np.zeros((2, 4)), ids=np.array([0, 10])), "inputs[1] (ids) holds 10, outside its range"),
        (lambda: npz(arr_0=np.zeros((2, 4)), ids=np.array([0.5, 1.0])), "numbers with a fraction"),
        (lambda: npz(arr_0=np.array([["a"] * 4]), ids=np.zeros(1, np.int64)), "is an array of <U1; send numbers"),
        (lambda: npz(arr_0=np.zeros((2, 4)), ids=np.zeros(3, np.int64)), "inputs[1] (ids) has 3 at dim 0"),
    ],
)
def test_a_bad_npz_is_one_line_naming_what_to_fix(codec, make, message):
    with pytest.raises(RequestError) as caught:
        codec.decode(make(), NPZ)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_an_npz_that_would_unpack_past_the_limit_is_refused_before_reading(codec, monkeypatch):
    import orchestrator.serving.codec as serve_codec

    monkeypatch.setattr(serve_codec, "MAX_NPZ_BYTES", 100)
    with pytest.raises(RequestError, match="unpacks to .* bytes, more than 100"):
        codec.decode(npz(arr_0=np.zeros((8, 4), np.float32), ids=np.zeros(8, np.int64)), NPZ)


def test_an_unknown_content_type_is_refused(codec):
    with pytest.raises(RequestError, match="Content-Type 'text/csv' is not served"):
        codec.decode(b"1,2,3", "text/csv")


def test_npz_answers_carry_each_output_tensor_by_its_path(codec):
    def model(x, ids):
        return {"scaled": x * 2, "pair": Pair(x.sum(dim=1), ids + 1), "half": x.to(torch.bfloat16), "n": 3}

    requests = [codec.decode(npz(arr_0=np.asarray(rows(n, n), np.float32), ids=np.arange(n)), NPZ) for n in (1, 3)] + [
        codec.decode(body(rows(2), [0, 1]))
    ]
    args, kwargs = codec.join(requests)
    answers = codec.split(model(*args, **kwargs), requests)
    assert [a.media_type for a in answers] == [NPZ, NPZ, JSON]
    for request, answer in zip(requests[:2], answers, strict=False):
        got = np.load(io.BytesIO(answer.body), allow_pickle=False)
        alone = model(*request.args, **request.kwargs)
        assert sorted(got.files) == [
            "output.half",
            "output.n",
            "output.pair.left",
            "output.pair.right",
            "output.scaled",
        ]
        np.testing.assert_array_equal(got["output.scaled"], alone["scaled"].numpy())
        np.testing.assert_array_equal(got["output.pair.right"], alone["pair"].right.numpy())
        assert got["output.half"].dtype == np.float32 and int(got["output.n"]) == 3
    assert json.loads(answers[2].body)["outputs"]["pair"]["right"] == [1, 2]
    with pytest.raises(OutputError, match="output.label is a str, which an .npz cannot carry"):
        codec.split({"label": "mlp"}, requests[:1])


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            body([[True, 1.0, 2.0, 3.0]], [1]),
            "inputs[0] holds true/false; it is float32: send numbers (inputs[0][0][0]",
        ),
        (body([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, False]], [1, 2]), "(inputs[0][1][3] is false)"),
        (body([[True, False, True, True]], [1]), "inputs[0] holds true/false; it is float32: send numbers"),
        (body(rows(2), [1, True]), "inputs[1] (ids) holds true/false; it is int64: send whole numbers"),
    ],
)
def test_true_and_false_are_not_numbers(codec, raw, message):
    with pytest.raises(RequestError) as caught:
        codec.decode(raw)
    assert message in str(caught.value) and caught.value.status == 400


def test_true_and_false_are_refused_in_an_npz_too(codec):
    with pytest.raises(RequestError, match=r"inputs\[0\] holds true/false; it is float32"):
        codec.decode(npz(arr_0=np.ones((1, 4), bool), ids=np.zeros(1, np.int64)), NPZ)


def test_a_bool_input_takes_true_and_false_or_0_and_1():
    codec = RequestCodec(make_spec([FEATURES, {"shape": ["batch"], "dtype": "bool", "name": "mask"}]), "cpu")
    request = codec.decode(json.dumps({"inputs": [rows(3), [True, False, 1]]}))
    assert request.kwargs["mask"].tolist() == [True, False, True]
    assert request.args[0].tolist() == rows(3)  # searched for true and false too, since the body holds them


def test_a_request_of_more_rows_than_serve_max_rows_is_a_413():
    """Unset, serve.max_rows is four times the largest bucket (8 here); 0 lifts the limit."""
    default = RequestCodec(make_spec([FEATURES]), "cpu")
    assert default.decode(body(rows(32))).size == 32
    with pytest.raises(TooManyRows) as caught:
        default.decode(body(rows(33)))
    assert caught.value.status == 413
    assert str(caught.value) == (
        "inputs[0] has 33 at dim 0 (batch), more than serve.max_rows 32; send at most that many a request"
    )
    assert RequestCodec(make_spec([FEATURES], serve={"max_rows": 0}), "cpu").decode(body(rows(100))).size == 100
    with pytest.raises(TooManyRows, match="more than serve.max_rows 5"):
        RequestCodec(make_spec([FEATURES], serve={"max_rows": 5}), "cpu").decode(body(rows(6)))


def test_a_compressed_npz_of_many_rows_is_refused_before_its_data_is_unpacked(codec, monkeypatch):
    """100,000 rows of zeros deflate to a few hundred KB: the .npy header's shape refuses them."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, arr_0=np.zeros((100_000, 4), np.float32), ids=np.zeros(100_000, np.int64))
    unpacked: list[int] = []
    real_read = zipfile.ZipExtFile.read
    monkeypatch.setattr(zipfile.ZipExtFile, "read", lambda self, n=-1: unpacked.append(n) or real_read(self, n))
    with pytest.raises(TooManyRows, match="inputs\\[0\\] has 100000 at dim 0 \\(batch\\), more than serve.max_rows 32"):
        codec.decode(buffer.getvalue(), NPZ)
    assert all(0 <= n < 4096 for n in unpacked), unpacked  # the header's bytes, never the data's


def test_serve_max_rows_is_not_part_of_the_namespace():
    assert make_spec([FEATURES], serve={"max_rows": 5}).identity_hash() == make_spec([FEATURES]).identity_hash()
    assert make_spec([FEATURES], serve={"max_rows": 0}).max_request_rows is None
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        make_spec([FEATURES], serve={"max_rows": -1})


GATED = """\
import torch


class Gated(torch.nn.Module):
    # rows are independent; `hook`, where set, sees each model call's input first
    hook = None

    def forward(self, x):
        if self.hook is not None:
            self.hook(x)
        return x * 2


def gated():
    return Gated()
"""


@pytest.mark.parametrize("short_rows", [1, 3])  # bucket 1's own shape; padded to bucket 4
def test_a_request_in_chunks_lets_a_short_one_run_after_the_chunk_under_way(tmp_path: Path, short_rows):
    """A request of 40 rows runs in ten chunks of bucket 4; a short request sent while the first
    chunk runs gets the model before the second chunk."""
    from orchestrator import runtime

    (tmp_path / "gated.py").write_text(GATED)
    (tmp_path / "gated.yaml").write_text(
        "model: {factory: gated.py:gated}\ninputs: [{shape: [batch, 3]}]\nbuckets: [1, 4]\ndevice: cpu\n"
    )
    served = runtime.load(tmp_path / "gated.yaml", cache_dir=tmp_path / "cache")
    long_x = torch.arange(120.0).reshape(40, 3)
    short_x = torch.full((short_rows, 3), -1.0)
    calls: list[str] = []  # each model call's request, in the order the model ran them
    finished: list[str] = []
    results: dict[str, torch.Tensor] = {}
    long_running, short_calling = threading.Event(), threading.Event()

    def hook(x: torch.Tensor) -> None:
        calls.append("short" if (x < 0).any() else "long")
        if len(calls) == 1:  # the long request's first chunk: it runs until the short one waits
            long_running.set()
            assert short_calling.wait(60)
            deadline = time.monotonic() + 60
            while not served._waiting and time.monotonic() < deadline:  # the short call waits for the lock
                time.sleep(0.01)

    def call(name: str, x: torch.Tensor) -> None:
        if name == "short":
            short_calling.set()
        results[name] = served(x)
        finished.append(name)

    served.model.hook = hook
    long = threading.Thread(target=call, args=("long", long_x))
    long.start()
    assert long_running.wait(60)
    short = threading.Thread(target=call, args=("short", short_x))
    short.start()
    long.join(120)
    short.join(120)
    # the order of model calls is the lock's doing; which thread returns first after them is the
    # scheduler's (the long request's last nine chunks may all run before the short thread wakes)
    assert calls == ["long", "short"] + ["long"] * 9
    assert sorted(finished) == ["long", "short"]
    assert torch.equal(results["long"], long_x * 2) and torch.equal(results["short"], short_x * 2)


def test_a_grid_request_is_sized_in_every_dimension_whatever_order_its_inputs_come_in():
    # a keyword input without the sequence before a positional one with it: the call order
    # (positional first) is not the config's, and the sizes are read in the config's
    lengths = {"shape": ["batch"], "dtype": "int64", "range": [1, 17], "name": "lengths"}
    tokens = {"shape": ["batch", "seq"], "dtype": "int64", "range": [0, 100]}
    spec = make_spec([lengths, tokens], buckets={"batch": [1, 8], "seq": [8, 16]})
    codec = RequestCodec(spec, "cpu", grid_dims={})
    request = codec.decode(json.dumps({"inputs": [[5, 5], [[7] * 5] * 2]}))
    assert (request.size, request.sizes) == (2, {"seq": 5})
    with pytest.raises(RequestError, match=r"inputs\[1\] has 3 at dim 0 \(batch\) where inputs\[0\] \(lengths\) has 2"):
        codec.decode(json.dumps({"inputs": [[5, 5], [[7] * 5] * 3]}))
