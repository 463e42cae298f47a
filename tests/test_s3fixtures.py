"""Tests proving the S3 test infrastructure in s3fixtures.py works."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from http.client import HTTPConnection

import pytest
from s3fixtures import FaultProxy, MotoServer, fault_proxy, moto_server  # noqa: F401

boto3 = pytest.importorskip("boto3")
from boto3.s3.transfer import TransferConfig  # noqa: E402
from botocore.auth import S3SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import (  # noqa: E402
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

# NB: botocore's retries["max_attempts"] counts *retries* (max_attempts=1 means up to two
# attempts); total_max_attempts=1 is what disables retrying.
NO_RETRY = Config(retries={"total_max_attempts": 1, "mode": "standard"})


def _status(err: ClientError) -> int:
    return err.response["ResponseMetadata"]["HTTPStatusCode"]


def _code(err: ClientError) -> str:
    return err.response["Error"]["Code"]


# -- moto server -------------------------------------------------------------------------


def test_server_attributes(moto_server):
    assert moto_server.endpoint.startswith("http://127.0.0.1:")
    assert moto_server.region == "us-east-1"
    assert moto_server.access_key and moto_server.secret_key
    b1, b2 = moto_server.make_bucket(), moto_server.make_bucket()
    assert b1 != b2
    names = {b["Name"] for b in moto_server.client().list_buckets()["Buckets"]}
    assert {b1, b2} <= names


def test_roundtrip_direct(moto_server):
    s3 = moto_server.client()
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="a/b.bin", Body=b"hello world")
    assert s3.get_object(Bucket=bucket, Key="a/b.bin")["Body"].read() == b"hello world"
    assert s3.head_object(Bucket=bucket, Key="a/b.bin")["ContentLength"] == 11
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="missing")
    assert _status(ei.value) == 404


SPECIAL_KEYS = ["torch-2.11.0+cu128/k=v&x;y", "a:b@c/(d)!e*f'g,h$", "ünï/€😀", "sp ace/%41/~x?#"]


@pytest.mark.parametrize("via_proxy", [False, True])
def test_special_character_keys(moto_server, fault_proxy, via_proxy):
    """Keys with reserved / non-ASCII characters survive auth, listing and copying."""
    s3 = moto_server.client(endpoint=fault_proxy.url if via_proxy else None, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    for key in SPECIAL_KEYS:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()
        prefix = key[: len(key) // 2 + 1]
        listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
        assert listed == [key]
        s3.copy_object(Bucket=bucket, Key=key + ".copy", CopySource={"Bucket": bucket, "Key": key})
        s3.delete_object(Bucket=bucket, Key=key + ".copy")


def test_unknown_access_key_refused(moto_server):
    bucket = moto_server.make_bucket()
    bad = moto_server.client(access_key="AKIAIOSFODNN7EXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG")
    with pytest.raises(ClientError) as ei:
        bad.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert _status(ei.value) == 403
    assert _code(ei.value) == "InvalidAccessKeyId"
    with pytest.raises(ClientError) as ei:
        bad.list_buckets()
    assert _status(ei.value) == 403


def test_wrong_secret_refused(moto_server):
    bucket = moto_server.make_bucket()
    bad = moto_server.client(secret_key="definitely-not-the-secret")
    with pytest.raises(ClientError) as ei:
        bad.get_object(Bucket=bucket, Key="k")
    assert _status(ei.value) == 403
    assert _code(ei.value) in ("SignatureDoesNotMatch", "AccessDenied")


def test_bad_credentials_refused_through_proxy(moto_server, fault_proxy):
    bucket = moto_server.make_bucket()
    bad = moto_server.client(endpoint=fault_proxy.url, access_key="AKIAIOSFODNN7EXAMPLE", secret_key="nope")
    with pytest.raises(ClientError) as ei:
        bad.head_bucket(Bucket=bucket)
    assert _status(ei.value) == 403


# -- conditional writes (moto 5.2.1 server mode) ----------------------------------------


def test_put_if_none_match_star(moto_server):
    s3 = moto_server.client(config=NO_RETRY)
    bucket = moto_server.make_bucket()
    # New key: the conditional create succeeds.
    s3.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    # Existing key: 412 PreconditionFailed, and the object is unchanged.
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert _status(ei.value) == 412
    assert _code(ei.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"first"


def test_put_if_none_match_star_through_proxy(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert _status(ei.value) == 412


def test_complete_multipart_if_none_match_star(moto_server):
    s3 = moto_server.client(config=NO_RETRY)
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="k", Body=b"existing")
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"p" * 1024)["ETag"]
    with pytest.raises(ClientError) as ei:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]},
            IfNoneMatch="*",
        )
    assert _status(ei.value) == 412
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"existing"
    # On a key that does not exist, the conditional multipart create succeeds.
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="new")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="new", UploadId=upload_id, PartNumber=1, Body=b"q" * 1024)["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="new",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]},
        IfNoneMatch="*",
    )
    assert s3.get_object(Bucket=bucket, Key="new")["Body"].read() == b"q" * 1024


def test_put_if_match(moto_server):
    s3 = moto_server.client(config=NO_RETRY)
    bucket = moto_server.make_bucket()
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"v1")["ETag"]
    s3.put_object(Bucket=bucket, Key="k", Body=b"v2", IfMatch=etag)
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="k", Body=b"v3", IfMatch=etag)  # stale etag
    assert _status(ei.value) == 412
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v2"


# -- proxy: plain forwarding -------------------------------------------------------------


def test_roundtrip_through_proxy(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url)
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="x y/ü.txt", Body=b"via proxy", Metadata={"m": "1"})
    obj = s3.get_object(Bucket=bucket, Key="x y/ü.txt")
    assert obj["Body"].read() == b"via proxy"
    assert obj["Metadata"] == {"m": "1"}
    head = s3.head_object(Bucket=bucket, Key="x y/ü.txt")  # HEAD: Content-Length but no body
    assert head["ContentLength"] == 9
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="x y/")["Contents"]]
    assert keys == ["x y/ü.txt"]
    s3.delete_object(Bucket=bucket, Key="x y/ü.txt")  # 204, no body
    with pytest.raises(ClientError) as ei:
        s3.head_object(Bucket=bucket, Key="x y/ü.txt")
    assert _status(ei.value) == 404
    assert fault_proxy.requests == fault_proxy.forwarded == 6
    # All six requests went over one keep-alive connection.
    assert fault_proxy.connections == 1


def test_large_multipart_transfer_through_proxy(moto_server, fault_proxy, tmp_path):
    s3 = moto_server.client(endpoint=fault_proxy.url)
    bucket = moto_server.make_bucket()
    src = tmp_path / "src.bin"
    data = os.urandom(20 * 1024 * 1024)
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=4)
    s3.upload_file(str(src), bucket, "big.bin", Config=cfg)
    dst = tmp_path / "dst.bin"
    s3.download_file(bucket, "big.bin", str(dst), Config=cfg)
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()
    targets = [t for _, t, _ in fault_proxy.history]
    assert any("uploads" in t for t in targets), "expected a multipart upload"
    assert sum("partNumber=" in t for t in targets) == 3
    assert fault_proxy.requests == fault_proxy.forwarded


def test_single_large_put_and_get_through_proxy(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url)
    bucket = moto_server.make_bucket()
    data = os.urandom(6 * 1024 * 1024)
    s3.put_object(Bucket=bucket, Key="six", Body=data)  # one PUT with Expect: 100-continue
    assert s3.get_object(Bucket=bucket, Key="six")["Body"].read() == data
    assert s3.get_object(Bucket=bucket, Key="six", Range="bytes=100-199")["Body"].read() == data[100:200]


def _signed(moto_server, method, url, body=b""):
    req = AWSRequest(method=method, url=url, data=body)
    S3SigV4Auth(Credentials(moto_server.access_key, moto_server.secret_key), "s3", moto_server.region).add_auth(req)
    return {k: v for k, v in req.headers.items()}


def test_chunked_request_body_and_keepalive_through_proxy(moto_server, fault_proxy):
    """A Transfer-Encoding: chunked request body passes through unchanged and the
    client connection stays usable for the next request."""
    bucket = moto_server.make_bucket()
    body = b"".join(bytes([i]) * 1000 for i in range(200))
    path = f"/{bucket}/chunked.bin"
    conn = HTTPConnection("127.0.0.1", fault_proxy.port, timeout=10)
    try:
        headers = _signed(moto_server, "PUT", fault_proxy.url + path, body)
        # An iterable body without Content-Length is sent with chunked framing.
        conn.request("PUT", path, body=iter([body[:12345], body[12345:150000], body[150000:]]), headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        sock = conn.sock
        headers = _signed(moto_server, "GET", fault_proxy.url + path)
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.read() == body
        assert conn.sock is sock  # same keep-alive connection
    finally:
        conn.close()
    assert fault_proxy.connections == 1
    assert moto_server.client().get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == body


# -- proxy: faults -----------------------------------------------------------------------


@pytest.mark.parametrize("status,code", [(503, "SlowDown"), (500, "InternalError")])
def test_fail_next(moto_server, fault_proxy, status, code):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    base_req, base_fwd = fault_proxy.requests, fault_proxy.forwarded
    fault_proxy.fail_next(2, status=status)
    for _ in range(2):
        with pytest.raises(ClientError) as ei:
            s3.get_object(Bucket=bucket, Key="k")
        assert _status(ei.value) == status
        assert _code(ei.value) == code
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    assert fault_proxy.requests - base_req == 3
    assert fault_proxy.forwarded - base_fwd == 1


def test_fail_next_on_uploads_keeps_connection_usable(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    fault_proxy.fail_next(1)
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="small", Body=b"s" * 1000)
    assert _status(ei.value) == 503
    fault_proxy.fail_next(1, status=500)
    big = os.urandom(2 * 1024 * 1024)  # > 1 MB: botocore sends Expect: 100-continue
    with pytest.raises(ClientError) as ei:
        s3.put_object(Bucket=bucket, Key="big", Body=big)
    assert _status(ei.value) == 500
    s3.put_object(Bucket=bucket, Key="small", Body=b"s" * 1000)
    s3.put_object(Bucket=bucket, Key="big", Body=big)
    assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == big
    assert fault_proxy.forwarded == 3


def test_fail_next_with_boto_retries_recovers(moto_server, fault_proxy):
    """With boto3's default retries, a couple of 503s are retried transparently."""
    s3 = moto_server.client(endpoint=fault_proxy.url, config=Config(retries={"max_attempts": 4, "mode": "standard"}))
    bucket = moto_server.make_bucket()
    fault_proxy.fail_next(2)
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert fault_proxy.requests == 3 and fault_proxy.forwarded == 1


def test_reset_next(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    fault_proxy.reset_next(1)
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        s3.get_object(Bucket=bucket, Key="k")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    assert fault_proxy.requests == 3 and fault_proxy.forwarded == 2


def test_reset_is_a_tcp_rst(fault_proxy):
    fault_proxy.reset_next(1)
    with socket.create_connection(("127.0.0.1", fault_proxy.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            data = s.recv(1024)
            # Some stacks report the RST on the second read.
            assert data == b""
            s.recv(1024)
    assert fault_proxy.forwarded == 0


def test_stall_next(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY.merge(Config(read_timeout=1)))
    bucket = moto_server.make_bucket()
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    fault_proxy.stall_next(1, 3)
    t0 = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        s3.get_object(Bucket=bucket, Key="k")
    assert 0.9 < time.monotonic() - t0 < 2.9
    # The next request (on a fresh connection) is served normally.
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_faults_queue_in_order(moto_server, fault_proxy):
    s3 = moto_server.client(endpoint=fault_proxy.url, config=NO_RETRY)
    bucket = moto_server.make_bucket()
    fault_proxy.fail_next(1, status=500)
    fault_proxy.reset_next(1)
    assert fault_proxy.pending_faults == 2
    with pytest.raises(ClientError):
        s3.head_bucket(Bucket=bucket)
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        s3.head_bucket(Bucket=bucket)
    s3.head_bucket(Bucket=bucket)
    assert [o for _, _, o in fault_proxy.history] == ["fail:500", "reset", "forwarded"]


def test_proxy_close_is_prompt(moto_server):
    proxy = FaultProxy(moto_server.endpoint)
    s3 = moto_server.client(endpoint=proxy.url, config=NO_RETRY.merge(Config(read_timeout=1)))
    bucket = moto_server.make_bucket()
    proxy.stall_next(1, 30)
    with pytest.raises(ReadTimeoutError):
        s3.head_bucket(Bucket=bucket)
    t0 = time.monotonic()
    proxy.close()
    assert time.monotonic() - t0 < 3
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
