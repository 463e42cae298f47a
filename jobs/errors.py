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


def install_hint(module: str) -> str:
    """What to do about a factory module that does not import. torchvision ships compiled
    operators for one torch build: a wheel from another index (PyPI's CUDA build beside a CPU
    torch) imports, then fails with "operator torchvision::nms does not exist"."""
    from importlib import metadata

    generic = "install it or use 'path/to/file.py:callable'"
    if module.partition(".")[0] != "torchvision":
        return generic
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return generic
    release, _, build = torch_version.partition("+")
    major, minor = (release.split(".") + ["0"])[:2]
    if major != "2" or not minor.isdigit():
        return generic
    index = f" --index-url https://download.pytorch.org/whl/{build}" if build else ""
    # torchvision 0.(N + 15) is built for torch 2.N
    return (
        f"install the torchvision built for torch {torch_version}, from the index torch came from: "
        f".venv/bin/pip install 'torchvision==0.{int(minor) + 15}.*'{index} (scripts/install.sh --examples does it)"
    )
