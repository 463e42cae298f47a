"""Errors a user can fix, each with the exit code the CLI documents (docs/cli.md)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BUCKET_FAILED = 1  # the job ran; at least one bucket failed (the rest are reported)
EXIT_USAGE = 2  # bad flag, bad config, unusable model or device: nothing ran
EXIT_INTERRUPTED = 130  # Ctrl-C


class UserError(Exception):
    """A problem the user can fix; printed as one line, no traceback."""

    exit_code = EXIT_USAGE
