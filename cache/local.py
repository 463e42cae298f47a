"""The node-local store: one directory per namespace holding the Inductor and Triton caches."""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalCache:
    root: Path  # node-local (NVMe in production)
    namespace: str

    @property
    def path(self) -> Path:
        return self.root / self.namespace

    @property
    def inductor_dir(self) -> Path:
        return self.path / "inductor"

    @property
    def triton_dir(self) -> Path:
        return self.path / "triton"

    def prepare(self) -> LocalCache:
        self.inductor_dir.mkdir(parents=True, exist_ok=True)
        self.triton_dir.mkdir(parents=True, exist_ok=True)
        return self

    def wipe(self) -> None:
        """Remove this namespace only. Renamed away first, so a crash mid-delete leaves no half cache."""
        if not self.path.exists():
            return
        trash = self.root / f".trash-{self.namespace}-{uuid.uuid4().hex[:8]}"
        os.replace(self.path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def remove_if_empty(self) -> bool:
        """Remove the namespace directory if it holds no file, only folders (a set-up that failed
        after making it, or buckets that all failed and whose files were deleted): left there, an
        empty namespace looks like a cache to `cache ls` and to the next person. Folders go one by
        one, deepest first, and never with what is in them: a file another process writes into
        the namespace meanwhile stops the removal and stays."""
        if not self.path.is_dir() or self.path.is_symlink():
            return False
        folders = sorted((p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        try:
            for folder in [*folders, self.path]:
                folder.rmdir()
        except OSError:  # not empty: a file is there
            return False
        return True

    def usage(self) -> tuple[int, int]:
        """(files, bytes) under the namespace directory."""
        sizes = [f.stat().st_size for f in self.path.rglob("*") if f.is_file()]
        return len(sizes), sum(sizes)


@dataclass(frozen=True)
class LocalNamespace:
    """One namespace directory of a local cache root as `orchestrate cache ls --cache-dir` shows it."""

    namespace: str
    files: int
    bytes: int


def local_namespaces(root: Path) -> list[LocalNamespace]:
    """Every namespace directory under `root`: the store beside it, node directories, scratch and
    trash are not namespaces."""
    from orchestrator.cache.namespace import is_namespace
    from orchestrator.cache.sync import scan

    if not root.is_dir():
        return []
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and is_namespace(p.name)):
        files = scan(path)
        found.append(LocalNamespace(path.name, len(files), sum(size for _, size in files.values())))
    return found
