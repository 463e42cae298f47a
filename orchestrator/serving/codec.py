"""What `orchestrate serve` does with a request between HTTP and the model: a body in, tensors
checked against the config's inputs, several requests joined into one call along the bucket
dimension, the call's outputs cut back per request and encoded as the request was.

    codec = RequestCodec(spec, device)
    request = codec.decode(body, NPZ if npz else JSON)   # RequestError: the client's fault, its .status
    args, kwargs = codec.join([request, other])          # one call for both
    first, second = codec.split(model(*args, **kwargs), [request, other])   # Answer per request

Two wire formats. JSON (`{"inputs": [...]}` in, `{"outputs": ...}` out) is the one any client
can send; for tensors of thousands of numbers its text dominates a fast model's time. NumPy's
`.npz` (`numpy.savez`: one array per input, named by the config's input name or `arr_<i>` in
config order) carries the bytes as they are; its answer is an `.npz` with one array per output
tensor, named by its path in the output tree (`output`, `output.logits`, `output[0]`).

Another protocol (orchestrator.serving.inference_protocol, the Open Inference Protocol) reads its
own bodies into tensors and makes them requests here (`request`), which are checked the same way,
join the same batches and are cut back the same way; the protocol writes their answers itself
(`Request.encoder`).

A request is checked completely before it joins others, so one malformed request never fails
the requests batched with it. The checks are the config's: count and names of the inputs, rank,
fixed dimensions, one size along the bucket dimension, values the input's dtype can hold, and
integer inputs within their `range` (an out-of-range token id would index past an embedding),
and at most `serve.max_rows` along the bucket dimension (HTTP 413 above it). A body that cannot be
read at all (JSON nested past the parser's depth, an archive whose zip structure or .npy headers do
not hold up) is refused the same way, naming what is wrong.
"""

from __future__ import annotations

import bisect
import io
import json
import math
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from orchestrator.jobs import grid as grid_shapes
from orchestrator.jobs import trees
from orchestrator.jobs.errors import first_line
from orchestrator.jobs.spec import FLOAT_DTYPES, InputSpec, WarmupSpec


class RequestError(ValueError):
    """A request the client has to fix: one line naming the input and what is wrong."""

    status = 400  # the HTTP status the server answers it with


class TooManyRows(RequestError):
    """A request of more rows along the bucket dimension than `serve.max_rows`."""

    status = 413


class OutputError(ValueError):
    """Model outputs that the wire format cannot carry (in JSON: NaN, Inf, complex numbers, other
    objects; in .npz: anything but tensors and numbers): the server's fault, 500."""

    status = 500


class NotFinite(OutputError):
    """NaN or Inf in an answer asked for in JSON: a finite request can overflow in the model, and
    the client's choice of format is what cannot carry it; another format it can ask for does."""

    status = 422


JSON = "application/json"
NPZ = "application/x-npz"
WIRES = (JSON, NPZ)
# an .npz may be compressed: what its arrays unpack to is bounded before any is read
MAX_NPZ_BYTES = 1 << 30
# how numpy.savez and numpy.savez_compressed store their members; zipfile's other methods
# (bzip2, lzma) need modules a Python build may lack, and no client of this server writes them
NPZ_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
# what zipfile raises for a member it cannot unpack: a bad CRC, a stream cut short, a corrupt
# deflate stream, a flag it does not implement, an encryption it needs a password for
_UNZIP_ERRORS = (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, RuntimeError)
# how deep the search for a non-number in a JSON array goes: deeper than any input's rank, and
# far below the interpreter's recursion limit, whatever the body nests
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Answer:
    """One request's HTTP answer: status, body, its media type and any headers of its own."""

    status: int
    body: bytes
    media_type: str
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def error(cls, status: int, message: str) -> Answer:
        return cls(status, _json_bytes({"error": message}), JSON)


# Takes one request's rows out of a tensor of a call that ran other requests too
Cut = Callable[[torch.Tensor], torch.Tensor]
# Writes one request's answer from a call's outputs and its cut (None: the call was its alone)
Encoder = Callable[[Any, Optional[Cut]], Answer]


@dataclass(frozen=True)
class Request:
    """One decoded request: the model's arguments as tensors on its device, and its size along
    the bucket dimension."""

    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]
    size: int
    wire: str = JSON  # how it came, and how its answer goes
    # a protocol of its own (orchestrator.serving.inference_protocol) writes the answer; None: `wire`'s
    encoder: Optional[Encoder] = None
    # a grid's request: its size in each other dimension (`{"seq": 71}`); empty in the list form
    sizes: dict[str, int] = field(default_factory=dict)
    # the output leaves its answer carries, by path (`output.logits`); None: every one
    outputs: Optional[frozenset[str]] = None


@dataclass(frozen=True)
class _Input:
    spec: InputSpec
    label: str
    dtype: torch.dtype
    bucket_dims: tuple[int, ...]
    # every dimension that follows a request's size, by name: the bucket's and a grid's others
    sized_dims: tuple[tuple[int, str], ...]


class RequestCodec:
    """Decodes requests for one model config and shapes batches of them."""

    def __init__(
        self, spec: WarmupSpec, device: torch.device | str, grid_dims: Optional[grid_shapes.GridDims] = None
    ) -> None:
        """grid_dims: a grid replica's output dimensions by grid dimension (GridModel.dims), which
        cutting a joined call's answer back to each request's own sizes needs."""
        self.device = torch.device(device)
        self.symbol = spec.bucket_symbol
        self.largest_bucket = max(spec.buckets)
        self.oversize = spec.serve.oversize
        self.max_rows = spec.max_request_rows
        self._inputs = [
            _Input(
                spec=item,
                label=f"inputs[{i}]" + (f" ({item.name})" if item.name else ""),
                dtype=getattr(torch, item.dtype),
                bucket_dims=tuple(d for d, dim in enumerate(item.shape) if dim == spec.bucket_symbol),
                sized_dims=tuple(
                    (d, dim)
                    for d, dim in enumerate(item.shape)
                    if dim == spec.bucket_symbol or dim in (spec.grid or {})
                ),
            )
            for i, item in enumerate(spec.inputs)
        ]
        # Requests join along the bucket dimension: possible where every input has exactly one.
        # An input without one (the same for every row) or with several (a [seq, seq] mask) makes
        # each request a call of its own.
        # A grid's requests join where they fall in the same sizes of its other dimensions (seq 40
        # and 61 both in 64): each is padded to the longest of its call with its inputs' pad values,
        # as the replica pads any request to its point (proven harmless at warmup), and its answer
        # is cut back to its own sizes, which takes the replica's output dimensions.
        self.joinable = all(len(entry.bucket_dims) == 1 for entry in self._inputs) and (
            not spec.grid or grid_dims is not None
        )
        self._grid_dims = grid_dims or {}
        self._grid = spec.grid or {}
        self._shaper = grid_shapes.InputShaper(spec) if spec.grid else None
        # the largest size a grid takes in each of its other dimensions: above it, 413
        self._largest = {dim: max(sizes) for dim, sizes in self._grid.items()}
        # The dimension outputs most likely share with the inputs, for an output tensor with
        # several dimensions of the batch's size
        self._preferred_dim = next(entry.bucket_dims[0] for entry in self._inputs if entry.bucket_dims)
        # what a client that names every input calls them: the config's name, else NumPy's
        # `arr_<i>` in config order (numpy.savez's names for unnamed arrays)
        self.input_names = [entry.spec.name or f"arr_{i}" for i, entry in enumerate(self._inputs)]

    # -- requests ---------------------------------------------------------------------------------

    def decode(self, body: bytes | str, wire: str = JSON) -> Request:
        """A request body as tensors on the model's device; RequestError for anything the config
        does not accept. JSON: `{"inputs": [...]}` in config order or `{"inputs": {name: ...}}`;
        NPZ: one array per input (see the module's docstring)."""
        if wire == NPZ:
            tensors = self._npz_tensors(body)
        elif wire == JSON:
            tensors = self._json_tensors(body)
        else:
            raise RequestError(f"Content-Type {wire!r} is not served; send {JSON} or {NPZ}")
        return self._request(tensors, wire)

    def request(
        self, tensors: Sequence[torch.Tensor], encoder: Encoder, outputs: Optional[frozenset[str]] = None
    ) -> Request:
        """Tensors decoded by another protocol, one per input in config order, checked as a body's
        are (shape, then values) and moved to the model's device: a request whose answer `encoder`
        writes, from the output leaves named in `outputs` alone (None: every one). RequestError as
        `decode`."""
        if len(tensors) != len(self._inputs):
            raise ValueError(f"{len(tensors)} tensors for a model of {len(self._inputs)} inputs")
        checked = [self._checked(entry, tensor) for entry, tensor in zip(self._inputs, tensors, strict=True)]
        return self._request(checked, JSON, encoder, outputs)

    def tensor_from_json(self, index: int, value: Any, body: bytes | str) -> torch.Tensor:
        """Input `index` as JSON gives it (a nested list of numbers) as a tensor that holds them
        exactly, its shape not yet checked; `body`, the JSON it came in, says whether true/false
        must be looked for. RequestError for anything but numbers."""
        return self._from_json(self._inputs[index], value, _spells_a_boolean(body))

    def _request(
        self,
        tensors: list[torch.Tensor],
        wire: str,
        encoder: Optional[Encoder] = None,
        outputs: Optional[frozenset[str]] = None,
    ) -> Request:
        sizes = self._sizes(tensors)
        size = sizes.pop(self.symbol)
        if self.oversize == "error" and size > self.largest_bucket:
            raise RequestError(
                f"a request of {size} is larger than the largest bucket {self.largest_bucket} "
                "(serve.oversize: error); send at most that many"
            )
        args = tuple(t for entry, t in zip(self._inputs, tensors, strict=True) if not entry.spec.name)
        kwargs = {entry.spec.name: t for entry, t in zip(self._inputs, tensors, strict=True) if entry.spec.name}
        return Request(args, kwargs, size, wire, encoder, sizes, outputs)

    def _json_tensors(self, body: bytes | str) -> list[torch.Tensor]:
        try:
            data = json.loads(body, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"the body is not valid JSON: {first_line(exc)}") from None
        except RecursionError:  # the parser recurses per level: its depth is the interpreter's limit
            raise RequestError(
                "the body nests deeper than JSON is parsed here; an input of n dimensions is n nested arrays"
            ) from None
        if not isinstance(data, dict):
            raise RequestError(f'the body is a JSON {_json_type(data)}; send an object {{"inputs": [...]}}')
        if "inputs" not in data:
            raise RequestError('the body has no "inputs": send {"inputs": [...]}, one array per config input')
        unknown = sorted(set(data) - {"inputs"})
        if unknown:
            raise RequestError(f'unknown key {unknown[0]!r} in the body; it takes "inputs" only')
        values = self._by_input(data["inputs"])
        # JSON's true and false are numbers to Python and torch: only a body that spells one is searched
        booleans = _spells_a_boolean(body)
        return [
            self._checked(entry, self._from_json(entry, value, booleans))
            for entry, value in zip(self._inputs, values, strict=True)
        ]

    def _npz_tensors(self, body: bytes | str) -> list[torch.Tensor]:
        data = body.encode() if isinstance(body, str) else body
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
            members = archive.infolist()
        except (zipfile.BadZipFile, ValueError, NotImplementedError) as exc:  # the last: a zip version it lacks
            raise RequestError(f"the body is not an .npz (numpy.savez) archive: {first_line(exc)}") from None
        unpacked = sum(info.file_size for info in members)
        if unpacked > MAX_NPZ_BYTES:
            raise RequestError(
                f"the .npz unpacks to {unpacked} bytes, more than {MAX_NPZ_BYTES}; send smaller requests"
            )
        arrays: dict[str, zipfile.ZipInfo] = {}
        for info in members:
            _check_member(info, len(data))
            name = info.filename.removesuffix(".npy")
            if name in arrays:
                raise RequestError(f"the .npz holds {info.filename!r} twice")
            arrays[name] = info
        wanted = self.input_names
        for name in arrays:
            if name not in wanted:
                raise RequestError(
                    f"unknown array {name!r} in the .npz; send {', '.join(wanted)} "
                    "(the config's input names, arr_<i> for unnamed inputs)"
                )
        tensors = []
        for entry, name in zip(self._inputs, wanted, strict=True):
            if name not in arrays:
                raise RequestError(f"the .npz lacks {entry.label} (array {name!r})")
            tensors.append(self._npy(entry, archive, arrays[name]))
        return tensors

    def _npy(self, entry: _Input, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> torch.Tensor:
        """A member as the input's tensor on the model's device. Its .npy header is checked before
        any data is read: its dtype, its size against what the member holds (a header may claim
        any shape; nothing is allocated for more than the body unpacks to), its shape against the
        config's."""
        import numpy as np

        where = f"{entry.label} (array {info.filename!r})"
        try:
            with archive.open(info) as stream:
                shape, fortran_order, dtype = _npy_header(stream)
                if dtype.kind not in "biuf" or dtype.itemsize > 8:
                    raise RequestError(f"{entry.label} is an array of {dtype}; send numbers")
                size = math.prod(shape) * dtype.itemsize
                held = info.file_size - stream.tell()
                if size != held:
                    raise RequestError(
                        f"{where}: its .npy header declares {shape} {dtype} ({size} bytes), the member holds {held}"
                    )
                self._check_shape(entry, shape)
                raw = stream.read(size + 1)
        except RequestError:
            raise
        except ValueError as exc:  # numpy's word for an .npy header it cannot read
            raise RequestError(f"{where} is not an .npy array: {first_line(exc)}") from None
        except _UNZIP_ERRORS as exc:
            raise RequestError(f"{where} cannot be unpacked: {first_line(exc)}") from None
        if len(raw) != size:  # the zip's sizes lied, and its CRC with them
            raise RequestError(f"{where} unpacks to {len(raw)} bytes of data, its .npy header declares {size}")
        array = np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran_order else "C")
        if not dtype.isnative:
            array = array.astype(dtype.newbyteorder("="))
        return self._values(entry, torch.tensor(array)).to(self.device)

    def _by_input(self, inputs: Any) -> list[Any]:
        expected = len(self._inputs)
        if isinstance(inputs, list):
            if len(inputs) != expected:
                labels = ", ".join(entry.label for entry in self._inputs)
                raise RequestError(f'"inputs" has {len(inputs)} arrays, the model takes {expected}: {labels}')
            return inputs
        if isinstance(inputs, dict):
            unnamed = [entry.label for entry in self._inputs if not entry.spec.name]
            if unnamed:
                raise RequestError(f'{unnamed[0]} has no name in the config; send "inputs" as a list in config order')
            names = [entry.spec.name for entry in self._inputs]
            for key in inputs:
                if key not in names:
                    raise RequestError(
                        f'unknown input {key!r} in "inputs"; the config names {", ".join(map(str, names))}'
                    )
            for entry in self._inputs:
                if entry.spec.name not in inputs:
                    raise RequestError(f'"inputs" lacks {entry.label}')
            return [inputs[name] for name in names]
        raise RequestError(f'"inputs" is a JSON {_json_type(inputs)}; send a list with one array per config input')

    def _from_json(self, entry: _Input, value: Any, booleans: bool = True) -> torch.Tensor:
        """A JSON array as a tensor that holds its numbers exactly, as float64 where any is not
        whole (JSON's numbers are doubles: a float16 input is rounded once, from them). True and
        false are refused for a number input: `booleans` says whether the body may hold any."""
        if isinstance(value, (dict, str)) or value is None:
            raise RequestError(f"{entry.label} is a JSON {_json_type(value)}, not an array of numbers")
        if booleans and entry.spec.dtype != "bool":
            found = _non_number(value, booleans=False)
            if found is not None and isinstance(found[1], bool):
                where, leaf = found
                raise RequestError(_holds_booleans(entry, f" ({entry.label}{where} is {_shown(leaf)})"))
        try:
            tensor = torch.tensor(value, dtype=torch.float64 if entry.spec.dtype in FLOAT_DTYPES else None)
            if tensor.is_floating_point() and tensor.dtype != torch.float64:
                # torch's guess for mixed numbers is float32, exact only up to 2**24
                tensor = torch.tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            odd = _non_number(value)
            if odd is not None:
                where, leaf = odd
                raise RequestError(f"{entry.label}{where} is {_shown(leaf)}, not a number") from None
            raise RequestError(f"{entry.label} is not a rectangular array of numbers: {first_line(exc)}") from None
        return tensor

    def _checked(self, entry: _Input, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the input's tensor on the model's device: shape first, then its values."""
        self._check_shape(entry, tuple(tensor.shape))
        return self._values(entry, tensor).to(self.device)

    def _check_shape(self, entry: _Input, shape: tuple[int, ...]) -> None:
        config = entry.spec.shape
        shown = "[" + ", ".join(map(str, config)) + "]"
        if len(shape) != len(config):
            raise RequestError(
                f"{entry.label} has {len(shape)} dimensions {list(shape)}, expected {len(config)}: {shown}"
            )
        for dim, want in enumerate(config):
            if isinstance(want, int) and shape[dim] != want:
                raise RequestError(f"{entry.label} has size {shape[dim]} at dim {dim}, expected {want}: {shown}")
        if math.prod(shape) == 0:
            raise RequestError(f"{entry.label} is empty; a request needs at least one row")
        for dim, want in enumerate(config):
            if isinstance(want, str) and want in self._largest and shape[dim] > self._largest[want]:
                raise TooManyRows(
                    f"{entry.label} has {shape[dim]} at dim {dim} ({want}), more than the largest {want} bucket "
                    f"{self._largest[want]}; send at most that many"
                )
        for dim in entry.bucket_dims:
            if self.max_rows is not None and shape[dim] > self.max_rows:
                raise TooManyRows(
                    f"{entry.label} has {shape[dim]} at dim {dim} ({self.symbol}), more than serve.max_rows "
                    f"{self.max_rows}; send at most that many a request"
                )

    def _values(self, entry: _Input, tensor: torch.Tensor) -> torch.Tensor:
        dtype = entry.spec.dtype
        if tensor.dtype == torch.bool and dtype != "bool":
            raise RequestError(_holds_booleans(entry))
        if dtype in FLOAT_DTYPES:
            converted = tensor.to(entry.dtype)
            if not torch.isfinite(converted).all():
                raise RequestError(f"{entry.label} holds values too large for {dtype}")
            return converted
        if dtype == "bool":
            if tensor.dtype != torch.bool and (tensor.is_floating_point() or ((tensor != 0) & (tensor != 1)).any()):
                raise RequestError(f"{entry.label} is bool: send true/false (or 0/1)")
            return tensor.to(torch.bool)
        if tensor.is_floating_point():
            if (tensor != tensor.round()).any():
                raise RequestError(f"{entry.label} holds numbers with a fraction; it is {dtype}: send whole numbers")
        assert entry.spec.range is not None  # the spec requires a range for integer inputs
        info = torch.iinfo(entry.dtype)
        low, high = max(entry.spec.range[0], info.min), min(entry.spec.range[1], info.max + 1)
        outside = (tensor < low) | (tensor >= high)
        if outside.any():
            raise RequestError(f"{entry.label} holds {tensor[outside][0].item():g}, outside its range [{low}, {high})")
        return tensor.to(entry.dtype)

    def _sizes(self, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
        """The request's size in each dimension that follows it (the bucket's, and a grid's
        others), the same in every input that has it: a request is joined and padded as a whole,
        so one that disagrees with itself is refused here."""
        found: dict[str, tuple[int, str]] = {}
        for entry, tensor in zip(self._inputs, tensors, strict=True):
            for dim, name in entry.sized_dims:
                size, first = found.setdefault(name, (tensor.shape[dim], entry.label))
                if tensor.shape[dim] != size:
                    raise RequestError(
                        f"{entry.label} has {tensor.shape[dim]} at dim {dim} ({name}) where {first} has "
                        f"{size}; every input needs the same {name}"
                    )
        assert self.symbol in found  # the spec requires an input with the bucket symbol
        return {name: size for name, (size, _) in found.items()}

    # -- batches ----------------------------------------------------------------------------------

    def groups(self, requests: Sequence[Request]) -> list[list[int]]:
        """Which requests run as one call (indices, in order). All of them where they can be
        joined; with `serve.oversize: error`, as many consecutive ones as fit the largest bucket,
        since the model refuses a call larger than it."""
        if not self.joinable:
            return [[i] for i in range(len(requests))]
        limit = self.largest_bucket if self.oversize == "error" else math.inf
        out: list[list[int]] = []
        # a group per size in the other dimensions of a grid, each filled as the list form's one
        open_groups: dict[tuple[int, ...], tuple[list[int], int]] = {}
        for i, request in enumerate(requests):
            key = self._grid_sizes(request)
            group, rows = open_groups.get(key, (None, 0))
            if group is not None and rows + request.size <= limit:
                group.append(i)
                open_groups[key] = (group, rows + request.size)
            else:
                out.append([i])
                open_groups[key] = (out[-1], request.size)
        return out

    def _grid_sizes(self, request: Request) -> tuple[int, ...]:
        """The grid's smallest sizes that hold the request in its other dimensions: requests that
        share them pay no more padding joined than alone (none in the list form)."""
        key = []
        for name, sizes in self._grid.items():
            at = bisect.bisect_left(sizes, request.sizes[name])
            key.append(sizes[min(at, len(sizes) - 1)])
        return tuple(key)

    def join(self, requests: Sequence[Request]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """The model's arguments for these requests as one call: each input concatenated along
        its bucket dimension, in request order."""
        if len(requests) == 1:
            return requests[0].args, requests[0].kwargs
        if not self.joinable:
            raise ValueError("these inputs cannot be joined: an input has no bucket dimension, or several")
        calls = [(r.args, r.kwargs) for r in requests]
        if self._shaper is not None:  # a grid: each request padded to the call's sizes
            longest = {name: max(r.sizes[name] for r in requests) for name in self._grid}
            calls = [self._shaper.pad(args, kwargs, longest) for args, kwargs in calls]
        positional = [entry for entry in self._inputs if not entry.spec.name]
        named = [entry for entry in self._inputs if entry.spec.name]
        args = tuple(
            torch.cat([call[0][i] for call in calls], dim=entry.bucket_dims[0]) for i, entry in enumerate(positional)
        )
        kwargs = {
            str(entry.spec.name): torch.cat([call[1][str(entry.spec.name)] for call in calls], dim=entry.bucket_dims[0])
            for entry in named
        }
        return args, kwargs

    def to_host(self, outputs: Any, requests: Sequence[Request]) -> Any:
        """The outputs of one call for these requests, every tensor that some request's answer
        carries copied to the host once for all of them: each request's rows are then a view of
        that copy. A tensor no request carries stays where it is, unread. Once this returns, the
        call's outputs may be overwritten (the next replay of a CUDA graph overwrites what the
        replica's `borrow()` returned)."""
        if self.device.type == "cpu":  # a model on the host answers there: nothing to read
            return outputs
        wanted: Optional[set[str]] = set()
        for request in requests:
            wanted = None if wanted is None or request.outputs is None else wanted | request.outputs

        # on CUDA the copies are queued together (into pinned memory) and waited for once; on
        # another device each copy waits for itself
        queued = self.device.type == "cuda"
        copies: list[torch.Tensor] = []

        def moved(path: str, leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu" and (wanted is None or path in wanted):
                copies.append(leaf.to("cpu", non_blocking=queued))
                return copies[-1]
            return leaf

        on_host = trees.map_leaves(outputs, moved)
        if copies and queued:
            torch.cuda.current_stream(self.device).synchronize()
        return on_host

    def split(self, outputs: Any, requests: Sequence[Request]) -> list[Answer]:
        """Outputs of one call for these requests, as each request's answer in its own wire
        format. A tensor is cut along its dimension of the call's total size (the inputs' bucket
        dimension where several match); a tensor without one, and any other leaf, goes whole to
        every request. OutputError for what a request's format cannot carry."""
        total = sum(request.size for request in requests)
        answers = []
        offset = 0
        for request in requests:
            cut: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
            own = outputs
            if len(requests) > 1:
                cut = lambda t, start=offset, length=request.size: self._cut(t, total, start, length)  # noqa: E731
                if self._shaper is not None:  # its rows, then its own sizes in the grid's other dimensions
                    own = grid_shapes.cut_outputs(self._rows(outputs, cut), self._grid_dims, request.sizes)
                    cut = None
            answers.append(request.encoder(own, cut) if request.encoder else encode(own, request.wire, cut))
            offset += request.size
        return answers

    @staticmethod
    def _rows(outputs: Any, cut: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        return trees.map_leaves(outputs, lambda _, leaf: cut(leaf) if isinstance(leaf, torch.Tensor) else leaf)

    def _cut(self, tensor: torch.Tensor, total: int, start: int, length: int) -> torch.Tensor:
        dims = [d for d, size in enumerate(tensor.shape) if size == total]
        if not dims:
            return tensor
        dim = self._preferred_dim if self._preferred_dim in dims else dims[0]
        return tensor.narrow(dim, start, length)


def encode(outputs: Any, wire: str, cut: Any = None) -> Answer:
    """A 200 answer carrying `outputs` (each tensor `cut` first) in the wire format."""
    if wire == NPZ:
        return Answer(200, to_npz(outputs, cut), NPZ)
    return Answer(200, _json_bytes({"outputs": to_json(outputs, cut)}), JSON)


def to_npz(outputs: Any, cut: Any = None) -> bytes:
    """Model outputs as an .npz: one array per tensor or number, named by its path in the tree."""
    import io

    import numpy as np

    arrays: dict[str, Any] = {}

    for path, node in trees.leaves(outputs):
        if isinstance(node, torch.Tensor):
            tensor = (cut(node) if cut else node).detach().cpu()
            if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16; float32 holds it exactly
                tensor = tensor.float()
            arrays[path] = tensor.numpy()
        elif isinstance(node, (bool, int, float)):
            arrays[path] = np.asarray(node)
        else:
            raise OutputError(f"{path} is a {type(node).__name__}, which an .npz cannot carry; ask for JSON")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _json_bytes(value: Any) -> bytes:
    # as starlette's JSONResponse renders: compact, UTF-8, NaN refused
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def to_json(node: Any, cut: Any = None, path: str = "output") -> Any:
    """Model outputs as JSON values: tensors as nested lists (`cut` applied to each first),
    tuples, lists and pytree nodes as lists, mappings (HF ModelOutput too), named tuples,
    dataclasses and Hugging Face caches as objects (orchestrator.jobs.trees),
    None/bool/int/float/str as they are."""
    if isinstance(node, torch.Tensor):
        tensor = (cut(node) if cut else node).detach()
        if tensor.is_complex():
            raise OutputError(f"{path} is a complex tensor, which JSON cannot carry")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise NotFinite(f"{path} holds NaN or Inf, which JSON cannot carry; ask for {NPZ}, which does")
        return tensor.cpu().tolist()
    split = trees.children(node)
    if split is not None:
        if split.keyed:
            return {str(key): to_json(value, cut, trees.path_of(path, key)) for key, value in split.items}
        return [to_json(value, cut, trees.path_of(path, key)) for key, value in split.items]
    if isinstance(node, float) and not math.isfinite(node):
        raise OutputError(f"{path} is {node}, which JSON cannot carry")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise OutputError(f"{path} is a {type(node).__name__}, which JSON cannot carry")


def _non_number(value: Any, booleans: bool = True, depth: int = 0) -> Optional[tuple[str, Any]]:
    """Where a nested list holds something other than a number (or a boolean, unless `booleans`
    is False), and that leaf. The search goes _MAX_DEPTH lists deep."""
    if isinstance(value, list):
        if depth == _MAX_DEPTH:
            return None
        for i, item in enumerate(value):
            found = _non_number(item, booleans, depth + 1)
            if found is not None:
                return f"[{i}]{found[0]}", found[1]
        return None
    if isinstance(value, (int, float)) and (booleans or not isinstance(value, bool)):
        return None
    return "", value


def _shown(leaf: Any) -> str:
    """A JSON leaf as a message shows it: containers by their type, anything else as JSON."""
    if isinstance(leaf, (dict, list)):
        return f"a JSON {_json_type(leaf)}"
    shown = json.dumps(leaf)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _spells_a_boolean(body: bytes | str) -> bool:
    if isinstance(body, str):
        return "true" in body or "false" in body
    return b"true" in body or b"false" in body


def _holds_booleans(entry: _Input, where: str = "") -> str:
    dtype = entry.spec.dtype
    numbers = "numbers" if dtype in FLOAT_DTYPES else "whole numbers"
    return f"{entry.label} holds true/false; it is {dtype}: send {numbers}{where}"


def _check_member(info: zipfile.ZipInfo, body_bytes: int) -> None:
    """An .npz member as numpy.savez writes one: an .npy array, stored or deflated, not encrypted,
    whose sizes fit the body that carries it."""
    name = info.filename
    if not name.endswith(".npy"):
        raise RequestError(f"{name!r} in the .npz is not an .npy array; send numpy.savez archives")
    if info.compress_type not in NPZ_METHODS:
        raise RequestError(
            f"{name!r} in the .npz is compressed with method {info.compress_type}; "
            f"send numpy.savez or numpy.savez_compressed archives ({' or '.join(NPZ_METHODS.values())})"
        )
    if info.flag_bits & 0x1:
        raise RequestError(f"{name!r} in the .npz is encrypted; send numpy.savez archives")
    if info.compress_size > body_bytes:
        raise RequestError(f"{name!r} in the .npz claims {info.compress_size} bytes, the body has {body_bytes}")
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise RequestError(
            f"{name!r} in the .npz is stored in {info.compress_size} bytes and claims to unpack to {info.file_size}"
        )


def _npy_header(stream: Any) -> tuple[tuple[int, ...], bool, Any]:
    """An .npy file's shape, order and dtype, its data next in `stream`. ValueError for anything
    numpy.save would not have written."""
    from numpy.lib import format as npy

    version = npy.read_magic(stream)
    if version not in ((1, 0), (2, 0)):  # 3.0 is for structured dtypes' unicode field names: no input is one
        raise ValueError(f"format version {version[0]}.{version[1]}; numpy.save writes numbers in 1.0 or 2.0")
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    try:
        shape, fortran_order, dtype = read(stream)
    except (tokenize.TokenError, SyntaxError) as exc:  # numpy parses the header as Python's tokens
        raise ValueError(f"its header is not a Python literal ({exc.args[0] if exc.args else exc})") from None
    if any(size < 0 for size in shape):
        raise ValueError(f"shape {shape} has a negative size")
    return shape, fortran_order, dtype


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
