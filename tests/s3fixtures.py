"""S3 test infrastructure: a real moto S3 server (with auth enforced) and a fault-injecting proxy.

Import from tests/conftest.py with ``from s3fixtures import *``; this exports the
``moto_server`` (session) and ``fault_proxy`` (function) fixtures plus the
``MotoServer`` and ``FaultProxy`` classes.

Everything binds to 127.0.0.1 only and every wait is bounded.

Auth enforcement (moto 5.2.1): ``moto.settings.INITIAL_NO_AUTH_ACTION_COUNT`` is read
from the environment when the server process imports moto.  Each request handled by a
service backend (IAM, S3, ...) while ``ActionAuthenticatorMixin.request_count`` is below
that number is let through unauthenticated and increments the count; every request after
that has its SigV4 signature checked against moto's own IAM access keys and its action
checked against the caller's IAM policies.  ``/moto-api/*`` requests never count.  The
server is started with INITIAL_NO_AUTH_ACTION_COUNT=3 and exactly three unauthenticated
IAM calls are made (CreateUser, PutUserPolicy with s3:* on *, CreateAccessKey); startup
then checks that a request with unknown credentials is refused with 403.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from http.client import HTTPConnection
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

__all__ = [
    "MotoServer",
    "FaultProxy",
    "free_port",
    "moto_server",
    "fault_proxy",
]

HOST = "127.0.0.1"
REGION = "us-east-1"
# The number of unauthenticated requests the setup in MotoServer._bootstrap_iam makes.
_BOOTSTRAP_REQUESTS = 3
_IAM_USER = "s3fixtures-user"
_S3_ALL_POLICY = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'


# Launches ``moto.server`` after two fixes: atomic conditional PutObject (below) and moto 5.2.1's SigV4 check.  moto verifies the
# signature against werkzeug's re-quoted ``request.url``, which leaves ``!$&'()*+,;=:@``
# (and non-ASCII) differently encoded than the client signed them, so any object key
# containing e.g. '+', '=' or ':' gets SignatureDoesNotMatch once auth is enforced.  The
# patch makes the check use the request target exactly as it arrived (RAW_URI), as S3
# does.  Nothing else in moto is changed; MotoServer(patch_sigv4_raw_uri=False) runs
# ``python -m moto.server`` unmodified.
_LAUNCHER = r"""
import sys
from urllib.parse import urlsplit
from moto.core.authorization import ActionAuthenticatorMixin

_orig = ActionAuthenticatorMixin._authenticate_and_authorize_action

def _authenticate_with_raw_uri(self, iam_request_cls, resource="*"):
    environ = getattr(getattr(self, "request", None), "environ", None) or {}
    raw = environ.get("RAW_URI")
    if raw:
        parts = urlsplit(raw)
        path, query = parts.path, parts.query
    elif getattr(self, "raw_path", None):
        path, query = self.raw_path, urlsplit(self.uri).query
    else:
        return _orig(self, iam_request_cls, resource)
    if not path.startswith("/"):
        path = "/" + path
    saved = self.uri
    self.uri = "http://raw-uri" + path + ("?" + query if query else "")
    try:
        return _orig(self, iam_request_cls, resource)
    finally:
        self.uri = saved

ActionAuthenticatorMixin._authenticate_and_authorize_action = _authenticate_with_raw_uri

# S3 evaluates If-None-Match and stores the object atomically; moto checks, then writes,
# without a lock, so two simultaneous conditional creates could both "win". Serialising
# PutObject restores the documented semantics the cache protocol's first-writer-wins uses.
import threading
from moto.s3.responses import S3Response

_put_lock = threading.Lock()
_orig_put = S3Response.put_object

def _atomic_put_object(self, *args, **kwargs):
    with _put_lock:
        return _orig_put(self, *args, **kwargs)

S3Response.put_object = _atomic_put_object

from moto.server import main
main(sys.argv[1:])
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------
# moto server
# --------------------------------------------------------------------------------------


class MotoServer:
    """A moto server subprocess on 127.0.0.1 with SigV4 auth enforced.

    Attributes: ``endpoint`` (http://127.0.0.1:PORT), ``port``, ``access_key``,
    ``secret_key``, ``region`` ('us-east-1'), ``log_path`` (server stdout/stderr).
    """

    def __init__(self, start_timeout: float = 30.0, patch_sigv4_raw_uri: bool = True):
        self.patch_sigv4_raw_uri = patch_sigv4_raw_uri
        self.region = REGION
        self.access_key: str | None = None
        self.secret_key: str | None = None
        self.port: int | None = None
        self.endpoint: str | None = None
        self._proc: subprocess.Popen | None = None
        self._logdir = tempfile.mkdtemp(prefix="moto-server-")
        self.log_path = Path(self._logdir) / "moto_server.log"
        self._start_timeout = start_timeout
        self._session = None
        self._session_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> MotoServer:
        last_error = ""
        for _attempt in range(3):  # a just-freed port can be grabbed by someone else
            self.port = free_port()
            self.endpoint = f"http://{HOST}:{self.port}"
            env = dict(os.environ)
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_BOOTSTRAP_REQUESTS)
            for var in ("MOTO_PORT", "TEST_SERVER_MODE", "TEST_PROXY_MODE"):
                env.pop(var, None)
            with open(self.log_path, "ab") as log:
                entry = ["-c", _LAUNCHER] if self.patch_sigv4_raw_uri else ["-m", "moto.server"]
                self._proc = subprocess.Popen(
                    [sys.executable, *entry, "-H", HOST, "-p", str(self.port)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            if self._wait_ready():
                break
            last_error = self._log_tail()
            self._terminate()
        else:
            raise RuntimeError(f"moto server did not start; log tail:\n{last_error}")
        try:
            self._bootstrap_iam()
            self._check_auth_enforced()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            conn = HTTPConnection(HOST, self.port, timeout=2)
            try:
                # /moto-api/ requests do not go through auth, so they don't use up
                # the unauthenticated-request allowance.
                conn.request("GET", "/moto-api/data.json")
                if conn.getresponse().status == 200:
                    return True
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        return False

    def _bootstrap_iam(self) -> None:
        iam = self._boto_client("iam", self.endpoint, "bootstrap", "bootstrap")
        iam.create_user(UserName=_IAM_USER)
        iam.put_user_policy(UserName=_IAM_USER, PolicyName="s3-all", PolicyDocument=_S3_ALL_POLICY)
        key = iam.create_access_key(UserName=_IAM_USER)["AccessKey"]
        self.access_key = key["AccessKeyId"]
        self.secret_key = key["SecretAccessKey"]

    def _check_auth_enforced(self) -> None:
        from botocore.exceptions import ClientError

        s3 = self.client(access_key="AKIANOTAREALKEY00000", secret_key="not-the-secret")
        try:
            s3.list_buckets()
        except ClientError as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] == 403:
                return
            raise
        raise RuntimeError("moto server accepted unknown credentials: auth is not enforced")

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------

    def _boto_client(self, service, endpoint, access_key, secret_key, config=None):
        import boto3
        from botocore.config import Config

        options = dict(
            region_name=self.region,
            s3={"addressing_style": "path"},
            proxies={},  # never route loopback traffic through an HTTP(S)_PROXY from the env
            connect_timeout=10,
            read_timeout=60,
        )
        if service == "iam":
            # botocore's retries["max_attempts"] counts *retries*; total_max_attempts=1
            # means exactly one attempt (the unauthenticated allowance is exact).
            options["retries"] = {"total_max_attempts": 1}
        base = Config(**options)
        if config is not None:
            base = base.merge(config)
        with self._session_lock:  # boto3 sessions are not thread-safe; reuse one (fast)
            if self._session is None:
                self._session = boto3.session.Session()
            return self._session.client(
                service,
                endpoint_url=endpoint,
                region_name=self.region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=None,
                config=base,
            )

    def client(self, endpoint=None, access_key=None, secret_key=None, config=None):
        """A boto3 S3 client (path-style addressing, region us-east-1).

        ``endpoint`` defaults to the moto server (pass ``fault_proxy.url`` to go through
        the proxy); credentials default to the fixture's IAM user; ``config`` (a
        ``botocore.config.Config``) is merged over the defaults.
        """
        return self._boto_client(
            "s3",
            endpoint or self.endpoint,
            access_key or self.access_key,
            secret_key or self.secret_key,
            config,
        )

    def make_bucket(self, prefix: str = "test") -> str:
        """Create a fresh, uniquely named bucket on the server and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.client().create_bucket(Bucket=name)
        return name


# --------------------------------------------------------------------------------------
# fault-injecting reverse proxy
# --------------------------------------------------------------------------------------

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
}
_MAX_LINE = 65536
_MAX_HEADERS = 200
_IO_CHUNK = 256 * 1024
_ERROR_CODES = {
    400: ("BadRequest", "Bad Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    429: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("BadGateway", "Bad Gateway"),
    503: ("SlowDown", "Please reduce your request rate."),
    504: ("GatewayTimeout", "Gateway Timeout"),
}
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    412: "Precondition Failed",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class _Closed(Exception):
    """The peer closed the connection (cleanly, between requests)."""


def _read_line(f) -> bytes:
    line = f.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ValueError("line too long")
    return line


def _read_head(f) -> tuple[bytes, list[tuple[str, str]]] | None:
    """Read a start line and headers; None at a clean EOF before any byte."""
    start = _read_line(f)
    while start in (b"\r\n", b"\n"):  # tolerate stray CRLF between requests
        start = _read_line(f)
    if not start:
        return None
    headers: list[tuple[str, str]] = []
    while True:
        line = _read_line(f)
        if not line:
            raise ConnectionError("EOF inside headers")
        if line in (b"\r\n", b"\n"):
            break
        if len(headers) >= _MAX_HEADERS:
            raise ValueError("too many headers")
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return start.rstrip(b"\r\n"), headers


def _header(headers, name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _is_chunked(headers) -> bool:
    te = _header(headers, "transfer-encoding")
    return bool(te) and te.split(",")[-1].strip().lower() == "chunked"


def _iter_chunked_raw(f):
    """Yield the raw bytes of a chunked body (framing included), up to and including
    the trailer section's terminating CRLF."""
    while True:
        size_line = _read_line(f)
        if not size_line:
            raise ConnectionError("EOF inside chunked body")
        yield size_line
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers
                line = _read_line(f)
                if not line:
                    raise ConnectionError("EOF inside chunked trailers")
                yield line
                if line in (b"\r\n", b"\n"):
                    return
        remaining = size + 2  # data + CRLF
        while remaining:
            data = f.read(min(remaining, _IO_CHUNK))
            if not data:
                raise ConnectionError("EOF inside chunk")
            remaining -= len(data)
            yield data


def _iter_exact(f, n: int):
    while n > 0:
        data = f.read(min(n, _IO_CHUNK))
        if not data:
            raise ConnectionError("EOF inside body")
        n -= len(data)
        yield data


def _iter_until_eof(f):
    while True:
        data = f.read1(_IO_CHUNK) if hasattr(f, "read1") else f.read(_IO_CHUNK)
        if not data:
            return
        yield data


def _iter_body(f, headers, *, is_request: bool, method: str = "", status: int = 200):
    """Raw body bytes per RFC 9112 message-length rules. Yields nothing for no body."""
    if not is_request and (method == "HEAD" or 100 <= status < 200 or status in (204, 304)):
        return iter(())
    if _is_chunked(headers):
        return _iter_chunked_raw(f)
    cl = _header(headers, "content-length")
    if cl is not None:
        return _iter_exact(f, int(cl.split(",")[0].strip()))
    if is_request:
        return iter(())
    return _iter_until_eof(f)


def _head_bytes(start: bytes, headers) -> bytes:
    lines = [start] + [f"{k}: {v}".encode("latin-1") for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _rst_close(sock: socket.socket) -> None:
    """Close with SO_LINGER 0 so the peer sees a TCP RST."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """Threaded HTTP/1.1 reverse proxy on 127.0.0.1 that forwards to ``upstream`` and can
    inject faults.

    Requests are forwarded byte-for-byte (request line, Host and all other end-to-end
    headers, and the raw body, whether Content-Length or chunked/aws-chunked framed), so
    SigV4 signatures stay valid.  Only hop-by-hop headers and ``Expect`` (not signed by
    SigV4; the proxy answers ``100-continue`` itself) are rewritten.  Responses are
    streamed back as they arrive.

    Faults are queued and consumed one per incoming request, in arrival order:
    ``fail_next(2); reset_next(1)`` fails the next two requests and resets the third.

    Counters: ``requests`` (request heads received), ``forwarded`` (requests sent to
    upstream), ``connections`` (client TCP connections accepted).  ``history`` is a list of ``(method, target, outcome)`` tuples, outcome
    one of 'forwarded', 'fail:<status>', 'reset', 'stall+forwarded', 'error'.
    """

    def __init__(self, upstream: str, idle_timeout: float = 30.0, upstream_timeout: float = 120.0):
        if not upstream.startswith("http://"):
            raise ValueError("upstream must be an http:// URL")
        hostport = upstream[len("http://") :].rstrip("/")
        host, _, port = hostport.rpartition(":")
        self.upstream = (host, int(port))
        self._idle_timeout = idle_timeout
        self._upstream_timeout = upstream_timeout
        self._lock = threading.Lock()
        self._faults: deque = deque()
        self._share: tuple[random.Random, float, float] | None = None
        self._requests = 0
        self._forwarded = 0
        self._connections = 0
        self.history: list[tuple[str, str, str]] = []
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()

        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"FaultProxy-{self.port}", daemon=True)
        self._acceptor.start()

    # -- control API ---------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 503, code: str | None = None, message: str | None = None) -> None:
        """The next ``n`` requests are answered with ``status`` and an S3 XML error body
        (503 -> SlowDown, 500 -> InternalError, ...) without being forwarded."""
        dcode, dmsg = _ERROR_CODES.get(status, ("InternalError", "Injected error"))
        with self._lock:
            self._faults.extend([("fail", status, code or dcode, message or dmsg)] * n)

    def reset_next(self, n: int) -> None:
        """The next ``n`` requests get their TCP connection reset (SO_LINGER 0) before any
        response byte is sent."""
        with self._lock:
            self._faults.extend([("reset",)] * n)

    def stall_next(self, n: int, seconds: float) -> None:
        """The next ``n`` requests are held for ``seconds`` before being forwarded."""
        with self._lock:
            self._faults.extend([("stall", float(seconds))] * n)

    def fault_share(self, share: float, seconds: float = 1.0, seed: int = 0) -> None:
        """From now on, each request that finds no queued fault gets one with probability
        ``share``: a 503, a reset or a stall of ``seconds``, in equal parts (``share=0`` stops it)."""
        with self._lock:
            self._share = (random.Random(seed), share, seconds) if share > 0 else None

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def forwarded(self) -> int:
        with self._lock:
            return self._forwarded

    @property
    def connections(self) -> int:
        """TCP connections accepted from clients (keep-alive reuse keeps this low)."""
        with self._lock:
            return self._connections

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(self._idle_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._serve_connection, args=(conn,), daemon=True)
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
                self._connections += 1
            t.start()

    def _serve_connection(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        reset = False
        try:
            while not self._stop.is_set():
                if not self._handle_one(conn, rfile):
                    break
        except _ResetRequested:
            reset = True
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(OSError):
                rfile.close()
            if reset:
                _rst_close(conn)
            else:
                with contextlib.suppress(OSError):
                    conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    def _record(self, method: str, target: str, outcome: str) -> None:
        with self._lock:
            self.history.append((method, target, outcome))

    def _random_fault(self) -> tuple | None:
        if self._share is None:
            return None
        rng, share, seconds = self._share
        if rng.random() >= share:
            return None
        kind = rng.choice(("fail", "reset", "stall"))
        if kind == "fail":
            return ("fail", 503, *_ERROR_CODES[503])
        return ("reset",) if kind == "reset" else ("stall", seconds)

    def _handle_one(self, conn: socket.socket, rfile) -> bool:
        """Serve one request. Returns whether the connection may be reused."""
        head = _read_head(rfile)
        if head is None:
            return False
        start, headers = head
        parts = start.decode("latin-1").split(" ")
        if len(parts) != 3:
            raise ValueError(f"bad request line {start!r}")
        method, target, version = parts
        with self._lock:
            self._requests += 1
            fault = self._faults.popleft() if self._faults else self._random_fault()

        conn_hdr = (_header(headers, "connection") or "").lower()
        keep_alive = version == "HTTP/1.1" and "close" not in conn_hdr
        if version == "HTTP/1.0" and "keep-alive" in conn_hdr:
            keep_alive = True
        expect_continue = (_header(headers, "expect") or "").lower() == "100-continue"

        if fault is not None and fault[0] == "reset":
            self._record(method, target, "reset")
            raise _ResetRequested()

        if fault is not None and fault[0] == "fail":
            _, status, code, message = fault
            if expect_continue:
                # The client holds the body back until it sees 100 Continue; answer
                # finally and drop the connection instead of reading the body.
                keep_alive = False
            else:
                for _ in _iter_body(rfile, headers, is_request=True):
                    pass
            self._send_error(conn, status, code, message, target, keep_alive)
            self._record(method, target, f"fail:{status}")
            return keep_alive

        body_chunks: list[bytes] = []
        if not expect_continue:
            body_chunks = list(_iter_body(rfile, headers, is_request=True))

        stalled = False
        if fault is not None and fault[0] == "stall":
            stalled = True
            self._stop.wait(fault[1])
            if self._stop.is_set():
                return False

        if expect_continue:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body_chunks = list(_iter_body(rfile, headers, is_request=True))

        fwd_headers = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() != "expect"]
        fwd_headers.append(("Connection", "close"))
        try:
            up = socket.create_connection(self.upstream, timeout=self._upstream_timeout)
        except OSError:
            self._record(method, target, "error")
            self._send_error(conn, 502, "BadGateway", "upstream unreachable", target, False)
            return False
        with self._lock:
            self._forwarded += 1
        self._record(method, target, "stall+forwarded" if stalled else "forwarded")
        try:
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up.sendall(_head_bytes(start, fwd_headers))
            for chunk in body_chunks:
                up.sendall(chunk)
            del body_chunks
            ufile = up.makefile("rb")
            try:
                while True:  # skip interim 1xx responses
                    uhead = _read_head(ufile)
                    if uhead is None:
                        raise ConnectionError("upstream closed without a response")
                    ustart, uheaders = uhead
                    status = int(ustart.split(b" ", 2)[1])
                    if not (100 <= status < 200):
                        break
                body_iter = _iter_body(ufile, uheaders, is_request=False, method=method, status=status)
                framed = (
                    method == "HEAD"
                    or 100 <= status < 200
                    or status in (204, 304)
                    or _is_chunked(uheaders)
                    or _header(uheaders, "content-length") is not None
                )
                if not framed:
                    keep_alive = False  # body delimited by close; must close toward client too
                out_headers = [(k, v) for k, v in uheaders if k.lower() not in _HOP_BY_HOP]
                out_headers.append(("Connection", "keep-alive" if keep_alive else "close"))
                ustart = b"HTTP/1.1 " + ustart.split(b" ", 1)[1]
                conn.sendall(_head_bytes(ustart, out_headers))
                for chunk in body_iter:
                    conn.sendall(chunk)
            finally:
                ufile.close()
        finally:
            with contextlib.suppress(OSError):
                up.close()
        return keep_alive

    @staticmethod
    def _send_error(conn, status, code, message, resource, keep_alive) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
        ).encode()
        reason = _REASONS.get(status, "Error")
        head = (
            f"HTTP/1.1 {status} {reason}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"x-amz-request-id: {request_id}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        ).encode()
        conn.sendall(head + body)


class _ResetRequested(Exception):
    pass


# --------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------


_shared_lock = threading.Lock()
_shared_server: MotoServer | None = None
_shared_refs = 0


@pytest.fixture(scope="session")
def moto_server():
    """A moto server subprocess with auth enforced, shared by the whole session.

    Reference-counted, so that importing this fixture into both conftest.py and a test
    module (two fixture definitions) still starts only one server.
    """
    global _shared_server, _shared_refs
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with _shared_lock:
        if _shared_server is None:
            _shared_server = MotoServer().start()
        _shared_refs += 1
        server = _shared_server
    try:
        yield server
    finally:
        with _shared_lock:
            _shared_refs -= 1
            if _shared_refs == 0:
                _shared_server = None
                server.stop()


@pytest.fixture
def fault_proxy(moto_server):
    """A fresh FaultProxy in front of the session moto server."""
    proxy = FaultProxy(moto_server.endpoint)
    try:
        yield proxy
    finally:
        proxy.close()
