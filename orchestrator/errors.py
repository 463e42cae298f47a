"""Errors a user can fix, each with the exit code the CLI documents (README.md, "Exit codes")."""

from __future__ import annotations

from typing import Optional

EXIT_OK = 0
EXIT_BUCKET_FAILED = 1  # the job ran; at least one bucket failed (the rest are reported)
EXIT_USAGE = 2  # bad flag, bad config, unusable model, device, store URL, --report or key path: nothing ran
EXIT_STORE = 3  # the cache store (or, for `submit --k8s --apply`, the Kubernetes API server) is unreachable,
#                 refuses our credentials, or refused what was sent
EXIT_UNTRUSTED = 4  # unsigned, tampered or corrupt cache data was refused; the local cache is untouched
EXIT_MISS = 5  # `pull`: the namespace was never published (see --allow-miss)
EXIT_CLUSTER = 6  # the Ray cluster could not be reached or joined, or its GPUs for the ranks stay held
EXIT_INTERRUPTED = 130  # Ctrl-C


class UserError(Exception):
    """A problem the user can fix; printed as one line, no traceback."""

    exit_code = EXIT_USAGE


class ClusterUnreachable(UserError):
    exit_code = EXIT_CLUSTER


def _families() -> tuple[tuple[type[Exception], int], ...]:
    """The exceptions from below the CLI that it documents, with their exit codes; the first
    that matches wins. A trusted key configured wrong and a store URL no backend serves are usage
    errors, as a missing --trust file is."""
    from orchestrator.cache import sync  # its subclasses, DiskFull and BadShard, are then known
    from orchestrator.cache.manifest import IntegrityError, KeyConfigError
    from orchestrator.cache.store import StoreError, UnsupportedStore

    return (
        (UserError, EXIT_USAGE),  # or the subclass's own exit_code
        (UnsupportedStore, EXIT_USAGE),
        (sync.LocalDirectoryError, EXIT_USAGE),
        (KeyConfigError, EXIT_USAGE),
        (StoreError, EXIT_STORE),
        (IntegrityError, EXIT_UNTRUSTED),
    )


def exit_code_of(exc: BaseException) -> Optional[int]:
    """The exit code the CLI documents for `exc`; None for an exception it does not know."""
    for family, code in _families():
        if isinstance(exc, family):
            return getattr(exc, "exit_code", code)
    return None


def exit_code_named(kind: str) -> int:
    """The exit code of an exception known only by its class name, as one raised in a Serve
    replica reaches the driver: the same as `exit_code_of` gives the exception itself, and a
    setup problem's (2) for a name it does not know."""
    for family, code in _families():
        for cls in _with_subclasses(family):
            if cls.__name__ == kind:
                return getattr(cls, "exit_code", code)
    return EXIT_USAGE


def _with_subclasses(cls: type[Exception]) -> list[type[Exception]]:
    found = [cls]
    for child in cls.__subclasses__():
        found += _with_subclasses(child)
    return found
