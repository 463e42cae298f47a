"""Object stores the cache publishes to and pulls from: S3 (boto3) and anything fsspec opens.

A store is a flat key space with five operations. Only `create` must be atomic and exclusive
(first writer wins): the protocol in cache/sync.py relies on it for manifests and on nothing
else, because every other object is immutable and named by its content.

Transient failures (throttling, 5xx, timeouts, dropped connections) are retried here with
exponential backoff and jitter, bounded in attempts and total time; auth and not-found errors
are not retried. botocore's own retries are off so the two policies never multiply.
"""

from __future__ import annotations

import builtins  # `list` names the stores' method inside their classes
import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional, Protocol, TypeVar
from urllib.parse import urlparse

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter
from tenacity.stop import stop_base

from orchestrator.cache.files import SCRATCH_PREFIX, replacing, scratch_beside

T = TypeVar("T")


def _setting(name: str, default: float) -> float:
    """Retry and timeout bounds: a dead store fails in seconds; operators may tighten or relax."""
    return float(os.environ.get(f"ORCHESTRATE_STORE_{name}", default))


class StoreError(Exception):
    """The store failed in a way the user must fix or wait out; the message names the store."""


class StoreUnreachable(StoreError):
    pass


class StoreAuthError(StoreError):
    pass


class NotFound(StoreError):
    pass


class OverLimit(StoreError):
    """The object holds more bytes than the reader accepts (a manifest over its limit); nothing
    past the limit was read. `size` is the object's size where the store said it, else None."""

    def __init__(self, message: str, size: Optional[int] = None) -> None:
        super().__init__(message)
        self.size = size


class WrongSize(StoreError):
    """The object does not hold the bytes its manifest declares (`size`: what it holds), or is no
    regular file (`size` None): nothing of it was read. Its message is what is wrong, after the
    object's name: "holds 20480 bytes"."""

    def __init__(self, message: str, size: Optional[int] = None) -> None:
        super().__init__(message)
        self.size = size


class TransientError(StoreError):
    """Worth retrying: throttling, 5xx, timeouts, dropped connections."""


OBJECT_MODE = 0o644  # what a directory store writes its objects as


def _local_disk_full(what: str, exc: BaseException) -> bool:
    """ENOSPC and EDQUOT come from a filesystem, never from the network: raised by a download,
    they mean the local disk it writes to is full. That stays an OSError, as it is from a file://
    store, so the pull names the local directory; it is no failure of the store's to report."""
    return what == "download" and isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch


class Store(Protocol):
    url: str

    def read(self, key: str, limit: int) -> bytes:
        """The object's bytes; OverLimit where it holds more than `limit`, read no further than
        one byte past it (a store's writer cannot make its reader allocate what it likes)."""
        ...

    def create(self, key: str, data: bytes) -> bool: ...

    def upload(self, key: str, path: Path) -> None: ...

    def download(self, key: str, path: Path, size: int) -> None:
        """The object into `path`, where it holds `size` bytes (what its manifest declares);
        WrongSize, before any of it is read, where it holds another count or is no regular file."""
        ...

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        """Every object whose key starts with `prefix`: a string prefix, as S3 has it
        (`v1/namespaces/mlp-torch` finds the objects under every folder whose name starts so)."""
        ...

    def delete(self, keys: builtins.list[str]) -> None: ...

    def abort_uploads(self, older_than: float, *, dry_run: bool = False) -> int:
        """Abort uploads begun before `older_than` (seconds since the epoch) and never finished,
        whose parts the store keeps (and bills) until then; how many. Stores without them: 0."""
        ...


class UnsupportedStore(ValueError):
    """The URL names a store this installation cannot open: an unknown protocol, or an fsspec
    backend whose package is not installed. A usage problem, found before anything runs."""


def check_url(url: str) -> None:
    """Raise UnsupportedStore unless `url`'s backend can be loaded here. Connects to nothing."""
    scheme = urlparse(url).scheme
    if scheme in ("", "file", "s3"):  # built in: boto3 is a dependency
        return
    from fsspec.registry import get_filesystem_class, known_implementations

    try:
        get_filesystem_class(scheme)
    except ImportError as exc:
        # the package to install: the missing module (gcsfs, adlfs, pyarrow...), else the backend's
        package = exc.name or known_implementations.get(scheme, {}).get("class", scheme).split(".")[0]
        raise UnsupportedStore(
            f"store {url}: {scheme}:// needs the {package!r} package, which is not installed here; "
            f"pip install {package}, or use an s3:// or file:// store"
        ) from None
    except ValueError:
        raise UnsupportedStore(
            f"store {url}: no store backend for {scheme}://; use s3://bucket/prefix, file:///dir or another "
            "fsspec protocol"
        ) from None


def open_store(url: str) -> Store:
    scheme = urlparse(url).scheme
    if scheme == "s3":
        return S3Store(url)
    if scheme in ("", "file"):
        return LocalStore(url)
    return FsspecStore(url)


class _StopAfterWaiting(stop_base):
    """Stop once the waits between attempts add up to `seconds`. The attempts' own time does not
    count: a 60 s download that drops at its end deserves its retry as much as a 1 s one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, retry_state: RetryCallState) -> bool:
        return retry_state.idle_for >= self.seconds


def _retry(call: Callable[[], T], what: str, url: str) -> T:
    """Run `call`, retrying transient failures; turn exhaustion into one clear StoreUnreachable."""
    retrying = Retrying(
        retry=retry_if_exception(lambda e: isinstance(e, TransientError)),
        wait=wait_exponential_jitter(initial=0.2, max=5.0, jitter=0.5),
        stop=stop_after_attempt(int(_setting("ATTEMPTS", 5))) | _StopAfterWaiting(_setting("RETRY_SECONDS", 30)),
        reraise=True,
    )
    try:
        return retrying(call)
    except TransientError as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise StoreUnreachable(
            f"{what} {url}: {exc} (gave up after {attempts} attempts); check the endpoint, network and AWS_ENDPOINT_URL"
        ) from None


class S3Store:
    def __init__(self, url: str) -> None:
        import boto3
        from botocore.config import Config

        parsed = urlparse(url)
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        # AWS_ENDPOINT_URL, AWS_REGION, credentials and profiles come from the standard variables
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=_setting("CONNECT_TIMEOUT", 5),
            read_timeout=_setting("READ_TIMEOUT", 30),
            max_pool_connections=32,
        )
        self._multipart_bytes = int(_setting("MULTIPART_BYTES", 64 * 1024 * 1024))
        self._client = boto3.session.Session().client("s3", config=config)
        self._endpoint = self._client.meta.endpoint_url

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        def attempt() -> T:
            try:
                return fn()
            except Exception as exc:
                if _local_disk_full(what, exc):
                    raise
                raise self._classify(exc, what) from exc

        return _retry(attempt, what, f"{self.url} ({self._endpoint})")

    def _classify(self, exc: Exception, what: str) -> Exception:
        from boto3.exceptions import S3UploadFailedError
        from botocore import exceptions as be

        if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, Exception):
            exc = exc.__context__
        where = f"{what} s3://{self.bucket}/{self.prefix}"
        if isinstance(exc, be.NoCredentialsError):
            return StoreAuthError(
                f"{where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role"
            )
        if isinstance(
            exc,
            (
                be.EndpointConnectionError,
                be.ConnectTimeoutError,
                be.ReadTimeoutError,
                be.ConnectionClosedError,
                be.ResponseStreamingError,
            ),
        ) or type(exc).__name__ in ("ProtocolError", "IncompleteReadError"):
            return TransientError(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, be.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in ("NoSuchKey", "404", "NotFound"):
                return NotFound(f"{where}: not found")
            if code == "NoSuchBucket":
                return StoreError(f"{where}: bucket {self.bucket!r} does not exist; create it or fix --remote")
            if code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
                "ExpiredToken",
                "InvalidToken",
            ) or status in (401, 403):
                return StoreAuthError(
                    f"{where}: access refused ({code}); check the credentials and their permissions on this bucket"
                )
            if status >= 500 or status == 429 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                return TransientError(f"HTTP {status} {code}")
            return StoreError(f"{where}: {code or status}: {exc}")
        if isinstance(exc, StoreError):
            return exc
        return StoreError(f"{where}: {type(exc).__name__}: {exc}")

    def read(self, key: str, limit: int) -> bytes:
        def get() -> bytes:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            body, size = answer["Body"], answer.get("ContentLength")
            try:
                data = b"" if size is not None and size > limit else body.read(limit + 1)
            finally:
                body.close()  # the rest of a large object is never received
            if size is not None and size > limit or len(data) > limit:
                raise OverLimit(f"s3://{self.bucket}/{self._key(key)}: more than {limit} bytes", size)
            return data

        return self._call("read", get)

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        def put() -> bool:
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                    return False
                raise

        return self._call("write", put)

    def upload(self, key: str, path: Path) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=self._multipart_bytes,
            multipart_chunksize=max(5 * 1024 * 1024, self._multipart_bytes // 2),
            max_concurrency=8,
        )
        self._call("upload", lambda: self._client.upload_file(str(path), self.bucket, self._key(key), Config=config))

    def download(self, key: str, path: Path, size: int) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=self._multipart_bytes, max_concurrency=8)

        def get() -> None:
            if 0 < size <= self._multipart_bytes:  # one ranged GET: the declared bytes and no more
                ranged(path)
                return
            # the transfer manager reads as many bytes as the store says the object holds: it is
            # asked only once the store says what the manifest does
            found = self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
            if found != size:
                raise WrongSize(f"holds {found} bytes", found)
            self._client.download_file(self.bucket, self._key(key), str(path), Config=config)

        def ranged(path: Path) -> None:
            from botocore.exceptions import ClientError

            try:
                answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes=0-{size - 1}")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":  # an empty object
                    raise WrongSize("holds 0 bytes", 0) from None
                raise
            body = answer["Body"]
            try:
                total = str(answer.get("ContentRange", "")).rpartition("/")[2]
                found = int(total) if total.isdigit() else answer.get("ContentLength")
                if found != size:
                    raise WrongSize(f"holds {found} bytes", found)
                with open(path, "wb") as target:
                    for chunk in body.iter_chunks(1 << 20):
                        target.write(chunk)
            finally:
                body.close()

        self._call("download", get)

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        def pages() -> builtins.list[ObjectInfo]:
            found = []
            paginator = self._client.get_paginator("list_objects_v2")
            strip = len(self._key(""))
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"][strip:], item["Size"], item["LastModified"].timestamp()))
            return found

        return self._call("list", pages)

    def delete(self, keys: builtins.list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            self._call("delete", lambda: self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch}))

    def abort_uploads(self, older_than: float, *, dry_run: bool = False) -> int:
        def abort() -> int:
            count = 0
            paginator = self._client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("")):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"].timestamp() >= older_than:
                        continue
                    count += 1
                    if not dry_run:
                        self._client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
            return count

        return self._call("abort uploads", abort)


class LocalStore:
    """A directory (`file:///srv/cache` or a plain path): tests, single hosts, shared filesystems.
    Exclusive create is a hard link of a finished temporary file, atomic on POSIX filesystems.
    Objects are readable by everyone (OBJECT_MODE): readers may run under another uid than the
    publisher, and a manifest's signature, not the file's mode, is what they trust."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.url = url
        self.root = Path(parsed.path if parsed.scheme else url)
        if not self.root.is_dir():
            raise StoreUnreachable(f"store {url}: directory {self.root} does not exist; create it or fix --remote")

    def _path(self, key: str) -> Path:
        return self.root / key

    def read(self, key: str, limit: int) -> bytes:
        with self._open(key) as (f, size):
            if size > limit:
                raise OverLimit(f"{self.url}/{key}: {size} bytes, more than {limit}", size)
            data = f.read(limit + 1)
        if len(data) > limit:  # grew while read
            raise OverLimit(f"{self.url}/{key}: more than {limit} bytes")
        return data

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = scratch_beside(path)  # linked, not renamed: a key that exists is never overwritten
        try:
            tmp.write_bytes(data)  # a full disk creates it empty, then refuses: removed below all the same
            os.chmod(tmp, OBJECT_MODE)
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def upload(self, key: str, path: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with replacing(target, mode=OBJECT_MODE) as scratch:  # readers never see a half-written object
            shutil.copyfile(path, scratch)

    def download(self, key: str, path: Path, size: int) -> None:
        with self._open(key) as (source, found):
            if found != size:
                raise WrongSize(f"holds {found} bytes", found)
            with open(path, "wb") as target:
                _copy_at_most(source, target, size)

    @contextlib.contextmanager
    def _open(self, key: str) -> Iterator[tuple[BinaryIO, int]]:
        """The object's file, open for reading, and its size: a regular file only. Opened without
        blocking, so a FIFO at the key cannot hang the reader, and checked once open, so a link
        swapped in meanwhile is judged by what was opened (a device, a directory: refused)."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(f"{self.url}/{key}: not found") from None
        except PermissionError:
            raise StoreAuthError(f"{self.url}/{key}: not readable by this user; fix its permissions") from None
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            os.close(fd)
            raise WrongSize(
                "is a directory, not an object"
                if stat.S_ISDIR(status.st_mode)
                else "is not a regular file (a device, a FIFO or a link to one)"
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            yield f, status.st_size

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        if prefix and not prefix.endswith("/"):
            return _by_prefix(self.list(_folder_of(prefix)), prefix)
        base = self._path(prefix)
        found: builtins.list[ObjectInfo] = []
        if not base.is_dir():
            return found

        def unreadable(exc: OSError) -> None:  # a folder not listed is no folder without objects
            raise StoreAuthError(
                f"{self.url}: cannot list {exc.filename} ({exc.strerror}); fix its permissions for this user"
            )

        for folder, _, names in os.walk(base, onerror=unreadable):
            for name in names:
                path = Path(folder) / name
                if not name.startswith(SCRATCH_PREFIX) and path.is_file():
                    info = path.stat()
                    found.append(ObjectInfo(str(path.relative_to(self.root)), info.st_size, info.st_mtime))
        return found

    def delete(self, keys: builtins.list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def abort_uploads(self, older_than: float, *, dry_run: bool = False) -> int:
        """A write killed midway leaves its temporary file: removed once older than `older_than`."""
        stale = [p for p in self.root.rglob(f"{SCRATCH_PREFIX}*") if p.is_file() and p.stat().st_mtime < older_than]
        if not dry_run:
            for path in stale:
                path.unlink(missing_ok=True)
        return len(stale)


class FsspecStore:
    """Any other fsspec URL (gs://, az://, ...). Exclusive create is check-then-write here, so
    concurrent publishers to one namespace are only safe on s3:// and file:// stores."""

    def __init__(self, url: str) -> None:
        import fsspec

        check_url(url)  # a missing backend package is one line, not fsspec's traceback
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except ImportError as exc:  # a backend that imports its package only when it is made (hdfs://)
            raise UnsupportedStore(
                f"store {url}: needs the {exc.name or 'backend'!r} package, which is not installed here; "
                f"pip install {exc.name or 'it'}, or use an s3:// or file:// store"
            ) from None
        except OSError as exc:  # a backend that connects when it is made (ftp://): a host not found, refused
            raise StoreUnreachable(
                f"store {url}: cannot connect ({exc.strerror or exc}); check the URL's host and port"
            ) from None

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        def attempt() -> T:
            try:
                return fn()
            except FileNotFoundError:
                raise NotFound(f"{what} {self.url}: not found") from None
            except (TimeoutError, ConnectionError, OSError) as exc:
                if _local_disk_full(what, exc):
                    raise
                raise TransientError(f"{type(exc).__name__}: {exc}") from exc

        return _retry(attempt, what, self.url)

    def read(self, key: str, limit: int) -> bytes:
        def get() -> bytes:
            size = self.fs.size(self._path(key))
            if size is not None and size > limit:
                raise OverLimit(f"{self.url}/{key}: {size} bytes, more than {limit}", size)
            with self.fs.open(self._path(key), "rb") as f:
                data = f.read(limit + 1)
            if len(data) > limit:
                raise OverLimit(f"{self.url}/{key}: more than {limit} bytes")
            return data

        return self._call("read", get)

    def create(self, key: str, data: bytes) -> bool:
        def put() -> bool:
            if self.fs.exists(self._path(key)):
                return False
            self.fs.pipe_file(self._path(key), data)
            return True

        return self._call("write", put)

    def upload(self, key: str, path: Path) -> None:
        self._call("upload", lambda: self.fs.put_file(str(path), self._path(key)))

    def download(self, key: str, path: Path, size: int) -> None:
        def get() -> None:
            found = self.fs.size(self._path(key))
            if found != size:
                raise WrongSize(f"holds {found} bytes", found)
            self.fs.get_file(self._path(key), str(path))

        self._call("download", get)

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        if prefix and not prefix.endswith("/"):
            return _by_prefix(self.list(_folder_of(prefix)), prefix)

        def find() -> builtins.list[ObjectInfo]:
            base = self._path(prefix)
            if not self.fs.exists(base):
                return []
            found = []
            for path, info in self.fs.find(base, detail=True).items():
                modified: Any = info.get("mtime") or info.get("LastModified") or 0
                modified = modified.timestamp() if hasattr(modified, "timestamp") else float(modified)
                found.append(ObjectInfo(path[len(self.root.rstrip("/")) + 1 :], int(info.get("size", 0)), modified))
            return found

        return self._call("list", find)

    def delete(self, keys: builtins.list[str]) -> None:
        if keys:
            self._call("delete", lambda: self.fs.rm([self._path(k) for k in keys]))

    def abort_uploads(self, older_than: float, *, dry_run: bool = False) -> int:
        return 0  # fsspec writes whole objects here: nothing is left half-uploaded


def _copy_at_most(source: BinaryIO, target: BinaryIO, size: int) -> None:
    """`size` bytes of `source` into `target`, and no more: a file that grows meanwhile adds nothing."""
    left = size
    while left > 0:
        chunk = source.read(min(left, 1 << 20))
        if not chunk:
            return
        target.write(chunk)
        left -= len(chunk)


def _folder_of(prefix: str) -> str:
    """The folder a string prefix ends in ("" for the store's root): what a store of folders lists."""
    return prefix[: prefix.rfind("/") + 1]


def _by_prefix(found: builtins.list[ObjectInfo], prefix: str) -> builtins.list[ObjectInfo]:
    return [item for item in found if item.key.startswith(prefix)]
