"""Signed manifests: which files make up a namespace, where their bytes are, and who vouches.

Inductor cache entries are pickles and Python source, so loading one runs code. A manifest lists
every file with its sha256 and the shard (an immutable, content-addressed tar) that holds it,
and carries an HMAC-SHA256 over its canonical JSON. Trust flows from the key to the manifest to
the shard hashes to the file hashes; nothing unverified reaches the local cache.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

KEY_ENV = "ORCHESTRATE_CACHE_SIGNING_KEY"
KEY_FILE_ENV = "ORCHESTRATE_CACHE_SIGNING_KEY_FILE"
FORMAT = 1


class IntegrityError(Exception):
    """Unsigned, tampered or corrupt cache data was refused; the local cache was not touched."""


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
    meta: dict[str, Any] = field(default_factory=dict)  # model name, platform: for `cache ls`

    def body(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT
        return data

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Manifest:
        if body.get("format") != FORMAT:
            raise IntegrityError(f"manifest format {body.get('format')!r} is not {FORMAT}; upgrade orchestrate")
        files = {path: FileEntry(**entry) for path, entry in body["files"].items()}
        return cls(
            namespace=body["namespace"],
            generation=body["generation"],
            files=files,
            shards=body["shards"],
            buckets=body.get("buckets", []),
            created_at=body.get("created_at", ""),
            publisher=body.get("publisher", ""),
            meta=body.get("meta", {}),
        )

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class SigningKey:
    """An HMAC key. Its value is never printed; `key_id` identifies it in errors and listings."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise IntegrityError("the cache signing key is shorter than 16 bytes; use e.g. `openssl rand -hex 32`")
        self._secret = secret
        self.key_id = hashlib.sha256(b"orchestrate-key-id:" + secret).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"SigningKey(id={self.key_id})"

    @classmethod
    def from_env(cls, key_file: Optional[str] = None) -> Optional[SigningKey]:
        path = key_file or os.environ.get(KEY_FILE_ENV)
        if path:
            try:
                return cls(Path(path).read_bytes().strip())
            except OSError as exc:
                raise IntegrityError(f"signing key file {path}: cannot read it ({exc.strerror})") from None
        value = os.environ.get(KEY_ENV)
        return cls(value.encode()) if value else None

    @staticmethod
    def create_file(path: Path) -> bool:
        """Write a new random key to `path` (mode 0600) unless a key is there already; whether it
        wrote one. Exclusive creation: two processes starting at once keep the same key."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        return True

    def sign(self, body: dict[str, Any]) -> str:
        return hmac.new(self._secret, _canonical(body), hashlib.sha256).hexdigest()


def encode(manifest: Manifest, key: Optional[SigningKey]) -> bytes:
    body = manifest.body()
    signature = None if key is None else {"alg": "hmac-sha256", "key_id": key.key_id, "value": key.sign(body)}
    return json.dumps({"body": body, "signature": signature}, sort_keys=True, indent=1).encode()


def decode(data: bytes, key: Optional[SigningKey], *, allow_unsigned: bool, where: str) -> Manifest:
    """Parse and verify. Refuses unsigned manifests unless allowed, and any bad signature."""
    try:
        envelope = json.loads(data)
        body, signature = envelope["body"], envelope["signature"]
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{where}: not a manifest (corrupt JSON); refusing it") from None
    if signature is None:
        if not allow_unsigned:
            raise IntegrityError(
                f"{where}: manifest is unsigned; refusing it (set {KEY_ENV} on the publisher, "
                "or pass --allow-unsigned for local experiments)"
            )
    elif key is None:
        if not allow_unsigned:
            raise IntegrityError(
                f"{where}: manifest is signed (key id {signature.get('key_id')}) but no key is "
                f"configured to verify it; set {KEY_ENV} or {KEY_FILE_ENV}"
            )
    elif not hmac.compare_digest(str(signature.get("value", "")), key.sign(body)):
        raise IntegrityError(
            f"{where}: manifest signature does not match (signed with key id "
            f"{signature.get('key_id')}, verifying with {key.key_id}): tampered or signed with "
            "another key; refusing it"
        )
    try:
        return Manifest.from_body(body)
    except (KeyError, TypeError) as exc:
        raise IntegrityError(f"{where}: manifest is malformed ({exc}); refusing it") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
