"""Progress on stderr: a live bar per bucket and phase on a terminal, one line per phase in logs."""

from __future__ import annotations

import time
from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from jobs.engine import BucketResult


class BucketProgress:
    """Implements jobs.engine.Progress. Use as a context manager around the run."""

    def __init__(self, console: Console, on_result: Callable[[dict], None] = lambda record: None) -> None:
        self.console = console
        self.on_result = on_result
        self.live = console.is_terminal
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console, transient=False)
        self._tasks: dict[int, TaskID] = {}
        self._since: dict[int, float] = {}

    def __enter__(self) -> "BucketProgress":
        if self.live:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._bars.stop()

    def step(self, name: str) -> None:
        self.console.print(name, highlight=False, markup=False, soft_wrap=True)

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None:
        self._since[bucket] = time.perf_counter()
        if not self.live:
            self.console.print(f"bucket {bucket}: {name}", highlight=False, soft_wrap=True)
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
        self.on_result(result.to_dict())
        if result.status == "ok":
            line = (f"bucket {result.bucket}: {result.phase} ok, first call {result.compile_seconds:.2f} s, "
                    f"{result.cache_hits} hits/{result.cache_misses} misses, speedup {result.speedup:.2f}x")
        else:
            line = f"bucket {result.bucket}: FAILED at {result.error}"
        if self.live and result.bucket in self._tasks:
            task = self._tasks[result.bucket]
            self._bars.update(task, description=line, total=1, completed=1)
        else:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)


class FleetProgress:
    """Progress of a Ray warmup on stderr: a bar per wave on a terminal, and a line per finished
    compile task and rank (the only output in logs)."""

    def __init__(self, console: Console, on_record: Callable[[dict], None] = lambda record: None) -> None:
        self.console = console
        self.on_record = on_record
        self.live = console.is_terminal
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console)
        self._waves: dict[str, TaskID] = {}

    def __enter__(self) -> "FleetProgress":
        if self.live:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._bars.stop()

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def planned(self, compile_units: int, warm_records: int) -> None:
        if self.live:
            self._waves["compile"] = self._bars.add_task("compile wave (class x bucket)", total=compile_units)
            self._waves["warm"] = self._bars.add_task("warm wave (rank x bucket)", total=warm_records)

    def record(self, record: dict) -> None:
        self.on_record(record)
        if self.live and record["phase"] in self._waves:
            self._bars.advance(self._waves[record["phase"]])
