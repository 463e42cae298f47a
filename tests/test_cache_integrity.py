"""What a pull trusts, check by check: each test below is the attack (or accident) that exactly one
check in cache/sync.py or cache/manifest.py stops, so turning that check off fails the test.

Fast and CPU only: generated files, a directory store, no torch. Mutation testing runs this file
(scripts/mutation.py, docs/testing.md)."""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import re
import socket
import tarfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
from cryptography.hazmat.primitives import serialization
from test_cache_protocol import (  # noqa: F401  clock: fixture
    ARTIFACTS,
    KEY,
    NS,
    OTHER_KEY,
    OTHER_TRUST,
    TRUST,
    clock,
    make_cache,
    tree,
)

from orchestrator.cache import sync
from orchestrator.cache.files import replacing, scratch_beside, write_whole
from orchestrator.cache.manifest import (
    KEY_ENV,
    KEY_FILE_ENV,
    TRUSTED_ENV,
    FileEntry,
    IntegrityError,
    KeyConfigError,
    Manifest,
    PublicKey,
    SigningKey,
    TrustedKeys,
    decode,
    encode,
    manifest_digest,
    sha256_file,
)
from orchestrator.cache.store import NotFound, StoreError, open_store

SHARED = "inductor/shared/code.py"


@pytest.fixture
def store(tmp_path):
    (tmp_path / "store").mkdir()
    return open_store(f"file://{tmp_path / 'store'}")


def envelope(store, namespace: str, generation: int) -> dict:
    return json.loads(store.read(sync._manifest_key(namespace, generation), 1 << 26))


def write_signed(store, namespace: str, body: dict, key=KEY) -> None:
    """A manifest as a publisher holding `key` would create it: validly signed, whatever it says,
    and chained to the generation before it as a publisher chains it."""
    if body["generation"] - 1 in sync.generations(store, namespace):
        body["previous"] = manifest_digest(store.read(sync._manifest_key(namespace, body["generation"] - 1), 1 << 26))
    data = {"body": body, "signature": {"alg": "ed25519", "key_id": key.key_id, "value": key.sign(body)}}
    assert store.create(sync._manifest_key(namespace, body["generation"]), json.dumps(data).encode())


def no_staging_left(parent: Path) -> bool:
    return not any(p.name.startswith(".incoming") for p in parent.iterdir())


# --- (a) the per-file hash: a valid shard that holds other bytes under the promised name ------------


def test_a_file_whose_shard_is_valid_but_holds_other_bytes_is_refused(store, tmp_path):
    """Every publisher's shard holds its own bytes for a path they all compile (`SHARED`): each
    shard is intact and named by its hash, and the manifest is validly signed. A manifest that
    pairs one publisher's file hash with another publisher's shard (a merge bug, or a key holder
    mixing generations) passes the signature and the shard hash; only the per-file sha256 stops
    the wrong bytes from reaching the local cache."""
    ours, theirs = b"compiled by node A", b"compiled by node B"  # same size: no size check can help
    sync.publish(store, make_cache(tmp_path / "a", {**ARTIFACTS, SHARED: ours}), NS, KEY, allow_unsigned=False)
    sync.publish(store, make_cache(tmp_path / "b", {SHARED: theirs}), "other-ns", KEY, allow_unsigned=False)
    their_shard = envelope(store, "other-ns", 1)["body"]["files"][SHARED]["shard"]

    body = envelope(store, NS, 1)["body"]
    assert body["files"][SHARED]["shard"] != their_shard
    body["generation"] = 2
    body["files"][SHARED]["shard"] = their_shard  # sha256 and size still say `ours`
    body["shards"][their_shard] = envelope(store, "other-ns", 1)["body"]["shards"][their_shard]
    write_signed(store, NS, body)

    with pytest.raises(
        IntegrityError,
        match=re.escape(f"{sync._object_key(their_shard)}: {SHARED} does not match its sha256; refusing it"),
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)
    with pytest.raises(IntegrityError, match=f"{SHARED} does not match its sha256"):
        sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_a_shard_with_bytes_appended_is_refused_by_its_declared_size_unread(store, tmp_path):
    """Trailing bytes after a tar's end leave every member intact: the per-file hashes all pass.
    The manifest's size for the shard sees it before a byte is read (the shard hash would after)."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    [shard] = [p for p in (Path(store.root) / "v1" / "objects").rglob("*") if p.is_file()]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + b"\0" * 10240)
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"{store.url}: namespace {NS} (generation 1): {sync._object_key(shard.name)} holds {size + 10240} "
            f"bytes where its manifest declares {size} (corrupt or tampered); refusing it unread, the local cache "
            "is untouched; `orchestrate cache repair`"
        ),
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


def _repack(store, shard_sha: str, change) -> str:
    """Rewrite a published shard through `change(members) -> members` and upload it under its new
    hash; returns the new shard's sha256."""
    path = Path(store.root) / sync._object_key(shard_sha)
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in change(members):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    data = buffer.getvalue()
    sha = sync._sha256(data)
    target = Path(store.root) / sync._object_key(sha)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return sha


def _point_manifest_at(store, old_shard: str, new_shard: str) -> None:
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    for entry in body["files"].values():
        if entry["shard"] == old_shard:
            entry["shard"] = new_shard
    body["shards"][new_shard] = body["shards"].pop(old_shard)
    write_signed(store, NS, body)


def test_a_shard_missing_a_promised_file_is_refused(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    shard = envelope(store, NS, 1)["body"]["files"]["inductor/pr/cprf.py"]["shard"]
    short = _repack(store, shard, lambda members: [(m, d) for m, d in members if m.name != "inductor/pr/cprf.py"])
    _point_manifest_at(store, shard, short)
    with pytest.raises(
        IntegrityError,
        match=re.escape(f"{sync._object_key(short)} lacks 1 files its manifest promises; refusing it"),
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


def test_a_promised_file_that_is_a_link_in_its_shard_is_refused(store, tmp_path):
    """A tar member may be a symbolic link: extracted, it would point anywhere. Only regular
    files are accepted, whatever the manifest's signature."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    shard = envelope(store, NS, 1)["body"]["files"]["inductor/pr/cprf.py"]["shard"]

    def to_link(members):
        for info, data in members:
            if info.name == "inductor/pr/cprf.py":
                link = tarfile.TarInfo(info.name)
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                yield link, None
            else:
                yield info, data

    linked = _repack(store, shard, to_link)
    _point_manifest_at(store, shard, linked)
    with pytest.raises(
        IntegrityError,
        match=re.escape(f"{sync._object_key(linked)}: inductor/pr/cprf.py is not a regular file; refusing it"),
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


# --- (b) "already have it": size is not identity -----------------------------------------------------


def test_a_local_file_of_the_right_size_but_other_bytes_is_replaced(store, tmp_path):
    """A crash mid-write, a disk error or a stray edit can leave a file of the published size with
    other bytes; a pull must not trust it because the size matches."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    damaged = node / "inductor/pr/cprf.py"
    damaged.write_bytes(b"#" * len(ARTIFACTS["inductor/pr/cprf.py"]))
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 1 and again.shards == 1
    assert tree(node) == ARTIFACTS


def test_a_local_file_of_another_size_or_a_missing_one_is_fetched_again(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    (node / "inductor/pr/cprf.py").write_bytes(ARTIFACTS["inductor/pr/cprf.py"] + b"# one more line\n")
    (node / "inductor/aotautograd/aq/entry").unlink()
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 2
    assert tree(node) == ARTIFACTS


def test_complete_local_files_are_not_fetched_again(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = make_cache(tmp_path / "node", ARTIFACTS)  # compiled here already, byte for byte
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert (again.files, again.shards, again.bytes) == (0, 0, 0)
    assert sync.pulled_generation(node) == 1


def hashed_by_pulls(monkeypatch) -> list[str]:
    """The names of the files every later pull reads to hash them: a spy on the one function a
    pull hashes a file in place with."""
    read: list[str] = []
    real = sync.sha256_file

    def spy(path):
        read.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(sync, "sha256_file", spy)
    return read


def past_the_record(node: Path) -> None:
    """Wait until the filesystem stamps a later time than the pull's record carries (a tick is
    a few ms), as any pull that comes seconds later finds it."""
    record = (node / sync.VERIFIED_RECORD).stat().st_mtime_ns
    probe = node.parent / "clock-probe"
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_mtime_ns > record:
            probe.unlink()
            return


def test_a_pull_reads_no_file_it_found_intact_before(store, tmp_path, monkeypatch):
    """A replica pulls the namespace it holds at every start, beside its model's build: hashing
    every file again reads every byte of it. A file whose size, times and inode are what the last
    pull recorded is not read; one the record cannot vouch for (written in the record's own tick)
    is read once, and recorded anew so that the next pull need not."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert sync.VERIFIED_RECORD not in sync.scan(node)  # never published from here
    code = (node / "inductor/pr/cprf.py").stat().st_mtime_ns
    os.utime(node / sync.VERIFIED_RECORD, ns=(code, code))  # as though written in that file's tick
    past_the_record(node)
    read = hashed_by_pulls(monkeypatch)
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert "cprf.py" in read
    past_the_record(node)
    read.clear()
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert (again.files, read) == (0, [])
    assert tree(node) == ARTIFACTS


def test_a_pull_into_the_directory_published_from_reads_none_of_the_files_it_published(store, tmp_path, monkeypatch):
    """A warmup publishes from its cache directory, and a replica on that machine then pulls into
    it: the publish recorded the files it read, so the pull reads none of them. A file changed
    since is read, and fetched again."""
    warm = make_cache(tmp_path / "warm", ARTIFACTS)
    sync.publish(store, warm, NS, KEY, allow_unsigned=False)
    assert sync.VERIFIED_RECORD not in sync.scan(warm)  # local state: never published
    past_the_record(warm)
    read = hashed_by_pulls(monkeypatch)
    pulled = sync.pull(store, NS, warm, TRUST, allow_unsigned=False)
    assert (pulled.files, read) == (0, [])
    (warm / "inductor/pr/cprf.py").write_bytes(b"#" * len(ARTIFACTS["inductor/pr/cprf.py"]))
    again = sync.pull(store, NS, warm, TRUST, allow_unsigned=False)
    assert again.files == 1 and local_files(read) == ["cprf.py"]  # (and the shard it fetched)
    assert tree(warm) == ARTIFACTS


def test_a_publish_records_no_file_whose_path_another_publishers_bytes_won(store, tmp_path, monkeypatch):
    """Two publishers of one namespace: the second's file at a path the first published already is
    not uploaded, and the manifest keeps the first's bytes there. The second's publish must not
    vouch for its own file: the pull into its directory reads it and fetches the first's."""
    first = {"inductor/pr/cprf.py": b"# the first publisher's\n"}
    sync.publish(store, make_cache(tmp_path / "first", first), NS, KEY, allow_unsigned=False)
    theirs = b"# the second's".ljust(len(first["inductor/pr/cprf.py"]) - 1) + b"\n"  # the same size: read to tell
    second = make_cache(tmp_path / "second", {**ARTIFACTS, "inductor/pr/cprf.py": theirs})
    sync.publish(store, second, NS, KEY, allow_unsigned=False)
    past_the_record(second)
    read = hashed_by_pulls(monkeypatch)
    pulled = sync.pull(store, NS, second, TRUST, allow_unsigned=False)
    assert pulled.files == 1 and local_files(read) == ["cprf.py"]
    assert tree(second) == {**ARTIFACTS, **first}


def local_files(read: list[str]) -> list[str]:
    """Of the names a pull hashed, those of artifacts (not of the shards it fetched)."""
    names = {Path(rel).name for rel in ARTIFACTS}
    return [name for name in read if name in names]


def pulled_once(store, tmp_path) -> tuple[Path, Path]:
    """A node that pulled ARTIFACTS, the clock past its record's tick, and the file a test changes."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    past_the_record(node)
    return node, node / "inductor/pr/cprf.py"


def forge_record(node: Path, rel: str, fields: dict[int, int], stamped_ns: Optional[int] = None) -> None:
    """Set fields of one row of the node's record by index (1 size, 2 modification time, 3 inode,
    4 device, 5 change time), the record keeping its own time or stamped `stamped_ns`: the
    coincidences the record guards against, which no test can wait for, made by hand."""
    path = node / sync.VERIFIED_RECORD
    record, written = json.loads(path.read_text()), path.stat().st_mtime_ns
    for index, value in fields.items():
        record["files"][rel][index] = value
    path.write_text(json.dumps(record))
    stamp = written if stamped_ns is None else stamped_ns
    os.utime(path, ns=(stamp, stamp))


def test_a_file_written_in_the_records_own_tick_is_read_again(store, tmp_path, monkeypatch):
    """A filesystem stamps times at a coarse tick: a file damaged in the tick in which the pull
    recorded it can keep every field the record holds. Its modification time is then not before
    the record's, so the pull reads it and fetches it again."""
    node, damaged = pulled_once(store, tmp_path)
    with open(damaged, "r+b") as f:  # in place: the same inode, the same size
        f.write(b"#" * 16)
    now = damaged.stat()
    fields = {2: now.st_mtime_ns, 5: now.st_ctime_ns}  # recorded as it now is, in a record of that tick
    forge_record(node, "inductor/pr/cprf.py", fields, stamped_ns=now.st_mtime_ns)
    read = hashed_by_pulls(monkeypatch)
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 1 and "cprf.py" in read
    assert tree(node) == ARTIFACTS


def test_a_file_overwritten_in_place_with_its_time_put_back_is_read_again(store, tmp_path):
    """`cp -p` onto a file writes into its inode and sets its modification time back: size, time
    and inode stay as recorded. Its change time, which no user can set, moves: the pull reads it
    and fetches it again."""
    node, target = pulled_once(store, tmp_path)
    old = target.stat()
    with open(target, "r+b") as f:
        f.write(b"#" * old.st_size)
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (old.st_ino, old.st_mtime_ns)
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 1
    assert tree(node) == ARTIFACTS


def test_a_file_replaced_with_its_old_size_and_time_is_read_again(store, tmp_path):
    """A file renamed over the recorded one (an editor's save, a copy that keeps times) is another
    inode: read, found to differ, fetched again, even where its change time fell in the tick the
    record holds."""
    node, target = pulled_once(store, tmp_path)
    old = target.stat()
    replacement = node / "inductor/pr/replacement"
    replacement.write_bytes(b"#" * old.st_size)
    os.utime(replacement, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(replacement, target)
    forge_record(node, "inductor/pr/cprf.py", {5: target.stat().st_ctime_ns})  # only the inode differs
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 1
    assert tree(node) == ARTIFACTS


def test_a_file_published_elsewhere_with_other_bytes_of_its_size_is_fetched(store, tmp_path):
    """The record vouches for bytes by their hash: a local file unchanged since the last pull is
    still fetched where the manifest now names other bytes at its path (here another store's)."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    past_the_record(node)
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    changed = {**ARTIFACTS, "inductor/pr/cprf.py": b"# recompiled\n".ljust(len(ARTIFACTS["inductor/pr/cprf.py"]))}
    (tmp_path / "other-store").mkdir()
    other = open_store(f"file://{tmp_path / 'other-store'}")
    sync.publish(other, make_cache(tmp_path / "b", changed), NS, KEY, allow_unsigned=False)
    again = sync.pull(other, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 1
    assert tree(node) == changed


@pytest.mark.parametrize(
    "record", ["not json", '{"files": [1, 2]}', '{"files": {"inductor/pr/cprf.py": ["x", 1]}}', "{}"]
)
def test_a_damaged_record_makes_a_pull_read_every_file_and_record_them_again(store, tmp_path, monkeypatch, record):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    (node / sync.VERIFIED_RECORD).write_text(record)
    read = hashed_by_pulls(monkeypatch)
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again.files == 0 and sorted(read) == sorted(Path(rel).name for rel in ARTIFACTS)
    assert set(json.loads((node / sync.VERIFIED_RECORD).read_text())["files"]) == set(ARTIFACTS)


# --- (c) a signed manifest and no key: refuse, do not skip the check ---------------------------------


def test_a_signed_manifest_is_refused_when_no_key_is_configured(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    message = re.escape(
        f"manifest is signed by key id {KEY.key_id}, which is not trusted (trusted: none); refusing it "
        f"(add its public key with --trust or {TRUSTED_ENV})"
    )
    with pytest.raises(IntegrityError, match=message):
        sync.pull(store, NS, tmp_path / "node", None, allow_unsigned=False)
    assert not (tmp_path / "node").exists()
    with pytest.raises(IntegrityError, match=message):
        sync.verify(store, NS, None, allow_unsigned=False)
    # --allow-unsigned is the explicit opt-out: it reads what it cannot verify
    assert sync.pull(store, NS, tmp_path / "node", None, allow_unsigned=True).files == len(ARTIFACTS)
    assert tree(tmp_path / "node") == ARTIFACTS


# --- the manifest format: what another version of orchestrate must read and verify -------------------

GOLDEN = Manifest(
    namespace="mlp-torch2.13.0-cpu-x86-64-0123456789abcdef",
    generation=3,
    files={"inductor/pr/cprf.py": FileEntry(sha256="ab" * 32, size=1700, shard="cd" * 32)},
    shards={"cd" * 32: 10240},
    buckets=[1, 8],
    created_at="2026-11-30T12:00:00+00:00",
    publisher="node-1/4242",
    meta={"model": "mlp-\u00fc"},
    previous="ef" * 32,
)  # non-ASCII: the canonical form escapes it
# Written by this version; a change here breaks every published manifest (bump manifest.FORMAT instead)
GOLDEN_KEY_ID = "cd8fa86afd6bf20d"  # SigningKey.from_text(b"6b" * 32): sha256 of the raw public key, 16 hex
GOLDEN_PUBLIC = """-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAgyClGXfYw4yopJJ8Zw31gh5El2GUXhXp77JqFQnSMOo=
-----END PUBLIC KEY-----
"""
GOLDEN_SIGNATURE = "18c71cdfabefd2fa4c5b76b5f8c12c02418b6c24886f4d72c248e9441880802315af96e7b3395c898bcd0927b36a2372cc3497ecde46f008e9dcfe91d370b006"


def test_signatures_and_key_ids_are_stable_across_versions():
    key = SigningKey.from_text(b"6b" * 32, "k")  # made here, not at import: the key derivation runs under the test
    assert key.key_id == GOLDEN_KEY_ID and repr(key) == f"SigningKey(id={GOLDEN_KEY_ID})"
    assert repr(key.public) == f"PublicKey(id={GOLDEN_KEY_ID})"
    assert key.sign(GOLDEN.body()) == GOLDEN_SIGNATURE  # Ed25519 signatures are deterministic
    envelope = {
        "body": GOLDEN.body(),
        "signature": {"alg": "ed25519", "key_id": GOLDEN_KEY_ID, "value": GOLDEN_SIGNATURE},
    }
    assert json.loads(encode(GOLDEN, key)) == envelope
    trusted = TrustedKeys([PublicKey.from_text(GOLDEN_PUBLIC.encode(), "k")])
    assert decode(json.dumps(envelope).encode(), trusted, allow_unsigned=False, where="w") == GOLDEN
    assert json.loads(encode(GOLDEN, None)) == {"body": GOLDEN.body(), "signature": None}


def test_optional_manifest_fields_have_defaults():
    body = GOLDEN.body()
    for name in ("buckets", "created_at", "publisher", "meta", "previous"):
        del body[name]
    manifest = decode(json.dumps({"body": body, "signature": None}).encode(), None, allow_unsigned=True, where="w")
    assert (manifest.buckets, manifest.created_at, manifest.publisher, manifest.meta) == ([], "", "", {})
    assert manifest.previous is None
    assert (manifest.namespace, manifest.generation, manifest.files, manifest.shards) == (
        GOLDEN.namespace,
        GOLDEN.generation,
        GOLDEN.files,
        GOLDEN.shards,
    )
    assert manifest.total_bytes == 1700


def signed(body: dict, key=KEY) -> bytes:
    signature = {"alg": "ed25519", "key_id": key.key_id, "value": key.sign(body)}
    return json.dumps({"body": body, "signature": signature}).encode()


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"body": {}}', b'{"signature": null}'])
def test_what_is_not_a_manifest_is_refused(data):
    with pytest.raises(IntegrityError, match=r"^w: not a manifest \(corrupt JSON\); refusing it$"):
        decode(data, KEY, allow_unsigned=True, where="w")


def test_a_signed_but_malformed_or_newer_manifest_is_refused():
    body = GOLDEN.body()
    del body["files"]
    with pytest.raises(IntegrityError, match=r"^w: manifest is malformed \('files'\); refusing it$"):
        decode(signed(body), TRUST, allow_unsigned=False, where="w")
    body = {**GOLDEN.body(), "format": 2}
    with pytest.raises(IntegrityError, match=r"^w: manifest format 2 is not 1; upgrade orchestrate$"):
        decode(signed(body), TRUST, allow_unsigned=False, where="w")


@pytest.mark.parametrize(
    "signature, problem",
    [
        ("abc", "manifest signature is malformed"),
        (["ed25519"], "manifest signature is malformed"),
        ({"alg": "ed25519", "key_id": 7, "value": "00"}, "manifest signature is malformed"),
        ({"alg": "hmac-sha256", "key_id": "x", "value": "00"}, "manifest is signed with 'hmac-sha256', not ed25519"),
    ],
)
def test_a_malformed_signature_is_refused_in_one_line(signature, problem):
    data = json.dumps({"body": GOLDEN.body(), "signature": signature}).encode()
    with pytest.raises(IntegrityError, match=f"^w: {re.escape(problem)}") as info:
        decode(data, TRUST, allow_unsigned=False, where="w")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("files", ["not", "a", "mapping"]),
        ("files", {"a.py": "not an entry"}),
        ("files", {"a.py": {"sha256": "x", "size": "big", "shard": "y"}}),
        ("generation", "3"),
        ("namespace", None),
        ("shards", {"x": "big"}),
        ("previous", 5),
    ],
)
def test_a_signed_body_with_fields_of_the_wrong_type_is_refused_in_one_line(field, value):
    body = {**GOLDEN.body(), field: value}
    with pytest.raises(IntegrityError, match=r"^w: manifest is malformed \(.*\); refusing it$") as info:
        decode(signed(body), TRUST, allow_unsigned=False, where="w")
    assert "\n" not in str(info.value)
    with pytest.raises(IntegrityError, match=r"^w: manifest body is not an object"):
        decode(json.dumps({"body": [1], "signature": None}).encode(), TRUST, allow_unsigned=True, where="w")


def test_refusals_say_why_and_what_to_do():
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"w: manifest is unsigned; refusing it (sign with {KEY_FILE_ENV} on the publisher, or pass "
            "--allow-unsigned for local experiments)"
        ),
    ):
        decode(encode(GOLDEN, None), TRUST, allow_unsigned=False, where="w")
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"w: manifest is signed by key id {KEY.key_id}, which is not trusted (trusted: {OTHER_KEY.key_id}); "
            f"refusing it (add its public key with --trust or {TRUSTED_ENV})"
        ),
    ):
        decode(encode(GOLDEN, KEY), OTHER_TRUST, allow_unsigned=False, where="w")
    tampered = json.loads(encode(GOLDEN, KEY))
    tampered["body"]["buckets"] = [1, 8, 64]
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"w: manifest signature does not match (key id {KEY.key_id}): tampered or corrupt; refusing it"
        ),
    ):
        decode(json.dumps(tampered).encode(), TRUST, allow_unsigned=False, where="w")


def test_a_new_key_pair_is_written_once_private_0600_and_signs_what_its_public_half_verifies(tmp_path):
    private = tmp_path / "k" / "cache-signing.key"
    private.parent.mkdir()
    assert SigningKey.create_file(private) is True
    public = SigningKey.public_path(private)
    assert oct(private.stat().st_mode & 0o777) == "0o600" and public.name == "cache-signing.key.pub"
    before = private.read_bytes()
    assert SigningKey.create_file(private) is False and private.read_bytes() == before  # never overwritten
    key, verifier = SigningKey.load(private), PublicKey.load(public)
    assert key.key_id == verifier.key_id and len(key.key_id) == 16
    assert key.public == verifier and repr(TrustedKeys([verifier])) == f"TrustedKeys({key.key_id})"
    body = GOLDEN.body()
    assert verifier.verify(body, key.sign(body))
    assert not verifier.verify({**body, "generation": 4}, key.sign(body))
    assert not OTHER_KEY.public.verify(body, key.sign(body))
    assert not verifier.verify(body, "not hex")
    # the public file alone comes back from the private one
    public.unlink()
    assert SigningKey.create_file(private) is False and PublicKey.load(public) == verifier


def test_key_files_in_the_wrong_role_or_shape_are_refused_without_quoting_them(tmp_path):
    private = tmp_path / "cache-signing.key"
    SigningKey.create_file(private)
    public = SigningKey.public_path(private)
    with pytest.raises(  # a publisher's key file is its configuration too: exit 2, not refused data's 4
        KeyConfigError, match=re.escape(f"signing key file {public}: is a public key, which only verifies")
    ):
        SigningKey.load(public)
    # a reader's key file is its configuration: a wrong one is a usage error, not refused cache data
    with pytest.raises(KeyConfigError, match=re.escape(f"trusted key file {private}: is a private key")):
        PublicKey.load(private)
    garbage = tmp_path / "garbage"
    garbage.write_text("s3cr3t-but-not-a-key")
    for load, error in ((SigningKey.load, KeyConfigError), (PublicKey.load, KeyConfigError)):
        with pytest.raises(error, match="not an .*Ed25519 .* key") as info:
            load(garbage)
        assert "s3cr3t" not in str(info.value)
    with pytest.raises(
        KeyConfigError, match=re.escape(f"trusted key file {tmp_path / 'missing'}: cannot read it (No such file")
    ):
        PublicKey.load(tmp_path / "missing")
    # the raw forms: 64 hex digits of the seed, or of the public key
    raw = SigningKey.from_text(b"6b" * 32, "k")
    assert raw.key_id == KEY.key_id
    assert PublicKey.from_text(raw.public.pem().encode(), "k") == KEY.public


def test_the_signing_key_comes_from_a_file_or_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    assert SigningKey.from_env() is None
    monkeypatch.setenv(KEY_ENV, KEY.pem().decode())
    assert SigningKey.from_env().key_id == KEY.key_id
    env_file, arg_file = tmp_path / "env-key", tmp_path / "arg-key"
    SigningKey.create_file(env_file)
    SigningKey.create_file(arg_file)
    env_id, arg_id = SigningKey.load(env_file).key_id, SigningKey.load(arg_file).key_id
    monkeypatch.setenv(KEY_FILE_ENV, str(env_file))
    assert SigningKey.from_env().key_id == env_id  # a file beats a value
    assert SigningKey.from_env(str(arg_file)).key_id == arg_id
    monkeypatch.delenv(KEY_FILE_ENV)
    assert SigningKey.from_env(str(arg_file)).key_id == arg_id
    with pytest.raises(
        KeyConfigError,
        match=re.escape(f"signing key file {tmp_path / 'missing'}: cannot read it (No such file or directory)"),
    ):
        SigningKey.from_env(str(tmp_path / "missing"))
    monkeypatch.setenv(KEY_ENV, "6b" * 31)
    with pytest.raises(KeyConfigError, match=f"^\\${KEY_ENV}: not an unencrypted Ed25519 private key") as info:
        SigningKey.from_env()
    assert "6b6b" not in str(info.value)


def test_trusted_keys_come_from_files_the_environment_and_the_own_signing_key(monkeypatch, tmp_path):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(TRUSTED_ENV, raising=False)
    paths = []
    for name in ("a", "b", "c"):
        SigningKey.create_file(tmp_path / name)
        paths.append(SigningKey.public_path(tmp_path / name))
    ids = [PublicKey.load(path).key_id for path in paths]
    assert TrustedKeys.load().key_ids == []
    monkeypatch.setenv(TRUSTED_ENV, os.pathsep.join(map(str, paths[:2])))
    assert TrustedKeys.load([paths[2]]).key_ids == sorted(ids)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "a"))  # its own key: already trusted, once
    assert len(TrustedKeys.load()) == 2
    monkeypatch.setenv(KEY_ENV, KEY.pem().decode())
    monkeypatch.delenv(KEY_FILE_ENV)
    assert KEY.key_id in TrustedKeys.load().key_ids
    assert TrustedKeys.load(environ=False).key_ids == []
    pems = TrustedKeys.load([paths[2]]).pems()  # travels to workers as text
    assert "PRIVATE" not in "".join(pems) and sorted(TrustedKeys.from_pems(pems).key_ids) == sorted([*ids, KEY.key_id])


@pytest.mark.parametrize("mistake", ["missing", "private", "directory"])
def test_a_wrong_trusted_key_in_the_environment_is_a_key_config_error_naming_the_variable(
    monkeypatch, tmp_path, mistake
):
    """Not IntegrityError (exit 4, refused cache data): the same mistake given as --trust is a
    usage error, and the line says which variable named the file and what to put there."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    SigningKey.create_file(tmp_path / "k")
    path = {"missing": tmp_path / "missing", "private": tmp_path / "k", "directory": tmp_path}[mistake]
    monkeypatch.setenv(TRUSTED_ENV, os.pathsep.join([str(SigningKey.public_path(tmp_path / "k")), str(path)]))
    fix = "give readers the public key (.pub file) only" if mistake == "private" else "name a readable public key file"
    with pytest.raises(
        KeyConfigError, match=f"^{re.escape(f'${TRUSTED_ENV} names {path}: ')}.*{re.escape(fix)}"
    ) as info:
        TrustedKeys.load()
    assert "\n" not in str(info.value) and not isinstance(info.value, IntegrityError)


# --- the store layout and the shards: content-addressed and reproducible ------------------------------


def objects(store) -> dict[str, Path]:
    return {p.name: p for p in (Path(store.root) / "v1" / "objects").rglob("*") if p.is_file()}


def test_objects_are_named_by_their_hash_under_a_two_character_fan_out(store, tmp_path):
    transfer = sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    [info] = store.list("v1/objects/")
    match = re.fullmatch(r"v1/objects/([0-9a-f]{2})/([0-9a-f]{64})", info.key)
    assert match and match.group(2).startswith(match.group(1))
    assert sha256_file(Path(store.root) / info.key) == match.group(2)
    assert transfer.bytes == info.size and transfer.files == len(ARTIFACTS) and transfer.shards == 1
    assert [i.key for i in store.list(f"v1/namespaces/{NS}/")] == [f"v1/namespaces/{NS}/gen-00000001.json"]


def test_shards_are_reproducible_tars_with_zeroed_metadata(store, tmp_path):
    """Two nodes that compiled the same bytes upload the same shard: one object, whatever the
    files' times and permissions were."""
    first = make_cache(tmp_path / "a", ARTIFACTS)
    second = make_cache(tmp_path / "b", ARTIFACTS)
    for i, path in enumerate(p for p in second.rglob("*") if p.is_file()):
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        path.chmod(0o600)
    sync.publish(store, first, NS, KEY, allow_unsigned=False)
    sync.publish(store, second, "other-ns", KEY, allow_unsigned=False)
    [shard] = objects(store).values()
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(ARTIFACTS)
    for member in members:
        assert (member.type, member.mode, member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            tarfile.REGTYPE,
            0o644,
            0,
            0,
            0,
            "",
            "",
        ), member.name


def test_files_are_packed_into_shards_of_at_most_shard_bytes(store, tmp_path, monkeypatch):
    monkeypatch.setattr(sync, "SHARD_BYTES", 10)
    files = {"f1": b"a" * 5, "f2": b"b" * 5, "f3": b"c" * 4, "f4": b"d" * 6, "f5": b"e" * 10, "f6": b"f"}
    transfer = sync.publish(store, make_cache(tmp_path / "a", files), NS, KEY, allow_unsigned=False)
    manifest = sync.newest(store, NS, TRUST, allow_unsigned=False)
    groups: dict[str, set[str]] = {}
    for rel, entry in manifest.files.items():
        groups.setdefault(entry.shard, set()).add(rel)
    # in path order, a shard takes files while it stays within SHARD_BYTES; exactly full is within
    assert sorted(map(sorted, groups.values())) == [["f1", "f2"], ["f3", "f4"], ["f5"], ["f6"]]
    assert (transfer.files, transfer.shards) == (6, 4)
    assert transfer.bytes == sum(p.stat().st_size for p in objects(store).values())
    assert manifest.shards == {name: p.stat().st_size for name, p in objects(store).items()}
    pulled = sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert (pulled.files, pulled.shards) == (6, 4) and tree(tmp_path / "node") == files


# --- publish: what a manifest records, and when there is nothing to publish --------------------------


def test_a_manifest_records_who_published_what_and_when(store, tmp_path):
    before = datetime.now().astimezone()
    started = time.perf_counter()
    transfer = sync.publish(
        store,
        make_cache(tmp_path / "a", {**ARTIFACTS, "inductor/skip/me.py": b"x"}),
        NS,
        KEY,
        allow_unsigned=False,
        buckets=[8, 1, 8],
        meta={"model": "mlp"},
        exclude=["inductor/skip/me.py", "inductor/never/there.py"],
    )
    assert 0 <= transfer.seconds <= time.perf_counter() - started
    assert transfer.skipped == ["inductor/never/there.py", "inductor/skip/me.py"]
    manifest = sync.newest(store, NS, TRUST, allow_unsigned=False)
    assert manifest.namespace == NS and manifest.generation == 1 and manifest.buckets == [1, 8]
    assert sorted(manifest.files) == sorted(ARTIFACTS)  # the excluded file stays local
    assert manifest.meta == {"model": "mlp"}
    assert manifest.publisher == f"{socket.gethostname()}/{os.getpid()}"
    created = datetime.fromisoformat(manifest.created_at)
    assert created.utcoffset() == timedelta(0) and before - timedelta(seconds=1) <= created
    assert set(manifest.shards) == {entry.shard for entry in manifest.files.values()}
    assert sync.publish(store, tmp_path / "a", "no-meta", KEY, allow_unsigned=False).generation == 1
    assert sync.newest(store, "no-meta", TRUST, allow_unsigned=False).meta == {}


def test_publishing_nothing_new_uploads_nothing_and_adds_no_generation(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[1, 32])
    uploaded = set(objects(store))
    again = sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[32, 1])
    assert (again.generation, again.files, again.shards, again.bytes) == (1, 0, 0, 0)
    assert set(objects(store)) == uploaded and sync.generations(store, NS) == [1]
    # a new bucket with no new files is a new generation: readers learn the bucket is warm
    assert sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[64]).generation == 2
    manifest = sync.newest(store, NS, TRUST, allow_unsigned=False)
    assert manifest.buckets == [1, 32, 64] and set(manifest.shards) == uploaded


def test_an_unsigned_namespace_grows_with_allow_unsigned(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, NS, None, allow_unsigned=True)
    make_cache(node, {"inductor/more.py": b"more"})
    assert sync.publish(store, node, NS, None, allow_unsigned=True).generation == 2
    assert sync.verify(store, NS, None, allow_unsigned=True).generation == 2


def test_publishing_without_a_key_says_how_to_get_one(store, tmp_path):
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            "publishing needs the private signing key (public keys only verify): set "
            "ORCHESTRATE_CACHE_SIGNING_KEY_FILE or pass --signing-key-file (make one with `orchestrate keys new DIR`), "
            "or pass --allow-unsigned"
        ),
    ):
        sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, None, allow_unsigned=False)
    assert store.list("v1/") == []


class RacingStore:
    """A store where, before each of our manifest creates, the next rival publishes first."""

    def __init__(self, inner, rivals: list[Path], key, allow_unsigned: bool) -> None:
        self.inner, self.rivals, self.key, self.allow_unsigned = inner, rivals, key, allow_unsigned

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def create(self, key: str, data: bytes) -> bool:
        if self.rivals and "/namespaces/" in key:
            sync.publish(self.inner, self.rivals.pop(0), NS, self.key, allow_unsigned=self.allow_unsigned)
        return self.inner.create(key, data)


@pytest.mark.parametrize("key, allow_unsigned", [(KEY, False), (None, True)], ids=["signed", "unsigned"])
def test_a_publisher_that_loses_races_merges_onto_the_winners(store, tmp_path, key, allow_unsigned):
    trust = TRUST if key else None
    sync.publish(
        store, make_cache(tmp_path / "base", {"inductor/base.py": b"base"}), NS, key, allow_unsigned=allow_unsigned
    )
    rivals = [
        make_cache(tmp_path / f"rival{i}", {f"inductor/rival{i}.py": b"r", SHARED: f"rival {i}".encode()})
        for i in range(2)
    ]
    ours = make_cache(tmp_path / "ours", {"inductor/ours.py": b"o", SHARED: b"ours"})
    transfer = sync.publish(
        RacingStore(store, rivals, key, allow_unsigned), ours, NS, key, allow_unsigned=allow_unsigned, buckets=[4]
    )
    assert (transfer.generation, transfer.races) == (4, 2)
    manifest = sync.newest(store, NS, trust, allow_unsigned=allow_unsigned)
    assert sorted(manifest.files) == [
        "inductor/base.py",
        "inductor/ours.py",
        "inductor/rival0.py",
        "inductor/rival1.py",
        SHARED,
    ]
    assert manifest.buckets == [4]
    sync.pull(store, NS, tmp_path / "node", trust, allow_unsigned=allow_unsigned)
    assert (tmp_path / "node" / SHARED).read_bytes() == b"rival 0"
    # each generation names the one it merged onto, the winners' included
    assert sync.verify(store, NS, trust, allow_unsigned=allow_unsigned).previous == manifest_digest(
        store.read(sync._manifest_key(NS, 3), 1 << 26)
    )  # the first to publish a path keeps it


def test_a_publisher_gives_up_after_losing_max_publish_races(store, tmp_path, monkeypatch):
    monkeypatch.setattr(sync, "MAX_PUBLISH_RACES", 3)
    losing = SimpleNamespace(
        url=store.url, list=store.list, read=store.read, upload=store.upload, create=lambda key, data: False
    )
    with pytest.raises(StoreError, match=f"^publish {NS}: lost 3 races for the next manifest generation$"):
        sync.publish(losing, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)


# --- pull: where files land, and in which order -----------------------------------------------------


def test_pull_creates_a_nested_directory_even_for_an_empty_namespace(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", {}), "empty-ns", KEY, allow_unsigned=False, buckets=[1])
    empty = sync.pull(store, "empty-ns", tmp_path / "x" / "y" / "empty", TRUST, allow_unsigned=False)
    assert empty.files == 0 and tree(tmp_path / "x" / "y" / "empty") == {}
    assert (tmp_path / "x" / "y" / "empty" / sync.APPLIED_MARKER).is_file()
    sync.publish(store, make_cache(tmp_path / "b", ARTIFACTS), NS, KEY, allow_unsigned=False)
    started = time.perf_counter()
    pulled = sync.pull(store, NS, tmp_path / "p" / "q" / "node", TRUST, allow_unsigned=False)
    assert 0 <= pulled.seconds <= time.perf_counter() - started
    assert tree(tmp_path / "p" / "q" / "node") == ARTIFACTS


def test_a_pull_that_fails_midway_leaves_the_directory_as_it_was(store, tmp_path, monkeypatch):
    """Generation 2 adds files; the pull fails after half of them are unpacked: the node keeps
    generation 1 whole, and no staging is left."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    more = {f"inductor/fxgraph/zz/new{i}": f"entry {i}".encode() for i in range(6)}
    sync.publish(store, make_cache(tmp_path / "b", {**ARTIFACTS, **more}), NS, KEY, allow_unsigned=False)
    written, write_bytes = [], Path.write_bytes

    def fail_halfway(self, data):
        if len(written) == 3:
            raise ConnectionResetError("connection lost")
        written.append(self)
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", fail_halfway)
    with pytest.raises(ConnectionResetError):
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    monkeypatch.undo()
    assert written and tree(node) == ARTIFACTS and no_staging_left(tmp_path)
    assert sync.pull(store, NS, node, TRUST, allow_unsigned=False).files == len(more)
    assert tree(node) == {**ARTIFACTS, **more}


def test_a_kill_between_the_two_renames_is_undone_by_the_next_pull(store, tmp_path, monkeypatch):
    """Where the kernel cannot exchange two directories, the swap is two renames: a kill between
    them leaves the old directory moved aside, which the next pull puts back before its own."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    sync.publish(
        store, make_cache(tmp_path / "b", {**ARTIFACTS, "inductor/new.py": b"new"}), NS, KEY, allow_unsigned=False
    )
    monkeypatch.setattr(sync, "_exchange", lambda a, b: False)
    rename, calls = os.rename, []

    def killed_after_first(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here
        return rename(src, dst)

    monkeypatch.setattr(sync.os, "rename", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    monkeypatch.setattr(sync.os, "rename", rename)
    assert not node.exists() and (tmp_path / f".previous-{node.name}").is_dir()
    sync._recover(node)  # what the next pull does first
    assert tree(node) == ARTIFACTS and not (tmp_path / f".previous-{node.name}").exists()
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert tree(node) == {**ARTIFACTS, "inductor/new.py": b"new"} and no_staging_left(tmp_path)


def test_the_swap_is_an_atomic_exchange_where_the_kernel_offers_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "which").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "which").write_text("b")
    if not sync._exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this kernel or filesystem has no renameat2(RENAME_EXCHANGE)")
    assert (tmp_path / "a" / "which").read_text() == "b" and (tmp_path / "b" / "which").read_text() == "a"


def test_what_a_killed_pull_left_is_removed_and_local_files_stay(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    (node / "local").mkdir(parents=True)
    (node / "local" / "only-here.txt").write_text("mine")
    stale = tmp_path / f".incoming-{node.name}-deadbeef"
    (stale / "inductor").mkdir(parents=True)
    (stale / "inductor" / "half").write_bytes(b"half a file")
    scratch = tmp_path / f".incoming-{node.name}-0123abcd"  # a record written, not yet renamed in
    scratch.write_text('{"half": ')
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert not stale.exists() and not scratch.exists() and no_staging_left(tmp_path)
    assert tree(node) == {**ARTIFACTS, "local/only-here.txt": b"mine"}


def test_a_files_scratch_is_written_beside_the_pulled_directory_never_in_it(store, tmp_path, monkeypatch):
    """The marker and the record are written whole, then renamed in: a kill before the rename must
    leave the directory as it was, so the scratch stands outside it."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    renamed = []
    replace = os.replace

    def watched(source, target):
        renamed.append((Path(source), Path(target)))
        return replace(source, target)

    monkeypatch.setattr(sync.os, "replace", watched)
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)  # verifies in place: the marker written again
    os.utime(node / next(iter(ARTIFACTS)), ns=(1, 1))  # a file to read again: the record written again
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert {target.name for _, target in renamed} >= {".orchestrate-manifest.json", ".orchestrate-verified.json"}
    assert all(source.parent == tmp_path and source.name.startswith(f".incoming-{node.name}-") for source, _ in renamed)
    assert no_staging_left(tmp_path)


PULLER = """
import sys, time
from pathlib import Path
from orchestrator.cache import sync
from orchestrator.cache.manifest import TrustedKeys
from orchestrator.cache.store import open_store
url, namespace, target, public = sys.argv[1:5]
print("pulling", flush=True)
started = time.perf_counter()
sync.pull(open_store(url), namespace, Path(target), TrustedKeys.from_pems([Path(public).read_text()]), allow_unsigned=False)
print(time.perf_counter() - started, flush=True)
"""


def test_a_pull_killed_at_any_moment_leaves_the_old_generation_or_the_new(store, tmp_path):
    """SIGKILL, not a simulated failure: a pull process is killed at random moments of a pull that
    moves a node from one generation to the next. Each time the directory holds exactly the old
    generation or exactly the new one, and the next pull completes it and leaves nothing behind."""
    import random
    import shutil
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    rng = random.Random(7)
    old = {f"inductor/old/{i:03}.py": rng.randbytes(2_000) for i in range(40)}
    new = {f"inductor/new/{i:03}.py": rng.randbytes(20_000) for i in range(300)}
    url = f"file://{tmp_path / 'store'}"
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    sync.publish(store, make_cache(tmp_path / "gen1", old), NS, KEY, allow_unsigned=False)
    base = tmp_path / "base" / "node"
    sync.pull(store, NS, base, TRUST, allow_unsigned=False)
    sync.publish(store, make_cache(tmp_path / "gen2", new), NS, KEY, allow_unsigned=False)  # merged: old + new
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(target: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", PULLER, url, NS, str(target), str(public)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "pulling"
        return proc

    timed = tmp_path / "timed" / "node"
    shutil.copytree(base, timed)
    first = start(timed)
    pull_seconds = float(first.communicate(timeout=120)[0])
    assert tree(timed) == {**old, **new}

    # Trials go on until ten kills have landed inside a pull. On a busy machine a pull's length
    # varies from one process to the next: a kill that comes after its pull has ended tests
    # nothing, and the next kills aim within that shorter pull.
    killed = trial = 0
    while killed < 10:
        assert trial < 40, f"only {killed} of {trial} kills landed inside a pull"
        node = tmp_path / f"trial-{trial}" / "node"
        shutil.copytree(base, node)
        proc = start(node)
        time.sleep(rng.uniform(0.0, pull_seconds))
        proc.send_signal(signal.SIGKILL)
        finished = proc.communicate(timeout=60)[0]
        if proc.returncode == -signal.SIGKILL:
            killed += 1
        elif proc.returncode == 0:
            pull_seconds = min(pull_seconds, float(finished))
        assert tree(node) in (old, {**old, **new}), f"trial {trial}: a mix of generations"
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
        assert tree(node) == {**old, **new} and no_staging_left(node.parent)
        trial += 1


# A pull on a C library or filesystem without renameat2(RENAME_EXCHANGE): its swap is two renames.
# It stops for good right after the rename named by its last argument (the one that moves the old
# directory aside, or the one that puts the new one in place), where the test kills it.
PULLER_WITHOUT_EXCHANGE = """
import os, sys, time
from pathlib import Path
from orchestrator.cache import sync
from orchestrator.cache.manifest import TrustedKeys
from orchestrator.cache.store import open_store
url, namespace, target, public, stop_after = sys.argv[1:6]
sync._exchange = lambda a, b: False
rename = os.rename
def rename_then_maybe_stop(src, dst):
    rename(src, dst)
    if (stop_after == "aside" and Path(dst).name.startswith(".previous-")) or (stop_after == "in place" and str(dst) == target):
        print("renamed", flush=True)
        time.sleep(600)
sync.os.rename = rename_then_maybe_stop
sync.pull(open_store(url), namespace, Path(target), TrustedKeys.from_pems([Path(public).read_text()]), allow_unsigned=False)
"""


@pytest.mark.parametrize("killed_after", ["aside", "in place"])
def test_a_two_rename_swap_killed_between_or_after_its_renames_is_completed_by_the_next_pull(
    store, tmp_path, killed_after
):
    """SIGKILL of a real pull process in the swap's two windows: after the old directory moved
    aside (the directory is missing for that moment; its old generation waits beside it), and
    after the new one moved in (the old one is still beside it). The next pull, in another
    process, puts things right before anything else and leaves exactly the new generation."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    newer = {**ARTIFACTS, "inductor/new.py": b"new"}
    sync.publish(store, make_cache(tmp_path / "b", newer), NS, KEY, allow_unsigned=False)
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    proc = subprocess.Popen(
        [sys.executable, "-c", PULLER_WITHOUT_EXCHANGE, store.url, NS, str(node), str(public), killed_after],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "renamed", proc.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    previous = tmp_path / f".previous-{node.name}"
    if killed_after == "aside":
        assert not node.exists() and tree(previous) == ARTIFACTS
    else:
        assert tree(node) == newer and tree(previous) == ARTIFACTS
    nothing_to_do = killed_after == "in place"
    pulled = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert pulled is not None and (pulled.files == 0) == nothing_to_do
    assert tree(node) == newer and not previous.exists() and no_staging_left(tmp_path)


def test_a_symlink_inside_the_target_is_never_followed(store, tmp_path):
    """A directory inside the target that links elsewhere: the pull writes nothing there and
    reads nothing from there; the target ends with real directories."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "pr").mkdir(parents=True)
    (elsewhere / "pr" / "cprf.py").write_bytes(ARTIFACTS["inductor/pr/cprf.py"])  # the listed bytes
    node = tmp_path / "node"
    node.mkdir()
    (node / "inductor").symlink_to(elsewhere, target_is_directory=True)
    pulled = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert pulled.files == len(ARTIFACTS)  # nothing counted as present through the link
    assert sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*")) == ["pr", "pr/cprf.py"]
    assert not (node / "inductor").is_symlink() and tree(node) == ARTIFACTS


@pytest.mark.parametrize(
    "names, message",
    [
        (["", "x"], "names an unsafe path ''"),
        (["inductor//x.py"], "names an unsafe path 'inductor//x.py'"),
        (["inductor/./x.py"], "names an unsafe path 'inductor/./x.py'"),
        (["inductor/pr", "inductor/pr/cprf.py"], "names 'inductor/pr' as a file and as the directory of"),
    ],
)
def test_empty_and_clashing_names_are_refused_before_anything_is_written(store, tmp_path, names, message):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    for name in names:
        body["files"].setdefault(name, body["files"]["inductor/pr/cprf.py"])
    write_signed(store, NS, body)
    node = tmp_path / "node"
    with pytest.raises(IntegrityError, match=re.escape(message)):
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert not node.exists() and no_staging_left(tmp_path)


def test_a_full_disk_is_one_line_and_leaves_the_directory_unchanged(store, tmp_path, monkeypatch):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    (node / "local").mkdir(parents=True)
    (node / "local" / "keep").write_text("k")

    def no_space(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", no_space)
    with pytest.raises(StoreError) as caught:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    monkeypatch.undo()
    assert isinstance(caught.value, sync.DiskFull)
    assert "no space left on the device" in str(caught.value) and "\n" not in str(caught.value)
    assert tree(node) == {"local/keep": b"k"} and no_staging_left(tmp_path)


def test_a_full_local_disk_while_downloading_from_an_fsspec_store_is_disk_full(tmp_path, monkeypatch):
    """fsspec raises the local file's OSError as it raises the network's: ENOSPC is the local disk
    filling up, not a store to retry and then call unreachable."""
    import fsspec.spec

    monkeypatch.setenv("ORCHESTRATE_STORE_ATTEMPTS", "1")
    store = open_store(f"memory://{tmp_path.name}/store")
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)

    def on_a_full_disk(file, mode="r", *args, **kwargs):  # where fsspec's get_file makes the local file
        if "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fsspec.spec, "open", on_a_full_disk, raising=False)
    with pytest.raises(sync.DiskFull, match=f"^{re.escape(f'no space left on the device of {tmp_path} while')}"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


@pytest.mark.parametrize("path", ["/etc/cron.d/evil", "inductor/../../evil.py", "inductor/x.lock", sync.APPLIED_MARKER])
def test_a_signed_manifest_naming_an_unsafe_path_is_refused(store, tmp_path, path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    body["files"][path] = body["files"]["inductor/pr/cprf.py"]
    write_signed(store, NS, body)
    message = re.escape(f"manifest of {NS} names an unsafe path {path!r}; refusing it")
    with pytest.raises(IntegrityError, match=message):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    with pytest.raises(IntegrityError, match=message):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists()


# --- scan: a directory that changes while it is read -------------------------------------------------


def test_scan_skips_what_disappears_while_it_scans(tmp_path, monkeypatch):
    """Compilers write and delete temporaries meanwhile: a file or folder gone between listing and
    reading is skipped, and everything else is still found."""
    root = make_cache(
        tmp_path / "ns",
        {"a/keep1": b"1", "a/vanishing": b"v", "a/z-keep2": b"22", "b/keep3": b"333", "z-gone-folder/x": b"x"},
    )  # scanned first, the others still to come
    real_scandir = os.scandir

    def racing_scandir(folder):
        if Path(folder).name == "z-gone-folder":
            raise FileNotFoundError(folder)
        entries = list(real_scandir(folder))
        if Path(folder).name == "a":
            (Path(folder) / "vanishing").unlink()  # listed, then removed before its stat
        return iter(sorted(entries, key=lambda e: e.name))

    monkeypatch.setattr(sync.os, "scandir", racing_scandir)
    found = sync.scan(root)
    assert {rel: size for rel, (_, size) in found.items()} == {"a/keep1": 1, "a/z-keep2": 2, "b/keep3": 3}


# --- listing, describing and verifying a store --------------------------------------------------------


def test_only_generation_files_make_a_namespace(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    root = Path(store.root) / "v1" / "namespaces"
    (root / "gen-00000001.json").write_text("{}")  # no namespace folder: not a namespace
    (root / "notes").mkdir()
    (root / "notes" / "README").write_text("hello")
    assert sync.namespaces(store) == [NS]


def test_errors_name_the_manifest_by_its_full_url(tmp_path):
    (tmp_path / "storeX").mkdir()  # rstrip takes a set of characters: a name ending in X keeps it honest
    store = open_store(f"file://{tmp_path / 'storeX'}/")
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"file://{tmp_path / 'storeX'}/v1/namespaces/{NS}/gen-00000001.json: manifest is signed by key id"
        ),
    ):
        sync.pull(store, NS, tmp_path / "node", OTHER_TRUST, allow_unsigned=False)


def test_describe_lists_every_namespace_and_why_one_cannot_be_read(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, "good", KEY, allow_unsigned=False, buckets=[1])
    sync.publish(store, node, "good", KEY, allow_unsigned=False, buckets=[2])
    sync.publish(store, node, "foreign", OTHER_KEY, allow_unsigned=False)
    sync.publish(store, node, "unsigned", None, allow_unsigned=True)
    infos = {info.namespace: info for info in sync.describe(store, TRUST, allow_unsigned=False)}
    assert sorted(infos) == ["foreign", "good", "unsigned"]
    good, foreign, unsigned = infos["good"], infos["foreign"], infos["unsigned"]
    assert (good.generations, good.manifest.buckets, good.error) == (2, [1, 2], None)
    assert (foreign.generations, foreign.manifest) == (1, None)
    assert foreign.error.startswith(
        f"{store.url}/v1/namespaces/foreign/gen-00000001.json: manifest is signed by key id {OTHER_KEY.key_id}, "
        "which is not trusted"
    )
    assert (unsigned.generations, unsigned.manifest) == (1, None) and "manifest is unsigned" in unsigned.error
    relaxed = {info.namespace: info for info in sync.describe(store, TRUST, allow_unsigned=True)}
    assert relaxed["unsigned"].manifest is not None and relaxed["unsigned"].error is None


def test_verify_names_a_namespace_that_was_never_published(store):
    with pytest.raises(NotFound, match=re.escape(f"{store.url}: namespace nope was never published")):
        sync.verify(store, "nope", TRUST, allow_unsigned=False)


# --- gc: which namespaces, generations and shards go ----------------------------------------------


NOW = 2_000_000_000  # gc's clock in these tests: whole seconds, so ages compare exactly


@pytest.fixture
def gc_time(monkeypatch):
    monkeypatch.setattr(sync, "time", SimpleNamespace(time=lambda: NOW, perf_counter=time.perf_counter))


def age_objects(store, seconds: float) -> None:
    for path in objects(store).values():
        os.utime(path, (NOW - seconds, NOW - seconds))


def manifest_names(store) -> list[str]:
    return sorted(i.key.split("/", 2)[2] for i in store.list("v1/namespaces/"))


def test_gc_keeps_the_newest_generations_of_every_namespace_and_never_judges_one_by_another(
    store, tmp_path, clock, gc_time
):
    """Two models that share the name `mlp`, another named by its namespace only: each namespace
    keeps its own newest generation, whatever the others are called or how new they are."""

    def publish(namespace: str, generations: int, meta=None) -> None:
        for g in range(generations):
            node = make_cache(tmp_path / namespace / str(g), {f"{namespace}/{g}.py": namespace.encode()})
            sync.publish(store, node, namespace, KEY, allow_unsigned=False, buckets=[g], meta=meta)
            clock.advance(60)

    publish("mlp-torch2.11.0-x-1111", 1, meta={"model": "mlp"})
    publish("bert-torch2.11.0-x-3333", 1)
    publish("mlp-torch2.13.0-x-5555", 3, meta={"model": "mlp"})  # another model of the same name
    publish("mlp-torch2.13.0-x-2222", 3, meta={"model": "mlp"})
    age_objects(store, 7200)
    shards = set(objects(store))

    done = sync.gc(store, 1, TRUST, allow_unsigned=False)
    assert (len(done.manifests), done.objects, done.retired_namespaces, done.unverified) == (4, [], [], [])
    assert manifest_names(store) == [
        "bert-torch2.11.0-x-3333/gen-00000001.json",
        "mlp-torch2.11.0-x-1111/gen-00000001.json",
        "mlp-torch2.13.0-x-2222/gen-00000003.json",
        "mlp-torch2.13.0-x-5555/gen-00000003.json",
    ]
    assert set(objects(store)) == shards  # a newest generation names every file of the ones before
    for namespace in sync.namespaces(store):
        sync.verify(store, namespace, TRUST, allow_unsigned=False)


def test_gc_dry_run_says_what_would_go_and_deletes_nothing(store, tmp_path, clock, gc_time):
    node = make_cache(tmp_path / "a", {"inductor/a.py": b"a"})
    for bucket in (1, 2, 3):
        sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[bucket])
    stray = tmp_path / "stray"
    stray.write_bytes(b"stray")
    store.upload(sync._object_key(sha256_file(stray)), stray)
    age_objects(store, 7200)
    before = (manifest_names(store), set(objects(store)))
    planned = sync.gc(store, 1, TRUST, allow_unsigned=False, dry_run=True)
    assert planned.dry_run and len(planned.manifests) == 2 and len(planned.objects) == 1 and planned.bytes_freed == 5
    assert (manifest_names(store), set(objects(store))) == before
    done = sync.gc(store, 1, TRUST, allow_unsigned=False)
    assert (done.manifests, done.objects) == (planned.manifests, planned.objects)
    assert manifest_names(store) == [f"{NS}/gen-00000003.json"]


def test_gc_retires_whole_namespaces_only_when_asked_and_only_by_age(store, tmp_path, gc_time):
    sync.publish(store, make_cache(tmp_path / "a", {"inductor/a.py": b"a"}), "old-ns", KEY, allow_unsigned=False)
    sync.publish(store, make_cache(tmp_path / "b", {"inductor/b.py": b"b"}), NS, KEY, allow_unsigned=False)
    age_objects(store, 40 * 86400)
    for path in (Path(store.root) / "v1" / "namespaces" / "old-ns").iterdir():
        os.utime(path, (NOW - 40 * 86400, NOW - 40 * 86400))
    for path in (Path(store.root) / "v1" / "namespaces" / NS).iterdir():
        os.utime(path, (NOW - 86400, NOW - 86400))
    assert sync.gc(store, 1, TRUST, allow_unsigned=False).retired_namespaces == []
    done = sync.gc(store, 1, TRUST, allow_unsigned=False, unused_days=30)
    assert done.retired_namespaces == ["old-ns"] and len(done.objects) == 1
    assert sync.namespaces(store) == [NS]
    sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_gc_deletes_unreferenced_shards_only_after_the_grace_period(store, tmp_path, gc_time):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    age_objects(store, 86400)  # referenced: kept however old
    strays = {}
    for name, age in (("exactly-the-grace", 3600), ("just-past-it", 3600.5), ("fresh", 10)):
        source = tmp_path / name
        source.write_bytes(name.encode())
        sha = sha256_file(source)
        store.upload(sync._object_key(sha), source)
        os.utime(Path(store.root) / sync._object_key(sha), (NOW - age, NOW - age))
        strays[name] = sha
    done = sync.gc(store, 1, TRUST, allow_unsigned=False)
    assert (done.manifests, done.objects) == ([], [sync._object_key(strays["just-past-it"])])
    assert strays["just-past-it"] not in objects(store)
    assert {strays["exactly-the-grace"], strays["fresh"]} <= set(objects(store))
    sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_gc_keeps_every_shard_while_a_kept_generation_cannot_be_verified(store, tmp_path, clock, gc_time):
    """A namespace signed with a key this gc does not hold may need any shard: none is deleted,
    and it is named; old generations still go by count, as for every namespace."""
    node = make_cache(tmp_path / "a", {"inductor/a.py": b"a"})
    sync.publish(store, node, "theirs-torch2.13.0-x-8888", OTHER_KEY, allow_unsigned=False, buckets=[1])
    sync.publish(store, node, "theirs-torch2.13.0-x-8888", OTHER_KEY, allow_unsigned=False, buckets=[2])
    sync.publish(store, make_cache(tmp_path / "b", {"inductor/b.py": b"b"}), NS, KEY, allow_unsigned=False)
    stray = tmp_path / "stray"
    stray.write_bytes(b"stray")
    store.upload(sync._object_key(sha256_file(stray)), stray)
    age_objects(store, 7200)
    shards = set(objects(store))
    done = sync.gc(store, 1, TRUST, allow_unsigned=False, grace_seconds=0)
    assert done.unverified == ["theirs-torch2.13.0-x-8888"] and done.objects == []
    assert done.manifests == [sync._manifest_key("theirs-torch2.13.0-x-8888", 1)]
    assert set(objects(store)) == shards


def test_gc_of_an_unsigned_store_with_allow_unsigned(store, tmp_path, clock, gc_time):
    node = make_cache(tmp_path / "a", {"inductor/a.py": b"a"})
    sync.publish(store, node, NS, None, allow_unsigned=True, buckets=[1])
    sync.publish(store, node, NS, None, allow_unsigned=True, buckets=[2])
    age_objects(store, 7200)
    done = sync.gc(store, 1, None, allow_unsigned=True)
    assert len(done.manifests) == 1 and done.objects == [] and done.unverified == []
    sync.verify(store, NS, None, allow_unsigned=True)


def test_gc_removes_what_writes_killed_midway_left_in_a_directory_store(store, tmp_path, gc_time):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    leftovers = Path(store.root) / "v1" / "objects" / "ab"
    leftovers.mkdir(parents=True, exist_ok=True)
    (old := leftovers / ".tmp-old").write_bytes(b"half")
    (young := leftovers / ".tmp-young").write_bytes(b"half")
    os.utime(old, (NOW - 7200, NOW - 7200))
    os.utime(young, (NOW - 60, NOW - 60))
    assert sync.gc(store, 1, TRUST, allow_unsigned=False, dry_run=True).uploads_aborted == 1 and old.exists()
    assert sync.gc(store, 1, TRUST, allow_unsigned=False).uploads_aborted == 1
    assert not old.exists() and young.exists()


# --- repair, every generation verified, transient corruption, lost create answers -------------------


def _shard_paths(store) -> list[Path]:
    return sorted(p for p in (Path(store.root) / "v1" / "objects").rglob("*") if p.is_file())


def test_repair_uploads_a_damaged_shard_again_from_local_files(store, tmp_path):
    source = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, source, NS, KEY, allow_unsigned=False)
    [shard] = _shard_paths(store)
    shard.write_bytes(b"garbage")
    with pytest.raises(sync.BadShard, match="holds 7 bytes where its manifest declares"):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    done = sync.repair(store, NS, source, KEY, allow_unsigned=False)
    assert (done.bad, done.restored, done.moved, done.dropped, done.generation, done.retired) == (
        [sync._object_key(shard.name)],
        1,
        0,
        [],
        None,
        [],
    )
    sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert sync.repair(store, NS, source, KEY, allow_unsigned=False).bad == []  # nothing left to do


def test_repair_without_local_files_drops_them_and_the_next_publish_brings_them_back(store, tmp_path):
    source = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, source, NS, KEY, allow_unsigned=False)
    [shard] = _shard_paths(store)
    shard.unlink()
    with pytest.raises(sync.BadShard, match="which the store lacks"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    partial = make_cache(tmp_path / "partial", {"inductor/pr/cprf.py": ARTIFACTS["inductor/pr/cprf.py"]})
    done = sync.repair(store, NS, partial, KEY, allow_unsigned=False)
    assert done.moved == 1 and sorted(done.dropped) == sorted(set(ARTIFACTS) - {"inductor/pr/cprf.py"})
    assert done.generation == 2 and done.retired == [1]  # generation 1 names the lost shard
    sync.verify(store, NS, TRUST, allow_unsigned=False)
    pulled = sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert pulled.generation == 2 and tree(tmp_path / "node") == {
        "inductor/pr/cprf.py": ARTIFACTS["inductor/pr/cprf.py"]
    }
    sync.publish(store, source, NS, KEY, allow_unsigned=False)  # a later warmup publishes the rest again
    sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert tree(tmp_path / "node") == ARTIFACTS


def test_verify_checks_every_generation(store, tmp_path):
    """Generation 1's own shard is damaged; generation 2 names other files as well: verify reads
    both generations and finds it, naming the generation."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    [first] = _shard_paths(store)
    sync.publish(
        store, make_cache(tmp_path / "b", {**ARTIFACTS, "inductor/new.py": b"new"}), NS, KEY, allow_unsigned=False
    )
    first.write_bytes(b"garbage")
    with pytest.raises(sync.BadShard, match=re.escape(f"namespace {NS} (generation 1)")):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    done = sync.repair(store, NS, None, KEY, allow_unsigned=False)  # no local files: generation 2 drops them
    assert done.generation == 3 and done.retired == [1, 2] and sync.generations(store, NS) == [3]
    assert sync.verify(store, NS, TRUST, allow_unsigned=False).files.keys() == {"inductor/new.py"}


def test_a_shard_corrupted_in_transit_is_fetched_again(store, tmp_path, monkeypatch):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    download, calls = type(store).download, []

    def flaky(self, key, path, size):
        download(self, key, path, size)
        calls.append(key)
        if len(calls) == 1:  # the first transfer of a shard arrives with a flipped byte
            data = bytearray(path.read_bytes())
            data[100] ^= 0xFF
            path.write_bytes(bytes(data))

    monkeypatch.setattr(type(store), "download", flaky)
    sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert len(calls) == 2 and tree(tmp_path / "node") == ARTIFACTS


def test_a_create_whose_answer_was_lost_is_the_publishers_own_win(store, tmp_path, monkeypatch):
    """The manifest's create reached the store but its answer did not: the retried create finds
    the object. It holds this publisher's bytes, so the publish succeeded: no lost race, no
    second generation."""
    create = type(store).create

    def answer_lost(self, key, data):
        create(self, key, data)
        return False  # what a retry after a dropped response sees: the object exists

    monkeypatch.setattr(type(store), "create", answer_lost)
    published = sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    assert published.generation == 1 and published.races == 0
    assert sync.generations(store, NS) == [1]


def test_a_local_listing_shows_namespaces_only(tmp_path):
    from orchestrator.cache.local import local_namespaces

    root = tmp_path / "cache"
    namespace = "mlp-torch2.13.0-cpu-x86-64-245b3387736f98d9"
    make_cache(root / namespace, {"inductor/a.py": b"abc"})
    for other in ("store/v1/objects", "node-0/inductor", ".trash-x", ".incoming-y"):
        (root / other).mkdir(parents=True)
    [listed] = local_namespaces(root)
    assert (listed.namespace, listed.files, listed.bytes) == (namespace, 1, 3)


# --- where a manifest is stored: copies, replays and roll-backs ---------------------------------------


def test_a_manifest_copied_into_another_namespace_is_refused(store, tmp_path):
    """Another namespace's generation 1, validly signed, copied to this namespace's generation 1:
    the number fits, only the signed namespace gives it away."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), "other-ns", KEY, allow_unsigned=False)
    assert store.create(sync._manifest_key(NS, 1), store.read(sync._manifest_key("other-ns", 1), 1 << 26))
    message = re.escape(
        f"{store.url}/v1/namespaces/{NS}/gen-00000001.json: manifest says namespace other-ns generation 1 "
        "but is stored elsewhere: copied or replayed; refusing it"
    )
    with pytest.raises(IntegrityError, match=f"^{message}$"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    with pytest.raises(IntegrityError, match=f"^{message}$"):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


def test_an_old_generation_replayed_under_a_newer_number_is_refused(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[1])
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[2])
    assert store.create(sync._manifest_key(NS, 3), store.read(sync._manifest_key(NS, 1), 1 << 26))
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"{store.url}/v1/namespaces/{NS}/gen-00000003.json: manifest says namespace {NS} generation 1 "
            "but is stored elsewhere"
        ),
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists()


def test_the_namespace_a_refusal_quotes_is_cut_at_100_characters():
    body = {**GOLDEN.body(), "namespace": "n" * 120}
    with pytest.raises(
        IntegrityError,
        match="^"
        + re.escape(
            f"w: manifest says namespace {'n' * 100} generation 3 but is stored elsewhere: copied or replayed; "
            "refusing it"
        )
        + "$",
    ):
        decode(signed(body), TRUST, allow_unsigned=False, where="w", namespace="elsewhere", generation=3)


def test_a_store_rolled_back_to_an_older_generation_is_refused_by_a_node_that_pulled_a_newer_one(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[1])
    make_cache(node, {"inductor/new.py": b"new"})
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[2])
    target = tmp_path / "node"
    assert sync.pull(store, NS, target, TRUST, allow_unsigned=False).generation == 2
    store.delete([sync._manifest_key(NS, 2)])  # the store as it was before generation 2
    with pytest.raises(
        IntegrityError,
        match="^"
        + re.escape(
            f"{store.url}/v1/namespaces/{NS}/gen-00000001.json: generation 1 is older than generation 2 already "
            f"pulled into {target} (store rolled back or replayed); refusing it (remove "
            f"{target / sync.APPLIED_MARKER} if the namespace was republished on purpose)"
        )
        + "$",
    ):
        sync.pull(store, NS, target, TRUST, allow_unsigned=False)
    assert tree(target) == {**ARTIFACTS, "inductor/new.py": b"new"} and sync.pulled_generation(target) == 2


def test_a_new_store_s_first_generation_is_no_rollback_of_another_store_s(store, tmp_path):
    """A node that pulled generation 2 from one store (the local one beside its cache) then pulls
    the same namespace from a new store, which has only its generation 1: generations count per
    store, so that is no rollback (the rollback of one store is refused by the test above)."""
    (tmp_path / "first-store").mkdir()
    first = open_store(f"file://{tmp_path / 'first-store'}")
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(first, node, NS, KEY, allow_unsigned=False, buckets=[1])
    make_cache(node, {"inductor/new.py": b"new"})
    sync.publish(first, node, NS, KEY, allow_unsigned=False, buckets=[2])
    target = tmp_path / "node"
    assert sync.pull(first, NS, target, TRUST, allow_unsigned=False).generation == 2
    sync.publish(store, make_cache(tmp_path / "b", ARTIFACTS), NS, KEY, allow_unsigned=False, buckets=[1])
    assert sync.pull(store, NS, target, TRUST, allow_unsigned=False).generation == 1
    assert sync.pulled_generation(target, store.url) == 1 and sync.pulled_generation(target, first.url) == 0
    assert sync.pull(store, NS, target, TRUST, allow_unsigned=False).files == 0  # current: nothing to fetch


def test_a_pulled_directory_records_namespace_generation_and_manifest_digest(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    target = tmp_path / "node"
    sync.pull(store, NS, target, TRUST, allow_unsigned=False)
    assert json.loads((target / sync.APPLIED_MARKER).read_text()) == {
        "namespace": NS,
        "generation": 1,
        "manifest": manifest_digest(store.read(sync._manifest_key(NS, 1), 1 << 26)),
        "store": store.url,
    }
    # a record without a readable whole-number generation counts as none
    assert sync.pulled_generation(tmp_path / "never-pulled") == 0
    for text in ("{}", '{"generation": "2"}', "[2]", "not json"):
        (target / sync.APPLIED_MARKER).write_text(text)
        assert sync.pulled_generation(target) == 0, text


def test_verify_refuses_a_generation_that_does_not_name_the_one_before(store, tmp_path):
    """A key holder's generation 2 that chains to something other than generation 1's manifest
    (generation 1 replaced after the fact, or 2 taken from another history) fails verify while
    generation 1 is in the store; once gc deleted generation 1 there is nothing to compare."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = {**envelope(store, NS, 1)["body"], "generation": 2, "previous": "00" * 32}
    assert store.create(sync._manifest_key(NS, 2), signed(body))
    with pytest.raises(
        IntegrityError,
        match="^"
        + re.escape(
            f"{store.url}/v1/namespaces/{NS}/gen-00000002.json: does not name generation 1's manifest as its "
            "previous one (replaced or reordered generations); refusing it"
        )
        + "$",
    ):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    store.delete([sync._manifest_key(NS, 1)])
    assert sync.verify(store, NS, TRUST, allow_unsigned=False).generation == 2


def test_verify_downloads_each_shard_once_however_many_generations_name_it(store, tmp_path, monkeypatch):
    monkeypatch.setattr(sync, "SHARD_BYTES", 10)
    node = make_cache(tmp_path / "a", {"f1": b"1" * 6, "f2": b"2" * 6})
    sync.publish(store, node, NS, KEY, allow_unsigned=False)
    make_cache(node, {"f3": b"3" * 6})
    sync.publish(store, node, NS, KEY, allow_unsigned=False)
    download, fetched = type(store).download, []

    def counted(self, key, path, size):
        fetched.append(key)
        return download(self, key, path, size)

    monkeypatch.setattr(type(store), "download", counted)
    sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert sorted(fetched) == sorted(i.key for i in store.list("v1/objects/")) and len(fetched) == 3


# --- listing a store -----------------------------------------------------------------------------------


def test_listing_shows_each_namespaces_newest_generation_or_why_it_cannot(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, "good", KEY, allow_unsigned=False, buckets=[1])
    make_cache(node, {"inductor/new.py": b"new"})
    sync.publish(store, node, "good", KEY, allow_unsigned=False, buckets=[2])
    sync.publish(store, node, "foreign", OTHER_KEY, allow_unsigned=False)
    sync.publish(store, node, "unsigned", None, allow_unsigned=True)
    good = sync.newest(store, "good", TRUST, allow_unsigned=False)
    rows = sync.listing(store, TRUST, allow_unsigned=False)
    assert [row.namespace for row in rows] == ["foreign", "good", "unsigned"]
    foreign, listed, unsigned = rows
    assert listed == sync.NamespaceListing(
        namespace="good",
        generations=2,
        generation=2,
        files=len(ARTIFACTS) + 1,
        bytes=good.total_bytes,
        buckets=[1, 2],
        created_at=good.created_at,
        error=None,
    )
    assert (foreign.generations, foreign.generation, foreign.files, foreign.bytes) == (1, None, None, None)
    assert (foreign.buckets, foreign.created_at) == (None, None)
    assert foreign.error.startswith(f"{store.url}/v1/namespaces/foreign/gen-00000001.json: manifest is signed by")
    assert unsigned.generation is None and "manifest is unsigned" in unsigned.error
    relaxed = {row.namespace: row for row in sync.listing(store, TRUST, allow_unsigned=True)}
    assert (relaxed["unsigned"].generation, relaxed["unsigned"].files, relaxed["unsigned"].error) == (
        1,
        len(ARTIFACTS) + 1,
        None,
    )
    (tmp_path / "empty").mkdir()
    assert sync.listing(open_store(f"file://{tmp_path / 'empty'}"), TRUST, allow_unsigned=False) == []


def test_newest_of_a_namespace_never_published_is_none(store):
    assert sync.newest(store, "never-published", TRUST, allow_unsigned=False) is None


# --- pull: what is carried over from the directory, and how the swap ends ----------------------------


def test_local_files_where_the_manifest_needs_a_directory_are_dropped_and_the_rest_stay(store, tmp_path):
    """Files only this node has are carried into the pulled directory, except one standing where the
    manifest needs a directory (`triton`, `inductor/fxgraph`). A stale file's own folder is scanned
    before its subfolder, so the local file below it comes after it."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = make_cache(
        tmp_path / "node",
        {
            "triton": b"a file where a folder goes",
            "inductor/fxgraph": b"another one, one level down",
            "inductor/pr/cprf.py": b"stale",
            "inductor/pr/sub/mine.txt": b"mine",
        },
    )
    pulled = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert pulled.files == len(ARTIFACTS)
    assert tree(node) == {**ARTIFACTS, "inductor/pr/sub/mine.txt": b"mine"}


def test_local_files_under_a_path_the_manifest_names_as_a_file_are_dropped(store, tmp_path):
    """The manifest names `top`, `r1/f` and `r2/f` as files; this node has folders there. What is
    under them goes; everything else stays, in whichever order the folders are read."""
    published = {"top": b"t", "r1/f": b"1", "r2/f": b"2"}
    sync.publish(store, make_cache(tmp_path / "a", published), NS, KEY, allow_unsigned=False)
    node = make_cache(
        tmp_path / "node",
        {"top/x": b"old", "r1/f/x": b"old", "r1/keep.txt": b"k1", "r2/f/x": b"old", "r2/keep.txt": b"k2"},
    )
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert tree(node) == {**published, "r1/keep.txt": b"k1", "r2/keep.txt": b"k2"}


def test_where_hard_links_fail_local_files_are_copied_except_on_a_full_disk(store, tmp_path, monkeypatch):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = make_cache(tmp_path / "node", {**ARTIFACTS, "inductor/pr/cprf.py": b"stale", "local/keep": b"k"})

    def no_link(code):
        def link(src, dst):
            raise OSError(code, os.strerror(code))

        return link

    monkeypatch.setattr(sync.os, "link", no_link(errno.ENOSPC))
    with pytest.raises(sync.DiskFull):
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert tree(node) == {**ARTIFACTS, "inductor/pr/cprf.py": b"stale", "local/keep": b"k"}
    monkeypatch.setattr(sync.os, "link", no_link(errno.EXDEV))  # a filesystem without hard links
    assert sync.pull(store, NS, node, TRUST, allow_unsigned=False).files == 1
    assert tree(node) == {**ARTIFACTS, "local/keep": b"k"} and no_staging_left(tmp_path)


def test_a_pull_into_a_link_to_a_directory_works_in_the_real_directory(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    real = make_cache(tmp_path / "real", {"local/keep": b"k"})
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    sync.pull(store, NS, link, TRUST, allow_unsigned=False)
    assert link.is_symlink() and tree(real) == {**ARTIFACTS, "local/keep": b"k"}
    assert no_staging_left(tmp_path)


def test_the_old_directory_moved_aside_is_removed_once_the_new_one_is_in_place(store, tmp_path, monkeypatch):
    """Without an atomic exchange the swap is two renames; after the second the old directory goes,
    and one left by a pull killed just after the second rename goes on the next pull."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    make_cache(tmp_path / "a", {"inductor/new.py": b"new"})
    sync.publish(store, tmp_path / "a", NS, KEY, allow_unsigned=False)
    monkeypatch.setattr(sync, "_exchange", lambda a, b: False)
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert tree(node) == {**ARTIFACTS, "inductor/new.py": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # the lock went too
    left = make_cache(tmp_path / ".previous-node", {"inductor/old.py": b"old"})
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert not left.exists() and tree(node) == {**ARTIFACTS, "inductor/new.py": b"new"}


def _renameat2_exchanges(a: Path, b: Path) -> bool:
    """Whether this kernel and filesystem exchange two directories: asked directly, not through sync."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0


def test_the_exchange_takes_paths_relative_to_the_working_directory_and_reports_failures(tmp_path, monkeypatch):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "which").write_text(name)
    if not _renameat2_exchanges(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this kernel or filesystem has no renameat2(RENAME_EXCHANGE)")
    monkeypatch.chdir(tmp_path)  # the probe swapped them: a holds "b"
    assert sync._exchange(Path("a"), Path("b")) is True
    assert (tmp_path / "a" / "which").read_text() == "a" and (tmp_path / "b" / "which").read_text() == "b"
    with pytest.raises(FileNotFoundError) as missing:
        sync._exchange(tmp_path / "a", tmp_path / "missing")
    assert (missing.value.errno, missing.value.strerror, missing.value.filename) == (
        errno.ENOENT,
        os.strerror(errno.ENOENT),
        str(tmp_path / "missing"),
    )
    (tmp_path / "a" / "sub").mkdir()
    assert sync._exchange(tmp_path / "a", tmp_path / "a" / "sub") is False  # EINVAL: the caller renames instead


def test_a_full_disk_says_how_much_the_namespace_takes(store, tmp_path, monkeypatch):
    sync.publish(store, make_cache(tmp_path / "a", {"big.bin": b"x" * 1_050_000}), NS, KEY, allow_unsigned=False)

    def no_space(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", no_space)
    with pytest.raises(
        sync.DiskFull,
        match="^"
        + re.escape(
            f"no space left on the device of {tmp_path} while pulling {NS} (its files take 1.1 MB); "
            "free space there or pull to a larger disk; the directory is unchanged"
        )
        + "$",
    ):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)


@pytest.mark.parametrize(
    "name, message",
    [
        ("inductor/a\0b.py", "names an unsafe path 'inductor/a\\x00b.py'"),
        ("triton", "names 'triton' as a file and as the directory of 'triton/HASH/"),
    ],
)
def test_a_nul_in_a_path_or_a_top_level_clash_is_refused(store, tmp_path, name, message):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    body["files"][name] = body["files"]["inductor/pr/cprf.py"]
    write_signed(store, NS, body)
    with pytest.raises(IntegrityError, match=re.escape(message)):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists() and no_staging_left(tmp_path)


# --- repair and gc: counts, chains and boundaries ------------------------------------------------------


def _two_shards(store, tmp_path, monkeypatch, key=KEY) -> Path:
    monkeypatch.setattr(sync, "SHARD_BYTES", 10)
    source = make_cache(tmp_path / "a", {"f1": b"1" * 6, "f2": b"2" * 6})
    sync.publish(store, source, NS, key, allow_unsigned=key is None)
    assert len(_shard_paths(store)) == 2
    return source


def test_repair_restores_every_damaged_shard_and_counts_them(store, tmp_path, monkeypatch):
    source = _two_shards(store, tmp_path, monkeypatch)
    for shard in _shard_paths(store):
        shard.write_bytes(b"garbage")
    done = sync.repair(store, NS, source, KEY, allow_unsigned=False)
    assert (done.namespace, done.shards, len(done.bad), done.restored, done.generation) == (NS, 2, 2, 2, None)
    sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_repair_without_a_directory_drops_every_file_of_every_lost_shard(store, tmp_path, monkeypatch):
    """No directory: nothing local is read, not even the working directory, which here holds the
    very files. The new generation names no shard it does not use and nothing new is uploaded."""
    source = _two_shards(store, tmp_path, monkeypatch)
    for shard in _shard_paths(store):
        shard.unlink()
    monkeypatch.chdir(source)
    done = sync.repair(store, NS, None, KEY, allow_unsigned=False)
    assert (done.dropped, done.moved, done.restored, done.generation, done.retired) == (["f1", "f2"], 0, 0, 2, [1])
    manifest = sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert (manifest.files, manifest.shards) == ({}, {}) and store.list("v1/objects/") == []


def test_a_repaired_generation_chains_to_the_newest_one_it_replaces(store, tmp_path):
    node = make_cache(tmp_path / "a", {"inductor/a.py": b"a"})
    sync.publish(store, node, NS, KEY, allow_unsigned=False)
    make_cache(node, {"inductor/b.py": b"b"})
    sync.publish(store, node, NS, KEY, allow_unsigned=False)
    second = store.read(sync._manifest_key(NS, 2), 1 << 26)
    lost = envelope(store, NS, 2)["body"]["files"]["inductor/b.py"]["shard"]
    (Path(store.root) / sync._object_key(lost)).unlink()
    done = sync.repair(store, NS, None, KEY, allow_unsigned=False)
    assert (done.generation, done.retired, done.dropped) == (3, [2], ["inductor/b.py"])
    assert sync.generations(store, NS) == [1, 3]
    repaired = sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert repaired.previous == manifest_digest(second) and set(repaired.shards) == {
        e.shard for e in repaired.files.values()
    }


def test_repair_of_an_unsigned_namespace_with_allow_unsigned(store, tmp_path, monkeypatch):
    _two_shards(store, tmp_path, monkeypatch, key=None)
    _shard_paths(store)[0].unlink()
    done = sync.repair(store, NS, None, None, allow_unsigned=True)
    assert done.generation == 2 and len(done.dropped) == 1
    assert sync.verify(store, NS, None, allow_unsigned=True).generation == 2


def test_repair_that_a_publisher_beats_to_the_next_generation_repairs_from_its_generation(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    [shard] = _shard_paths(store)
    shard.unlink()
    rival = make_cache(tmp_path / "rival", {"inductor/rival.py": b"r"})
    done = sync.repair(RacingStore(store, [rival], KEY, False), NS, None, KEY, allow_unsigned=False)
    assert (done.generation, done.retired) == (3, [1, 2])  # the rival's generation 2 named the lost shard too
    assert sync.verify(store, NS, TRUST, allow_unsigned=False).files.keys() == {"inductor/rival.py"}


def test_repair_says_when_a_namespace_was_never_published_or_every_race_was_lost(store, tmp_path, monkeypatch):
    with pytest.raises(NotFound, match=f"^{re.escape(store.url)}: namespace nope was never published$"):
        sync.repair(store, "nope", None, KEY, allow_unsigned=False)
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    _shard_paths(store)[0].unlink()
    monkeypatch.setattr(sync, "MAX_PUBLISH_RACES", 2)
    losing = SimpleNamespace(
        url=store.url,
        list=store.list,
        read=store.read,
        download=store.download,
        upload=store.upload,
        delete=store.delete,
        create=lambda key, data: False,
    )
    with pytest.raises(StoreError, match=f"^repair {NS}: lost 2 races for the next manifest generation$"):
        sync.repair(losing, NS, None, KEY, allow_unsigned=False)


def test_gc_keeps_at_least_one_generation():
    with pytest.raises(ValueError, match="^gc keeps at least the newest generation of every namespace$"):
        sync.gc(None, 0, TRUST, allow_unsigned=False)


def test_gc_retires_namespaces_unused_for_longer_than_the_limit_and_goes_on_with_the_rest(store, tmp_path, gc_time):
    """Namespaces are read in name order: two retired ones come before one exactly at the limit
    (kept) and one still in use whose older generation goes."""
    ages = {"a-old": 30 * 86400 + 10, "b-old": 31 * 86400, "c-edge": 30 * 86400, "d-live": 60}
    for namespace in ages:
        node = make_cache(tmp_path / namespace, {f"{namespace}.py": namespace.encode()})
        sync.publish(store, node, namespace, KEY, allow_unsigned=False)
    sync.publish(store, make_cache(tmp_path / "d-live", {"more.py": b"more"}), "d-live", KEY, allow_unsigned=False)
    for namespace, age in ages.items():
        for path in (Path(store.root) / "v1" / "namespaces" / namespace).iterdir():
            os.utime(path, (NOW - age, NOW - age))
    age_objects(store, 40 * 86400)
    sizes = {
        namespace: (Path(store.root) / sync._object_key(entry.shard)).stat().st_size
        for namespace in ("a-old", "b-old")
        for entry in sync.newest(store, namespace, TRUST, allow_unsigned=False).files.values()
    }
    done = sync.gc(store, 1, TRUST, allow_unsigned=False, unused_days=30)
    assert done.retired_namespaces == ["a-old", "b-old"]
    assert done.manifests == [
        sync._manifest_key("a-old", 1),
        sync._manifest_key("b-old", 1),
        sync._manifest_key("d-live", 1),
    ]
    assert len(done.objects) == 2 and done.bytes_freed == sum(sizes.values())
    assert sync.namespaces(store) == ["c-edge", "d-live"]
    for namespace in ("c-edge", "d-live"):
        sync.verify(store, namespace, TRUST, allow_unsigned=False)


# --- manifest.py: what a refusal quotes, and the keys' smaller surfaces --------------------------------


def test_refusals_quote_at_most_32_characters_of_an_algorithm_or_key_id_and_every_trusted_key():
    data = json.dumps({"body": GOLDEN.body(), "signature": {"alg": "a" * 40, "key_id": "x", "value": "00"}}).encode()
    with pytest.raises(
        IntegrityError,
        match="^"
        + re.escape(
            f"w: manifest is signed with {'a' * 32!r}, not ed25519; refusing it "
            "(republish it with this version of orchestrate)"
        )
        + "$",
    ):
        decode(data, TRUST, allow_unsigned=False, where="w")
    data = json.dumps({"body": GOLDEN.body(), "signature": {"alg": "ed25519", "key_id": "k" * 40, "value": "00"}})
    both = TrustedKeys([KEY.public, OTHER_KEY.public])
    with pytest.raises(
        IntegrityError,
        match=re.escape(
            f"w: manifest is signed by key id {'k' * 32}, which is not trusted "
            f"(trusted: {', '.join(sorted([KEY.key_id, OTHER_KEY.key_id]))}); refusing it"
        ),
    ):
        decode(data.encode(), both, allow_unsigned=False, where="w")


@pytest.mark.parametrize("size", [10**400, -1, True], ids=["10^400", "negative", "a boolean"])
def test_a_size_no_file_can_have_is_malformed(size):
    """JSON's integers are unbounded: a size of 10^400 would overflow the first float that meets it."""
    entry = {"sha256": "ab" * 32, "size": size, "shard": "cd" * 32}
    for body in ({**GOLDEN.body(), "files": {"a.py": entry}}, {**GOLDEN.body(), "shards": {"cd" * 32: size}}):
        with pytest.raises(
            IntegrityError, match=r"^w: manifest is malformed \(a field has the wrong type\); refusing it$"
        ):
            decode(signed(body), TRUST, allow_unsigned=False, where="w")


def test_a_file_size_off_by_one_is_refused_not_fetched_at_every_pull(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    rel = sorted(body["files"])[0]
    body["files"][rel]["size"] += 1
    write_signed(store, NS, body)
    with pytest.raises(sync.BadShard, match=rf"{re.escape(rel)} is \d+ bytes where its manifest declares \d+ \(a bad"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert not (tmp_path / "node").exists()


def test_a_malformed_body_is_named_in_one_short_line():
    with pytest.raises(IntegrityError, match=r"^w: manifest is malformed \(a field has the wrong type\); refusing it$"):
        decode(signed({**GOLDEN.body(), "generation": "3"}), TRUST, allow_unsigned=False, where="w")
    entry = {"sha256": "ab" * 32, "size": 1, "shard": "cd" * 32, "z" * 100: 1}
    with pytest.raises(IntegrityError) as info:
        decode(signed({**GOLDEN.body(), "files": {"a.py": entry}}), TRUST, allow_unsigned=False, where="w")
    detail = re.fullmatch(r"w: manifest is malformed \((.*)\); refusing it", str(info.value)).group(1)
    assert len(detail) == 80 and "unexpected keyword argument 'zzzz" in detail


def test_a_public_key_in_hex_and_how_keys_compare_and_print():
    raw = (
        serialization.load_pem_public_key(GOLDEN_PUBLIC.encode())
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        .hex()
    )
    public = PublicKey.from_text(raw.encode(), "k")
    assert public == KEY.public and public.key_id == GOLDEN_KEY_ID
    assert public != KEY and public != GOLDEN_KEY_ID  # a signing key of the same id is not a public key
    assert len({public, KEY.public, OTHER_KEY.public}) == 2
    with pytest.raises(IntegrityError, match=r"^k: not an Ed25519 public key \(PEM or 64 hex digits\)"):
        PublicKey.from_text(raw[:-2].encode(), "k")
    assert repr(TrustedKeys()) == "TrustedKeys(none)"
    assert repr(TrustedKeys([KEY.public, OTHER_KEY.public])) == f"TrustedKeys({KEY.key_id}, {OTHER_KEY.key_id})"
    assert TrustedKeys([KEY.public]).get(["not", "an", "id"]) is None and TrustedKeys([KEY.public]).get(None) is None
    with pytest.raises(IntegrityError, match=r"^trusted key: not an Ed25519 public key"):
        TrustedKeys.from_pems(["-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n"])


def test_a_file_written_whole_is_the_old_one_or_the_new_one_and_leaves_no_scratch(tmp_path):
    namespace = tmp_path / "ns"
    target = namespace / "inductor" / "torch-key"
    write_whole(target, "a" * 64)  # its directory made where missing
    assert target.read_text() == "a" * 64 and sync.scan(namespace) == {"inductor/torch-key": (target, 64)}

    # a block that raises (a config that would not load, a full disk refusing the bytes) changes nothing
    for failure in (ValueError("would not load"), OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(type(failure)), replacing(target) as scratch:
            scratch.write_text("b" * 10)
            raise failure
    assert target.read_text() == "a" * 64 and os.listdir(target.parent) == ["torch-key"]

    # a scratch that a killed writer left is never taken for an artifact by the next publish
    scratch_beside(target).write_text("half")
    assert list(sync.scan(namespace)) == ["inductor/torch-key"]

    # the mode asked for, else what any new file gets
    old = os.umask(0o022)
    try:
        write_whole(target, b"c", mode=0o640)
        assert target.read_bytes() == b"c" and target.stat().st_mode & 0o777 == 0o640
        write_whole(target, "d")
        assert target.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
    long_name = scratch_beside(tmp_path / ("x" * 248 + ".json.gz")).name  # within the filesystem's limit on a name
    assert long_name.startswith(".tmp-") and len(long_name) == 255 and long_name.endswith("x.json.gz")
    wide = scratch_beside(tmp_path / ("é" * 127)).name  # 254 bytes: cut between characters, never inside one
    assert len(wide.encode()) <= 255 and wide.endswith("é" * 118)
