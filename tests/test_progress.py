"""The fleet's live bars (a terminal is forced; in logs only lines are written): one bar per
bucket, counting compile units, loads and ranks done, complete exactly when every rank is."""

import io

from rich.console import Console

from orchestrator.jobs.records import BucketResult
from orchestrator.progress import FleetProgress
from orchestrator.ray_driver import FleetObserver


def warm(rank, bucket, status="ok"):
    return BucketResult(phase="warm", rank=rank, bucket=bucket, status=status)


def test_a_bar_per_bucket_counts_compiles_loads_and_ranks_done():
    seen = []
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with FleetProgress(console, on_record=seen.append) as progress:
        observer: FleetObserver = progress
        observer.planned([1, 8], units_per_bucket=1, ranks=2)
        observer.record(BucketResult(phase="compile", rank=None, bucket=1, status="ok"))
        observer.loaded(0, 1)
        bars = {task.description.split(" · ")[0]: task for task in progress._bars.tasks}
        assert bars["bucket    1"].description.endswith("compiled 1/1 · loaded 1/2 · ranks done 0/2")
        assert (bars["bucket    1"].completed, bars["bucket    1"].total) == (2, 5)
        observer.loaded(1, 1)
        for rank in (0, 1):
            observer.record(warm(rank, 1))
        # bucket 8 failed to compile: its ranks never load it, yet its bar completes with their records
        observer.record(BucketResult(phase="compile", rank=None, bucket=8, status="failed"))
        for rank in (0, 1):
            observer.record(warm(rank, 8, status="failed"))
        bars = {task.description.split(" · ")[0]: task for task in progress._bars.tasks}
        assert all(task.finished for task in bars.values())
        assert bars["bucket    8"].description.endswith("compiled 1/1 · loaded 0/2 · ranks done 2/2 (2 failed)")
        assert bars["bucket    1"].description.endswith("compiled 1/1 · loaded 2/2 · ranks done 2/2")
    assert len(seen) == 6  # every record still reaches the metrics observer


def test_in_logs_the_fleet_writes_lines_only():
    out = io.StringIO()
    with FleetProgress(Console(file=out, force_terminal=False, width=200)) as progress:
        progress.planned([1], units_per_bucket=1, ranks=1)
        progress.loaded(0, 1)
        progress.line("rank 0 (127.0.0.1) loaded bucket 1: ok")
    assert out.getvalue() == "rank 0 (127.0.0.1) loaded bucket 1: ok\n"
