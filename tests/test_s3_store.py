"""The cache protocol over HTTP against a real S3-protocol server (moto) on loopback, with faults
injected by a proxy in front of it: what production's boto3 path meets."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
from test_cache_protocol import ARTIFACTS, KEY, NS, TRUST, check_consistent, make_cache, publish_concurrently, tree

from orchestrator.cache import store as store_module
from orchestrator.cache import sync
from orchestrator.cache.manifest import IntegrityError
from orchestrator.cache.store import StoreAuthError, StoreUnreachable, open_store


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """Standard AWS variables pointing at the loopback server; returns a fresh bucket's URL."""

    def point_at(endpoint: str, access_key: str | None = None, secret_key: str | None = None) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key or moto_server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key or moto_server.secret_key)
        monkeypatch.setenv("AWS_DEFAULT_REGION", moto_server.region)
        monkeypatch.setenv("ORCHESTRATE_STORE_ATTEMPTS", "4")
        monkeypatch.setenv("ORCHESTRATE_STORE_READ_TIMEOUT", "1")

    point_at(moto_server.endpoint)
    bucket = moto_server.make_bucket()
    return point_at, f"s3://{bucket}/cache"


def test_round_trip_and_exclusive_create(s3_env, tmp_path):
    _, url = s3_env
    store = open_store(url)
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False, buckets=[1])
    assert sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False).files == len(ARTIFACTS)
    assert tree(tmp_path / "b") == ARTIFACTS
    assert store.create("probe", b"first") is True
    assert store.create("probe", b"second") is False
    assert store.read("probe", 100) == b"first"


def test_multipart_shards(s3_env, tmp_path, monkeypatch):
    _, url = s3_env
    monkeypatch.setenv("ORCHESTRATE_STORE_MULTIPART_BYTES", str(8 * 1024 * 1024))
    big = {"triton/big/kernel.cubin": os.urandom(20 * 1024 * 1024), "inductor/x.py": b"code"}
    store = open_store(url)
    sync.publish(store, make_cache(tmp_path / "a", big), NS, KEY, allow_unsigned=False)
    sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert tree(tmp_path / "b") == big


def test_eight_concurrent_publishers_leave_one_consistent_state(s3_env, tmp_path):
    _, url = s3_env
    results = publish_concurrently(url, tmp_path)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    check_consistent(open_store(url), 8)


def test_tampering_is_refused(s3_env, moto_server, tmp_path):
    _, url = s3_env
    store = open_store(url)
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    client, bucket = moto_server.client(), url.split("/")[2]
    [shard] = [o for o in store.list(f"{sync.PREFIX}/objects/")]
    data = bytearray(store.read(shard.key, shard.size))
    data[100] ^= 0x01
    client.put_object(Bucket=bucket, Key=f"cache/{shard.key}", Body=bytes(data))
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert not (tmp_path / "b").exists()
    manifest_key = f"cache/{sync._manifest_key(NS, 1)}"
    edited = store.read(sync._manifest_key(NS, 1), 1 << 26).replace(b'"buckets": []', b'"buckets": [64]')
    client.put_object(Bucket=bucket, Key=manifest_key, Body=edited)
    with pytest.raises(IntegrityError, match="signature does not match"):
        sync.pull(store, NS, tmp_path / "c", TRUST, allow_unsigned=False)


@pytest.mark.parametrize("inject", ["fail_503", "fail_500", "reset", "stall"])
def test_transient_faults_are_retried_to_success(s3_env, fault_proxy, tmp_path, inject):
    point_at, url = s3_env
    point_at(fault_proxy.url)
    store = open_store(url)
    node = make_cache(tmp_path / "a", ARTIFACTS)
    {
        "fail_503": lambda: fault_proxy.fail_next(2, status=503),
        "fail_500": lambda: fault_proxy.fail_next(2, status=500),
        "reset": lambda: fault_proxy.reset_next(2),
        "stall": lambda: fault_proxy.stall_next(1, 3.0),
    }[inject]()
    sync.publish(store, node, NS, KEY, allow_unsigned=False, buckets=[1])
    assert fault_proxy.requests > fault_proxy.forwarded  # the faults really happened
    {
        "fail_503": lambda: fault_proxy.fail_next(2, status=503),
        "fail_500": lambda: fault_proxy.fail_next(2, status=500),
        "reset": lambda: fault_proxy.reset_next(2),
        "stall": lambda: fault_proxy.stall_next(1, 3.0),
    }[inject]()
    assert sync.pull(store, NS, tmp_path / "b", TRUST, allow_unsigned=False).files == len(ARTIFACTS)
    assert tree(tmp_path / "b") == ARTIFACTS


def test_store_down_is_one_bounded_error_without_a_retry_storm(s3_env, fault_proxy, tmp_path):
    point_at, url = s3_env
    point_at(fault_proxy.url)
    fault_proxy.fail_next(1000, status=503)
    with pytest.raises(StoreUnreachable, match="gave up after 4 attempts") as info:
        sync.pull(open_store(url), NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert fault_proxy.requests == 4  # ours are the only retries: botocore's are off
    assert fault_proxy.url.split("//")[1] in str(info.value)
    assert not (tmp_path / "b").exists()


def test_bad_credentials_fail_at_once(s3_env, fault_proxy, moto_server, tmp_path):
    point_at, url = s3_env
    point_at(fault_proxy.url, secret_key="wrong-secret-value")
    with pytest.raises(StoreAuthError, match="access refused") as info:
        sync.pull(open_store(url), NS, tmp_path / "b", TRUST, allow_unsigned=False)
    assert fault_proxy.requests == 1  # not retried
    assert "wrong-secret-value" not in str(info.value) and moto_server.secret_key not in str(info.value)


def test_missing_credentials_name_the_fix(s3_env, monkeypatch, tmp_path):
    _, url = s3_env
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreAuthError, match="no AWS credentials found; set AWS_ACCESS_KEY_ID"):
        sync.pull(open_store(url), NS, tmp_path / "b", TRUST, allow_unsigned=False)


@pytest.mark.parametrize("transfer", ["one ranged GET", "the transfer manager"])
def test_a_full_local_disk_while_downloading_is_disk_full_naming_the_directory(s3_env, monkeypatch, tmp_path, transfer):
    """The store answers; only the local side of the download fails, where the shard is written
    (by the store itself for a shard within one request, by boto3's transfer for a larger one):
    that is the local disk's error (DiskFull naming where the pull writes), not the store's."""
    from s3transfer.utils import OSUtils

    if transfer == "the transfer manager":
        monkeypatch.setenv("ORCHESTRATE_STORE_MULTIPART_BYTES", "1024")
    _, url = s3_env
    store = open_store(url)
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "pulled" / "node"
    node.parent.mkdir()

    def on_a_full_disk(opened):
        def open_it(*args, **kwargs):
            file = opened(*args, **kwargs)
            if "w" in (args[-1] if len(args) > 1 else kwargs.get("mode", "r")):

                def no_space(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

                file.write = no_space
            return file

        return open_it

    if transfer == "the transfer manager":
        monkeypatch.setattr(OSUtils, "open", on_a_full_disk(OSUtils.open))
    else:
        monkeypatch.setattr(store_module, "open", on_a_full_disk(open), raising=False)
    with pytest.raises(sync.DiskFull) as info:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert str(info.value).startswith(f"no space left on the device of {node.parent} while pulling {NS}")
    assert url.split("/")[2] not in str(info.value)  # the bucket is not to blame
    assert list(node.parent.iterdir()) == []  # no directory, staging, lock or partial download left


PULLER = """
import sys
import time
from pathlib import Path
from orchestrator.cache import sync
from orchestrator.cache.manifest import SigningKey, TrustedKeys
from orchestrator.cache.store import open_store
trusted = TrustedKeys([SigningKey.from_text(b"6b" * 32, "test key").public])  # test_cache_protocol.KEY's
sync.pull(open_store(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), trusted, allow_unsigned=False)
"""


@pytest.mark.slow
def test_a_fleet_pulling_through_faults_ends_verified_or_failed_with_nothing_partial(
    s3_env, fault_proxy, tmp_path, monkeypatch
):
    """Twelve replicas pull one namespace at once while the proxy faults a share of requests
    (503s, resets, stalls past the read timeout): each ends with the published files, or with an
    error line and no directory at all."""
    point_at, url = s3_env
    files = {f"inductor/fxgraph/{i:02x}/entry": os.urandom(2000 + 997 * i) for i in range(40)}
    sync.publish(open_store(url), make_cache(tmp_path / "src", files), NS, KEY, allow_unsigned=False)
    point_at(fault_proxy.url)
    monkeypatch.setenv("ORCHESTRATE_STORE_ATTEMPTS", "3")
    fault_proxy.fault_share(0.3, seconds=1.5, seed=3)  # stalls outlast the 1 s read timeout
    targets = [tmp_path / f"replica-{i}" / NS for i in range(12)]
    pullers = [
        subprocess.Popen([sys.executable, "-c", PULLER, url, NS, str(target)], stderr=subprocess.PIPE, text=True)
        for target in targets
    ]
    outcomes = [(puller.wait(timeout=300), puller.stderr.read() if puller.stderr else "") for puller in pullers]
    fault_proxy.fault_share(0)
    assert any(outcome != "forwarded" for _, _, outcome in fault_proxy.history), "no fault was injected"
    for target, (code, stderr) in zip(targets, outcomes, strict=True):
        if code == 0:
            assert tree(target) == files
        else:
            assert "StoreUnreachable" in stderr.strip().splitlines()[-1], stderr[-2000:]
            assert not target.exists() and not list(target.parent.glob(".incoming-*"))
    assert sum(code == 0 for code, _ in outcomes) >= 1


def test_gc_aborts_abandoned_multipart_uploads(s3_env, moto_server, tmp_path):
    """moto dates every upload's start in 2010, so each is past the grace here (the grace itself
    is tested on the directory store's leftovers)."""
    _, url = s3_env
    store = open_store(url)
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = moto_server.client()
    client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/v1/objects/ab/abandoned")
    assert sync.gc(store, 1, TRUST, allow_unsigned=False, dry_run=True).uploads_aborted == 1
    assert len(client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1
    assert sync.gc(store, 1, TRUST, allow_unsigned=False).uploads_aborted == 1
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_a_slow_attempt_does_not_use_up_the_retries(monkeypatch):
    """The retry budget is the waiting between attempts: a first attempt that itself took longer
    than that (a large download dropped at its end) is still retried."""

    monkeypatch.setenv("ORCHESTRATE_STORE_RETRY_SECONDS", "0.5")
    monkeypatch.setattr(store_module, "wait_exponential_jitter", lambda **_: lambda state: 0.01)
    calls = []

    def slow_then_fine():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.8)  # longer than the whole retry budget
            raise store_module.TransientError("connection reset at the end of the body")
        return "done"

    assert store_module._retry(slow_then_fine, "download", "s3://bucket/x") == "done" and len(calls) == 2
