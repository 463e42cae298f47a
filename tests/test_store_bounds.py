"""What a store's writer can make its readers read: no more than the signed manifest declares.

Anyone who can write the store, with no key, can put any object at any key. A reader reads a
manifest only up to its limit and a shard only where it holds the size the manifest declares,
and refuses a key that is no regular file (a FIFO, a device, a directory) before reading it:
each ends in one line naming the object, exit 4, and nothing in the local cache.

Generated files, a directory store, fsspec's memory store and moto's server for S3; no torch."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_cache_attacks import _point_every_file_at, second_generation
from test_cache_integrity import store, write_signed  # noqa: F401  (store: a fixture)
from test_cache_protocol import ARTIFACTS, KEY, NS, TRUST, make_cache

from orchestrator.cache import sync
from orchestrator.cache.manifest import IntegrityError
from orchestrator.cache.store import OverLimit, StoreAuthError, open_store

SHARD = "ab" * 32  # a well-formed name whose object the test plants


def _planted_shard(store, body: dict, declared: int) -> Path:
    """Generation 2 names SHARD, declared `declared` bytes, for every file; the object's path."""
    _point_every_file_at(body, SHARD)
    body["shards"] = {SHARD: declared}
    write_signed(store, NS, body)
    path = Path(store.root) / sync._object_key(SHARD)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _refused(store, tmp_path: Path, message: str) -> None:
    node = tmp_path / "node"
    with pytest.raises(IntegrityError) as refused:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert not node.exists() and not list(tmp_path.glob(".incoming*"))


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (lambda path: path.symlink_to("/dev/zero"), "is not a regular file (a device, a FIFO or a link to one)"),
        (lambda path: os.mkfifo(path), "is not a regular file (a device, a FIFO or a link to one)"),
        (lambda path: path.mkdir(), "is a directory, not an object"),
    ],
    ids=["link to /dev/zero", "fifo", "directory"],
)
def test_a_shard_key_that_is_no_regular_file_is_refused_unread(store, tmp_path, plant, why):
    """Copied as they are, a link to /dev/zero fills the local disk and a FIFO hangs the pull."""
    plant(_planted_shard(store, second_generation(store, tmp_path), 10240))
    _refused(store, tmp_path, f"{sync._object_key(SHARD)} {why} (corrupt or tampered); refusing it unread")


@pytest.mark.parametrize("plant", [lambda path: path.symlink_to("/dev/zero"), os.mkfifo], ids=["/dev/zero", "fifo"])
def test_a_manifest_key_that_is_no_regular_file_is_no_generation(store, tmp_path, plant):
    """A directory store lists regular files only: the pull takes the newest real generation and
    never opens the planted one (which would hang on the FIFO, or read /dev/zero forever); a reader
    that opens it all the same is refused in one line."""
    second_generation(store, tmp_path)
    plant(Path(store.root) / sync._manifest_key(NS, 2))
    assert sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False).generation == 1
    with pytest.raises(IntegrityError, match=r"gen-00000002\.json is not a regular file .*; refusing it$"):
        sync.read_manifest(store, NS, 2, TRUST, allow_unsigned=False)


def test_a_shard_larger_than_declared_is_refused_before_a_byte_is_read(store, tmp_path):
    path = _planted_shard(store, second_generation(store, tmp_path), 307)
    with open(path, "wb") as f:
        f.truncate(400 << 20)  # 400 MB, sparse: the size a reader sees, none of it on disk
    _refused(store, tmp_path, f"{sync._object_key(SHARD)} holds {400 << 20} bytes where its manifest declares 307")


GREEDY_READER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from orchestrator.cache import sync
from orchestrator.cache.manifest import IntegrityError
from orchestrator.cache.store import open_store
try:
    sync.read_manifest(open_store(sys.argv[1]), sys.argv[2], 2, None, allow_unsigned=True)
except IntegrityError as exc:
    print(exc)
"""


def test_a_two_gib_manifest_is_refused_without_reading_it_under_a_small_memory_limit(store, tmp_path):
    """The limit is checked before the manifest is read: read whole, it would not fit a process
    allowed 1.5 GB."""
    second_generation(store, tmp_path)
    manifest = Path(store.root) / sync._manifest_key(NS, 2)
    with open(manifest, "wb") as f:
        f.truncate(2 << 30)
    done = subprocess.run(
        [sys.executable, "-c", GREEDY_READER, store.url, NS], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip().endswith(
        f"{sync._manifest_key(NS, 2)}: manifest takes 2048 MiB, more than the 64 MiB a manifest may "
        "(corrupt or tampered); refusing it unread"
    )


def test_an_fsspec_store_checks_a_shard_s_size_before_downloading_it(tmp_path):
    fs_store = open_store(f"memory://{tmp_path.name}/store")
    body = second_generation(fs_store, tmp_path)
    _point_every_file_at(body, SHARD)
    body["shards"] = {SHARD: 307}
    write_signed(fs_store, NS, body)
    fs_store.fs.pipe_file(fs_store._path(sync._object_key(SHARD)), b"x" * 4096)
    with pytest.raises(sync.BadShard, match="holds 4096 bytes where its manifest declares 307"):
        sync.pull(fs_store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    with pytest.raises(OverLimit):
        fs_store.read(sync._manifest_key(NS, 2), 100)


@pytest.fixture
def s3_store(moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", moto_server.region)
    monkeypatch.setenv("ORCHESTRATE_STORE_MULTIPART_BYTES", str(5 << 20))  # larger shards: HEAD, then the transfer
    store = open_store(f"s3://{moto_server.make_bucket()}/cache")
    requested: list[tuple[str, str, str]] = []  # (operation, key, range) of every request the client sends
    store._client.meta.events.register(
        "provide-client-params.s3",
        lambda params, model, **_: requested.append((model.name, params.get("Key", ""), params.get("Range", ""))),
    )
    store.requested = requested
    return store


@pytest.mark.parametrize(
    ("declared", "sent"),
    [(307, [("GetObject", "bytes=0-306")]), (6 << 20, [("HeadObject", "")])],
    ids=["small: one ranged GET", "large: a HEAD"],
)
def test_an_s3_shard_larger_than_declared_is_never_read(s3_store, tmp_path, monkeypatch, declared, sent):
    """Fetched whole, an object far larger than declared costs its bytes on every attempt before its
    hash refuses it. A shard within one request is asked for by its declared range and refused by
    the size the answer states, its body unread; a larger one is refused by a HEAD before the
    transfer starts."""
    from botocore.response import StreamingBody

    body = second_generation(s3_store, tmp_path)
    _point_every_file_at(body, SHARD)
    body["shards"] = {SHARD: declared}
    write_signed(s3_store, NS, body)
    big = tmp_path / "big"
    big.write_bytes(b"\0" * (8 << 20))
    s3_store.upload(sync._object_key(SHARD), big)
    key = f"cache/{sync._object_key(SHARD)}"
    s3_store.requested.clear()
    chunks: list[bytes] = []  # what is read of a shard's body (manifests are read whole, by read())
    iter_chunks = StreamingBody.iter_chunks
    monkeypatch.setattr(
        StreamingBody, "iter_chunks", lambda self, size: (chunks.append(c) or c for c in iter_chunks(self, size))
    )
    with pytest.raises(sync.BadShard, match=f"holds {8 << 20} bytes where its manifest declares {declared}"):
        sync.pull(s3_store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert [(op, rng) for op, k, rng in s3_store.requested if k == key] == sent and chunks == []
    assert not (tmp_path / "node").exists()


def test_an_s3_shard_of_its_declared_size_is_fetched_in_one_request(s3_store, tmp_path):
    from test_cache_protocol import tree

    sync.publish(s3_store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    s3_store.requested.clear()
    sync.pull(s3_store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    shards = [(op, rng) for op, k, rng in s3_store.requested if "/objects/" in k]
    assert len(shards) == 1 and shards[0][0] == "GetObject" and shards[0][1].startswith("bytes=0-")
    assert tree(tmp_path / "node") == ARTIFACTS


def test_an_s3_manifest_over_the_limit_is_not_read(s3_store, tmp_path, monkeypatch):
    from botocore.response import StreamingBody

    second_generation(s3_store, tmp_path)
    monkeypatch.setattr(sync, "MAX_MANIFEST_BYTES", 1 << 20)
    s3_store._client.put_object(
        Bucket=s3_store.bucket, Key=f"cache/{sync._manifest_key(NS, 2)}", Body=b"{" + b" " * (3 << 20) + b"}"
    )
    received: list[int] = []
    read = StreamingBody.read
    monkeypatch.setattr(
        StreamingBody, "read", lambda self, amt=None: received.append(len(data := read(self, amt))) or data
    )
    with pytest.raises(IntegrityError, match="manifest takes 3 MiB, more than the 1 MiB a manifest may"):
        sync.pull(s3_store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert sum(received) == 0
    small = s3_store.read(sync._manifest_key(NS, 1), 1 << 20)  # a manifest within the limit reads whole
    assert small.startswith(b"{") and len(small) < 1 << 20


def _denied(monkeypatch, call: str, under: Path) -> None:
    """`os.<call>` refused (EACCES) for paths under `under`, as to a user without the permission:
    root reads through mode bits, so the refusal is made at the call the store makes."""
    real = getattr(os, call)

    def refused(path, *args, **kwargs):
        if Path(path).is_relative_to(under):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, call, refused)


def test_a_shard_the_reader_may_not_read_is_one_line_naming_it(store, tmp_path, monkeypatch):
    """Refused by the file system, not by the store's contents: the store's line, exit 3."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    _denied(monkeypatch, "open", Path(store.root) / "v1" / "objects")
    for run in (lambda: sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False),
                lambda: sync.verify(store, NS, TRUST, allow_unsigned=False)):  # fmt: skip
        with pytest.raises(StoreAuthError, match=r"v1/objects/\w\w/\w{64}: not readable by this user; fix its"):
            run()
    assert not (tmp_path / "node").exists()


def test_a_namespace_folder_the_reader_may_not_list_is_no_miss(store, tmp_path, monkeypatch):
    """Listed as empty, it would read as "never published" (exit 5), and --allow-miss would start
    cold on a store fault: it is the store refusing (exit 3), naming the folder."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    folder = Path(store.root) / "v1" / "namespaces" / NS
    _denied(monkeypatch, "scandir", folder)
    with pytest.raises(StoreAuthError, match=rf"cannot list {re.escape(str(folder))} \(Permission denied\)"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)


def test_a_pull_target_this_user_may_not_read_is_one_line(store, tmp_path, monkeypatch):
    """A cache root that is not readable is the user's to fix: one line naming it, exit 2."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    node.mkdir()
    _denied(monkeypatch, "scandir", node)
    with pytest.raises(
        sync.LocalDirectoryError,
        match=rf"^{re.escape(str(node))}: cannot read or write {re.escape(str(node))} \(Permission denied\)",
    ):
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert list(node.iterdir()) == []
