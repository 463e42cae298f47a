"""Signed manifests: which files make up a namespace, where their bytes are, and who vouches.

Inductor cache entries are pickles and Python source, so loading one runs code. A manifest lists
every file with its sha256 and the shard (an immutable, content-addressed tar) that holds it,
names the namespace and generation it was published as and the hash of the generation before it,
and carries an Ed25519 signature over its canonical JSON. Publishers hold the private key; pulls,
verification and serving hold only public keys, so a reader cannot vouch for anything. Trust flows
from a trusted public key to the manifest to the shard hashes to the file hashes; nothing
unverified reaches the local cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from orchestrator.cache.files import NAME_MAX, write_whole

KEY_ENV = "ORCHESTRATE_CACHE_SIGNING_KEY"  # the private key itself (PEM or 64 hex digits), e.g. from a Secret
KEY_FILE_ENV = "ORCHESTRATE_CACHE_SIGNING_KEY_FILE"  # a file holding the private key
TRUSTED_ENV = "ORCHESTRATE_CACHE_TRUSTED_KEYS"  # public key files, os.pathsep-separated
ALG = "ed25519"
FORMAT = 1
PRIVATE_NAME = "cache-signing.key"  # what `orchestrate keys new DIR` writes
PUBLIC_SUFFIX = ".pub"
APPLIED_MARKER = ".orchestrate-manifest.json"  # what a pulled directory records of its generation
VERIFIED_RECORD = ".orchestrate-verified.json"  # what the last pull or publish found each file to be (sync)
# Process-local state, never an artifact: a scan skips it and no manifest may name it
LOCAL_STATE = re.compile(
    r"(^|/)(locks/|\.tmp|tmp[^/]*$|[^/]*\.lock$|" + re.escape(APPLIED_MARKER) + "|" + re.escape(VERIFIED_RECORD) + ")"
)
# Bounds on what a manifest may be before anything else reads it: a manifest of 100,000 files takes
# about 30 MB and nests 4 levels deep, so these refuse only what would exhaust memory or the stack.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_SIZE = 1 << 62  # bytes a manifest may declare for one file or shard: far past any disk
MAX_DEPTH = 32
# Bounds on a path a manifest names, in bytes: the filesystem's limit on one name (NAME_MAX), and
# half of PATH_MAX for the whole, the rest left to the directory it is pulled into.
MAX_NAME_BYTES = NAME_MAX
MAX_PATH_BYTES = 2048
_SHA256 = re.compile(r"[0-9a-f]{64}")


class IntegrityError(Exception):
    """Unsigned, tampered or corrupt cache data was refused; the local cache was not touched."""


class KeyConfigError(Exception):
    """A key file or value that is missing, unreadable, or holds no key of its role: a reader's
    trusted key (--trust, $ORCHESTRATE_CACHE_TRUSTED_KEYS, a caller's) or a publisher's signing key
    (--signing-key-file, $ORCHESTRATE_CACHE_SIGNING_KEY[_FILE]). The configuration is wrong: a usage
    problem, found before any cache data is read or written; nothing was refused."""


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    shard: str  # sha256 of the shard holding this file


@dataclass
class Manifest:
    namespace: str
    generation: int
    files: dict[str, FileEntry]
    shards: dict[str, int]  # shard sha256 -> size in bytes
    buckets: list[int] = field(default_factory=list)
    created_at: str = ""
    publisher: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # model name, config hash, platform: `cache ls`, a miss
    # sha256 of the stored bytes of generation - 1's manifest (None for the first): the chain a
    # replayed or reordered generation breaks
    previous: Optional[str] = None

    def body(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT
        return data

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Manifest:
        if body.get("format") != FORMAT:
            raise IntegrityError(f"manifest format {body.get('format')!r} is not {FORMAT}; upgrade orchestrate")
        files = {path: FileEntry(**entry) for path, entry in body["files"].items()}
        manifest = cls(
            namespace=body["namespace"],
            generation=body["generation"],
            files=files,
            shards=body["shards"],
            buckets=body.get("buckets", []),
            created_at=body.get("created_at", ""),
            publisher=body.get("publisher", ""),
            meta=body.get("meta", {}),
            previous=body.get("previous"),
        )
        _check_types(manifest)
        _check_names(manifest)
        return manifest

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())


def _check_types(manifest: Manifest) -> None:
    """Fields of the wrong JSON type are refused here, not met later as a crash mid-pull."""
    ok = (
        isinstance(manifest.namespace, str)
        and isinstance(manifest.generation, int)
        and not isinstance(manifest.generation, bool)
        and isinstance(manifest.shards, dict)
        and all(isinstance(k, str) and _is_size(v) for k, v in manifest.shards.items())
        and all(
            isinstance(e.sha256, str) and _is_size(e.size) and isinstance(e.shard, str) for e in manifest.files.values()
        )
        and isinstance(manifest.buckets, list)
        and isinstance(manifest.meta, dict)
        and (manifest.previous is None or isinstance(manifest.previous, str))
    )
    if not ok:
        raise TypeError("a field has the wrong type")


def _is_size(value: Any) -> bool:
    """A byte count a file or an object can have: JSON's integers are unbounded, and one of 10^400
    would overflow the first float or C call that meets it (a listing's MiB, a disk-space check)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SIZE


def _check_names(manifest: Manifest) -> None:
    """Every name that becomes a local path or a store key is checked here, where the manifest is
    parsed, so nothing downstream writes, reads or deletes by a name it has not vetted: a shard is
    its sha256 (64 lowercase hex digits), and each file is a plain relative path inside its
    directory, within the filesystem's limits, not process-local state, and not a directory of
    another file."""
    where = manifest.namespace[:100]
    for shard in [*manifest.shards, *(entry.shard for entry in manifest.files.values())]:
        if not _SHA256.fullmatch(shard):
            raise IntegrityError(
                f"manifest of {where} names shard {shard[:80]!r}, which is not a sha256 (64 lowercase hex "
                "digits); refusing it"
            )
    for rel in manifest.files:
        parts = rel.split("/")
        try:
            sizes = [len(part.encode()) for part in parts]
        except UnicodeEncodeError:  # a lone surrogate: no file can be named so
            sizes = []
        if not sizes or any(part in ("", ".", "..") for part in parts) or "\0" in rel or LOCAL_STATE.search(rel):
            raise IntegrityError(f"manifest of {where} names an unsafe path {rel[:200]!r}; refusing it")
        if max(sizes) > MAX_NAME_BYTES or sum(sizes) + len(sizes) - 1 > MAX_PATH_BYTES:
            raise IntegrityError(
                f"manifest of {where} names a path longer than a filesystem allows ({MAX_NAME_BYTES} bytes a "
                f"name, {MAX_PATH_BYTES} in all): {rel[:100]!r}...; refusing it"
            )
    names = set(manifest.files)
    for rel in manifest.files:
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in names:
                raise IntegrityError(
                    f"manifest of {where} names {parent!r} as a file and as the directory of {rel[:200]!r}; refusing it"
                )


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in parsed JSON, counted without recursion, up to just
    past MAX_DEPTH."""
    deepest, pending = 0, [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending and deepest <= MAX_DEPTH:
        item, depth = pending.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _key_id(key: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw_public(key)).hexdigest()[:16]


def _read_key_text(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes().strip()
    except OSError as exc:
        raise KeyConfigError(f"{what} {path}: cannot read it ({exc.strerror})") from None


_NEW_KEY = "make a pair with `orchestrate keys new DIR`"


class PublicKey:
    """An Ed25519 public key: verifies manifests, cannot sign them. Not a secret, but only its id
    is shown, so listings stay short and alike."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        self.key_id = _key_id(key)

    def __repr__(self) -> str:
        return f"PublicKey(id={self.key_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.key_id == self.key_id

    def __hash__(self) -> int:
        return hash(self.key_id)

    @classmethod
    def from_text(cls, data: bytes, where: str) -> PublicKey:
        """PEM (SubjectPublicKeyInfo) or the raw 32 bytes as 64 hex digits."""
        try:
            if data.startswith(b"-----BEGIN"):
                if b"PRIVATE KEY" in data:
                    raise IntegrityError(
                        f"{where}: is a private key; give readers the public key ({PUBLIC_SUFFIX} file) only"
                    )
                key = serialization.load_pem_public_key(data)
            else:
                key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(data.decode("ascii")))
        except (ValueError, TypeError, UnicodeDecodeError, UnsupportedAlgorithm):
            key = None
        if not isinstance(key, Ed25519PublicKey):
            raise IntegrityError(f"{where}: not an Ed25519 public key (PEM or 64 hex digits); {_NEW_KEY}")
        return cls(key)

    @classmethod
    def load(cls, path: str | Path, what: str = "trusted key file") -> PublicKey:
        """The key in file `path`; KeyConfigError when it cannot be (`what` says who named it)."""
        try:
            data = Path(path).read_bytes().strip()
        except OSError as exc:
            raise KeyConfigError(
                f"{what} {path}: cannot read it ({exc.strerror}); name a readable public key file "
                f"(the {PUBLIC_SUFFIX} file of a pair from `orchestrate keys new DIR`)"
            ) from None
        try:
            return cls.from_text(data, f"{what} {path}")
        except IntegrityError as exc:  # a private key or no key: what was configured, not what was pulled
            raise KeyConfigError(str(exc)) from None

    def pem(self) -> str:
        return self._key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def verify(self, body: dict[str, Any], value: str) -> bool:
        try:
            self._key.verify(bytes.fromhex(value), _canonical(body))
            return True
        except (InvalidSignature, ValueError, TypeError):
            return False


class SigningKey:
    """An Ed25519 private key: only publishers hold one. Its value is never printed; `key_id`
    (of its public half) identifies it in errors and listings."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public = PublicKey(key.public_key())
        self.key_id = self.public.key_id

    def __repr__(self) -> str:
        return f"SigningKey(id={self.key_id})"

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_text(cls, data: bytes, where: str) -> SigningKey:
        """PEM (PKCS#8, unencrypted) or the raw 32-byte seed as 64 hex digits. The error never
        quotes the data: it may be a key with a typo."""
        try:
            if data.startswith(b"-----BEGIN"):
                if b"PUBLIC KEY" in data:
                    raise KeyConfigError(
                        f"{where}: is a public key, which only verifies; publishing needs the private key"
                    )
                key = serialization.load_pem_private_key(data, password=None)
            else:
                key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(data.decode("ascii")))
        except (ValueError, TypeError, UnicodeDecodeError, UnsupportedAlgorithm):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyConfigError(f"{where}: not an unencrypted Ed25519 private key (PEM or 64 hex digits); {_NEW_KEY}")
        return cls(key)

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        return cls.from_text(_read_key_text(Path(path), "signing key file"), f"signing key file {path}")

    @classmethod
    def from_env(cls, key_file: Optional[str] = None) -> Optional[SigningKey]:
        """The publisher's key: `key_file`, else $ORCHESTRATE_CACHE_SIGNING_KEY_FILE, else the key
        itself in $ORCHESTRATE_CACHE_SIGNING_KEY; None when none is configured."""
        path = key_file or os.environ.get(KEY_FILE_ENV)
        if path:
            return cls.load(path)
        value = os.environ.get(KEY_ENV)
        return cls.from_text(value.strip().encode(), f"${KEY_ENV}") if value and value.strip() else None

    def pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @staticmethod
    def public_path(path: Path) -> Path:
        return path.with_name(path.name + PUBLIC_SUFFIX)

    @classmethod
    def create_file(cls, path: Path) -> bool:
        """Write a new private key to `path` (mode 0600) and its public key to `path`.pub unless a
        key is there already; whether it wrote one. Exclusive creation: two processes starting at
        once keep the same key. The public file is rewritten from the private one when missing."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            public = cls.public_path(path)
            if not public.exists():
                _write_public(public, cls.load(path).public)
            return False
        key = cls.generate()
        with os.fdopen(fd, "wb") as out:
            out.write(key.pem())
        _write_public(cls.public_path(path), key.public)
        return True

    def sign(self, body: dict[str, Any]) -> str:
        return self._key.sign(_canonical(body)).hex()


def _write_public(path: Path, key: PublicKey) -> None:
    write_whole(path, key.pem())  # a reader never trusts half a file


class TrustedKeys:
    """The public keys a reader accepts manifests from, by key id: several at once, so a new key
    can be trusted before publishers switch to it and the old one dropped after."""

    def __init__(self, keys: Iterable[PublicKey] = ()) -> None:
        self._keys = {key.key_id: key for key in keys}

    def __repr__(self) -> str:
        return f"TrustedKeys({', '.join(self._keys) or 'none'})"

    def __iter__(self) -> Iterator[PublicKey]:
        return iter(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key_id: object) -> Optional[PublicKey]:
        return self._keys.get(key_id) if isinstance(key_id, str) else None

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def plus(self, *keys: Optional[PublicKey]) -> TrustedKeys:
        return TrustedKeys([*self, *(k for k in keys if k is not None)])

    @classmethod
    def load(cls, files: Iterable[str | Path] = (), *, environ: bool = True) -> TrustedKeys:
        """Public key files `files`, then those in $ORCHESTRATE_CACHE_TRUSTED_KEYS (when `environ`),
        then the public half of the signing key this process is configured with, if any: a
        publisher trusts its own key."""
        keys = [PublicKey.load(path) for path in files]
        if environ:
            named = [p for p in os.environ.get(TRUSTED_ENV, "").split(os.pathsep) if p.strip()]
            keys += [PublicKey.load(path, f"${TRUSTED_ENV} names") for path in named]
        own = SigningKey.from_env() if environ else None
        return cls([*keys, *([own.public] if own else [])])

    @classmethod
    def from_pems(cls, texts: Iterable[str]) -> TrustedKeys:
        return cls(PublicKey.from_text(text.strip().encode(), "trusted key") for text in texts)

    def pems(self) -> tuple[str, ...]:
        """The keys as PEM text: public, so they travel to workers on other nodes as they are."""
        return tuple(key.pem() for key in self)


def encode(manifest: Manifest, key: Optional[SigningKey]) -> bytes:
    body = manifest.body()
    signature = None if key is None else {"alg": ALG, "key_id": key.key_id, "value": key.sign(body)}
    return json.dumps({"body": body, "signature": signature}, sort_keys=True, indent=1).encode()


def manifest_digest(data: bytes) -> str:
    """What the next generation names as `previous`: the hash of the stored bytes."""
    return hashlib.sha256(data).hexdigest()


def decode(
    data: bytes,
    trusted: Optional[TrustedKeys],
    *,
    allow_unsigned: bool,
    where: str,
    namespace: Optional[str] = None,
    generation: Optional[int] = None,
) -> Manifest:
    """Parse and verify. Refuses unsigned manifests unless allowed, any bad signature, a key id not
    in `trusted`, and a manifest whose signed namespace or generation is not `namespace` and
    `generation` (where it was found): a valid signature vouches for the body, and the body must
    say it belongs here, or a manifest copied from another namespace or an old generation
    replayed under a newer number would pass. Before any of that, a manifest over
    MAX_MANIFEST_BYTES or nested deeper than MAX_DEPTH is refused; after it, any name that is
    not safe to use as a path or a store key (_check_names)."""
    trusted = trusted if trusted is not None else TrustedKeys()
    if len(data) > MAX_MANIFEST_BYTES:
        raise IntegrityError(
            f"{where}: manifest takes {len(data) / 2**20:.0f} MiB, more than the {MAX_MANIFEST_BYTES // 2**20} MiB "
            "a manifest may (corrupt or tampered); refusing it"
        )
    try:
        envelope = json.loads(data)
        too_deep = _depth(envelope) > MAX_DEPTH
    except RecursionError:  # nested past the interpreter's own limit
        too_deep = True
    except ValueError:
        raise IntegrityError(f"{where}: not a manifest (corrupt JSON); refusing it") from None
    if too_deep:
        raise IntegrityError(
            f"{where}: manifest nests deeper than {MAX_DEPTH} levels (corrupt or tampered); refusing it"
        )
    try:
        body, signature = envelope["body"], envelope["signature"]
    except (KeyError, TypeError):
        raise IntegrityError(f"{where}: not a manifest (corrupt JSON); refusing it") from None
    if not isinstance(body, dict):
        raise IntegrityError(f"{where}: manifest body is not an object (corrupt or tampered); refusing it")
    if signature is None:
        if not allow_unsigned:
            raise IntegrityError(
                f"{where}: manifest is unsigned; refusing it (sign with {KEY_FILE_ENV} on the publisher, "
                "or pass --allow-unsigned for local experiments)"
            )
    elif not isinstance(signature, dict) or not all(
        isinstance(signature.get(k), str) for k in ("alg", "key_id", "value")
    ):
        raise IntegrityError(f"{where}: manifest signature is malformed (corrupt or tampered); refusing it")
    elif signature["alg"] != ALG:
        raise IntegrityError(
            f"{where}: manifest is signed with {signature['alg'][:32]!r}, not {ALG}; refusing it "
            "(republish it with this version of orchestrate)"
        )
    else:
        key = trusted.get(signature["key_id"])
        if key is None:
            if not allow_unsigned:
                trusting = ", ".join(trusted.key_ids) or "none"
                raise IntegrityError(
                    f"{where}: manifest is signed by key id {signature['key_id'][:32]}, which is not trusted "
                    f"(trusted: {trusting}); refusing it (add its public key with --trust or {TRUSTED_ENV})"
                )
        elif not key.verify(body, signature["value"]):
            raise IntegrityError(
                f"{where}: manifest signature does not match (key id {key.key_id}): tampered or corrupt; refusing it"
            )
    try:
        manifest = Manifest.from_body(body)
    except IntegrityError as exc:
        raise IntegrityError(f"{where}: {exc}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        detail = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        raise IntegrityError(f"{where}: manifest is malformed ({detail}); refusing it") from None
    if (namespace is not None and manifest.namespace != namespace) or (
        generation is not None and manifest.generation != generation
    ):
        raise IntegrityError(
            f"{where}: manifest says namespace {str(manifest.namespace)[:100]} generation {manifest.generation} "
            "but is stored elsewhere: copied or replayed; refusing it"
        )
    return manifest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
