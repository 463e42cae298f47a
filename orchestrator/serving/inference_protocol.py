"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST API) for `orchestrate serve`, beside
`POST /predict`: what `tritonclient.http` and KServe's clients send and read.

    GET  /v2                      server metadata: name, version, extensions
    GET  /v2/health/live          200 {"live": true}
    GET  /v2/health/ready         200 {"ready": true}
    GET  /v2/models/NAME          model metadata: inputs and outputs, datatype and shape (-1: the bucket dimension)
    GET  /v2/models/NAME/ready    200 {"name": NAME, "ready": true}
    POST /v2/models/NAME/infer    {"id", "inputs": [{name, shape, datatype, data}], "outputs": [{name}]}
                                  -> {"model_name", "id", "outputs": [{name, shape, datatype, data}]}
    any refusal                   400 (404: model or route, 405: method, 413: rows) {"error": "<one line>"}

NAME is the config's model name. Inputs are named as the config names them (`arr_<i>` in config
order for an unnamed one, as /predict's .npz names it), each of the config's dtype (FP32 for
float32, INT64 for int64, BOOL for bool, ...), which a request must declare as it is. Outputs are
named by their paths in the model's output, as /predict's .npz answer names its arrays: `output`
for a tensor, `output.logits` for a dict's (or ModelOutput's) entry, `output[0]` for a tuple's
first; a number is a tensor of shape [].

The binary tensor data extension: an input whose `parameters.binary_data_size` is set carries its
data as raw bytes after the JSON, whose length the `Inference-Header-Content-Length` header gives
(the inputs' bytes in the order they are listed); an output asked for with `parameters.binary_data`
(every output, under the request's `parameters.binary_data_output`) comes back the same way, the
answer's header giving its JSON's length. Raw bytes are in the host's order: little-endian on the
platforms torch serves on. tritonclient sends inputs in binary unless told not to, and asks for
every output in binary when it names none.

A decoded request is a codec Request (orchestrator.serving.codec): the same checks, batches and
model calls as /predict's; this module writes its answer (`InferenceProtocol.encode`).
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

from orchestrator.jobs import trees
from orchestrator.jobs.errors import first_line
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.serving.codec import JSON, Answer, Cut, NotFinite, OutputError, Request, RequestCodec, RequestError

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"  # an answer that carries raw tensor bytes after its JSON
# the model's one version, as KServe and Triton clients address it (/v2/models/NAME/versions/1/...)
VERSION = "1"
PLATFORM = "pytorch"
EXTENSIONS = ("binary_tensor_data",)
# the config's dtypes (orchestrator.jobs.spec.DType) as the protocol names them
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
# what an output may be: any torch dtype the protocol has a name for
_OUTPUT_DATATYPES = {
    getattr(torch, name): datatype
    for name, datatype in {**DATATYPES, "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64"}.items()
    if hasattr(torch, name)
}
_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}  # a number output as a tensor

Endpoint = Literal["server", "live", "ready", "model", "model ready", "infer"]
# path under /v2 -> (endpoint, its method); a model's own under /v2/models/NAME
_SERVER_ROUTES: dict[tuple[str, ...], tuple[Endpoint, str]] = {
    (): ("server", "GET"),
    ("health", "live"): ("live", "GET"),
    ("health", "ready"): ("ready", "GET"),
}
_MODEL_ROUTES: dict[tuple[str, ...], tuple[Endpoint, str]] = {
    (): ("model", "GET"),
    ("ready",): ("model ready", "GET"),
    ("infer",): ("infer", "POST"),
}
_REQUEST_KEYS = ("id", "inputs", "outputs", "parameters")
_INPUT_KEYS = ("name", "shape", "datatype", "parameters", "data")
_OUTPUT_KEYS = ("name", "parameters")


class ProtocolError(RequestError):
    """A request the client has to fix, answered at `status` with the protocol's error body."""

    def __init__(self, message: str, status: int = 400, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


@dataclass(frozen=True)
class TensorMetadata:
    """An input or output as the model metadata describes it."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: a dimension of the request's size

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class InputTensor:
    """One entry of a request's `inputs`, its data not yet read."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any  # the JSON `data`; None where the data is binary
    binary_size: Optional[int]  # `parameters.binary_data_size`: its bytes after the JSON


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """An inference request's JSON, checked: what to run on, and what to answer with."""

    id: Optional[str]
    inputs: tuple[InputTensor, ...]
    outputs: Optional[tuple[RequestedOutput, ...]]  # None: every output
    binary_output: bool  # `parameters.binary_data_output`: how outputs not asked for by name are sent


class InferenceProtocol:
    """The protocol for one served model: its routes, its metadata, its requests and answers."""

    def __init__(
        self,
        spec: WarmupSpec,
        codec: RequestCodec,
        model: Callable[..., Any],
        output_dims: Optional[Callable[[], dict[str, set[int]]]] = None,
    ) -> None:
        """`model`: what calls the served model; `output_dims`: a grid replica's, the dimensions
        of its outputs that follow the grid's (GridModel.output_dims)."""
        self.model_name = spec.label
        self._spec, self._codec, self._model, self._output_dims = spec, codec, model, output_dims
        self.inputs = tuple(
            TensorMetadata(name, DATATYPES[item.dtype], tuple(_dims(item.shape)))
            for name, item in zip(codec.input_names, spec.inputs, strict=True)
        )
        self._outputs: Optional[tuple[TensorMetadata, ...]] = None
        self._outputs_lock = threading.Lock()  # the first metadata request learns them, once

    # -- routes -----------------------------------------------------------------------------------

    def endpoint(self, method: str, path: str) -> Endpoint:
        """Which endpoint `method path` (under /v2) asks for; ProtocolError 404 for a path or model
        this server does not have, 405 for the wrong method."""
        parts = tuple(part for part in path.split("/") if part)[1:]
        found = _SERVER_ROUTES.get(parts)
        if found is None and parts[:1] == ("models",) and len(parts) >= 2:
            found = _MODEL_ROUTES.get(parts[2:])
            if parts[1] != self.model_name:
                raise ProtocolError(f"unknown model {parts[1]!r}; this server serves {self.model_name!r}", 404)
            if parts[2:3] == ("versions",):
                # KServe clients address a version: the one this server has is VERSION
                if parts[3:4] != (VERSION,):
                    raise ProtocolError(f"{self.model_name} has version {VERSION} only here", 404)
                found = _MODEL_ROUTES.get(parts[4:])
        if found is None:
            routes = f"/v2, /v2/health/live, /v2/health/ready, /v2/models/{self.model_name}[/ready, /infer]"
            raise ProtocolError(f"no route {method} {path}; the v2 routes are {routes}", 404)
        endpoint, allowed = found
        if method != allowed:
            raise ProtocolError(f"use {allowed} on {path}", 405, {"Allow": allowed})
        return endpoint

    def get(self, endpoint: Endpoint) -> dict[str, Any]:
        """The answer of a GET endpoint. A replica answers only once its load has returned (Serve
        routes nothing to it before), which `--ready` decides: answering at all is being ready."""
        if endpoint == "server":
            from orchestrator import __version__

            return {"name": "orchestrate", "version": __version__, "extensions": list(EXTENSIONS)}
        if endpoint == "live":
            return {"live": True}
        if endpoint == "ready":
            return {"ready": True}
        if endpoint == "model ready":
            return {"name": self.model_name, "ready": True}
        if endpoint == "model":
            return self.metadata()
        raise ValueError(f"{endpoint} is not a GET endpoint")

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.model_name,
            "versions": [VERSION],
            "platform": PLATFORM,
            "inputs": [tensor.to_json() for tensor in self.inputs],
            "outputs": [tensor.to_json() for tensor in self.outputs()],
        }

    def outputs(self) -> tuple[TensorMetadata, ...]:
        """The model's outputs, learned from two calls at the first metadata request: a model's
        output is known only from what it returns."""
        with self._outputs_lock:
            if self._outputs is None:
                self._outputs = self._probe()
            return self._outputs

    def _probe(self) -> tuple[TensorMetadata, ...]:
        """Outputs at requests of 1 and 2 rows (of 1 only, where the model refuses 2): the
        dimensions that follow the request's size are -1, found as the replica finds them."""
        from orchestrator.jobs.model import make_inputs
        from orchestrator.jobs.padding import output_bucket_dims

        spec = self._spec
        grid_dims = self._output_dims
        if spec.grid and grid_dims is not None:  # a grid's replica learnt them, every dimension's
            spec = spec.slices()[0]
        sizes = (1, 2) if spec.serve.oversize == "split" or max(spec.buckets) >= 2 else (1,)
        answers = {}
        for size in sizes:
            args, kwargs = make_inputs(spec, size, self._codec.device)
            answers[size] = self._model(*args, **kwargs)
        input_dim = next(
            item.shape.index(spec.bucket_symbol) for item in spec.inputs if spec.bucket_symbol in item.shape
        )
        dims = output_bucket_dims(answers, input_dim)
        if self._spec.grid and grid_dims is not None:
            dims = {path: tuple(found) for path, found in grid_dims().items()}
        described = []
        for name, leaf in trees.leaves(answers[1]):
            tensor = _tensor(name, leaf)
            shape = tuple(-1 if dim in dims.get(name, ()) else size for dim, size in enumerate(tensor.shape))
            described.append(TensorMetadata(name, _datatype(name, tensor), shape))
        return tuple(described)

    # -- requests ---------------------------------------------------------------------------------

    def decode(
        self, body: bytes, header_length: Optional[str] = None, content_encoding: Optional[str] = None
    ) -> Request:
        """An inference request as the codec's Request, which this protocol answers; ProtocolError
        (or the codec's RequestError: a shape, value or row count the config refuses) for anything
        the model does not take."""
        if content_encoding not in (None, "", "identity"):
            raise ProtocolError(f"Content-Encoding {content_encoding!r} is not served; send the body uncompressed")
        header, binary = split_body(body, header_length)
        request = parse_request(header)
        tensors = self._tensors(request.inputs, header, binary)
        named = None if request.outputs is None else frozenset(output.name for output in request.outputs)
        return self._codec.request(tensors, functools.partial(self.encode, request), named)

    def _tensors(self, inputs: Sequence[InputTensor], header: bytes, binary: bytes | memoryview) -> list[torch.Tensor]:
        """The request's inputs as tensors in config order."""
        names = [tensor.name for tensor in self.inputs]
        given: dict[str, InputTensor] = {}
        for entry in inputs:
            if entry.name not in names:
                raise ProtocolError(f"unknown input {entry.name!r}; {self.model_name} takes {', '.join(names)}")
            if entry.name in given:
                raise ProtocolError(f"input {entry.name!r} is given twice")
            given[entry.name] = entry
        for name in names:
            if name not in given:
                raise ProtocolError(f"the request lacks input {name!r}; {self.model_name} takes {', '.join(names)}")
        chunks = binary_chunks(inputs, binary)
        return [self._tensor(i, given[name], header, chunks.get(name)) for i, name in enumerate(names)]

    def _tensor(
        self, index: int, entry: InputTensor, header: bytes, chunk: Optional[bytes | memoryview]
    ) -> torch.Tensor:
        """One input at its declared shape, of the config's dtype where its data is binary (BOOL as
        bytes, which the codec checks are 0 or 1); the codec checks shape and values."""
        meta = self.inputs[index]
        expected = meta.datatype
        if entry.datatype != expected:
            raise ProtocolError(f"input {entry.name!r} is {expected}; the request declares {entry.datatype}")
        # checked against the metadata first: the message speaks of what a client sees, and no
        # tensor is made at a rank torch refuses
        if not _fits(entry.shape, meta.shape):
            raise ProtocolError(
                f"input {entry.name!r} has shape {list(entry.shape)}; {self.model_name} takes {list(meta.shape)} "
                "(-1: any size)"
            )
        count = math.prod(entry.shape)
        if not count:
            raise ProtocolError(f"input {entry.name!r} is empty (shape {list(entry.shape)}); send at least one row")
        if chunk is None:
            values = self._codec.tensor_from_json(index, entry.data, header)
            if values.numel() != count:
                raise ProtocolError(
                    f'input {entry.name!r} has {values.numel()} values in "data", its shape {list(entry.shape)} '
                    f"holds {count}"
                )
            return values.reshape(entry.shape)
        dtype = torch.uint8 if expected == "BOOL" else getattr(torch, self._spec.inputs[index].dtype)
        if len(chunk) != count * dtype.itemsize:
            raise ProtocolError(
                f"input {entry.name!r} has {len(chunk)} bytes of binary data, its shape {list(entry.shape)} "
                f"of {expected} takes {count * dtype.itemsize}"
            )
        return torch.frombuffer(bytearray(chunk), dtype=dtype).reshape(entry.shape)

    # -- answers ----------------------------------------------------------------------------------

    def encode(self, request: InferRequest, outputs: Any, cut: Optional[Cut]) -> Answer:
        """The answer to `request` from the model's outputs (each tensor `cut` first, where the call
        ran other requests too). An output the model does not have is a 400 answered here: it is
        known only once the model has answered, and it is this request's fault alone, not the
        batch's. OutputError for an output the protocol cannot carry, as the codec's encoders."""
        leaves = dict(trees.leaves(outputs))
        try:
            chosen = _chosen(request, list(leaves))
        except ProtocolError as exc:
            return Answer.error(exc.status, str(exc))
        entries: list[dict[str, Any]] = []
        raws: list[bytes] = []
        for output in chosen:
            tensor = _tensor(output.name, leaves[output.name], cut)
            entry: dict[str, Any] = {
                "name": output.name,
                "datatype": _datatype(output.name, tensor),
                "shape": list(tensor.shape),
            }
            if output.binary:
                raws.append(_raw(tensor))
                entry["parameters"] = {"binary_data_size": len(raws[-1])}
            else:
                entry["data"] = _json_data(output.name, tensor)
            entries.append(entry)
        named = {"id": request.id} if request.id is not None else {}
        header = _json_bytes({"model_name": self.model_name, **named, "outputs": entries})
        if not raws:
            return Answer(200, header, JSON)
        return Answer(200, header + b"".join(raws), BINARY, ((HEADER_LENGTH, str(len(header))),))


def split_body(body: bytes, header_length: Optional[str]) -> tuple[bytes, memoryview]:
    """The body's JSON and the binary data after it, as `Inference-Header-Content-Length` divides them."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} {header_length!r} is not a number of bytes") from None
    if not 0 < length <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {length} does not fit the body's {len(body)} bytes")
    return body[:length], memoryview(body)[length:]


def parse_request(header: bytes) -> InferRequest:
    """An inference request's JSON, each field checked; ProtocolError naming the first that is wrong."""
    document = _object(_parse_json(header), "the request")
    _no_other_keys(document, _REQUEST_KEYS, "the request")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError('"id" is not a string')
    if "inputs" not in document:
        raise ProtocolError('the request has no "inputs": send [{"name", "shape", "datatype", "data"}, ...]')
    inputs = tuple(_input(i, value) for i, value in enumerate(_list(document["inputs"], '"inputs"')))
    parameters = _parameters(document, "the request")
    if parameters.get("sequence_id"):
        raise ProtocolError("sequence_id is not served: the model keeps no state between requests")
    binary_output = _flag(parameters, "binary_data_output", "the request")
    outputs = None
    if "outputs" in document:
        outputs = tuple(
            _requested(i, value, binary_output) for i, value in enumerate(_list(document["outputs"], '"outputs"'))
        )
        names = [output.name for output in outputs]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:
            raise ProtocolError(f"output {twice!r} is asked for twice")
    return InferRequest(request_id, inputs, outputs, binary_output)


def binary_chunks(inputs: Sequence[InputTensor], binary: bytes | memoryview) -> dict[str, memoryview]:
    """Each binary input's bytes, taken in the order the inputs are listed."""
    sizes = [(entry.name, entry.binary_size) for entry in inputs if entry.binary_size is not None]
    total = sum(size for _, size in sizes)
    if total != len(binary):
        hint = f"; send {HEADER_LENGTH} with the JSON's length" if total and not len(binary) else ""
        raise ProtocolError(
            f"the body has {len(binary)} bytes after its JSON, its inputs' binary_data_size add up to {total}{hint}"
        )
    chunks, offset = {}, 0
    view = memoryview(binary)
    for name, size in sizes:
        chunks[name] = view[offset : offset + size]
        offset += size
    return chunks


def _input(index: int, value: Any) -> InputTensor:
    entry = _object(value, f"inputs[{index}]")
    name = _string(entry, "name", f"inputs[{index}]")
    where = f"input {name!r}"
    _no_other_keys(entry, _INPUT_KEYS, where)
    datatype = _string(entry, "datatype", where)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(size, int) and not isinstance(size, bool) for size in shape):
        raise ProtocolError(f'{where}: "shape" is not a list of sizes')
    if any(size < 0 for size in shape):
        raise ProtocolError(f"{where}: shape {shape} has a negative size")
    parameters = _parameters(entry, where)
    if "shared_memory_region" in parameters:
        raise ProtocolError(f"{where}: shared memory is not served; send the data in the body")
    size = parameters.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise ProtocolError(f"{where}: binary_data_size is not a number of bytes")
    if size is not None and "data" in entry:
        raise ProtocolError(f'{where} has both "data" and binary_data_size; send one')
    if size is None and "data" not in entry:
        raise ProtocolError(f'{where} has no "data" (nor binary_data_size)')
    return InputTensor(name, datatype, tuple(shape), entry.get("data"), size)


def _requested(index: int, value: Any, binary_output: bool) -> RequestedOutput:
    entry = _object(value, f"outputs[{index}]")
    name = _string(entry, "name", f"outputs[{index}]")
    where = f"output {name!r}"
    _no_other_keys(entry, _OUTPUT_KEYS, where)
    parameters = _parameters(entry, where)
    for unserved in ("classification", "shared_memory_region"):
        if unserved in parameters:
            raise ProtocolError(f"{where}: {unserved} is not served; ask for the tensor")
    binary = _flag(parameters, "binary_data", where) if "binary_data" in parameters else binary_output
    return RequestedOutput(name, binary)


def _chosen(request: InferRequest, names: list[str]) -> list[RequestedOutput]:
    if request.outputs is None:
        return [RequestedOutput(name, request.binary_output) for name in names]
    for output in request.outputs:
        if output.name not in names:
            raise ProtocolError(f"unknown output {output.name!r}; the model's outputs are {', '.join(names)}")
    return list(request.outputs)


def _tensor(name: str, leaf: Any, cut: Optional[Cut] = None) -> torch.Tensor:
    """An output leaf as a tensor on the CPU: a tensor cut to the request's rows, a number as a 0-d tensor."""
    if isinstance(leaf, torch.Tensor):
        return (cut(leaf) if cut else leaf).detach().cpu()
    if type(leaf) in _NUMBER_DTYPES:
        try:
            return torch.tensor(leaf, dtype=_NUMBER_DTYPES[type(leaf)])
        except (RuntimeError, OverflowError):
            raise OutputError(f"{name} is {leaf}, which no datatype of the protocol holds") from None
    raise OutputError(f"{name} is a {type(leaf).__name__}, which the v2 protocol cannot carry")


def _datatype(name: str, tensor: torch.Tensor) -> str:
    datatype = _OUTPUT_DATATYPES.get(tensor.dtype)
    if datatype is None:
        raise OutputError(f"{name} is a {tensor.dtype} tensor, which the v2 protocol has no datatype for")
    return datatype


def _raw(tensor: torch.Tensor) -> bytes:
    """A tensor's elements as bytes in row-major order (bfloat16 and bool too: reinterpreted as bytes)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _json_data(name: str, tensor: torch.Tensor) -> list[Any]:
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise NotFinite(f"{name} holds NaN or Inf, which JSON cannot carry; ask for it with binary_data")
    return tensor.reshape(-1).tolist()


def _fits(shape: Sequence[int], model_shape: Sequence[int]) -> bool:
    """Whether a request's shape is one the metadata's allows (-1: any size)."""
    return len(shape) == len(model_shape) and all(
        want in (-1, got) for want, got in zip(model_shape, shape, strict=True)
    )


def _dims(shape: Sequence[int | str]) -> list[int]:
    """A config's shape as the protocol's metadata: -1 for every bucketed dimension (a name)."""
    return [-1 if isinstance(dim, str) else dim for dim in shape]


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _parse_json(header: bytes) -> Any:
    try:
        return json.loads(header, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"the request is not valid JSON: {first_line(exc)}") from None
    except RecursionError:
        raise ProtocolError("the request nests deeper than JSON is parsed here") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where} is not a JSON object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{where} is not a JSON array")
    return value


def _string(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f'{where} has no "{key}" string')
    return value


def _parameters(entry: dict[str, Any], where: str) -> dict[str, Any]:
    return _object(entry.get("parameters", {}), f"{where}: parameters")


def _flag(parameters: dict[str, Any], key: str, where: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}: {key} is not true or false")
    return value


def _no_other_keys(entry: dict[str, Any], keys: Sequence[str], where: str) -> None:
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ProtocolError(f"unknown key {unknown[0]!r} in {where}; it takes {', '.join(keys)}")
