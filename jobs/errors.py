"""Failures raised by worker code, and their one-line form for reports."""

from __future__ import annotations


class SetupError(Exception):
    """The model or device cannot be set up as configured; nothing was run."""


class OutputMismatch(Exception):
    """Compiled output differs from eager: structure, type, shape, values beyond tolerance."""

    def __init__(self, message: str, max_abs_error: float | None = None) -> None:
        super().__init__(message)
        self.max_abs_error = max_abs_error  # set when values were compared and found too far apart


class NonFiniteOutput(OutputMismatch):
    """Eager's own output holds NaN or Inf, so nothing can be checked against it."""


def brief(exc: BaseException) -> str:
    """`Type: first line of the message`: enough to act on, short enough for a table cell."""
    return f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The message's first line, or the exception's type where it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
