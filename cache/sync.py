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

Pull: newest manifest -> signature -> download missing shards in parallel into a staging
directory on the same filesystem -> sha256 of every shard and file -> rename into place, code
files before the index entries that point to them, so a compiler process reading the directory
meanwhile finds either nothing or a complete entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.cache.manifest import (
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
from orchestrator.cache.store import NotFound, Store, StoreError

PREFIX = "v1"
SHARD_BYTES = 64 * 1024 * 1024  # few large objects: requests cost more than bytes on S3
PARALLEL = 8
MAX_PUBLISH_RACES = 20
APPLIED_MARKER = ".orchestrate-manifest.json"
# Files that are process-local state, not artifacts
_SKIP = re.compile(r"(^|/)(locks/|\.tmp|tmp[^/]*$|[^/]*\.lock$|" + re.escape(APPLIED_MARKER) + ")")
# Index entries point at code; they are placed last (see module doc)
_INDEX = re.compile(r"^inductor/(fxgraph|aotautograd)/|/__grp__[^/]*\.json$")
_GEN = re.compile(r"gen-(\d+)\.json$")


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


def _manifest_key(namespace: str, generation: int) -> str:
    return f"{PREFIX}/namespaces/{namespace}/gen-{generation:08d}.json"


def _object_key(sha: str) -> str:
    return f"{PREFIX}/objects/{sha[:2]}/{sha}"


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
            elif entry.is_file(follow_symlinks=False) and not _SKIP.search(rel):
                try:
                    found[rel] = (Path(entry.path), entry.stat(follow_symlinks=False).st_size)
                except FileNotFoundError:  # removed since it was listed: it is not an artifact any more
                    continue
    return found


def generations(store: Store, namespace: str) -> list[int]:
    found = (_GEN.search(info.key) for info in store.list(f"{PREFIX}/namespaces/{namespace}/"))
    return sorted(int(m.group(1)) for m in found if m)


def _where(store: Store, namespace: str, generation: int) -> str:
    return f"{store.url.rstrip('/')}/{_manifest_key(namespace, generation)}"


def read_manifest(
    store: Store, namespace: str, generation: int, trusted: Optional[TrustedKeys], *, allow_unsigned: bool
) -> tuple[Manifest, str]:
    """One generation's manifest, verified and bound to where it was found, with its digest."""
    data = store.read(_manifest_key(namespace, generation))
    where = _where(store, namespace, generation)
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
    entries, shard_sizes = _upload_shards(store, fresh, transfer) if fresh else ({}, {})
    buckets = sorted(set(buckets))

    for _ in range(MAX_PUBLISH_RACES):
        new_paths = {rel: entry for rel, entry in entries.items() if head is None or rel not in head.files}
        if head is not None and not new_paths and set(buckets) <= set(head.buckets):
            transfer.generation = head.generation  # nothing new: publishing again would change nothing
            break
        generation = (head.generation if head else 0) + 1
        files = dict(head.files) if head else {}
        files.update(new_paths)
        shards = dict(head.shards) if head else {}
        shards.update({entry.shard: shard_sizes[entry.shard] for entry in new_paths.values()})
        manifest = Manifest(
            namespace=namespace,
            generation=generation,
            files=files,
            shards=shards,
            buckets=sorted(set(head.buckets if head else []) | set(buckets)),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            publisher=f"{socket.gethostname()}/{os.getpid()}",
            meta=meta or {},
            previous=head_digest,
        )
        if store.create(_manifest_key(namespace, generation), encode(manifest, key)):
            transfer.generation = generation
            break
        transfer.races += 1  # another publisher took this generation: merge onto theirs
        current = _head(store, namespace, readers, allow_unsigned=allow_unsigned)
        head, head_digest = current if current else (None, None)
    else:
        raise StoreError(f"publish {namespace}: lost {MAX_PUBLISH_RACES} races for the next manifest generation")
    transfer.seconds = time.perf_counter() - started
    return transfer


def _upload_shards(
    store: Store, files: dict[str, tuple[Path, int]], transfer: Transfer
) -> tuple[dict[str, FileEntry], dict[str, int]]:
    """Pack files into deterministic tars of about SHARD_BYTES and upload them in parallel."""
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
            hashes = _write_tar(shard_path, {rel: files[rel][0] for rel in group})
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


def pulled_generation(directory: Path) -> int:
    """The generation last pulled into `directory` (0: none, or no readable record)."""
    try:
        generation = json.loads((directory / APPLIED_MARKER).read_text()).get("generation", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return generation if isinstance(generation, int) else 0


def pull(
    store: Store, namespace: str, directory: Path, trusted: Optional[TrustedKeys], *, allow_unsigned: bool
) -> Optional[Transfer]:
    """Bring `directory` up to the newest published state. None when the namespace is absent.
    Refuses a newest generation older than the one `directory` already holds."""
    started = time.perf_counter()
    head = _head(store, namespace, trusted, allow_unsigned=allow_unsigned)
    if head is None:
        return None
    manifest, digest = head
    seen = pulled_generation(directory)
    if manifest.generation < seen:
        raise IntegrityError(
            f"{_where(store, namespace, manifest.generation)}: generation {manifest.generation} is older than "
            f"generation {seen} already pulled into {directory} (store rolled back or replayed); refusing it "
            f"(remove {directory / APPLIED_MARKER} if the namespace was republished on purpose)"
        )
    needed = {rel: entry for rel, entry in manifest.files.items() if not _matches(directory / rel, entry)}
    transfer = Transfer(generation=manifest.generation, files=len(needed))
    if needed:
        directory.parent.mkdir(parents=True, exist_ok=True)  # the directory itself appears only when verified
        staging = directory.parent / f".incoming-{directory.name}-{uuid.uuid4().hex[:8]}"
        try:
            _fetch(store, manifest, needed, staging, transfer)
            _place(staging, directory, needed)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"namespace": namespace, "generation": manifest.generation, "manifest": digest}
    (directory / APPLIED_MARKER).write_text(json.dumps(record) + "\n")
    transfer.seconds = time.perf_counter() - started
    return transfer


def _matches(path: Path, entry: FileEntry) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and sha256_file(path) == entry.sha256


def _fetch(store: Store, manifest: Manifest, needed: dict[str, FileEntry], staging: Path, transfer: Transfer) -> None:
    """Download the shards holding `needed` files, verify shard and file hashes, extract to staging."""
    by_shard: dict[str, list[str]] = {}
    for rel, entry in needed.items():
        if rel.startswith("/") or ".." in Path(rel).parts or _SKIP.search(rel):
            raise IntegrityError(f"manifest of {manifest.namespace} names an unsafe path {rel!r}; refusing it")
        by_shard.setdefault(entry.shard, []).append(rel)
    (staging / ".shards").mkdir(parents=True)

    def fetch_one(shard: str) -> int:
        path = staging / ".shards" / shard
        store.download(_object_key(shard), path)
        if sha256_file(path) != shard:
            raise IntegrityError(
                f"{store.url}: shard {shard[:16]}... does not match its sha256 (corrupt or "
                "tampered); refusing it, the local cache is untouched"
            )
        wanted = set(by_shard[shard])
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name not in wanted:
                    continue
                if not member.isfile():
                    raise IntegrityError(f"shard {shard[:16]}...: {member.name} is not a regular file; refusing it")
                extracted = tar.extractfile(member)
                if extracted is None:  # isfile() above: not reached
                    raise IntegrityError(f"shard {shard[:16]}...: {member.name} has no content; refusing it")
                data = extracted.read()
                if _sha256(data) != needed[member.name].sha256:
                    raise IntegrityError(f"shard {shard[:16]}...: {member.name} does not match its sha256; refusing it")
                target = staging / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                wanted.discard(member.name)
        if wanted:
            raise IntegrityError(f"shard {shard[:16]}... lacks {len(wanted)} files its manifest promises; refusing it")
        size = path.stat().st_size
        path.unlink()
        return size

    with ThreadPoolExecutor(PARALLEL) as pool:
        sizes = list(pool.map(fetch_one, sorted(by_shard)))
    transfer.shards, transfer.bytes = len(sizes), sum(sizes)


def _place(staging: Path, directory: Path, needed: dict[str, FileEntry]) -> None:
    for rel in sorted(needed, key=lambda r: (bool(_INDEX.search(r)), r)):
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)


# --- inspection and maintenance -------------------------------------------------------------


@dataclass
class NamespaceInfo:
    namespace: str
    generations: int
    manifest: Optional[Manifest]
    error: Optional[str] = None


def namespaces(store: Store) -> list[str]:
    names = set()
    for info in store.list(f"{PREFIX}/namespaces/"):
        parts = info.key.split("/")
        if len(parts) >= 4 and _GEN.search(parts[-1]):
            names.add(parts[2])
    return sorted(names)


def describe(store: Store, trusted: Optional[TrustedKeys], *, allow_unsigned: bool) -> list[NamespaceInfo]:
    found = []
    for namespace in namespaces(store):
        try:
            manifest = newest(store, namespace, trusted, allow_unsigned=allow_unsigned)
            found.append(NamespaceInfo(namespace, len(generations(store, namespace)), manifest))
        except (IntegrityError, StoreError) as exc:
            found.append(NamespaceInfo(namespace, len(generations(store, namespace)), None, str(exc)))
    return found


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
    """Check the newest manifest's signature, its link to the generation before it (when that one
    is still in the store), and every shard and file hash it names."""
    manifest = newest(store, namespace, trusted, allow_unsigned=allow_unsigned)
    if manifest is None:
        raise NotFound(f"{store.url}: namespace {namespace} was never published")
    before = manifest.generation - 1
    if before in generations(store, namespace):
        digest = manifest_digest(store.read(_manifest_key(namespace, before)))
        if manifest.previous != digest:
            raise IntegrityError(
                f"{_where(store, namespace, manifest.generation)}: does not name generation {before}'s manifest "
                "as its previous one (replaced or reordered generations); refusing it"
            )
    with tempfile.TemporaryDirectory(prefix="orchestrate-verify-") as tmp:
        _fetch(store, manifest, manifest.files, Path(tmp) / "staging", Transfer())
    return manifest


def gc(
    store: Store, keep: int, trusted: Optional[TrustedKeys], *, allow_unsigned: bool, grace_seconds: float = 3600.0
) -> dict[str, int]:
    """Keep the `keep` newest namespaces of each model (and the two newest generations of each);
    delete the rest, then shards no kept manifest names that are older than `grace_seconds`
    (a publisher uploads shards before its manifest exists: the grace protects it)."""
    infos = describe(store, trusted, allow_unsigned=allow_unsigned)
    by_model: dict[str, list[NamespaceInfo]] = {}
    for info in infos:
        model = (info.manifest.meta.get("model") if info.manifest else None) or info.namespace.split("-torch")[0]
        by_model.setdefault(model, []).append(info)
    doomed_manifests: list[str] = []
    referenced: set[str] = set()
    for group in by_model.values():
        group.sort(key=lambda i: i.manifest.created_at if i.manifest else "", reverse=True)
        for rank, info in enumerate(group):
            gens = generations(store, info.namespace)
            if rank < keep and info.manifest is not None:
                doomed_manifests += [_manifest_key(info.namespace, g) for g in gens[:-2]]
                for generation in gens[-2:]:
                    kept, _ = read_manifest(store, info.namespace, generation, trusted, allow_unsigned=allow_unsigned)
                    referenced |= set(kept.shards)
            elif rank >= keep:
                doomed_manifests += [_manifest_key(info.namespace, g) for g in gens]
            else:
                # an unverifiable newest manifest: keep everything it might need, delete nothing
                referenced |= {o.key.rsplit("/", 1)[-1] for o in store.list(f"{PREFIX}/objects/")}
    now = time.time()
    doomed_objects = [
        o.key
        for o in store.list(f"{PREFIX}/objects/")
        if o.key.rsplit("/", 1)[-1] not in referenced and now - o.modified > grace_seconds
    ]
    store.delete(doomed_manifests)
    store.delete(doomed_objects)
    return {"manifests_deleted": len(doomed_manifests), "objects_deleted": len(doomed_objects)}
