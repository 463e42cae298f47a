"""The Python garbage collector around a replica's load and a process's exit.

A full collection walks every object the process holds, and a process that imported torch,
Dynamo and Inductor and built a model holds millions: each takes a few hundred milliseconds,
under the interpreter lock. Python starts one whenever enough objects have survived into the
oldest generation, and a load is when most of them are made (imports, a model's modules, the
compiled code loaded), so a load left to them pays for several, in the same interpreter as the answering
replica and its own build.
"""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Callable

# the oldest generation's threshold while loads run: collections of it that many collections of
# the middle one apart, which is never within a load
_DEFERRED = 1_000_000

_lock = threading.Lock()
_holders = 0
_restore: tuple[int, ...] = ()  # the thresholds found by the first holder
_exit_registered = False


def defer_full_collections() -> Callable[[], None]:
    """Hold off Python's automatic full collections until the returned release is called (once
    for each call here; further calls of a release do nothing). The young generations are still
    collected, so short-lived cycles are freed as before; the old generation's garbage waits for
    the last release, which collects it at once (unless the collector is off: gc.disable) and
    puts back the thresholds found, unless someone else changed them in between."""
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
        if gc.isenabled():  # a process that turned the collector off collects when it chooses
            gc.collect()

    return release


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
