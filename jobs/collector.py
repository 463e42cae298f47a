"""The Python garbage collector around a serving process's imports, a replica's load and a process's exit.

A full collection walks every object the process holds, and a process that imported torch,
Dynamo and Inductor and built a model holds millions: each takes a few hundred milliseconds,
under the interpreter lock. Python starts one whenever enough objects have survived into the
oldest generation, and a load is when most of them are made (imports, a model's modules, the
compiled code loaded), so a load left to them pays for several, in the same interpreter as the answering
replica and its own build.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

# the oldest generation's threshold while loads run: collections of it that many collections of
# the middle one apart, which is never within a load
_DEFERRED = 1_000_000

_lock = threading.Lock()
_holders = 0
_restore: tuple[int, ...] = ()  # the thresholds found by the first holder
_exit_registered = False


def defer_full_collections(collect: bool = True) -> Callable[[], None]:
    """Hold off Python's automatic full collections until the returned release is called (once
    for each call here; further calls of a release do nothing). The young generations are still
    collected, so short-lived cycles are freed as before; the old generation's garbage waits for
    the last release, which collects it at once (unless the collector is off: gc.disable, or the
    hold was taken with `collect=False`) and puts back the thresholds found, unless someone else
    changed them in between."""
    global _holders, _restore
    with _lock:
        if _holders == 0:
            found = gc.get_threshold()
            _restore = found
            gc.set_threshold(found[0], found[1], max(found[2], _DEFERRED))
        _holders += 1
    released = False

    def release() -> None:
        global _holders
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _holders -= 1
            if _holders > 0:
                return
            ours = (*_restore[:2], max(_restore[2], _DEFERRED))
            if gc.get_threshold() == ours:
                gc.set_threshold(*_restore)
        if collect and gc.isenabled():  # a process that turned the collector off collects when it chooses
            gc.collect()

    return release


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """For the imports of a serving process, which make most of the objects it holds before its
    model (torch's modules among them) and keep them for its whole life: no full collection runs
    while the block runs (each would walk every object so far, and torch's import alone meets
    two), and every object alive at its end is frozen out of the collector (gc.freeze), so no
    later collection walks them again, a replica's at the end of its load and a served call's
    included. What the freeze keeps that was garbage is what the young collections had not freed
    yet: a few dozen objects after the runtime's imports."""
    release = defer_full_collections(collect=False)
    try:
        yield
    finally:
        gc.freeze()
        release()


def deferred() -> bool:
    """Whether a load holds full collections off now."""
    with _lock:
        return _holders > 0


def exit_without_collecting() -> None:
    """At exit, Python's last garbage collections walk every object torch, Dynamo and Inductor
    made (seconds after a compile, on a GPU more); the process is ending and its memory goes back
    to the system whole, so they are skipped: the objects alive at exit are frozen out of the
    collector."""
    global _exit_registered
    if not _exit_registered:
        atexit.register(gc.freeze)
        _exit_registered = True
