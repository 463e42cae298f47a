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
