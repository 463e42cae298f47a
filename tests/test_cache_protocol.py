"""The publish/pull protocol against real stores: a directory store here, S3 (moto) in test_s3_store.py.

Cache contents are opaque files to the protocol, so these tests use generated files; the
end-to-end tests warm a real compiled model through the same code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

import pytest

from orchestrator.cache import sync
from orchestrator.cache.manifest import IntegrityError, SigningKey, TrustedKeys, sha256_file
from orchestrator.cache.store import open_store

# fixed seeds: Ed25519 signatures are deterministic, so the manifests these sign are reproducible
KEY = SigningKey.from_text(b"6b" * 32, "test key")
OTHER_KEY = SigningKey.from_text(b"6f" * 32, "test key")
TRUST = TrustedKeys([KEY.public])  # what a reader holds: public keys only
OTHER_TRUST = TrustedKeys([OTHER_KEY.public])
NS = "mlp-torch2.13.0-cpu-x86-64-0123456789abcdef"


def make_cache(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name not in (sync.APPLIED_MARKER, sync.VERIFIED_RECORD)
    }


ARTIFACTS = {
    "inductor/fxgraph/ab/fabc/entry": b"pickled entry",
    "inductor/aotautograd/aq/entry": b"aot entry",
    "inductor/pr/cprf.py": b"# generated code\n" * 100,
    "triton/HASH/kernel.cubin": os.urandom(3 * 1024 * 1024),
    "triton/HASH/__grp__kernel.json": b"{}",
}
NOT_ARTIFACTS = {"inductor/locks/cprf.lock": b"", "inductor/pr/tmpab12cd": b"half written"}


@pytest.fixture
def store(tmp_path):
    (tmp_path / "store").mkdir()
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture
def clock(monkeypatch):
    """The clock publish() stamps `created_at` with, moved by hand: ordering without sleeping."""

    class Clock(datetime):
        current = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)

        @classmethod
        def now(cls, tz=None):
            return cls.current.astimezone(tz) if tz is not None else cls.current.replace(tzinfo=None)

        @classmethod
        def advance(cls, seconds: float) -> None:
            cls.current += timedelta(seconds=seconds)

    monkeypatch.setattr(sync, "datetime", Clock)
    return Clock


def test_round_trip_skips_locks_and_temporaries(store, tmp_path):
    node_a = make_cache(tmp_path / "a", {**ARTIFACTS, **NOT_ARTIFACTS})
    published = sync.publish(store, node_a, NS, KEY, allow_unsigned=False, buckets=[1, 8])
    assert published.generation == 1 and published.files == len(ARTIFACTS) and published.shards == 1
    pulled = sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert pulled.generation == 1 and pulled.files == len(ARTIFACTS)
    assert tree(tmp_path / "b") == ARTIFACTS
    assert sync.pulled_generation(tmp_path / "b") == 1
    again = sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert again.files == 0 and again.shards == 0  # already complete: nothing downloaded
    assert sync.pull(store, "never-published", tmp_path / "c", TRUST, allow_unsigned=False) is None


def test_scan_lists_artifacts_by_relative_path_and_never_through_a_link(tmp_path):
    root = make_cache(tmp_path / "ns", {**ARTIFACTS, **NOT_ARTIFACTS})
    outside = make_cache(tmp_path / "outside", {"secret.txt": b"not ours"})
    (root / "inductor" / "linked-dir").symlink_to(outside, target_is_directory=True)
    (root / "inductor" / "linked-file").symlink_to(outside / "secret.txt")
    found = sync.scan(root)
    assert {rel: size for rel, (_, size) in found.items()} == {rel: len(data) for rel, data in ARTIFACTS.items()}
    assert all(path == root / rel for rel, (path, _) in found.items())
    assert sync.scan(tmp_path / "missing") == {}


def test_new_buckets_extend_a_namespace(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[1])
    sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    make_cache(node, {"inductor/fxgraph/zz/fzz/entry": b"bucket 32"})
    second = sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[32])
    assert second.generation == 2 and second.files == 1
    manifest = sync.newest(store, NS, TRUST, allow_unsigned=False)
    assert manifest.buckets == [1, 32] and len(manifest.files) == len(ARTIFACTS) + 1
    pulled = sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert pulled.files == 1 and pulled.shards == 1  # only the new shard travels
    # publishing the same state again adds no generation
    assert sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[32]).generation == 2


PUBLISHER = """
import sys, time
from pathlib import Path
from orchestrator.cache import sync
from orchestrator.cache.manifest import SigningKey
from orchestrator.cache.store import open_store
store, directory, namespace = open_store(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 5:  # held back: publish only once this file exists
    deadline = time.monotonic() + 120
    while not Path(sys.argv[5]).exists():
        if time.monotonic() > deadline:
            sys.exit("never released: " + sys.argv[5])
        time.sleep(0.01)
key = SigningKey.from_text(b"6b" * 32, "k")
transfer = sync.publish(store, directory, namespace, key, allow_unsigned=False, buckets=[int(sys.argv[4])])
print(transfer.generation, transfer.races)
"""


def start_publishers(
    store_url: str, tmp_path: Path, publishers: int = 8, release: Optional[Path] = None
) -> list[subprocess.Popen]:
    """One process per publisher on namespace NS, each with its own files and one path all share.
    With `release`, the last publisher waits for that file to exist before it publishes."""
    procs = []
    for i in range(publishers):
        node = make_cache(
            tmp_path / f"node{i}",
            {
                f"inductor/fxgraph/{i:02d}/entry": f"bucket {i}".encode(),
                f"triton/k{i}/kernel.cubin": os.urandom(200_000),
                "inductor/shared/code.py": f"compiled by node {i}".encode(),  # same path, different bytes
            },
        )
        held = [str(release)] if release is not None and i == publishers - 1 else []
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PUBLISHER, store_url, str(node), NS, str(i + 1), *held],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
        )
    return procs


def finish_publishers(procs: list[subprocess.Popen]) -> list[subprocess.CompletedProcess]:
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def publish_concurrently(store_url: str, tmp_path: Path, publishers: int = 8) -> list[subprocess.CompletedProcess]:
    return finish_publishers(start_publishers(store_url, tmp_path, publishers))


def check_consistent(store, publishers: int) -> None:
    manifest = sync.newest(store, NS, TRUST, allow_unsigned=False)
    assert manifest.buckets == list(range(1, publishers + 1))
    assert len(manifest.files) == 2 * publishers + 1  # every publisher's files, the shared path once
    assert sync.generations(store, NS) == list(range(1, publishers + 1))  # none lost, none overwritten
    sync.verify(store, NS, TRUST, allow_unsigned=False)


@dataclass(frozen=True)
class Observation:
    """One pull by the racing reader."""

    generation: Optional[int]  # None: nothing published yet, or the pull failed
    complete: Optional[bool]  # the pulled tree is exactly the manifest's file list
    error: Optional[str]
    during_publishing: bool  # the pull returned before the last publisher had exited


def test_concurrent_publishers_and_a_racing_reader(store, tmp_path):
    """8 publisher processes on one namespace while a reader pulls in a loop: every pull sees a
    complete, verified state, generations never go back, and the end state holds all 8
    publishers' files. The last publisher is held back until a pull of the reader has landed, so a
    pull during publishing is guaranteed however the machine schedules us; the other 7 race each
    other freely."""
    observations: list[Observation] = []
    first_pull_landed, publishers_done, stop = threading.Event(), threading.Event(), threading.Event()
    deadline = time.monotonic() + 180  # the reader's bound, whatever happens to the publishers

    def reader() -> None:
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            n += 1
            target = tmp_path / "readers" / f"pull{n}"
            generation = complete = error = None
            try:
                pulled = sync.pull(store, NS, target, TRUST, allow_unsigned=False)
                if pulled is not None:
                    generation = pulled.generation
                    manifest = json.loads(store.read(sync._manifest_key(NS, generation), 1 << 26))["body"]["files"]
                    complete = sorted(tree(target)) == sorted(manifest)
            except Exception as exc:  # any failure is a protocol bug: recorded, asserted below
                error = repr(exc)
            during = not publishers_done.is_set()  # read after the pull returned: conservative
            observations.append(Observation(generation, complete, error, during))
            if generation is not None or error is not None:
                first_pull_landed.set()  # the held-back publisher may go: this pull was during publishing
            shutil.rmtree(target, ignore_errors=True)
            if generation is None and error is None:
                time.sleep(0.005)  # nothing published yet: let the publishers have the CPU

    release = tmp_path / "release-the-last-publisher"
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    procs = start_publishers(store.url, tmp_path, 8, release=release)
    try:
        first_pull_landed.wait(timeout=120)
    finally:
        release.touch()
        results = finish_publishers(procs)
        publishers_done.set()
    time.sleep(0.05)  # a few pulls of the final state too
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the reader did not stop"

    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert sorted(int(r.stdout.split()[0]) for r in results) == list(range(1, 9))
    assert [o.error for o in observations if o.error] == []
    pulled = [o for o in observations if o.generation is not None]
    assert [o for o in pulled if not o.complete] == []  # never a partial namespace
    assert any(o.during_publishing for o in pulled), f"no pull landed while publishing: {observations[-5:]}"
    generations = [o.generation for o in pulled]
    assert generations == sorted(generations)  # a reader never goes back to an older generation
    check_consistent(store, 8)
    # first writer wins per path: the shared file keeps generation 1's bytes in every later one
    gen1 = json.loads(store.read(sync._manifest_key(NS, 1), 1 << 26))["body"]["files"]["inductor/shared/code.py"]
    final = tmp_path / "final"
    sync.pull(store, NS, final, TRUST, allow_unsigned=False)
    assert sha256_file(final / "inductor/shared/code.py") == gen1["sha256"]


def _published(store, tmp_path) -> Path:
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    return Path(store.root)


def test_flipped_byte_in_a_shard_is_refused_and_touches_nothing(store, tmp_path):
    root = _published(store, tmp_path)
    shard = next(p for p in (root / "v1" / "objects").rglob("*") if p.is_file())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".incoming")] == []


def test_edited_manifest_is_refused(store, tmp_path):
    root = _published(store, tmp_path)
    path = root / sync._manifest_key(NS, 1)
    envelope = json.loads(path.read_text())
    envelope["body"]["files"]["inductor/pr/cprf.py"]["sha256"] = "0" * 64
    path.write_text(json.dumps(envelope))
    with pytest.raises(IntegrityError, match="signature does not match"):
        sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert not (tmp_path / "b").exists()


def test_wrong_key_is_refused_without_revealing_either_key(store, tmp_path):
    _published(store, tmp_path)
    with pytest.raises(IntegrityError) as info:
        sync.pull(store, NS, tmp_path / "b", OTHER_TRUST, allow_unsigned=False)
    message = str(info.value)
    assert KEY.key_id in message and OTHER_KEY.key_id in message
    assert "6b6b6b" not in message and "6f6f6f" not in message and "BEGIN" not in message


def test_unsigned_needs_explicit_opt_in_on_both_sides(store, tmp_path):
    node = make_cache(tmp_path / "a", ARTIFACTS)
    with pytest.raises(IntegrityError, match="needs the private signing key"):
        sync.publish(store, node, NS, None, allow_unsigned=False)
    sync.publish(store, node, NS, None, allow_unsigned=True)
    with pytest.raises(IntegrityError, match="unsigned"):
        sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert sync.pull(store, NS, tmp_path / "b", None, allow_unsigned=True).files == len(ARTIFACTS)


def test_unsafe_paths_in_a_signed_manifest_are_refused(store, tmp_path):
    root = _published(store, tmp_path)
    path = root / sync._manifest_key(NS, 1)
    envelope = json.loads(path.read_text())
    body = envelope["body"]
    body["files"]["../../escape.py"] = body["files"].pop("inductor/pr/cprf.py")
    envelope["signature"]["value"] = KEY.sign(body)  # even a validly signed one
    path.write_text(json.dumps(envelope))
    with pytest.raises(IntegrityError, match="unsafe path"):
        sync.pull(store, NS, tmp_path / "deep" / "b", TRUST, allow_unsigned=False)
    assert not (tmp_path / "escape.py").exists()


def test_gc_keeps_each_namespace_and_its_referenced_shards(store, tmp_path, clock):
    old = make_cache(tmp_path / "old", {"inductor/a": b"old artifact"})
    new = make_cache(tmp_path / "new", {"inductor/b": b"new artifact"})
    sync.publish(store, old, "mlp-torch2.11.0-x-1111", KEY, allow_unsigned=False, meta={"model": "mlp"})
    clock.advance(1)
    sync.publish(store, new, "mlp-torch2.13.0-x-2222", KEY, allow_unsigned=False, meta={"model": "mlp"})
    done = sync.gc(store, 1, TRUST, allow_unsigned=False, grace_seconds=0)
    assert (done.namespaces, done.manifests, done.objects) == (2, [], [])  # same model name, two namespaces
    assert sync.namespaces(store) == ["mlp-torch2.11.0-x-1111", "mlp-torch2.13.0-x-2222"]
    sync.verify(store, "mlp-torch2.13.0-x-2222", TRUST, allow_unsigned=False)
