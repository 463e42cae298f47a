"""Progress on stderr: a live bar per bucket and phase on a terminal, one line per phase in logs."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from orchestrator.jobs.records import BucketResult, point_label


class _Bars:
    """Live bars on a terminal (a context manager around the run); plain lines always."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        # a description longer than its share of the terminal wraps in the live display: cut with
        # "…", it would hide the figures at its end
        self._bars = Progress(
            TextColumn("{task.description}", table_column=Column(overflow="fold")),
            # narrower in an 80-column terminal, where the fleet's descriptions need the room
            BarColumn(bar_width=20 if console.width >= 100 else 8),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            # rich would swap sys.stdout and sys.stderr for proxies that print above the bars, so
            # what Python code writes there (Ray's error listener prints its "(raylet) Task ...
            # failed" lines to sys.stdout, warnings go to sys.stderr) would reach the screen past
            # the run log (RunLog), which holds file descriptors 1 and 2, not Python's objects
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def __enter__(self):
        if self.live:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._bars.stop()

    def line(self, text: str) -> None:
        """On a terminal, wrapped at word boundaries to its width, above the live bars (a terminal
        left to wrap it breaks words); in a log, one line per event, whole, for grep."""
        if self.live:
            self.console.print(text, markup=False, highlight=False, overflow="fold")
        else:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class BucketProgress(_Bars):
    """Implements orchestrator.jobs.engine.Progress: a bar per bucket, its description the current phase."""

    def __init__(self, console: Console, on_result: Callable[[BucketResult], None] = lambda record: None) -> None:
        super().__init__(console)
        self.on_result = on_result
        self._tasks: dict[int, TaskID] = {}

    def step(self, name: str) -> None:
        self.line(name)

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None:
        if not self.live:
            self.line(f"bucket {bucket}: {name}")
            return
        description = f"bucket {bucket:>4} · {name}"
        if bucket not in self._tasks:
            self._tasks[bucket] = self._bars.add_task(description, total=total)
        else:
            self._bars.reset(self._tasks[bucket], description=description, total=total)

    def advance(self, bucket: int) -> None:
        if self.live and bucket in self._tasks:
            self._bars.advance(self._tasks[bucket])

    def finish(self, result: BucketResult) -> None:
        self.on_result(result)
        if result.status == "ok":
            line = (
                f"bucket {result.bucket}: {result.phase} ok, first call {result.compile_seconds:.2f} s, "
                f"{result.cache_hits} hits/{result.cache_misses} misses"
                + (
                    f", serves {result.variant} at {result.served_speedup:.2f}x eager"
                    if result.served_speedup is not None
                    else ""
                )
            )
        else:
            line = f"bucket {result.bucket}: FAILED at {result.error}"
        if self.live and result.bucket in self._tasks:  # the bar says it is done; the line says how
            status = "done" if result.status == "ok" else "FAILED"
            self._bars.update(
                self._tasks[result.bucket], description=f"bucket {result.bucket:>4} · {status}", total=1, completed=1
            )
        self.line(line)


class FleetProgress(_Bars):
    """Implements orchestrator.fleet.driver.FleetObserver. On a terminal, a bar per bucket (per
    point of a grid) that counts its compile units, the ranks that loaded it and the ranks done
    with it (benchmarked or failed); a line per compile unit, load and rank always (the only
    output in logs)."""

    def __init__(self, console: Console, on_record: Callable[[BucketResult], None] = lambda record: None) -> None:
        super().__init__(console)
        self.on_record = on_record
        self._tasks: dict[str, TaskID] = {}
        self._units = self._ranks = 0
        self._compiled: dict[str, int] = {}
        self._loaded: dict[str, set[Optional[int]]] = {}
        self._reported: dict[str, set[Optional[int]]] = {}  # ranks whose warm record of the point is in
        self._failed: dict[str, set[Optional[int]]] = {}

    def planned(self, points: list[str], units_per_point: int, ranks: int) -> None:
        self._units, self._ranks = units_per_point, ranks
        for point in map(str, points):
            self._compiled[point] = 0
            self._loaded[point], self._reported[point], self._failed[point] = set(), set(), set()
            if self.live:
                self._tasks[point] = self._bars.add_task(self._describe(point), total=units_per_point + 2 * ranks)

    def loaded(self, rank: int, point: str) -> None:
        point = str(point)
        self._loaded[point].add(rank)
        self._refresh(point)

    def record(self, record: BucketResult) -> None:
        self.on_record(record)
        point = point_label(record)
        if point not in self._compiled:
            return
        if record.phase == "compile":
            self._compiled[point] += 1
        else:  # a rank's last word on the point: benchmarked (loaded before, or in `finish`), or failed
            self._reported[point].add(record.rank)
            (self._loaded if record.status == "ok" else self._failed)[point].add(record.rank)
        self._refresh(point)

    def _describe(self, point: str) -> str:
        failed = len(self._failed[point])
        name = f"point {point}" if "x" in point else f"bucket {point:>4}"
        return (
            f"{name} · compiled {self._compiled[point]}/{self._units} · loaded "
            f"{len(self._loaded[point])}/{self._ranks} · done {len(self._reported[point])}/{self._ranks}"
            + (f" ({failed} failed)" if failed else "")
        )

    def _refresh(self, point: str) -> None:
        if self.live and point in self._tasks:  # a failed rank counts as loaded: it never will be
            loaded = len(self._loaded[point] | self._failed[point])
            done = self._compiled[point] + loaded + len(self._reported[point])
            self._bars.update(self._tasks[point], description=self._describe(point), completed=done)


def say(line: str, screen: IO[str]) -> None:
    """One line of this command's own for people: on a terminal, folded between words at its
    width (a terminal would fold it mid-word), continued lines indented; elsewhere (a pipe, a
    log) one line as it is, for whatever reads it."""
    if screen.isatty():
        width = shutil.get_terminal_size().columns
        try:  # the screen's own terminal: stderr's may differ from the process's stdout's
            width = os.get_terminal_size(screen.fileno()).columns
        except (OSError, ValueError):
            pass
        line = textwrap.fill(
            line, width=max(width, 40), subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    print(line, file=screen, flush=True)


class RunLog:
    """For the length of a run, everything this process and its children write to file
    descriptors 1 and 2 goes to a log file: torch's and Inductor's warnings, Dynamo's graph dumps,
    Ray's start-up lines, compiler output, prints from C code. The screen gets the progress lines
    alone (through `screen`, a copy of the real stderr), and stdout stays free for the report.
    A log that stays empty is deleted; one that is not is `kept`, for the caller to name once.
    Where the directory cannot be written, nothing is redirected (the run then says why it cannot
    use the cache directory)."""

    def __init__(self, directory: Path, name: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.path = directory / f"{name}-{stamp}-{os.getpid()}.log"
        self.kept: Optional[Path] = None
        self._saved: list[int] = []
        self.screen: IO[str] = sys.stderr

    @property
    def redirected(self) -> bool:
        """Inside the run, and the output does go to `path`."""
        return bool(self._saved)

    def __enter__(self) -> RunLog:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.screen = os.fdopen(os.dup(self._saved[1]), "w", buffering=1, encoding=sys.stderr.encoding)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._saved:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = []
        self.screen.close()
        self.screen = sys.stderr
        try:
            if self.path.stat().st_size:
                self.kept = self.path
            else:
                self.path.unlink()
                self.path.parent.rmdir()  # the folder goes too when it holds no other log
        except OSError:
            pass
