"""Progress on stderr: a live bar per bucket and phase on a terminal, one line per phase in logs."""

from __future__ import annotations

from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from jobs.records import BucketResult


class _Bars:
    """Live bars on a terminal (a context manager around the run); plain lines always."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console)

    def __enter__(self):
        if self.live:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._bars.stop()

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class BucketProgress(_Bars):
    """Implements jobs.engine.Progress: a bar per bucket, its description the current phase."""

    def __init__(self, console: Console, on_result: Callable[[dict], None] = lambda record: None) -> None:
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
        self.on_result(result.to_dict())
        if result.status == "ok":
            line = (f"bucket {result.bucket}: {result.phase} ok, first call {result.compile_seconds:.2f} s, "
                    f"{result.cache_hits} hits/{result.cache_misses} misses"
                    + (f", speedup {result.speedup:.2f}x" if result.speedup is not None else ""))
        else:
            line = f"bucket {result.bucket}: FAILED at {result.error}"
        if self.live and result.bucket in self._tasks:
            task = self._tasks[result.bucket]
            self._bars.update(task, description=line, total=1, completed=1)
        else:
            self.line(line)


class FleetProgress(_Bars):
    """Progress of a Ray warmup on stderr: a bar per wave on a terminal, and a line per finished
    compile task and rank (the only output in logs)."""

    def __init__(self, console: Console, on_record: Callable[[dict], None] = lambda record: None) -> None:
        super().__init__(console)
        self.on_record = on_record
        self._waves: dict[str, TaskID] = {}

    def planned(self, compile_units: int, warm_records: int) -> None:
        if self.live:
            self._waves["compile"] = self._bars.add_task("compile wave (class x bucket)", total=compile_units)
            self._waves["warm"] = self._bars.add_task("warm wave (rank x bucket)", total=warm_records)

    def record(self, record: dict) -> None:
        self.on_record(record)
        if self.live and record["phase"] in self._waves:
            self._bars.advance(self._waves[record["phase"]])
