"""Files written whole: whoever reads one beside its writer (a replica, a publish, a pull, a
browser) finds the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

SCRATCH_PREFIX = ".tmp-"  # a namespace's scan skips such names (manifest.LOCAL_STATE)
NAME_MAX = 255  # bytes in one name, on the filesystems a cache lives on


def scratch_beside(target: Path) -> Path:
    """A new hidden name in `target`'s directory, unique to the call, that a scan never takes for
    an artifact. It ends as the target's name ends (its suffix says the format to a writer that
    reads it, as torch's trace export does) and names the target to whoever finds one a crash left;
    what does not fit the filesystem's 255 bytes is cut from the front of the target's name."""
    head = f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}-"
    end = target.name.encode()[len(head) - NAME_MAX :].decode(errors="ignore")  # never half a character
    return target.with_name(head + end)


@contextlib.contextmanager
def replacing(target: Path, *, scratch: Optional[Path] = None, mode: Optional[int] = None) -> Iterator[Path]:
    """A path to write `target`'s new content into, renamed over `target` when the block ends
    without raising; a block that raises leaves `target` as it was. Whatever happens the scratch
    file is gone afterwards: a full disk creates it empty and then refuses its bytes, and a
    leftover beside a namespace's files would be published with them.

    `scratch` is where the content is written, by default `scratch_beside(target)`; it must be on
    `target`'s filesystem. `mode` sets the file's permission bits; without it the file has what
    any new file gets here (0666 less the umask)."""
    scratch = scratch or scratch_beside(target)
    try:
        yield scratch
        if mode is not None:
            os.chmod(scratch, mode)
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)


def write_whole(target: Path, content: str | bytes, *, mode: Optional[int] = None) -> None:
    """`target` holding `content` (text as UTF-8), written by `replacing`; its directory is made
    where missing."""
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    with replacing(target, mode=mode) as scratch:
        scratch.write_bytes(data)
