"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST) on `orchestrate serve`
(orchestrator.serving.inference_protocol): first without Ray, its requests decoded and answered
through the codec's batches; then a real server, asked by the real `tritonclient.http` client, every
answer checked against the model run eagerly on the same input."""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
from test_serve_fuzz import mutations

from orchestrator.jobs.spec import WarmupSpec
from orchestrator.serving.codec import JSON, Answer, OutputError, RequestCodec, RequestError
from orchestrator.serving.inference_protocol import BINARY, HEADER_LENGTH, InferenceProtocol, ProtocolError

Pair = namedtuple("Pair", "left right")
SPEC = WarmupSpec.model_validate(
    {
        "name": "scorer",
        "model": {"factory": "models.py:mlp"},
        "inputs": [{"shape": ["batch", 4]}, {"shape": ["batch"], "dtype": "int64", "range": [0, 10], "name": "ids"}],
        "buckets": [1, 8],
    }
)
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int64): "INT64"}
TORCH_DTYPES = {"FP32": torch.float32, "FP64": torch.float64, "INT64": torch.int64, "BF16": torch.bfloat16}


def model(x: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
    return {"scaled": x * 2, "pair": Pair(x.sum(dim=1), ids + 1), "total": x.sum(), "half": x.to(torch.bfloat16)}


@pytest.fixture
def codec() -> RequestCodec:
    return RequestCodec(SPEC, "cpu")


@pytest.fixture
def protocol(codec) -> InferenceProtocol:
    return InferenceProtocol(SPEC, codec, model)


def features(n: int, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 4).astype(np.float32)


def request(
    *tensors: tuple[str, np.ndarray, bool], outputs: Optional[list[dict]] = None, **fields: Any
) -> tuple[bytes, Optional[str]]:
    """A request as tritonclient writes one: each (name, array, binary) input in JSON `data` or as
    raw bytes after the JSON; the body and its Inference-Header-Content-Length."""
    entries, raws = [], []
    for name, array, binary in tensors:
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": DATATYPES[array.dtype]}
        if binary:
            raws.append(array.tobytes())
            entry["parameters"] = {"binary_data_size": len(raws[-1])}
        else:
            entry["data"] = array.flatten().tolist()
        entries.append(entry)
    document = {**fields, "inputs": entries, **({"outputs": outputs} if outputs is not None else {})}
    header = json.dumps(document).encode()
    return header + b"".join(raws), str(len(header)) if raws else None


def read(answer: Answer) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An answer's JSON and each output as a tensor, from its JSON `data` or its raw bytes."""
    length = dict(answer.headers).get(HEADER_LENGTH)
    offset = int(length) if length else len(answer.body)
    document = json.loads(answer.body[:offset])
    tensors = {}
    for output in document["outputs"]:
        dtype = TORCH_DTYPES[output["datatype"]]
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            tensors[output["name"]] = torch.tensor(output["data"], dtype=dtype).reshape(output["shape"])
        else:
            raw = bytearray(answer.body[offset : offset + size])
            tensors[output["name"]] = torch.frombuffer(raw, dtype=dtype).reshape(output["shape"])
            offset += size
    assert offset == len(answer.body)
    return document, tensors


def answer_alone(codec: RequestCodec, decoded) -> Answer:
    (answer,) = codec.split(model(*decoded.args, **decoded.kwargs), [decoded])
    return answer


def test_model_metadata_names_the_configs_inputs_and_the_models_outputs(codec):
    calls = []
    protocol = InferenceProtocol(SPEC, codec, lambda *args, **kwargs: calls.append(args) or model(*args, **kwargs))
    assert protocol.get("model") == {
        "name": "scorer",
        "versions": ["1"],
        "platform": "pytorch",
        "inputs": [
            {"name": "arr_0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "ids", "datatype": "INT64", "shape": [-1]},
        ],
        "outputs": [
            {"name": "output.scaled", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "output.pair.left", "datatype": "FP32", "shape": [-1]},
            {"name": "output.pair.right", "datatype": "INT64", "shape": [-1]},
            {"name": "output.total", "datatype": "FP32", "shape": []},
            {"name": "output.half", "datatype": "BF16", "shape": [-1, 4]},
        ],
    }
    protocol.get("model")
    assert [args[0].shape[0] for args in calls] == [1, 2]  # learned once, at requests of 1 and 2 rows
    assert protocol.get("model ready") == {"name": "scorer", "ready": True}
    assert protocol.get("ready") == {"ready": True} and protocol.get("live") == {"live": True}
    assert protocol.get("server")["extensions"] == ["binary_tensor_data"]


def test_json_and_binary_inputs_make_the_request_predict_makes(codec, protocol):
    x, ids = features(3), np.array([1, 2, 3])
    predicted = codec.decode(json.dumps({"inputs": [x.tolist(), ids.tolist()]}))
    for binary in [(False, False), (True, True), (True, False), (False, True)]:
        decoded = protocol.decode(*request(("arr_0", x, binary[0]), ("ids", ids, binary[1])))
        assert (
            decoded.size == 3 and decoded.args[0].dtype == torch.float32 and decoded.kwargs["ids"].dtype == torch.int64
        )
        assert torch.equal(decoded.args[0], predicted.args[0]) and torch.equal(
            decoded.kwargs["ids"], predicted.kwargs["ids"]
        )
    listed_last = protocol.decode(*request(("ids", ids, True), ("arr_0", x, True)))  # bytes in listed order
    assert torch.equal(listed_last.args[0], predicted.args[0])


def test_bfloat16_and_bool_inputs_come_as_their_bytes():
    spec = WarmupSpec.model_validate(
        {
            "model": {"factory": "models.py:mlp"},
            "inputs": [
                {"shape": ["batch", 2], "dtype": "bfloat16"},
                {"shape": ["batch"], "dtype": "bool", "name": "mask"},
            ],
            "buckets": [1, 8],
        }
    )
    protocol = InferenceProtocol(spec, RequestCodec(spec, "cpu"), model)
    half = torch.tensor([[0.5, -2.0], [3.0, 1e-3]], dtype=torch.bfloat16)
    inputs = [
        {"name": "arr_0", "shape": [2, 2], "datatype": "BF16", "parameters": {"binary_data_size": 8}},
        {"name": "mask", "shape": [2], "datatype": "BOOL", "parameters": {"binary_data_size": 2}},
    ]
    header = json.dumps({"inputs": inputs}).encode()
    raw = half.view(torch.int16).numpy().tobytes()
    decoded = protocol.decode(header + raw + bytes([1, 0]), str(len(header)))
    assert torch.equal(decoded.args[0], half) and decoded.kwargs["mask"].tolist() == [True, False]
    with pytest.raises(RequestError, match=r"inputs\[1\] \(mask\) is bool: send true/false \(or 0/1\)"):
        protocol.decode(header + raw + bytes([1, 2]), str(len(header)))


def test_an_answer_carries_the_asked_outputs_in_json_or_binary(codec, protocol):
    x, ids = features(3), np.array([1, 2, 3])
    outputs = [
        {"name": "output.pair.right", "parameters": {"binary_data": False}},
        {"name": "output.scaled", "parameters": {"binary_data": True}},
        {"name": "output.half"},  # binary_data_output's choice
    ]
    body, length = request(("arr_0", x, True), ("ids", ids, False), outputs=outputs, id="r-7")
    answer = answer_alone(codec, protocol.decode(body, length))
    document, got = read(answer)
    assert answer.status == 200 and answer.media_type == BINARY
    assert document["model_name"] == "scorer" and document["id"] == "r-7"
    assert [output["name"] for output in document["outputs"]] == ["output.pair.right", "output.scaled", "output.half"]
    assert ["data" in output for output in document["outputs"]] == [True, False, True]
    alone = model(torch.from_numpy(x), torch.from_numpy(ids))
    assert torch.equal(got["output.pair.right"], alone["pair"].right)
    assert torch.equal(got["output.scaled"], alone["scaled"])
    assert torch.equal(got["output.half"], alone["half"])


def test_unnamed_outputs_are_every_output_in_binary_where_the_request_says_so(codec, protocol):
    x, ids = features(2), np.array([0, 9])
    body, length = request(("arr_0", x, True), ("ids", ids, True), parameters={"binary_data_output": True})
    binary = answer_alone(codec, protocol.decode(body, length))
    body, length = request(("arr_0", x, False), ("ids", ids, False))
    plain = answer_alone(codec, protocol.decode(body, length))
    assert plain.media_type == JSON and plain.headers == () and "id" not in json.loads(plain.body)
    assert dict(binary.headers)[HEADER_LENGTH] and binary.media_type == BINARY
    from_binary, from_json = read(binary)[1], read(plain)[1]
    assert list(from_binary) == list(from_json) == [output["name"] for output in protocol.get("model")["outputs"]]
    for name, tensor in from_binary.items():
        assert torch.equal(tensor, from_json[name]), name
    assert from_json["output.total"].shape == () and from_json["output.total"].item() == x.sum()


def test_protocol_requests_batched_with_predicts_answer_as_each_alone(codec, protocol):
    """One call for four requests, two of each protocol: each answer is what a call of its own gives."""
    sizes = (1, 5, 2, 3)
    inputs = [(features(n, 10.0 * n), np.arange(n) % 10) for n in sizes]
    requests = [
        protocol.decode(*request(("arr_0", x, True), ("ids", ids, False), id=str(i)))
        if i % 2 == 0
        else codec.decode(json.dumps({"inputs": [x.tolist(), ids.tolist()]}))
        for i, (x, ids) in enumerate(inputs)
    ]
    assert codec.groups(requests) == [[0, 1, 2, 3]]
    args, kwargs = codec.join(requests)
    answers = codec.split(model(*args, **kwargs), requests)
    for i, ((x, ids), answer) in enumerate(zip(inputs, answers, strict=True)):
        alone = model(torch.from_numpy(x), torch.from_numpy(ids))
        if i % 2:
            assert json.loads(answer.body)["outputs"]["scaled"] == alone["scaled"].tolist()
            continue
        document, got = read(answer)
        assert document["id"] == str(i)
        assert torch.equal(got["output.scaled"], alone["scaled"]) and torch.equal(
            got["output.pair.right"], alone["pair"].right
        )
        assert torch.equal(got["output.total"], (args[0].sum()))  # no batch dimension: the call's value


def test_a_batch_takes_to_the_host_only_the_outputs_its_requests_ask_for(codec, protocol):
    """The server reads a batch's outputs out of the model's buffers before its next call: only
    the leaves some request's answer carries. A model on the meta device stands for one on the
    GPU: its tensors hold no data, so reading one to the host fails, and one no request asks for
    is never read. A model on the host answers there: nothing is read."""

    def asking(*names: str):
        return protocol.decode(
            *request(("arr_0", features(1), False), ("ids", np.array([1]), False), outputs=[{"name": n} for n in names])
        )

    assert asking("output.total", "output.half").outputs == {"output.total", "output.half"}
    assert protocol.decode(*request(("arr_0", features(1), False), ("ids", np.array([1]), False))).outputs is None
    outputs = {"scaled": torch.ones(2, 4, device="meta"), "total": torch.zeros(())}
    on_meta = RequestCodec(SPEC, "meta")
    kept = on_meta.to_host(outputs, [asking("output.total"), asking("output.total")])
    assert kept["scaled"] is outputs["scaled"] and kept["total"] is outputs["total"]
    with pytest.raises(NotImplementedError, match="meta"):  # one request of the batch asks for it
        on_meta.to_host(outputs, [asking("output.total"), asking("output.scaled")])
    predict = codec.decode(json.dumps({"inputs": [features(1).tolist(), [1]]}))
    with pytest.raises(NotImplementedError, match="meta"):  # /predict's answer carries every output
        on_meta.to_host(outputs, [asking("output.total"), predict])
    assert codec.to_host(outputs, [predict]) is outputs


def test_an_unknown_output_is_a_400_for_its_request_alone(codec, protocol):
    good = protocol.decode(*request(("arr_0", features(2), False), ("ids", np.array([1, 2]), False)))
    bad = protocol.decode(
        *request(("arr_0", features(1), False), ("ids", np.array([1]), False), outputs=[{"name": "logits"}])
    )
    args, kwargs = codec.join([good, bad])
    first, second = codec.split(model(*args, **kwargs), [good, bad])
    assert first.status == 200
    assert (second.status, json.loads(second.body)) == (
        400,
        {
            "error": "unknown output 'logits'; the model's outputs are output.scaled, output.pair.left, "
            "output.pair.right, output.total, output.half"
        },
    )


def test_outputs_the_protocol_cannot_carry_are_the_servers_fault_or_the_format_s(codec, protocol):
    decoded = protocol.decode(*request(("arr_0", features(1), False), ("ids", np.array([1]), False)))
    with pytest.raises(
        OutputError, match="output holds NaN or Inf, which JSON cannot carry; ask for it with binary_data"
    ) as not_finite:
        codec.split(torch.tensor([float("nan")]), [decoded])
    assert not_finite.value.status == 422  # finite inputs can overflow: the format asked for is what fails
    with pytest.raises(OutputError, match=r"output\[1\] is a str, which the v2 protocol cannot carry"):
        codec.split((torch.ones(1), "label"), [decoded])
    binary = protocol.decode(
        *request(("arr_0", features(1), True), ("ids", np.array([1]), True), parameters={"binary_data_output": True})
    )
    (answer,) = codec.split(torch.tensor([float("nan")]), [binary])
    assert torch.isnan(read(answer)[1]["output"]).all()  # raw bytes carry it


def body_of(document: Any) -> tuple[bytes, Optional[str]]:
    return json.dumps(document).encode(), None


def tensor(name: str = "arr_0", shape: Optional[list] = None, datatype: str = "FP32", **extra: Any) -> dict[str, Any]:
    shape = [1, 4] if shape is None else shape
    return {"name": name, "shape": shape, "datatype": datatype, "data": [0.5] * 4, **extra}


IDS = {"name": "ids", "shape": [1], "datatype": "INT64", "data": [1]}


def with_inputs(*inputs: dict, **fields: Any) -> tuple[bytes, Optional[str]]:
    return body_of({"inputs": list(inputs), **fields})


BAD = {
    "invalid JSON": ((b'{"inputs": [', None), 400, "the request is not valid JSON"),
    "not an object": (body_of([1]), 400, "the request is not a JSON object"),
    "an unknown key": (with_inputs(tensor(), IDS, extra=1), 400, "unknown key 'extra' in the request"),
    "no inputs": (body_of({"id": "1"}), 400, 'the request has no "inputs"'),
    "a number for an id": (with_inputs(tensor(), IDS, id=7), 400, '"id" is not a string'),
    "an input without a name": (
        with_inputs({"shape": [1], "datatype": "FP32", "data": [1]}),
        400,
        'inputs[0] has no "name"',
    ),
    "a wrong datatype": (
        with_inputs(tensor(datatype="FP64"), IDS),
        400,
        "input 'arr_0' is FP32; the request declares FP64",
    ),
    "a wrong shape": (
        with_inputs(tensor(shape=[1, 5]), IDS),
        400,
        "input 'arr_0' has shape [1, 5]; scorer takes [-1, 4]",
    ),
    "a wrong rank": (with_inputs(tensor(shape=[4]), IDS), 400, "input 'arr_0' has shape [4]; scorer takes [-1, 4]"),
    "a negative size": (
        with_inputs(tensor(shape=[-1, 4]), IDS),
        400,
        "input 'arr_0': shape [-1, 4] has a negative size",
    ),
    "a shape of strings": (
        with_inputs(tensor(shape=["1", 4]), IDS),
        400,
        "input 'arr_0': \"shape\" is not a list of sizes",
    ),
    "an empty input": (with_inputs(tensor(shape=[0, 4], data=[]), IDS), 400, "input 'arr_0' is empty"),
    "too few values": (
        with_inputs(tensor(shape=[2, 4]), IDS),
        400,
        "input 'arr_0' has 4 values in \"data\", its shape [2, 4] holds 8",
    ),
    "no data": (
        with_inputs({"name": "ids", "shape": [1], "datatype": "INT64"}, tensor()),
        400,
        "input 'ids' has no \"data\"",
    ),
    "an unknown input": (with_inputs(tensor(), IDS, tensor("x")), 400, "unknown input 'x'; scorer takes arr_0, ids"),
    "an input twice": (with_inputs(tensor(), IDS, IDS), 400, "input 'ids' is given twice"),
    "a missing input": (with_inputs(tensor()), 400, "the request lacks input 'ids'; scorer takes arr_0, ids"),
    "a string among numbers": (
        with_inputs(tensor(data=[0.5, "x", 0.5, 0.5]), IDS),
        400,
        'inputs[0][1] is "x", not a number',
    ),
    "true for a number": (
        with_inputs(tensor(data=[True, 0.5, 0.5, 0.5]), IDS),
        400,
        "inputs[0] holds true/false; it is float32",
    ),
    "NaN": (
        (b'{"inputs": [{"name": "arr_0", "shape": [1, 4], "datatype": "FP32", "data": [NaN, 1, 2, 3]}]}', None),
        400,
        "NaN is not a JSON number",
    ),
    "an id out of range": (
        with_inputs(tensor(), {**IDS, "data": [10]}),
        400,
        "inputs[1] (ids) holds 10, outside its range [0, 10)",
    ),
    "inputs of different rows": (
        with_inputs(tensor(shape=[2, 4], data=[0.5] * 8), IDS),
        400,
        "inputs[1] (ids) has 1 at dim 0 (batch) where inputs[0] has 2",
    ),
    "more rows than serve.max_rows": (
        with_inputs(tensor(shape=[33, 4], data=[0.5] * 132), {**IDS, "shape": [33], "data": [1] * 33}),
        413,
        "inputs[0] has 33 at dim 0 (batch), more than serve.max_rows 32",
    ),
    "an output twice": (
        with_inputs(tensor(), IDS, outputs=[{"name": "output.scaled"}, {"name": "output.scaled"}]),
        400,
        "output 'output.scaled' is asked for twice",
    ),
    "a classification": (
        with_inputs(tensor(), IDS, outputs=[{"name": "output.scaled", "parameters": {"classification": 3}}]),
        400,
        "output 'output.scaled': classification is not served",
    ),
    "shared memory": (
        with_inputs(tensor(parameters={"shared_memory_region": "r"}), IDS),
        400,
        "input 'arr_0': shared memory is not served",
    ),
    "a sequence": (with_inputs(tensor(), IDS, parameters={"sequence_id": 3}), 400, "sequence_id is not served"),
    "binary_data_output not a flag": (
        with_inputs(tensor(), IDS, parameters={"binary_data_output": "yes"}),
        400,
        "the request: binary_data_output is not true or false",
    ),
    "data and binary_data_size": (
        with_inputs(tensor(parameters={"binary_data_size": 16}), IDS),
        400,
        "input 'arr_0' has both \"data\" and binary_data_size",
    ),
    "binary data without its header": (
        with_inputs(
            {"name": "ids", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 8}}, tensor()
        ),
        400,
        "its inputs' binary_data_size add up to 8; send Inference-Header-Content-Length",
    ),
}


def binary_bodies() -> dict[str, tuple[tuple[bytes, Optional[str]], int, str]]:
    body, length = request(("arr_0", features(2), True), ("ids", np.array([1, 2]), True))
    assert length is not None
    header = int(length)
    return {
        "binary data short of its sizes": (
            (body[:-8], length),
            400,
            "the body has 40 bytes after its JSON, its inputs' binary_data_size add up to 48",
        ),
        "a header length past the body": (
            (body, str(len(body) + 1)),
            400,
            f"{HEADER_LENGTH} {len(body) + 1} does not fit the body's {len(body)} bytes",
        ),
        "a header length that is not a number": (
            (body, "twelve"),
            400,
            f"{HEADER_LENGTH} 'twelve' is not a number of bytes",
        ),
        "a header length inside the JSON": ((body, str(header - 1)), 400, "the request is not valid JSON"),
    }


@pytest.mark.parametrize("case", [*BAD, *binary_bodies()])
def test_a_bad_request_is_one_line_at_its_status(protocol, case):
    (body, length), status, message = {**BAD, **binary_bodies()}[case]
    with pytest.raises(RequestError) as caught:
        protocol.decode(body, length)
    assert caught.value.status == status
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_bytes_for_a_binary_input_must_be_its_shapes(protocol):
    x = features(2)
    body, length = request(("arr_0", x, True), ("ids", np.array([1, 2]), False))
    assert length is not None
    document = json.loads(body[: int(length)])
    document["inputs"][0]["parameters"]["binary_data_size"] = 24
    header = json.dumps(document).encode()
    with pytest.raises(
        ProtocolError, match=r"input 'arr_0' has 24 bytes of binary data, its shape \[2, 4\] of FP32 takes 32"
    ):
        protocol.decode(header + x.tobytes()[:24], str(len(header)))


def test_a_compressed_body_is_refused(protocol):
    with pytest.raises(ProtocolError, match="Content-Encoding 'gzip' is not served; send the body uncompressed"):
        protocol.decode(b"\x1f\x8b", None, "gzip")


def test_mutated_bodies_decode_or_are_refused_in_one_line(protocol):
    """Whatever a mutation breaks, decoding answers a request or a RequestError: never an exception
    the server would answer with a 500."""
    for binary in (False, True):
        body, length = request(("arr_0", features(2), binary), ("ids", np.array([1, 2]), binary), id="m")
        protocol.decode(body, length)
        refused = 0
        for mutated in mutations(body, 300, seed=int(binary)):
            try:
                protocol.decode(mutated, length)
            except RequestError as exc:
                assert exc.status in (400, 413) and "\n" not in str(exc) and str(exc), repr(mutated)
                refused += 1
        assert refused > 0


@pytest.mark.parametrize(
    "method, path, endpoint",
    [
        ("GET", "/v2", "server"),
        ("GET", "/v2/health/live", "live"),
        ("GET", "/v2/health/ready", "ready"),
        ("GET", "/v2/models/scorer", "model"),
        ("GET", "/v2/models/scorer/ready", "model ready"),
        ("POST", "/v2/models/scorer/infer", "infer"),
        # the one version, as KServe clients address it
        ("GET", "/v2/models/scorer/versions/1", "model"),
        ("GET", "/v2/models/scorer/versions/1/ready", "model ready"),
        ("POST", "/v2/models/scorer/versions/1/infer", "infer"),
    ],
)
def test_routes(protocol, method, path, endpoint):
    assert protocol.endpoint(method, path) == endpoint


@pytest.mark.parametrize(
    "method, path, status, message, allow",
    [
        ("POST", "/v2/models/mlp/infer", 404, "unknown model 'mlp'; this server serves 'scorer'", None),
        ("GET", "/v2/models/mlp/ready", 404, "unknown model 'mlp'; this server serves 'scorer'", None),
        (
            "POST",
            "/v2/models/scorer/versions/2/infer",
            404,
            "scorer has version 1 only here",
            None,
        ),
        (
            "GET",
            "/v2/models/scorer/config",
            404,
            "no route GET /v2/models/scorer/config; the v2 routes are /v2, ",
            None,
        ),
        ("GET", "/v2/repository/index", 404, "no route GET /v2/repository/index", None),
        ("GET", "/v2/models/scorer/infer", 405, "use POST on /v2/models/scorer/infer", "POST"),
        ("POST", "/v2/health/ready", 405, "use GET on /v2/health/ready", "GET"),
    ],
)
def test_a_route_the_server_has_not_is_a_404_and_a_wrong_method_a_405(protocol, method, path, status, message, allow):
    with pytest.raises(ProtocolError) as caught:
        protocol.endpoint(method, path)
    assert caught.value.status == status and str(caught.value).startswith(message)
    assert caught.value.headers == ({"Allow": allow} if allow else None)


SCORER = """\
import torch


class Scorer(torch.nn.Module):
    def forward(self, x, ids):
        return {"scaled": x * 2 + ids.unsqueeze(1), "next": ids + 1}


def scorer():
    return Scorer()
"""


def test_the_replica_answers_both_protocols_in_one_batch(tmp_path: Path, monkeypatch):
    """The replica's own class, outside Ray: its metadata learned from the served model, and a
    batch of v2 and /predict requests answered by one model call, each as alone."""
    from orchestrator.config import load_spec
    from orchestrator.serving.server import ModelServer

    (tmp_path / "scorer.py").write_text(SCORER)
    (tmp_path / "scorer.yaml").write_text(
        textwrap.dedent(
            """\
            model: {factory: scorer.py:scorer}
            inputs: [{shape: [batch, 4]}, {shape: [batch], dtype: int64, range: [0, 10], name: ids}]
            device: cpu
            buckets: [1, 4]
            """
        )
    )
    spec = load_spec(tmp_path / "scorer.yaml").replaced(cache_dir=str(tmp_path / "cache"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the constructor sets the replica's own
    replica = ModelServer.func_or_class(spec, None, False, 8, 0.005)
    assert replica.protocol.get("model")["outputs"] == [
        {"name": "output.scaled", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "output.next", "datatype": "INT64", "shape": [-1]},
    ]
    calls_before = sum(usage.calls for usage in replica.model.usage().values())
    inputs = [(features(n, n), np.arange(n) % 10) for n in (2, 1)]  # 3 rows: one call, on bucket 4
    v2 = replica.protocol.decode(*request(("arr_0", inputs[0][0], True), ("ids", inputs[0][1], True)))
    predict = replica.codec.decode(json.dumps({"inputs": [inputs[1][0].tolist(), inputs[1][1].tolist()]}))
    first, second = replica._answer_all([v2, predict])
    assert sum(usage.calls for usage in replica.model.usage().values()) == calls_before + 1
    _, got = read(first)
    x, ids = (torch.from_numpy(a) for a in inputs[0])
    assert torch.equal(got["output.scaled"], x * 2 + ids.unsqueeze(1)) and torch.equal(got["output.next"], ids + 1)
    assert json.loads(second.body)["outputs"]["next"] == (inputs[1][1] + 1).tolist()


# -- a real server, asked by tritonclient -----------------------------------------------------------

MODEL = "mlp"
ROWS = 256


@pytest.fixture(scope="module")
def triton():
    return pytest.importorskip("tritonclient.http", reason="needs tritonclient[http] (the dev extra)")


@pytest.fixture(scope="module")
def client(triton, server):
    with triton.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120) as client:
        yield client


def answered(result: Any) -> torch.Tensor:
    """The output tritonclient read, as a tensor of its own (its array is a read-only view of the body)."""
    return torch.tensor(result.as_numpy("output"))


def raised(call) -> Any:
    """The InferenceServerException `call` raises: its status() and message() are the server's."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


@pytest.mark.slow
def test_tritonclient_finds_a_live_ready_server_and_its_model(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and not client.is_model_ready("resnet")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    assert client.is_model_ready(MODEL, "1") and not client.is_model_ready(MODEL, "2")  # as KServe clients ask
    assert (
        client.get_model_metadata(MODEL)
        == client.get_model_metadata(MODEL, "1")
        == {
            "name": MODEL,
            "versions": ["1"],
            "platform": "pytorch",
            "inputs": [{"name": "arr_0", "datatype": "FP32", "shape": [-1, ROWS]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, ROWS]}],
        }
    )
    error = raised(lambda: client.get_model_metadata("resnet"))
    assert (error.status(), error.message()) == ("404", "unknown model 'resnet'; this server serves 'mlp'")


@pytest.mark.slow
@pytest.mark.parametrize("binary_in, binary_out", [(False, False), (True, True), (True, False), (False, True)])
@pytest.mark.parametrize("size", [3, 13])  # 13: more than the largest bucket, run in chunks of 8
def test_tritonclient_infers_as_eager(triton, client, eager, size, binary_in, binary_out):
    x = torch.randn(size, ROWS, generator=torch.Generator().manual_seed(size))
    given = triton.InferInput("arr_0", [size, ROWS], "FP32").set_data_from_numpy(x.numpy(), binary_data=binary_in)
    asked = triton.InferRequestedOutput("output", binary_data=binary_out)
    result = client.infer(MODEL, [given], outputs=[asked], request_id=f"r{size}")
    response = result.get_response()
    assert response["model_name"] == MODEL and response["id"] == f"r{size}"
    (output,) = response["outputs"]
    assert output["shape"] == [size, ROWS] and output["datatype"] == "FP32" and ("data" in output) != binary_out
    torch.testing.assert_close(answered(result), eager(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_tritonclient_gets_every_output_in_binary_when_it_names_none(triton, client, eager):
    x = torch.randn(5, ROWS, generator=torch.Generator().manual_seed(5))
    result = client.infer(MODEL, [triton.InferInput("arr_0", [5, ROWS], "FP32").set_data_from_numpy(x.numpy())])
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == 5 * ROWS * 4
    torch.testing.assert_close(answered(result), eager(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_concurrent_v2_and_predict_requests_are_each_answered_right(triton, server, eager):
    """Sent together, so that they share batches: tritonclient's async requests and /predict's."""
    from served import assert_answers, predict

    generator = torch.Generator().manual_seed(17)
    v2_inputs = [torch.randn(size, ROWS, generator=generator) for size in (1, 4, 7, 2, 9, 3)]
    predict_inputs = [torch.randn(size, ROWS, generator=generator) for size in (2, 5, 1, 6)]
    with triton.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=8, network_timeout=120) as many:
        with ThreadPoolExecutor(len(predict_inputs)) as pool:
            # /predict's from threads, which run on while tritonclient's greenlets wait for their answers
            predicting = [pool.submit(predict, server, x) for x in predict_inputs]
            pending = [
                many.async_infer(
                    MODEL, [triton.InferInput("arr_0", list(x.shape), "FP32").set_data_from_numpy(x.numpy())]
                )
                for x in v2_inputs
            ]
            results = [call.get_result() for call in pending]
            predicted = [future.result() for future in predicting]
    for x, result in zip(v2_inputs, results, strict=True):
        torch.testing.assert_close(answered(result), eager(x), atol=1e-4, rtol=1e-4)
    for x, (status, answer) in zip(predict_inputs, predicted, strict=True):
        assert_answers(status, answer, x, eager)


def tritonclient_bad_requests(triton) -> dict[str, tuple[dict[str, Any], str, str]]:
    """Bad requests tritonclient sends: infer's arguments, the status, the message."""

    def given(name: str = "arr_0", shape: tuple[int, ...] = (2, ROWS), dtype: Any = np.float32) -> Any:
        datatype = {np.float32: "FP32", np.float64: "FP64"}[dtype]
        return triton.InferInput(name, list(shape), datatype).set_data_from_numpy(np.zeros(shape, dtype))

    return {
        "a wrong datatype": (
            {"inputs": [given(dtype=np.float64)]},
            "400",
            "input 'arr_0' is FP32; the request declares FP64",
        ),
        "a wrong shape": (
            {"inputs": [given(shape=(2, 255))]},
            "400",
            "input 'arr_0' has shape [2, 255]; mlp takes [-1, 256] (-1: any size)",
        ),
        "a missing input": ({"inputs": []}, "400", "the request lacks input 'arr_0'; mlp takes arr_0"),
        "an unknown input": ({"inputs": [given(), given("x")]}, "400", "unknown input 'x'; mlp takes arr_0"),
        "an unknown output": (
            {"inputs": [given()], "outputs": [triton.InferRequestedOutput("logits")]},
            "400",
            "unknown output 'logits'; the model's outputs are output",
        ),
        "more rows than serve.max_rows": (
            {"inputs": [given(shape=(33, ROWS))]},
            "413",
            "inputs[0] has 33 at dim 0 (batch), more than serve.max_rows 32; send at most that many a request",
        ),
        "an unknown model": (
            {"model_name": "resnet", "inputs": [given()]},
            "404",
            "unknown model 'resnet'; this server serves 'mlp'",
        ),
        "a version": (
            {"model_version": "2", "inputs": [given()]},
            "404",
            "mlp has version 1 only here",
        ),
    }


@pytest.mark.slow
def test_tritonclients_bad_requests_are_refused_with_the_servers_one_line(triton, client, eager):
    for case, (arguments, status, message) in tritonclient_bad_requests(triton).items():
        error = raised(lambda arguments=arguments: client.infer(**{"model_name": MODEL, **arguments}))
        assert (error.status(), error.message()) == (status, message), case
    x = torch.randn(4, ROWS, generator=torch.Generator().manual_seed(4))  # and the replica serves on
    result = client.infer(MODEL, [triton.InferInput("arr_0", [4, ROWS], "FP32").set_data_from_numpy(x.numpy())])
    torch.testing.assert_close(answered(result), eager(x), atol=1e-4, rtol=1e-4)


def send(url: str, body: bytes, headers: Optional[dict[str, str]] = None, method: str = "POST") -> tuple[int, dict]:
    call = urllib.request.Request(url, data=body if method == "POST" else None, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_bodies_tritonclient_would_not_send_are_400s_with_one_line(server):
    infer = f"http://127.0.0.1:{server.port}/v2/models/{MODEL}/infer"
    x = np.zeros((2, ROWS), np.float32)
    header = json.dumps(
        {
            "inputs": [
                {"name": "arr_0", "shape": [2, ROWS], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
            ]
        }
    ).encode()
    cases = [
        (b'{"inputs": [', {}, 400, "the request is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, {}, 400, "the request nests deeper than JSON is parsed here"),
        (header + x.tobytes()[:-4], {HEADER_LENGTH: str(len(header))}, 400, "the body has 2044 bytes after its JSON"),
        (
            header + x.tobytes(),
            {HEADER_LENGTH: str(len(header) + 4096)},
            400,
            f"{HEADER_LENGTH} {len(header) + 4096} does not fit",
        ),
        (header + x.tobytes(), {}, 400, "the request is not valid JSON"),
        (header, {HEADER_LENGTH: "0"}, 400, f"{HEADER_LENGTH} 0 does not fit the body's"),
    ]
    for body, headers, status, message in cases:
        got, answer = send(infer, body, headers)
        assert got == status and list(answer) == ["error"] and message in answer["error"], (message, answer)
        assert "\n" not in answer["error"]
    status, answer = send(infer, b"", method="GET")
    assert status == 405 and answer == {"error": f"use POST on /v2/models/{MODEL}/infer"}
    status, answer = send(f"http://127.0.0.1:{server.port}/v2/models/{MODEL}/stats", b"", method="GET")
    assert status == 404 and answer["error"].startswith(f"no route GET /v2/models/{MODEL}/stats; the v2 routes are")


@pytest.mark.slow
def test_v2_requests_count_in_the_replicas_metrics(triton, client, server):
    from prometheus_client.parser import text_string_to_metric_families

    def calls() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as response:
            page = response.read().decode()
        families = text_string_to_metric_families(page)
        return sum(s.value for f in families for s in f.samples if s.name == "orchestrate_replica_calls_total")

    before = calls()
    x = np.zeros((3, ROWS), np.float32)
    client.infer(MODEL, [triton.InferInput("arr_0", [3, ROWS], "FP32").set_data_from_numpy(x)])
    assert calls() == before + 1
