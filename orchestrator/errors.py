"""Errors a user can fix, each with the exit code the CLI documents (README.md, "Exit codes")."""

from __future__ import annotations

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


def exit_code_named(kind: str) -> int:
    """The exit code of an exception known only by its class name, as one raised in a Serve
    replica reaches the driver: a store's and a disk's (3), untrusted data's (4), else a setup
    problem (2)."""
    from orchestrator.cache import sync  # noqa: F401 (its subclasses, DiskFull and BadShard, are then known)
    from orchestrator.cache.manifest import IntegrityError
    from orchestrator.cache.store import StoreError

    for family, code in ((StoreError, EXIT_STORE), (IntegrityError, EXIT_UNTRUSTED)):
        if kind in {cls.__name__ for cls in _with_subclasses(family)}:
            return code
    return EXIT_USAGE


def _with_subclasses(cls: type[Exception]) -> list[type[Exception]]:
    found = [cls]
    for child in cls.__subclasses__():
        found += _with_subclasses(child)
    return found
