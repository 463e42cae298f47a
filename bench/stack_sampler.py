"""Where one thread's wall time goes: its Python stack sampled every few milliseconds from a thread
of its own (diagnostics for the benches; stdlib only, so it runs in any child process).

cProfile cannot say this for one thread of many: on Python 3.12 it records through sys.monitoring,
which sees every thread at once, and it counts only the Python work it sees, not the waits for the
interpreter lock or inside a C call, which are part of what a thread costs. A sample counts
whatever the thread is doing, waiting included, at the interval's cost in resolution.

    sampler = ThreadSampler("orchestrate-replica-loader").start()
    ...
    sampler.stop()
    text = sampler.report([("load", 0.0, 2.5), ...])   # seconds from start(): per window, what ran
    sampler.write_collapsed(path)                      # `frame;frame;... count` lines, for flame graphs
"""

from __future__ import annotations

import collections
import re
import sys
import threading
import time
from pathlib import Path
from types import CodeType
from typing import Optional

Frame = tuple[str, int, str]  # file, first line, function


def _label(code: Frame) -> str:
    path, line, name = code
    short = re.split(r"site-packages/|/orchestrator/|/lib/python3\.\d+/", path)[-1]
    return f"{short}:{line}({name})"


class ThreadSampler:
    def __init__(self, thread_name: str, interval: float = 0.002) -> None:
        self.thread_name, self.interval = thread_name, interval
        self.samples: list[tuple[float, float, tuple[CodeType, ...]]] = []  # at, weight (s), root..leaf
        self._stop = threading.Event()
        self._started = 0.0
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> ThreadSampler:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _target(self) -> Optional[int]:
        for thread in threading.enumerate():
            if thread.name == self.thread_name:
                return thread.ident
        return None

    def _run(self) -> None:
        ident: Optional[int] = None
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            now = time.perf_counter()
            ident = ident or self._target()
            frame = sys._current_frames().get(ident) if ident else None
            if frame is not None:
                stack = []
                while frame is not None:
                    stack.append(frame.f_code)
                    frame = frame.f_back
                # each sample stands for the time since the one before: a sampler the interpreter
                # lock held back still accounts for the whole span
                self.samples.append((now - self._started, now - last, tuple(reversed(stack))))
            last = now

    def _windowed(self, start: float, end: float) -> list[tuple[float, tuple[Frame, ...]]]:
        return [
            (weight, tuple((c.co_filename, c.co_firstlineno, c.co_name) for c in stack))
            for at, weight, stack in self.samples
            if start <= at < end
        ]

    def report(self, windows: list[tuple[str, float, float]], rows: int = 25) -> str:
        """Per window (name, from, to: seconds from start()): the functions the thread spent it in
        (inclusive), the modules it imported (inclusive), and where it was when sampled (own)."""
        out: list[str] = []
        for name, start, end in windows:
            samples = self._windowed(start, end)
            seen = sum(weight for weight, _ in samples)
            importing = sum(weight for weight, stack in samples if any(c[2] == "_find_and_load" for c in stack))
            out.append(
                f"=== {name}: {start:.3f}-{end:.3f} s, {seen:.3f} s sampled ({len(samples)} samples), "
                f"{importing:.3f} s of it importing"
            )
            inclusive: collections.Counter[Frame] = collections.Counter()
            own: collections.Counter[Frame] = collections.Counter()
            for weight, stack in samples:
                for code in set(stack):
                    inclusive[code] += weight
                own[stack[-1]] += weight
            imports = [(s, c) for c, s in inclusive.items() if c[2] == "<module>"]
            for title, ranked in (
                ("inclusive", [(s, c) for c, s in inclusive.most_common(rows)]),
                ("modules imported (inclusive)", sorted(imports, reverse=True)[:rows]),
                ("own (the innermost frame)", [(s, c) for c, s in own.most_common(rows)]),
            ):
                out.append(f"  -- {title}")
                out += [f"  {s:8.3f} s {s / seen if seen else 0:6.1%}  {_label(c)}" for s, c in ranked]
        return "\n".join(out) + "\n"

    def write_collapsed(self, path: Path) -> None:
        """Every sample as `root;...;leaf milliseconds`, summed per stack (flamegraph.pl, speedscope)."""
        stacks: collections.Counter[str] = collections.Counter()
        for weight, stack in self._windowed(0.0, float("inf")):
            stacks[";".join(_label(c) for c in stack)] += weight * 1000
        path.write_text("".join(f"{key} {round(ms)}\n" for key, ms in stacks.most_common()))
