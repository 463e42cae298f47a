"""Malformed bodies on `orchestrate serve`'s decode path (orchestrator.serving.codec): every one is
the client's fault, a RequestError whose one line the server answers as a 400 JSON error, never an
exception the server would answer with a 500. A corpus of named bodies (JSON nested past the
parser's depth; .npz archives with bad CRCs, lying sizes, members that are not .npy arrays, .npy
headers that claim more than the member holds, compression methods numpy never writes), then
seeded random mutations of valid bodies."""

from __future__ import annotations

import io
import json
import random
import struct
import warnings
import zipfile
from collections.abc import Callable

import numpy as np
import pytest

from orchestrator.jobs.spec import WarmupSpec
from orchestrator.serving.codec import JSON, NPZ, Answer, RequestCodec, RequestError

SPEC = WarmupSpec.model_validate(
    {
        "model": {"factory": "models.py:mlp"},
        "inputs": [{"shape": ["batch", 4]}, {"shape": ["batch"], "dtype": "int64", "range": [0, 10], "name": "ids"}],
        "buckets": [1, 8],
    }
)
LOCAL, CENTRAL = b"PK\x03\x04", b"PK\x01\x02"  # a zip member's local header, its central directory entry


def savez(compressed: bool = False, rows: int = 2, **arrays: np.ndarray) -> bytes:
    arrays = arrays or {"arr_0": np.zeros((rows, 4), np.float32), "ids": np.zeros(rows, np.int64)}
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


def archive(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


def npy(data: bytes, version: tuple[int, int] = (1, 0), **header: object) -> bytes:
    """An .npy file of `data` under any header, true or not."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": (2, 4), **header})
    written = buffer.getvalue()
    return written[:6] + bytes(version) + written[8:] + data


def with_ids(member: bytes) -> bytes:
    """An archive of `member` as arr_0.npy beside a valid ids array."""
    return archive({"arr_0.npy": member, "ids.npy": savez_member(np.zeros(2, np.int64))})


def twice(member: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate it writes
        zipped.writestr("arr_0.npy", member)
        zipped.writestr("arr_0.npy", member)
        zipped.writestr("ids.npy", savez_member(np.zeros(2, np.int64)))
    return buffer.getvalue()


def savez_member(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def patched(body: bytes, signature: bytes, offset: int, fmt: str, value: int, every: bool = True) -> bytes:
    """`body` with a field of each zip header of `signature` (at `offset` in it) set to `value`."""
    out = bytearray(body)
    at = out.find(signature)
    while at >= 0:
        out[at + offset : at + offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
        at = out.find(signature, at + 1) if every else -1
    return bytes(out)


def flipped(body: bytes, at: int) -> bytes:
    out = bytearray(body)
    out[at] ^= 0xFF
    return bytes(out)


def first_data_byte(body: bytes) -> int:
    """Where the first member's .npy data begins in a stored archive."""
    header = body.find(b"\x93NUMPY")
    return header + 10 + struct.unpack("<H", body[header + 8 : header + 10])[0]


HUGE = npy(b"\0" * 64, shape=(2**40, 256))  # the header claims 2**48 floats; the member holds 64 bytes

CORPUS: dict[str, tuple[Callable[[], bytes | str], str]] = {
    # JSON nested past what the parser recurses into, at the top, inside "inputs", inside a leaf
    "arrays nested 100000 deep": (lambda: "[" * 100_000 + "]" * 100_000, JSON),
    "objects nested 100000 deep": (lambda: '{"a":' * 100_000 + "1" + "}" * 100_000, JSON),
    "an input nested 100000 deep": (lambda: '{"inputs": [' + "[" * 100_000 + "]" * 100_000 + ", [1]]}", JSON),
    **{
        f"an object nested {depth} deep where a number belongs": (
            lambda depth=depth: '{"inputs": [[[1, 2, 3, ' + '{"a":' * depth + "1" + "}" * depth + "]], [1]]}",
            JSON,
        )
        for depth in (500, 900, 950, 980, 990, 995)
    },
    **{
        f"a ragged input nested {depth} deep": (
            lambda depth=depth: '{"inputs": [[[1, 2, 3, 4], ' + "[" * depth + "]" * depth + "], [1, 2]]}",
            JSON,
        )
        for depth in (500, 900, 950, 980, 990, 995)
    },
    # archives whose zip structure lies
    "a bad CRC in a stored member": (lambda: flipped(savez(), first_data_byte(savez()) + 3), NPZ),
    "a bad CRC in a deflated member": (lambda: patched(savez(True), CENTRAL, 16, "<I", 0), NPZ),
    "a deflated stream cut short": (lambda: patched(savez(True), CENTRAL, 20, "<I", 20, every=False), NPZ),
    "a member claiming more than it holds": (
        lambda: patched(patched(savez(), LOCAL, 22, "<I", 10**6), CENTRAL, 24, "<I", 10**6),
        NPZ,
    ),
    "a member claiming less than it holds": (lambda: patched(savez(), CENTRAL, 24, "<I", 100, every=False), NPZ),
    "a deflated member claiming more than it holds": (
        lambda: patched(patched(savez(True), LOCAL, 22, "<I", 10**6), CENTRAL, 24, "<I", 10**6),
        NPZ,
    ),
    "a deflated member claiming less than it holds": (
        lambda: patched(savez(True), CENTRAL, 24, "<I", 100, every=False),
        NPZ,
    ),
    "a stored member whose sizes disagree": (lambda: patched(savez(), CENTRAL, 20, "<I", 10**6, every=False), NPZ),
    "a member past the end of the body": (lambda: patched(savez(), CENTRAL, 42, "<I", 10**6, every=False), NPZ),
    "an archive cut in half": (lambda: savez()[: len(savez()) // 2], NPZ),
    "an archive without its central directory": (lambda: savez()[: savez().find(CENTRAL)], NPZ),
    "compression method 99": (
        lambda: patched(patched(savez(), LOCAL, 8, "<H", 99), CENTRAL, 10, "<H", 99),
        NPZ,
    ),
    "compression method 99 in the central directory only": (
        lambda: patched(savez(), CENTRAL, 10, "<H", 99),
        NPZ,
    ),
    "bzip2, which numpy never writes": (
        lambda: archive({"arr_0.npy": savez_member(np.zeros((2, 4))), "ids.npy": b""}, zipfile.ZIP_BZIP2),
        NPZ,
    ),
    "an encrypted member": (lambda: patched(patched(savez(), LOCAL, 6, "<H", 1), CENTRAL, 8, "<H", 1), NPZ),
    "a member named twice": (lambda: twice(savez_member(np.zeros((2, 4), np.float32))), NPZ),
    # members that are not the .npy arrays they claim to be
    "a member that is not .npy": (lambda: archive({"arr_0": b"hello", "ids": b"world"}), NPZ),
    "a text member": (lambda: archive({"arr_0.txt": b"1,2,3,4"}), NPZ),
    "an .npy member without its magic": (lambda: with_ids(b"hello, this is not numpy"), NPZ),
    "an .npy member cut inside its header": (lambda: with_ids(npy(b"")[:20]), NPZ),
    "an .npy header of 2**40 x 256 elements": (lambda: with_ids(HUGE), NPZ),
    "the same header, deflated": (
        lambda: archive({"arr_0.npy": HUGE, "ids.npy": savez_member(np.zeros(2, np.int64))}, zipfile.ZIP_DEFLATED),
        NPZ,
    ),
    "an .npy header of fewer elements than its data": (lambda: with_ids(npy(b"\0" * 64, shape=(1, 4))), NPZ),
    "an .npy header of a negative size": (lambda: with_ids(npy(b"\0" * 32, shape=(-2, -4))), NPZ),
    "an .npy header of a huge negative size": (lambda: with_ids(npy(b"\0" * 32, shape=(-(2**62), -2))), NPZ),
    "an .npy header that is not a dict": (lambda: with_ids(npy(b"")[:10] + b"[1, 2]".ljust(118) + b"\n"), NPZ),
    # Python's tokenizer, which numpy reads a header with, raises its own error for this one
    "an .npy header with an unterminated string": (
        lambda: with_ids(npy(b"")[:10] + b"{'descr': '<f4', 'shape': (2, 4), 'x': '''}".ljust(118) + b"\n"),
        NPZ,
    ),
    "an .npy header of objects": (lambda: with_ids(npy(b"\0" * 64, descr="|O")), NPZ),
    "an .npy header of a made-up dtype": (lambda: with_ids(npy(b"\0" * 64, descr="<q9")), NPZ),
    "an .npy of version 9.9": (lambda: with_ids(npy(b"\0" * 32, version=(9, 9))), NPZ),
    "an .npy of version 3.0": (lambda: with_ids(npy(b"\0" * 32, version=(3, 0))), NPZ),
    "an empty body": (lambda: b"", NPZ),
    "an empty archive": (lambda: archive({}), NPZ),
}


@pytest.fixture(scope="module")
def codec() -> RequestCodec:
    return RequestCodec(SPEC, "cpu")


def refused(codec: RequestCodec, body: bytes | str, wire: str) -> RequestError:
    """The RequestError decoding `body` raises; anything else fails the test, a request included."""
    try:
        request = codec.decode(body, wire)
    except RequestError as exc:
        return exc
    pytest.fail(f"decoded into a request of {request.size}")


def assert_one_line_json(status: int, error: RequestError) -> None:
    """What the server answers for it: `{"error": "<one line>"}` with `status`."""
    answer = Answer.error(error.status, str(error))
    assert answer.status == status and answer.media_type == JSON
    assert list(json.loads(answer.body)) == ["error"] and "\n" not in str(error) and str(error)


@pytest.mark.parametrize("case", CORPUS)
def test_a_malformed_body_is_a_400_with_one_line(codec, case):
    make, wire = CORPUS[case]
    assert_one_line_json(400, refused(codec, make(), wire))


@pytest.mark.parametrize(
    "case, message",
    [
        ("arrays nested 100000 deep", "nests deeper than"),
        ("a bad CRC in a stored member", "inputs[0] (array 'arr_0.npy') cannot be unpacked: Bad CRC-32"),
        ("a member that is not .npy", "'arr_0' in the .npz is not an .npy array"),
        ("an .npy header of 2**40 x 256 elements", "declares (1099511627776, 256) float32 (1125899906842624 bytes)"),
        ("compression method 99", "'arr_0.npy' in the .npz is compressed with method 99"),
        ("an encrypted member", "'arr_0.npy' in the .npz is encrypted"),
    ],
)
def test_the_error_names_the_problem(codec, case, message):
    make, wire = CORPUS[case]
    assert message in str(refused(codec, make(), wire))


def mutations(body: bytes, count: int, seed: int) -> list[bytes]:
    """`count` seeded variants of `body`: bytes flipped, set to 0 or 0xFF, cut, inserted, repeated."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            kind = rng.randrange(5)
            if kind == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                data[at] = rng.choice((0, 0xFF, 0x7F, 0x80))
            elif kind == 2:
                del data[at : at + rng.randint(1, 16)]
            elif kind == 3:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                data[at:at] = data[at : at + rng.randint(1, 32)]
        out.append(bytes(data))
    return out


VALID = {
    "stored .npz": (savez(), NPZ),
    "deflated .npz": (savez(True), NPZ),
    "JSON": (json.dumps({"inputs": [[[0.5, 1, -2.25, 3e3]] * 2, [1, 2]]}).encode(), JSON),
}


@pytest.mark.parametrize("valid", VALID)
def test_mutated_bodies_decode_or_are_refused_in_one_line(codec, valid):
    """Whatever a mutation breaks, the decode path answers a request or a RequestError: never an
    exception the server would turn into a 500."""
    body, wire = VALID[valid]
    codec.decode(body, wire)  # the body itself is valid
    outcomes = {"decoded": 0, "refused": 0}
    for mutated in mutations(body, 300, seed=len(valid)):
        try:
            codec.decode(mutated, wire)
        except RequestError as exc:
            assert exc.status in (400, 413) and "\n" not in str(exc) and str(exc), repr(mutated)
            outcomes["refused"] += 1
        else:
            outcomes["decoded"] += 1
    assert outcomes["refused"] > 0
