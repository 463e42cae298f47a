"""The publish and pull protocol between a node-local namespace directory and a shared store.

Store layout under the URL's prefix:
    v1/objects/<sha[:2]>/<sha>            shards: deterministic tars of cache files, immutable
    v1/namespaces/<namespace>/gen-<N>.json signed manifests; generation N+1 is a superset of N

Publish: pack the files the newest manifest lacks into shards, upload them, then create the next
generation's manifest with an exclusive create (first writer wins). A publisher that loses the
race re-reads the winner, merges (a path already published keeps its first bytes) and tries the
next generation. So every generation is complete, none is ever overwritten, and concurrent
publishers' files all end up in the newest one.

Every manifest's signed body names its namespace, its generation and the sha256 of generation
N-1's manifest, and a reader refuses one found anywhere else: a manifest copied into another
namespace or an old one replayed under a newer number fails although its signature is valid. A
pulled directory remembers the generation it holds, and a pull refuses anything older (a store
rolled back to an earlier, validly signed state).

Pull: newest manifest -> signature -> every entry's path checked -> a staging directory beside the
target on the same filesystem, holding the files already there that still match (hard links)
and the missing shards' files, downloaded in parallel with the sha256 of every shard and file
checked -> swapped for the target in one step. A kill leaves the old directory or the new one,
never a mix; a reader sees one or the other. Pulls into one directory take turns (a lock file
beside it); the one holding the lock removes what a killed pull left behind. A file already there
is hashed unless the last pull recorded it as it still is (VERIFIED_RECORD: its hash beside its
size, times and inode), so a pull of a namespace already in place reads nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.cache.files import replacing
from orchestrator.cache.manifest import (
    APPLIED_MARKER,
    LOCAL_STATE,
    MAX_MANIFEST_BYTES,
    VERIFIED_RECORD,
    FileEntry,
    IntegrityError,
    Manifest,
    SigningKey,
    TrustedKeys,
    decode,
    encode,
    manifest_digest,
    sha256_file,
)
from orchestrator.cache.store import NotFound, OverLimit, Store, StoreError, WrongSize

PREFIX = "v1"
SHARD_BYTES = 64 * 1024 * 1024  # few large objects: requests cost more than bytes on S3
PARALLEL = 8
MAX_PUBLISH_RACES = 20
_MANIFEST_KEY = re.compile(rf"{PREFIX}/namespaces/([^/]+)/gen-([0-9]+)\.json")


@dataclass
class Transfer:
    """What one publish or pull did, for reports and metrics."""

    generation: Optional[int] = None
    files: int = 0
    bytes: int = 0
    shards: int = 0
    seconds: float = 0.0
    races: int = 0
    skipped: list[str] = field(default_factory=list)


def combined(transfers: Iterable[Transfer]) -> Optional[Transfer]:
    """Several transfers as one (a process's pulls; a fleet's pulls or publishes): the highest
    generation, the sums of the counts and seconds, every skipped file. None when there is none."""
    found = list(transfers)
    if not found:
        return None
    return Transfer(
        generation=max((t.generation for t in found if t.generation is not None), default=None),
        files=sum(t.files for t in found),
        bytes=sum(t.bytes for t in found),
        shards=sum(t.shards for t in found),
        seconds=sum(t.seconds for t in found),
        races=sum(t.races for t in found),
        skipped=[rel for t in found for rel in t.skipped],
    )


def _manifest_key(namespace: str, generation: int) -> str:
    return f"{PREFIX}/namespaces/{namespace}/gen-{generation:08d}.json"


def _object_key(sha: str) -> str:
    return f"{PREFIX}/objects/{sha[:2]}/{sha}"


def _parse_manifest_key(key: str) -> Optional[tuple[str, int]]:
    """The namespace and generation a store key names when it is exactly a key _manifest_key
    makes; None for anything else in the store (`gen-3.json`, `x/gen-00000009.json`, a
    namespace of `..`), which is then no generation of any namespace: nothing is read, deleted or
    counted by a key that was not made so."""
    match = _MANIFEST_KEY.fullmatch(key)
    if match is None or match.group(1) in (".", ".."):
        return None
    namespace, generation = match.group(1), int(match.group(2))
    return (namespace, generation) if _manifest_key(namespace, generation) == key else None


def scan(directory: Path) -> dict[str, tuple[Path, int]]:
    """Artifact files under a namespace directory: relative path -> (path, size). Symbolic links
    are neither followed nor listed. A worker scans before every step of a bucket (to know what a
    failing step created), on a rank's tail too, and three resnet18 buckets are 1,000 files:
    os.scandir takes file types from the directory listing, where pathlib's rglob, is_file and
    relative_to cost calls per file, and is several times faster (docs/performance.md, "where the
    fleet's extra seconds go")."""
    found: dict[str, tuple[Path, int]] = {}
    pending = [("", directory)]
    while pending:
        prefix, folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                pending.append((rel + "/", Path(entry.path)))
            elif entry.is_file(follow_symlinks=False) and not LOCAL_STATE.search(rel):
                try:
                    found[rel] = (Path(entry.path), entry.stat(follow_symlinks=False).st_size)
                except FileNotFoundError:  # removed since it was listed: it is not an artifact any more
                    continue
    return found


def generations(store: Store, namespace: str) -> list[int]:
    found = (_parse_manifest_key(info.key) for info in store.list(f"{PREFIX}/namespaces/{namespace}/"))
    return sorted(generation for name, generation in filter(None, found) if name == namespace)


def _where(store: Store, namespace: str, generation: int) -> str:
    return f"{store.url.rstrip('/')}/{_manifest_key(namespace, generation)}"


def read_manifest(
    store: Store, namespace: str, generation: int, trusted: Optional[TrustedKeys], *, allow_unsigned: bool
) -> tuple[Manifest, str]:
    """One generation's manifest, verified and bound to where it was found, with its digest."""
    where = _where(store, namespace, generation)
    try:
        data = store.read(_manifest_key(namespace, generation), MAX_MANIFEST_BYTES)
    except OverLimit as exc:
        size = f"{exc.size / 2**20:.0f} MiB" if exc.size is not None else "more"
        raise IntegrityError(
            f"{where}: manifest takes {size}, more than the {MAX_MANIFEST_BYTES // 2**20} MiB a manifest may "
            "(corrupt or tampered); refusing it unread"
        ) from None
    except WrongSize as exc:
        raise IntegrityError(f"{where} {exc} (a damaged store); refusing it") from None
    manifest = decode(
        data, trusted, allow_unsigned=allow_unsigned, where=where, namespace=namespace, generation=generation
    )
    return manifest, manifest_digest(data)


def _head(
    store: Store, namespace: str, trusted: Optional[TrustedKeys], *, allow_unsigned: bool
) -> Optional[tuple[Manifest, str]]:
    gens = generations(store, namespace)
    if not gens:
        return None
    return read_manifest(store, namespace, gens[-1], trusted, allow_unsigned=allow_unsigned)


def newest(store: Store, namespace: str, trusted: Optional[TrustedKeys], *, allow_unsigned: bool) -> Optional[Manifest]:
    """The newest manifest of a namespace, verified; None when the namespace was never published."""
    head = _head(store, namespace, trusted, allow_unsigned=allow_unsigned)
    return head[0] if head else None


def publish(
    store: Store,
    directory: Path,
    namespace: str,
    key: Optional[SigningKey],
    *,
    allow_unsigned: bool,
    trusted: Optional[TrustedKeys] = None,
    buckets: Iterable[int] = (),
    meta: Optional[dict[str, Any]] = None,
    exclude: Iterable[str] = (),
) -> Transfer:
    """Publish `directory` as the namespace's next generation, signed with the private `key`.
    The newest generation is read first and must verify: against `trusted` and `key`'s own
    public half (a publisher trusts itself; `trusted` adds the keys it rotates from)."""
    if key is None and not allow_unsigned:
        raise IntegrityError(
            "publishing needs the private signing key (public keys only verify): set "
            "ORCHESTRATE_CACHE_SIGNING_KEY_FILE or pass --signing-key-file (make one with "
            "`orchestrate keys new DIR`), or pass --allow-unsigned"
        )
    readers = (trusted or TrustedKeys()).plus(key.public if key else None)
    started = time.perf_counter()
    excluded = set(exclude)
    local = {rel: item for rel, item in scan(directory).items() if rel not in excluded}
    current = _head(store, namespace, readers, allow_unsigned=allow_unsigned)
    head, head_digest = current if current else (None, None)
    known = head.files if head else {}
    fresh = {rel: item for rel, item in local.items() if rel not in known}
    transfer = Transfer(skipped=sorted(excluded))
    read: dict[str, Fingerprint] = {}  # the files whose bytes the shards took, as they were then
    entries, shard_sizes = _upload_shards(store, fresh, transfer, read) if fresh else ({}, {})
    buckets = sorted(set(buckets))

    for _ in range(MAX_PUBLISH_RACES):
        new_paths = {rel: entry for rel, entry in entries.items() if head is None or rel not in head.files}
        if head is not None and not new_paths and set(buckets) <= set(head.buckets):
            transfer.generation = head.generation  # nothing new: publishing again would change nothing
            published = head
            break
        files = dict(head.files) if head else {}
        files.update(new_paths)
        shards = dict(head.shards) if head else {}
        shards.update({entry.shard: shard_sizes[entry.shard] for entry in new_paths.values()})
        all_buckets = sorted(set(head.buckets if head else []) | set(buckets))
        manifest = _next_manifest(head, namespace, files, shards, all_buckets, meta or {}, previous=head_digest)
        if _create_manifest(store, manifest, key):
            transfer.generation = manifest.generation
            published = manifest
            break
        transfer.races += 1  # another publisher took this generation: merge onto theirs
        current = _head(store, namespace, readers, allow_unsigned=allow_unsigned)
        head, head_digest = current if current else (None, None)
    else:
        raise StoreError(f"publish {namespace}: lost {MAX_PUBLISH_RACES} races for the next manifest generation")
    read_as = {rel: (entries[rel].sha256, found) for rel, found in read.items()}
    _record_published(directory, published, read_as, {rel: path for rel, (path, _) in local.items()})
    transfer.seconds = time.perf_counter() - started
    return transfer


def _record_published(
    directory: Path, manifest: Manifest, read: dict[str, tuple[str, Fingerprint]], local: dict[str, Path]
) -> None:
    """Record in `directory`, as a pull would, the files of the generation just published that it
    holds: those this publish read (hash, fingerprint) where the manifest names those very bytes,
    and those the last record vouches for still. A replica that then pulls into the directory a
    warmup published from (the same machine) reads none of them again: a conv net's namespace is
    hundreds of files. A file another publisher's bytes won the path of is left out; the pull
    reads it, and fetches theirs. A publish that read nothing has nothing to add to the record."""
    if not read:
        return
    if directory.is_symlink():  # as a pull does: its lock and record beside the real directory
        directory = directory.resolve()
    if not directory.is_dir():  # removed since its files were read: nowhere to record them
        return
    with _turn(directory) as refused:
        if refused is not None:
            return
        known = _Record.read(directory)
        verified: dict[str, Fingerprint] = {}
        for rel, entry in manifest.files.items():
            if rel in read:
                sha256, found = read[rel]
                if sha256 == entry.sha256:
                    verified[rel] = found
            elif rel in local:
                found_now = _fingerprint(local[rel])
                if found_now is not None and known.vouches(rel, entry.sha256, found_now):
                    verified[rel] = found_now
        _record(directory, manifest, verified)


def _next_manifest(
    head: Optional[Manifest],
    namespace: str,
    files: dict[str, FileEntry],
    shards: dict[str, int],
    buckets: Iterable[int],
    meta: dict[str, Any],
    *,
    previous: Optional[str],
) -> Manifest:
    return Manifest(
        namespace=namespace,
        generation=(head.generation if head else 0) + 1,
        files=files,
        shards=shards,
        buckets=sorted(set(buckets)),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        publisher=f"{socket.gethostname()}/{os.getpid()}",
        meta=meta,
        previous=previous,
    )


def _create_manifest(store: Store, manifest: Manifest, key: Optional[SigningKey]) -> bool:
    """Create the manifest's generation, first writer wins; whether this one won. A create whose
    answer was lost and whose retry found the object is this writer's own when the bytes are
    (a manifest names its publisher and time): that is a win, not a lost race."""
    data = encode(manifest, key)
    name = _manifest_key(manifest.namespace, manifest.generation)
    if store.create(name, data):
        return True
    try:
        return store.read(name, len(data)) == data
    except OverLimit:
        return False
    except NotFound:
        return False


def _upload_shards(
    store: Store,
    files: dict[str, tuple[Path, int]],
    transfer: Transfer,
    read: Optional[dict[str, Fingerprint]] = None,
) -> tuple[dict[str, FileEntry], dict[str, int]]:
    """Pack files into deterministic tars of about SHARD_BYTES and upload them in parallel. `read`:
    filled with the fingerprint of each file that did not change while its bytes were read."""
    groups: list[list[str]] = [[]]
    size = 0
    for rel in sorted(files):
        if groups[-1] and size + files[rel][1] > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(rel)
        size += files[rel][1]

    entries: dict[str, FileEntry] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="orchestrate-publish-") as tmp:

        def pack_and_upload(index_and_group: tuple[int, list[str]]) -> None:
            index, group = index_and_group
            shard_path = Path(tmp) / f"shard-{index}.tar"
            before = {rel: _fingerprint(files[rel][0]) for rel in group} if read is not None else {}
            hashes = _write_tar(shard_path, {rel: files[rel][0] for rel in group})
            if read is not None:
                for rel in group:
                    found = _fingerprint(files[rel][0])
                    if found is not None and found == before[rel]:
                        read[rel] = found
            shard_sha = sha256_file(shard_path)
            store.upload(_object_key(shard_sha), shard_path)  # same name, same bytes: idempotent
            sizes[shard_sha] = shard_path.stat().st_size
            for rel in group:
                entries[rel] = FileEntry(sha256=hashes[rel], size=files[rel][1], shard=shard_sha)

        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(pack_and_upload, enumerate(groups)))
    transfer.files, transfer.shards = len(entries), len(sizes)
    transfer.bytes = sum(sizes.values())
    return entries, sizes


def _write_tar(path: Path, members: dict[str, Path]) -> dict[str, str]:
    """A reproducible tar (sorted, zeroed metadata): equal inputs give an equal shard hash."""
    hashes = {}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(members):
            data = members[rel].read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
            hashes[rel] = _sha256(data)
    return hashes


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pulled_generation(directory: Path, store_url: Optional[str] = None) -> int:
    """The generation last pulled into `directory` (0: none, or no readable record). With
    `store_url`, 0 where the last pull came from another store: generations count per store, and
    a new store's first generation is no rollback of another's (a record from before stores were
    recorded counts as this store's)."""
    try:
        record = json.loads((directory / APPLIED_MARKER).read_text())
        generation, source = record.get("generation", 0), record.get("store")
    except (OSError, ValueError, AttributeError):
        return 0
    if store_url is not None and source is not None and source != store_url:
        return 0
    return generation if isinstance(generation, int) else 0


def pull(
    store: Store, namespace: str, directory: Path, trusted: Optional[TrustedKeys], *, allow_unsigned: bool
) -> Optional[Transfer]:
    """Bring `directory` to the newest published state at once. None when the namespace is absent.
    Local files the manifest does not name stay; symlinks inside the directory are never followed
    (and do not survive a pull that changes anything). Refuses a newest generation older than the
    one `directory` already holds."""
    started = time.perf_counter()
    if directory.is_symlink():  # a target that is a link to the real directory: work beside that
        directory = directory.resolve()
    manifest: Optional[Manifest] = None  # what a full disk's message sizes, once read
    try:
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            raise _unwritable(directory, exc) from None
        with _turn(directory) as refused:
            if refused is None:
                _recover(directory)
            head = _head(store, namespace, trusted, allow_unsigned=allow_unsigned)
            if head is None:
                return None
            manifest, digest = head
            seen = pulled_generation(directory, store.url)
            if manifest.generation < seen:
                raise IntegrityError(
                    f"{_where(store, namespace, manifest.generation)}: generation {manifest.generation} is older "
                    f"than generation {seen} already pulled into {directory} (store rolled back or replayed); "
                    f"refusing it (remove {directory / APPLIED_MARKER} if the namespace was republished on purpose)"
                )
            present = {rel: path for rel, (path, _) in scan(directory).items()}  # symlinks neither followed nor listed
            known = _Record.read(directory)
            verified: dict[str, Fingerprint] = {}  # the files in place that hold their manifest's bytes
            needed: dict[str, FileEntry] = {}
            for rel, entry in manifest.files.items():
                found = _verified(rel, present[rel], entry, known) if rel in present else None
                if found is None:
                    needed[rel] = entry
                else:
                    verified[rel] = found
            transfer = Transfer(generation=manifest.generation, files=len(needed))
            marker = (
                json.dumps(
                    {"namespace": namespace, "generation": manifest.generation, "manifest": digest, "store": store.url}
                )
                + "\n"
            )
            if refused is not None:  # read-only: a directory that is current already is all it can be
                if needed or _read_text(directory / APPLIED_MARKER) != marker:
                    raise _unwritable(directory, refused)
            elif not needed and directory.exists():
                _write_into(directory, APPLIED_MARKER, marker)
                if not all(known.vouches(rel, manifest.files[rel].sha256, found) for rel, found in verified.items()):
                    _record(directory, manifest, verified)  # files it had to read: so that the next pull need not
            else:  # a directory that does not exist yet appears whole too, even an empty namespace's
                staging = _staging_path(directory)
                try:
                    _fetch(store, manifest, needed, staging, transfer)
                    for rel in needed:  # written by this pull from bytes it checked, in a directory of its own
                        fetched = _fingerprint(staging / rel)
                        if fetched is not None:
                            verified[rel] = fetched
                    _carry_over(present, manifest, needed, staging)
                    (staging / APPLIED_MARKER).write_text(marker)
                    _swap_in(staging, directory)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                # once the links this pull made and removed have set their files' change times
                _record(directory, manifest, verified)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # the directory, or a file in it
            raise LocalDirectoryError(
                f"{directory}: cannot read or write {exc.filename or 'it'} ({exc.strerror}); pull into a "
                "directory this user can read and write (--to, --cache-dir); the directory is unchanged"
            ) from None
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        taking = f" (its files take {manifest.total_bytes / 1e6:.1f} MB)" if manifest else ""
        raise DiskFull(
            f"no space left on the device of {directory.parent} while pulling {namespace}{taking}; "
            "free space there or pull to a larger disk; the directory is unchanged"
        ) from None
    transfer.seconds = time.perf_counter() - started
    return transfer


class DiskFull(StoreError):
    """The local disk filled up: a pull's directory is as it was before, a scratch directory is gone."""


class LocalDirectoryError(Exception):
    """The directory to pull into cannot be written (read-only, not permitted, not a directory on
    its path) and is not already current: a usage problem, one line naming it, nothing changed."""


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR)


def _unwritable(directory: Path, exc: OSError) -> LocalDirectoryError:
    return LocalDirectoryError(
        f"{directory}: cannot write in {directory.parent} ({exc.strerror or exc}); pull into a directory "
        "this user can write (--to, --cache-dir), or make it current where it can be written"
    )


@contextlib.contextmanager
def _scratch(prefix: str, doing: str) -> Iterator[Path]:
    """A temporary directory for shards read from the store, removed after; a full disk while it
    is in use is a DiskFull naming where, not a traceback (nor a bad store)."""
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFull(
            f"no space left on the device of {tempfile.gettempdir()} while {doing}; "
            "free space there or point TMPDIR at a larger disk"
        ) from None


# Beside the directory `name`: `.incoming-<name>-<8 hex digits>` while a pull stages its files (or
# writes one file to rename into it), and `.previous-<name>` between the two renames of a swap
# without an exchange. Pulls into `name` and
# into a sibling such as `name-v2` hold different locks, so each recovers only names that are
# exactly its own: with the suffix's length fixed, `.incoming-<name>-` and 8 hex digits match no
# sibling's staging, whatever the sibling is called.
_STAGING_PREFIX = ".incoming-"
_STAGING_SUFFIX = "[0-9a-f]{8}"
_PREVIOUS_PREFIX = ".previous-"


def _staging_path(directory: Path) -> Path:
    """A new name beside `directory` that its pull's _recover removes if the pull is killed."""
    return directory.parent / f"{_STAGING_PREFIX}{directory.name}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _turn(directory: Path) -> Iterator[Optional[OSError]]:
    """Pulls into one directory take turns: two replicas on a node may start together. The lock
    file goes when its holder is done, so none is left beside the cache. It is removed while still
    held: a waiter that then gets the lock finds the file it locked gone from its path, and opens
    the path again, so two processes never hold locks on different files of one name. Where no
    lock file can be made (a read-only volume), there is nothing a pull could change either: it
    goes on without one, to find whether the directory is current: what it yields is the error
    that refused the lock file, None where the lock is held."""
    path = directory.parent / f".{directory.name}.pull-lock"
    while True:
        try:
            lock = open(path, "a")
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            yield exc
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        yield None
    finally:
        path.unlink(missing_ok=True)
        lock.close()


def recover(directory: Path) -> None:
    """Under `directory`'s pull lock, finish or undo what a killed pull into it left (a pull does
    this itself first; this is for when none follows)."""
    if not directory.parent.is_dir():
        return
    with _turn(directory) as refused:
        if refused is None:
            _recover(directory)


def _recover(directory: Path) -> None:
    """Finish or undo what a killed pull left: its staging goes; a directory moved aside by a
    swap without an atomic exchange comes back unless the new one is in place. Only this
    directory's own names, which its lock covers: a sibling's pull may be staging beside it."""
    own = re.compile(re.escape(f"{_STAGING_PREFIX}{directory.name}-") + _STAGING_SUFFIX)
    for stale in directory.parent.iterdir():
        if own.fullmatch(stale.name):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    previous = directory.parent / f"{_PREVIOUS_PREFIX}{directory.name}"
    if previous.exists():
        if directory.exists():
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.rename(previous, directory)


def _carry_over(present: dict[str, Path], manifest: Manifest, needed: dict[str, FileEntry], staging: Path) -> None:
    """Link into staging the files already in place: those that match the manifest, and local
    ones it does not name (unless one would stand where the manifest needs a directory)."""
    published_dirs = {"/".join(rel.split("/")[:d]) for rel in manifest.files for d in range(1, rel.count("/") + 1)}
    for rel, path in present.items():
        if rel in needed or rel in published_dirs:
            continue
        if rel not in manifest.files and any(
            "/".join(rel.split("/")[:d]) in manifest.files for d in range(1, rel.count("/") + 1)
        ):
            continue  # under a path the manifest names as a file
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            shutil.copy2(path, target)  # a filesystem without hard links


def _swap_in(staging: Path, directory: Path) -> None:
    """Put `staging` where `directory` is, in one step where the kernel can exchange the two."""
    if not directory.exists():
        os.rename(staging, directory)
        return
    if _exchange(staging, directory):
        return  # staging now holds the old directory; the caller removes it
    previous = directory.parent / f"{_PREVIOUS_PREFIX}{directory.name}"
    os.rename(directory, previous)  # a kill from here on is undone by _recover
    os.rename(staging, directory)
    shutil.rmtree(previous, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two paths atomically. False where the C library or the
    filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def _write_into(directory: Path, name: str, text: str) -> None:
    """The file `name` of a pulled directory, written whole then renamed in. Its scratch file
    stands beside the directory under a staging name, not in it: a pull killed between the two
    steps leaves the directory as it was, and the next pull's _recover removes the scratch. The
    scratch goes whatever else fails (a full disk creates it empty, then refuses its bytes)."""
    with replacing(directory / name, scratch=_staging_path(directory)) as scratch:
        scratch.write_text(text)


def _matches(path: Path, entry: FileEntry) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and sha256_file(path) == entry.sha256


# A file as its filesystem describes it: size, modification time (ns), inode, device and change
# time (ns). A write in place moves the times and a replacement (a rename over it, a copy) the
# inode; the change time moves at any write, and no user can set it back as `touch` or `cp -p`
# set the modification time. A hard link made or removed moves the change time alone, so a pull,
# which makes and removes them, compares the first four (`_same_file`) until it records its files.
Fingerprint = tuple[int, int, int, int, int]


def _fingerprint(path: Path) -> Optional[Fingerprint]:
    try:
        status = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return (status.st_size, status.st_mtime_ns, status.st_ino, status.st_dev, status.st_ctime_ns)


def _same_file(a: Fingerprint, b: Fingerprint) -> bool:
    """The same bytes in the same inode, whatever links were made or removed since."""
    return a[:4] == b[:4]


def _record(directory: Path, manifest: Manifest, verified: dict[str, Fingerprint]) -> None:
    """Record the files this pull found to hold their manifest's bytes, each as it is now. One
    whose size, modification time or inode moved since it was verified is left out: the next
    pull reads it."""
    rows = {}
    for rel, found in verified.items():
        now = _fingerprint(directory / rel)
        if now is not None and _same_file(now, found):
            rows[rel] = now
    _write_into(directory, VERIFIED_RECORD, _Record.text(manifest, rows))


@dataclass(frozen=True)
class _Record:
    """What the last pull into a directory found each file to be (VERIFIED_RECORD): path ->
    (sha256, fingerprint), and the record's own modification time. A file is taken as verified
    without being read only where its fingerprint is the recorded one and its modification time
    is strictly before the record's: a filesystem stamps times at a coarse tick, so a write in the
    same tick as the record could keep every field of the fingerprint (git's index meets the same
    and answers the same way)."""

    files: dict[str, tuple[str, Fingerprint]] = field(default_factory=dict)
    written_ns: int = 0

    @classmethod
    def read(cls, directory: Path) -> _Record:
        """Unreadable or malformed: an empty record, and every file in place is hashed."""
        path = directory / VERIFIED_RECORD
        try:
            written_ns = os.stat(path, follow_symlinks=False).st_mtime_ns
            files = json.loads(path.read_text())["files"]
        except (OSError, ValueError, TypeError, KeyError):
            return cls()
        if not isinstance(files, dict):
            return cls()
        rows = {
            rel: (row[0], (row[1], row[2], row[3], row[4], row[5]))
            for rel, row in files.items()
            if isinstance(row, list)
            and len(row) == 6
            and isinstance(row[0], str)
            and all(type(x) is int for x in row[1:])
        }
        return cls(rows, written_ns)

    def vouches(self, rel: str, sha256: str, found: Fingerprint) -> bool:
        return self.files.get(rel) == (sha256, found) and found[1] < self.written_ns

    @staticmethod
    def text(manifest: Manifest, verified: dict[str, Fingerprint]) -> str:
        rows = {rel: [manifest.files[rel].sha256, *found] for rel, found in sorted(verified.items())}
        return json.dumps({"files": rows}, separators=(",", ":")) + "\n"


def _verified(rel: str, path: Path, entry: FileEntry, record: _Record) -> Optional[Fingerprint]:
    """The file's fingerprint where it holds `entry`'s bytes, None where it does not. A file the
    record vouches for is not read again: a replica's pull of a namespace it holds would otherwise
    read every byte of it at every start."""
    before = _fingerprint(path)
    if before is None or before[0] != entry.size:
        return None
    if record.vouches(rel, entry.sha256, before):
        return before
    if sha256_file(path) != entry.sha256:
        return None
    return before if _fingerprint(path) == before else None  # changed while it was read: not verified


SHARD_ATTEMPTS = 3  # a shard whose bytes differ from its name is fetched again: transfers can corrupt
REPAIR_HINT = "`orchestrate cache repair` (or `warmup --fresh`) replaces it"


class BadShard(IntegrityError):
    """A shard the manifest names is missing from the store, or holds other bytes than it promises."""


def _fetch(store: Store, manifest: Manifest, needed: dict[str, FileEntry], staging: Path, transfer: Transfer) -> None:
    """Download the shards holding `needed` files, verify shard and file hashes, extract to staging.
    The manifest's paths and shard names were checked when it was parsed (manifest.decode)."""
    by_shard: dict[str, list[str]] = {}
    for rel, entry in needed.items():
        by_shard.setdefault(entry.shard, []).append(rel)
    (staging / ".shards").mkdir(parents=True)
    where = f"namespace {manifest.namespace} (generation {manifest.generation})"

    def fetch_one(shard: str) -> int:
        path = staging / ".shards" / shard
        entries = {rel: needed[rel] for rel in by_shard[shard]}
        files = _checked_shard(store, shard, manifest.shards.get(shard), entries, path, where)
        for rel, data in files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        size = path.stat().st_size
        path.unlink()
        return size

    with ThreadPoolExecutor(PARALLEL) as pool:
        sizes = list(pool.map(fetch_one, sorted(by_shard)))
    (staging / ".shards").rmdir()
    transfer.shards, transfer.bytes = len(sizes), sum(sizes)


def _checked_shard(
    store: Store, shard: str, size: Optional[int], entries: dict[str, FileEntry], path: Path, where: str
) -> dict[str, bytes]:
    """The shard downloaded to `path` and the bytes of `entries` read from it, every hash checked;
    BadShard naming the object when the store lacks it or it holds other bytes. `size`: what the
    manifest declares it holds, all that is ever read of it."""
    key = _object_key(shard)
    if size is None:
        raise BadShard(f"{store.url}: {where} names {key} without its size (corrupt or tampered); refusing it")
    for _ in range(SHARD_ATTEMPTS):
        try:
            store.download(key, path, size)
        except NotFound:
            raise BadShard(f"{store.url}: {where} names {key}, which the store lacks; {REPAIR_HINT}") from None
        except WrongSize as exc:
            declared = f" where its manifest declares {size}" if exc.size is not None else ""
            raise BadShard(
                f"{store.url}: {where}: {key} {exc}{declared} (corrupt or tampered); refusing it unread, "
                f"the local cache is untouched; {REPAIR_HINT}"
            ) from None
        if sha256_file(path) == shard:
            break
    else:
        raise BadShard(
            f"{store.url}: {where}: {key} does not match its sha256 (corrupt or tampered); refusing it, "
            f"the local cache is untouched; {REPAIR_HINT}"
        )
    wanted = dict(entries)
    found: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            if member.name not in wanted:
                continue
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is None:
                raise BadShard(f"{store.url}: {where}: {key}: {member.name} is not a regular file; refusing it")
            data = extracted.read()
            entry = wanted.pop(member.name)
            if _sha256(data) != entry.sha256:
                raise BadShard(f"{store.url}: {where}: {key}: {member.name} does not match its sha256; refusing it")
            if len(data) != entry.size:  # the hash matches, the size does not: the manifest is wrong
                raise BadShard(
                    f"{store.url}: {where}: {member.name} is {len(data)} bytes where its manifest declares "
                    f"{entry.size} (a bad publisher); refusing it, it would be fetched again at every pull"
                )
            found[member.name] = data
    if wanted:
        raise BadShard(f"{store.url}: {where}: {key} lacks {len(wanted)} files its manifest promises; refusing it")
    return found


# --- inspection and maintenance -------------------------------------------------------------


@dataclass
class NamespaceInfo:
    namespace: str
    generations: int
    manifest: Optional[Manifest]
    error: Optional[str] = None


def namespaces(store: Store) -> list[str]:
    found = (_parse_manifest_key(info.key) for info in store.list(f"{PREFIX}/namespaces/"))
    return sorted({name for name, _ in filter(None, found)})


def describe(store: Store, trusted: Optional[TrustedKeys], *, allow_unsigned: bool) -> list[NamespaceInfo]:
    found = []
    for namespace in namespaces(store):
        try:
            manifest = newest(store, namespace, trusted, allow_unsigned=allow_unsigned)
            found.append(NamespaceInfo(namespace, len(generations(store, namespace)), manifest))
        except (IntegrityError, StoreError) as exc:
            found.append(NamespaceInfo(namespace, len(generations(store, namespace)), None, str(exc)))
    return found


@dataclass(frozen=True)
class Elsewhere:
    """A namespace published for the model a pull looked for, on another platform."""

    namespace: str
    platform: dict[str, Any]  # Platform's fields, as its manifest's meta records them
    same_config: bool  # the manifest records this config's identity hash; False: only the model name matches
    created_at: str


MAX_ELSEWHERE = 20  # manifests a miss reads to say why: a failing init container stays fast


def published_elsewhere(
    store: Store,
    model: str,
    config_hash: str,
    trusted: Optional[TrustedKeys],
    *,
    allow_unsigned: bool,
    limit: int = MAX_ELSEWHERE,
) -> list[Elsewhere]:
    """The namespaces of `model` (its name as the config gives it) with this config, published
    for other platforms: why a pull missed. The `limit` most recently published namespaces whose
    name begins as the model's do are read, each newest manifest verified as a pull verifies it;
    one that does not verify, or records another config, is left out. A manifest that records no
    config (written before manifests did) counts when it names the model, with same_config False.
    Those with this config first, then the newest first."""
    from orchestrator.cache.namespace import model_prefix

    try:
        listed = store.list(f"{PREFIX}/namespaces/{model_prefix(model)}")
    except StoreError:
        return []  # the reason for a miss is worth a listing, not turning the miss into a store failure
    newest_gen: dict[str, tuple[float, int]] = {}
    for info in listed:
        parsed = _parse_manifest_key(info.key)
        if parsed is None:
            continue
        name, number = parsed
        modified, generation = newest_gen.get(name, (0.0, 0))
        newest_gen[name] = (max(modified, info.modified), max(generation, number))
    recent = sorted(newest_gen.items(), key=lambda item: item[1][0], reverse=True)[:limit]
    found = []
    for name, (_, generation) in recent:
        try:
            manifest, _ = read_manifest(store, name, generation, trusted, allow_unsigned=allow_unsigned)
        except (IntegrityError, StoreError):
            continue
        platform, config = manifest.meta.get("platform"), manifest.meta.get("config")
        if not isinstance(platform, dict):
            continue
        if config == config_hash or (config is None and manifest.meta.get("model") == model):
            found.append(Elsewhere(name, platform, config == config_hash, manifest.created_at))
    return sorted(found, key=lambda e: not e.same_config)  # stable: newest first within each


@dataclass
class NamespaceListing:
    """One namespace of a store as `orchestrate cache ls` shows it: its newest generation."""

    namespace: str
    generations: int
    generation: Optional[int]
    files: Optional[int]
    bytes: Optional[int]
    buckets: Optional[list[int]]
    created_at: Optional[str]
    error: Optional[str]  # the newest manifest could not be read or verified


def listing(store: Store, trusted: Optional[TrustedKeys], *, allow_unsigned: bool) -> list[NamespaceListing]:
    rows = []
    for info in describe(store, trusted, allow_unsigned=allow_unsigned):
        m = info.manifest
        rows.append(
            NamespaceListing(
                namespace=info.namespace,
                generations=info.generations,
                generation=m.generation if m else None,
                files=len(m.files) if m else None,
                bytes=m.total_bytes if m else None,
                buckets=m.buckets if m else None,
                created_at=m.created_at if m else None,
                error=info.error,
            )
        )
    return rows


def verify(store: Store, namespace: str, trusted: Optional[TrustedKeys], *, allow_unsigned: bool) -> Manifest:
    """Check every generation's manifest (signature, where it is stored, paths, its link to the
    generation before it when that one is still in the store) and every shard and file hash any
    of them names, each shard once; the newest manifest."""
    numbers = generations(store, namespace)
    if not numbers:
        raise NotFound(f"{store.url}: namespace {namespace} was never published")
    checked: set[tuple[str, str, str]] = set()  # (shard, path, sha256): what was read and matched
    manifest: Optional[Manifest] = None
    digests: dict[int, str] = {}
    with _scratch("orchestrate-verify-", f"verifying {namespace}") as tmp:
        for generation in numbers:
            manifest, digests[generation] = read_manifest(
                store, namespace, generation, trusted, allow_unsigned=allow_unsigned
            )
            before = generation - 1
            if before in digests and manifest.previous != digests[before]:
                raise IntegrityError(
                    f"{_where(store, namespace, generation)}: does not name generation {before}'s manifest "
                    "as its previous one (replaced or reordered generations); refusing it"
                )
            unchecked = {rel: e for rel, e in manifest.files.items() if (e.shard, rel, e.sha256) not in checked}
            by_shard: dict[str, dict[str, FileEntry]] = {}
            for rel, entry in unchecked.items():
                by_shard.setdefault(entry.shard, {})[rel] = entry
            where = f"namespace {namespace} (generation {generation})"
            for shard, entries in sorted(by_shard.items()):
                _checked_shard(store, shard, manifest.shards.get(shard), entries, tmp / shard, where)
                checked |= {(shard, rel, e.sha256) for rel, e in entries.items()}
    assert manifest is not None
    return manifest


@dataclass
class Repair:
    """What `repair` found and did to one namespace."""

    namespace: str
    shards: int = 0  # shards any generation names, each checked once
    bad: list[str] = field(default_factory=list)  # their store keys: missing, or other bytes
    restored: int = 0  # bad shards uploaded again with their own bytes, packed from local files
    moved: int = 0  # files packed into new shards (their old shard could not be rebuilt as it was)
    dropped: list[str] = field(default_factory=list)  # files no local copy restores: compiled again later
    generation: Optional[int] = None  # the manifest published to point past bad shards, if one was
    retired: list[int] = field(default_factory=list)  # older generations deleted: they named bad shards


def repair(
    store: Store,
    namespace: str,
    directory: Optional[Path],
    key: Optional[SigningKey],
    *,
    allow_unsigned: bool,
    trusted: Optional[TrustedKeys] = None,
) -> Repair:
    """Make the namespace verify again. Every shard of every generation is checked once; a bad
    one that the newest generation names is uploaded again from the local files in `directory`
    where they rebuild it byte for byte, and otherwise its files move to new shards (from local
    copies) or leave the manifest (none), in a new generation. Older generations that still name
    a bad shard are deleted, and so are the bad objects: content addressing never keeps a corrupt
    object, and the next publish of a dropped file uploads it again. Publishing, it needs the
    private `key`, as `publish` does."""
    readers = (trusted or TrustedKeys()).plus(key.public if key else None)
    for _ in range(MAX_PUBLISH_RACES):
        numbers = generations(store, namespace)
        if not numbers:
            raise NotFound(f"{store.url}: namespace {namespace} was never published")
        read = {g: read_manifest(store, namespace, g, readers, allow_unsigned=allow_unsigned) for g in numbers}
        manifests = {g: manifest for g, (manifest, _) in read.items()}
        head, head_digest = read[numbers[-1]]
        result = Repair(namespace)
        bad = _bad_shards(store, namespace, manifests.values())
        result.shards = len({e.shard for m in manifests.values() for e in m.files.values()})
        result.bad = [_object_key(shard) for shard in sorted(bad)]
        if not bad:
            return result
        local = scan(directory) if directory is not None else {}
        in_head: dict[str, dict[str, FileEntry]] = {}
        for rel, entry in head.files.items():
            if entry.shard in bad:
                in_head.setdefault(entry.shard, {})[rel] = entry
        moved: dict[str, tuple[Path, int]] = {}
        with _scratch("orchestrate-repair-", f"repairing {namespace}") as tmp:
            for shard, entries in sorted(in_head.items()):
                have = {
                    rel: local[rel] for rel, entry in entries.items() if rel in local and _matches(local[rel][0], entry)
                }
                if len(have) == len(entries):
                    rebuilt = tmp / f"rebuilt-{shard}"
                    _write_tar(rebuilt, {rel: path for rel, (path, _) in have.items()})
                    if sha256_file(rebuilt) == shard:
                        store.upload(_object_key(shard), rebuilt)
                        bad.discard(shard)
                        result.restored += 1
                        continue
                moved.update(have)
                result.dropped += sorted(rel for rel in entries if rel not in have)
        if moved or result.dropped:
            new_entries, new_sizes = _upload_shards(store, moved, Transfer()) if moved else ({}, {})
            result.moved = len(new_entries)
            files = {rel: entry for rel, entry in head.files.items() if rel not in result.dropped}
            files.update(new_entries)
            kept = {entry.shard for entry in files.values()}
            shards = {shard: size for shard, size in head.shards.items() if shard in kept}
            shards.update(new_sizes)
            manifest = _next_manifest(head, namespace, files, shards, head.buckets, head.meta, previous=head_digest)
            if not _create_manifest(store, manifest, key):
                continue  # a publisher came first: check again from its generation
            result.generation = manifest.generation
        result.retired = [g for g, m in manifests.items() if any(e.shard in bad for e in m.files.values())]
        store.delete([_manifest_key(namespace, g) for g in result.retired])
        store.delete([_object_key(shard) for shard in sorted(bad)])
        return result
    raise StoreError(f"repair {namespace}: lost {MAX_PUBLISH_RACES} races for the next manifest generation")


def _bad_shards(store: Store, namespace: str, manifests: Iterable[Manifest]) -> set[str]:
    """The shards that any of the manifests names and that are missing or do not hold what they promise."""
    wanted: dict[str, dict[str, FileEntry]] = {}
    sizes: dict[str, int] = {}
    for manifest in manifests:
        for rel, entry in manifest.files.items():
            wanted.setdefault(entry.shard, {})[rel] = entry
        sizes.update(manifest.shards)
    bad: set[str] = set()
    with _scratch("orchestrate-check-", f"checking the shards of {namespace}") as tmp:
        for shard, entries in sorted(wanted.items()):
            try:
                _checked_shard(store, shard, sizes.get(shard), entries, tmp / "shard", f"namespace {namespace}")
            except BadShard:
                bad.add(shard)
    return bad


@dataclass
class Collection:
    """What `gc` deleted, or would delete with dry_run."""

    namespaces: int = 0  # namespaces found
    manifests: list[str] = field(default_factory=list)  # store keys of generations deleted
    retired_namespaces: list[str] = field(default_factory=list)  # namespaces deleted whole (unused_days)
    objects: list[str] = field(default_factory=list)  # store keys of shards no kept generation names
    bytes_freed: int = 0
    uploads_aborted: int = 0
    unverified: list[str] = field(default_factory=list)  # namespaces whose kept manifests did not verify
    dry_run: bool = False


def gc(
    store: Store,
    keep: int,
    trusted: Optional[TrustedKeys],
    *,
    allow_unsigned: bool,
    grace_seconds: float = 3600.0,
    unused_days: Optional[float] = None,
    dry_run: bool = False,
) -> Collection:
    """Per namespace, keep its `keep` newest generations and delete the older ones; never judge
    one namespace by another (two models may share a name). With `unused_days`, a namespace whose
    newest generation is older than that goes whole. Then delete shards that no kept generation
    names and that are older than `grace_seconds` (a publisher uploads shards before its manifest
    exists: the grace protects it), and abort uploads abandoned for as long. A namespace whose
    kept generations do not verify might need any shard: then no shard is deleted."""
    if keep < 1:
        raise ValueError("gc keeps at least the newest generation of every namespace")
    now = time.time()
    done = Collection(dry_run=dry_run)
    referenced: set[str] = set()
    keep_every_shard = False
    names = namespaces(store)
    done.namespaces = len(names)
    for namespace in names:
        numbers = generations(store, namespace)
        if not numbers:
            continue
        if unused_days is not None:
            written = [o.modified for o in store.list(f"{PREFIX}/namespaces/{namespace}/")]
            if written and now - max(written) > unused_days * 86400:
                done.retired_namespaces.append(namespace)
                done.manifests += [_manifest_key(namespace, g) for g in numbers]
                continue
        kept, older = numbers[-keep:], numbers[:-keep]
        done.manifests += [_manifest_key(namespace, g) for g in older]
        for generation in kept:
            try:
                manifest, _ = read_manifest(store, namespace, generation, trusted, allow_unsigned=allow_unsigned)
            except IntegrityError:
                done.unverified.append(namespace)
                keep_every_shard = True
                break
            referenced |= set(manifest.shards) | {entry.shard for entry in manifest.files.values()}
    if not keep_every_shard:
        for item in store.list(f"{PREFIX}/objects/"):
            if item.key.rsplit("/", 1)[-1] not in referenced and now - item.modified > grace_seconds:
                done.objects.append(item.key)
                done.bytes_freed += item.size
    done.uploads_aborted = store.abort_uploads(now - grace_seconds, dry_run=dry_run)
    if not dry_run:
        store.delete(done.manifests)
        store.delete(done.objects)
    return done
