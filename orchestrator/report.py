"""The warmup report: one JSON document (the contract other tools read) and a table for people."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rich.console import Console
from rich.table import Table

from orchestrator.fleet import FleetRun, TaskRun
from orchestrator.jobs.records import BucketResult
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.report_records import (
    SCHEMA_VERSION,
    BucketFleetStats,
    Deviation,
    FleetRemote,
    FleetReport,
    FleetStats,
    FleetSummary,
    ProcessExecutor,
    ProcessRemote,
    ProcessReport,
    RayExecutor,
    Spread,
    Summary,
    TimelineRow,
)

if TYPE_CHECKING:  # the driver of a Ray run never imports torch
    from orchestrator.jobs.engine import WarmupRun


def build_report(spec: WarmupSpec, run: WarmupRun, started_at: datetime) -> dict[str, Any]:
    """The report of one process that compiled, warmed and benchmarked every bucket itself."""
    return asdict(process_report(spec, run, started_at))


def process_report(spec: WarmupSpec, run: WarmupRun, started_at: datetime) -> ProcessReport:
    results = list(run.results)
    ready = run.setup_seconds + _ready(results)
    return ProcessReport(
        **_header(
            spec,
            started_at,
            run.namespace,
            run.platform.torch_version,
            run.device,
            results[0].gpu if results else None,
            asdict(run.platform),
            results,
        ),
        executor=ProcessExecutor(kind="process"),
        cache_dir=run.cache_dir,
        summary=_summary(
            results,
            ready_seconds=ready,
            process_seconds_to_ready=None if run.process_age_at_start is None else run.process_age_at_start + ready,
            cache_bytes=run.cache_bytes,
            cache_files=run.cache_files,
            wall_seconds=run.wall_seconds,
        ),
        remote=None
        if run.remote is None
        else ProcessRemote(
            url=run.remote,
            pull=run.pull,  # None: nothing published yet (or --fresh)
            publish=run.publish,
            publish_error=run.publish_error,
        ),
    )


def build_fleet_report(spec: WarmupSpec, fleet: FleetRun, remote_url: str, started_at: datetime) -> dict[str, Any]:
    """The report of a Ray warmup: compile-wave and warm-wave records of every rank, one summary."""
    return asdict(fleet_report(spec, fleet, remote_url, started_at))


def fleet_report(spec: WarmupSpec, fleet: FleetRun, remote_url: str, started_at: datetime) -> FleetReport:
    results = fleet.results
    processes = [task.process for task in fleet.runs]
    warm_tasks = [task for task in fleet.runs if task.wave == "warm"]
    first = processes[0] if processes else None
    ranks_ready = [
        task.process.setup_seconds + _ready([r for r in results if r.phase == "warm" and r.rank == task.rank])
        for task in warm_tasks
    ]
    summary = _summary(
        [r for r in results if r.phase == "warm"] or results,
        ready_seconds=max(ranks_ready, default=None),
        process_seconds_to_ready=None,
        cache_bytes=max((p.cache_bytes for p in processes), default=0),
        cache_files=max((p.cache_files for p in processes), default=0),
        wall_seconds=fleet.wall_seconds,
    )
    return FleetReport(
        **_header(
            spec,
            started_at,
            first.namespace if first else None,
            first.platform.torch_version if first else None,
            first.device if first else None,
            ", ".join(sorted({t.gpu_class for t in fleet.targets})),
            asdict(first.platform) if first else {},
            list(results),
        ),
        namespaces=sorted({p.namespace for p in processes}),
        executor=RayExecutor(
            kind="ray",
            address=fleet.address or "local",
            nodes=len(fleet.nodes),
            ranks=len(fleet.targets),
            compile_units=len(fleet.units),
            wave_seconds=fleet.wave_seconds,
            timeline=_timeline(fleet),
        ),
        summary=FleetSummary(
            **{**vars(summary), "buckets_failed": sum(1 for r in results if r.status != "ok")},
            fleet=fleet_stats(results, [task.process.pull.seconds for task in warm_tasks if task.process.pull]),
        ),
        remote=FleetRemote(
            url=remote_url,
            published_generations=sorted(
                {p.publish.generation for p in processes if p.publish and p.publish.generation is not None}
            ),
            publish_errors=[p.publish_error for p in processes if p.publish_error],
        ),
    )


def fleet_stats(results: list[BucketResult], pull_seconds: list[float]) -> FleetStats:
    """Per bucket: cold compile time, warm load time across ranks, speedup across ranks; the
    ranks whose speedup is far from the others' or that failed; the spread of the ranks' pulls."""
    buckets: dict[str, BucketFleetStats] = {}
    deviating: list[Deviation] = []
    for bucket in sorted({r.bucket for r in results}):
        compiled = [r for r in results if r.bucket == bucket and r.phase == "compile" and r.status == "ok"]
        warm = [r for r in results if r.bucket == bucket and r.phase == "warm"]
        ok_warm = [r for r in warm if r.status == "ok"]
        speedups = [r.speedup for r in ok_warm if r.speedup]
        buckets[str(bucket)] = BucketFleetStats(
            cold_compile_seconds=max(
                (r.compile_seconds for r in compiled if r.compile_seconds is not None), default=None
            ),
            warm_load_seconds=spread([r.compile_seconds for r in ok_warm if r.compile_seconds is not None]),
            speedup=spread(speedups),
            ranks_ok=len(ok_warm),
            ranks_failed=len(warm) - len(ok_warm),
        )
        middle = statistics.median(speedups) if speedups else None
        for r in warm:
            if r.status != "ok":
                deviating.append(Deviation(rank=r.rank, bucket=bucket, why=r.error))
            elif middle and r.speedup and abs(r.speedup - middle) > 0.2 * middle:
                deviating.append(
                    Deviation(rank=r.rank, bucket=bucket, why=f"speedup {r.speedup:.2f}x vs median {middle:.2f}x")
                )
    return FleetStats(buckets=buckets, deviating_ranks=deviating, pull_seconds=spread(pull_seconds))


def spread(values: list[float]) -> Optional[Spread]:
    if not values:
        return None
    return Spread(min=min(values), median=statistics.median(values), max=max(values))


def _timeline(fleet: FleetRun) -> list[TimelineRow]:
    """When each task's process started, when it had its answer and when the driver had it, in
    seconds from the start of the waves (clocks of other nodes are trusted to be NTP-close)."""

    def row(task: TaskRun) -> TimelineRow:
        process = task.process
        return TimelineRow(
            wave=task.wave,
            bucket=task.bucket,
            rank=task.rank,
            node=process.node,
            gpu_ids=process.gpu_ids,
            started_s=round(process.process_started_at - fleet.started_at, 3),
            ended_s=round(process.ended_at - fleet.started_at, 3),
            answered_s=round(task.answered_at - fleet.started_at, 3),
            # where the process's time went: "worker up" (interpreter and Ray), "imported" (torch),
            # "device ready", "model built", each bucket "compiled"/"loaded"/"benchmarked", pulls,
            # "published"
            events=[[what, round(at - fleet.started_at, 3)] for what, at in process.events],
        )

    return sorted(map(row, fleet.runs), key=lambda r: r.started_s)


def _header(
    spec: WarmupSpec,
    started_at: datetime,
    namespace: Any,
    torch_version: Any,
    device: Any,
    gpu: Any,
    platform: dict[str, Any],
    results: list[BucketResult],
) -> dict[str, Any]:
    """The fields of ReportHeader."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": spec.name,
        "namespace": namespace,
        "torch_version": torch_version,
        "device": device,
        "gpu": gpu,
        "platform": platform,
        "config_hash": spec.identity_hash(),
        "compile": spec.compile.model_dump(mode="json"),
        "buckets": list(spec.buckets),
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }


def _ready(results: list[BucketResult]) -> float:
    """Compile (or load) plus graph recording of the given buckets: the time until they can serve."""
    return sum((r.compile_seconds or 0.0) + (r.graph_record_seconds or 0.0) for r in results)


def _summary(
    results: list[BucketResult],
    *,
    ready_seconds: Optional[float],
    process_seconds_to_ready: Optional[float],
    cache_bytes: int,
    cache_files: int,
    wall_seconds: float,
) -> Summary:
    ok = [r for r in results if r.status == "ok"]
    states = {r.cache_state for r in ok}
    speedups = [r.speedup for r in ok if r.speedup is not None]
    throughput = [r.throughput_speedup for r in ok if r.throughput_speedup is not None]
    return Summary(
        buckets_ok=len(ok),
        buckets_failed=len(results) - len(ok),
        cache_state="warm" if states == {"hit"} else "cold" if states == {"miss"} else "partial",
        cache_hits=sum(r.cache_hits or 0 for r in results),
        cache_misses=sum(r.cache_misses or 0 for r in results),
        compile_seconds_total=sum(r.compile_seconds or 0.0 for r in results),
        graph_record_seconds_total=sum(r.graph_record_seconds or 0.0 for r in results),
        ready_seconds=ready_seconds,
        process_seconds_to_ready=process_seconds_to_ready,
        speedup_min=min(speedups, default=None),
        speedup_median=statistics.median(speedups) if speedups else None,
        speedup_max=max(speedups, default=None),
        throughput_speedup_median=statistics.median(throughput) if throughput else None,
        graph_breaks=sum(r.graph_breaks or 0 for r in results),
        recompiles=sum(r.recompiles or 0 for r in results),
        cache_bytes=cache_bytes,
        cache_files=cache_files,
        wall_seconds=wall_seconds,
    )


def write_json(report: dict[str, Any], path: Path) -> None:
    """Atomic: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)


def render_table(report: dict[str, Any], console: Console) -> None:
    fleet = report["executor"]["kind"] == "ray"
    table = Table(
        title=f"{report['model']} on {report['gpu'] or report['device']} "
        f"(torch {report['torch_version']}, mode={report['compile']['mode']})"
    )
    columns = (["wave", "rank", "node"] if fleet else ["phase"]) + [
        "bucket",
        "status",
        "compile s",
        "record s",
        "cache hit/miss",
        "eager ms",
        "compiled ms",
        "speedup",
        "serves",
        "b2b speedup",
        "breaks",
        "recompiles",
        "max |err|",
    ]
    for column in columns:
        table.add_column(column, justify="left" if column in ("wave", "phase", "status", "node") else "right")
    for r in report["results"]:
        where = [r["phase"], _num(r["rank"], "d"), r["node"]] if fleet else [r["phase"]]
        table.add_row(
            *where,
            str(r["bucket"]),
            "ok" if r["status"] == "ok" else "[red]failed[/red]",
            _num(r["compile_seconds"], ".2f"),
            _num(r["graph_record_seconds"], ".3f"),
            f"{_num(r['cache_hits'], 'd')}/{_num(r['cache_misses'], 'd')}",
            _num(r["eager_ms"], ".3f"),
            _num(r["compiled_ms"], ".3f"),
            _num(r["speedup"], ".2f", "x"),
            _served(r),
            _num(r["throughput_speedup"], ".2f", "x"),
            _num(r["graph_breaks"], "d"),
            _num(r["recompiles"], "d"),
            _num(r["max_abs_error"], ".1e"),
        )
    console.print(table)
    for r in report["results"]:
        if r["error"]:
            console.print(f"[red]bucket {r['bucket']} failed[/red] at {r['error']}", highlight=False)
    skipped: dict[str, list[str]] = {}
    for r in report["results"]:
        for reason in r["cudagraph_skip_reasons"]:
            skipped.setdefault(reason, []).append(str(r["bucket"]))
    unavailable: dict[tuple[str, str], list[str]] = {}
    for r in report["results"]:
        for name, measure in (r.get("variants") or {}).items():
            if not measure["ok"] and measure["reason"]:
                unavailable.setdefault((name, measure["reason"]), []).append(str(r["bucket"]))
    for (name, reason), buckets in unavailable.items():
        console.print(
            f"variant {name} not served for bucket {', '.join(sorted(set(buckets), key=int))}: {reason}",
            highlight=False,
            markup=False,
            style="yellow",
        )
    for reason, buckets in skipped.items():
        console.print(
            f"no CUDA graphs for bucket {', '.join(sorted(set(buckets), key=int))}: {reason}",
            highlight=False,
            style="yellow",
        )
    s = report["summary"]
    remote = report["remote"]
    if remote and fleet:
        console.print(
            f"store {remote['url']}: published generations {remote['published_generations']}"
            + "".join(f"; publish error: {e}" for e in remote["publish_errors"]),
            highlight=False,
        )
    elif remote:
        pulled, published = remote["pull"], remote["publish"]
        console.print(
            f"store {remote['url']}: pulled "
            + (
                f"generation {pulled['generation']} ({pulled['files']} files, {pulled['bytes'] / 1e6:.1f} MB, "
                f"{pulled['seconds']:.2f} s)"
                if pulled
                else "nothing"
            )
            + "; published "
            + (
                f"generation {published['generation']} ({published['files']} new files, {published['seconds']:.2f} s)"
                if published
                else remote["publish_error"] or "nothing"
            ),
            highlight=False,
        )
    if fleet:
        for bucket, row in s["fleet"]["buckets"].items():
            load, speedup = row["warm_load_seconds"], row["speedup"]
            console.print(
                f"bucket {bucket}: cold compile {_num(row['cold_compile_seconds'], '.2f')} s; warm load across "
                f"{row['ranks_ok']} ranks "
                + (f"{load['min']:.2f}/{load['median']:.2f}/{load['max']:.2f} s" if load else "-")
                + "; speedup "
                + (f"{speedup['min']:.2f}/{speedup['median']:.2f}/{speedup['max']:.2f}x" if speedup else "-")
                + " (min/median/max)",
                highlight=False,
            )
        for deviant in s["fleet"]["deviating_ranks"]:
            console.print(
                f"rank {deviant['rank']} bucket {deviant['bucket']} deviates: {deviant['why']}",
                highlight=False,
                style="yellow",
            )
    console.print(
        f"cache {s['cache_state']} ({s['cache_hits']} hits, {s['cache_misses']} misses) in {report['namespace']}; "
        + (f"ready in {s['ready_seconds']:.1f} s; " if s["ready_seconds"] is not None else "")
        + f"{s['buckets_ok']} ok, {s['buckets_failed']} failed; {s['wall_seconds']:.1f} s in all",
        highlight=False,
    )


def _served(record: dict[str, Any]) -> str:
    """The chosen variant and its latency (the fastest correct one; eager when nothing beats it)."""
    chosen = record.get("variant")
    ms = (record.get("variants") or {}).get(chosen, {}).get("ms") if chosen else None
    return "-" if chosen is None else f"{chosen} {_num(ms, '.3f')}"


def _num(value: Any, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


PROFILE_TOP = 4  # kernels shown per variant; the report keeps more


def render_profile(report: dict[str, Any], console: Console) -> None:
    """`warmup --profile`: per bucket, each profiled variant's time per call, Inductor's kernels
    against ATen's, and its costliest kernels. Printed without markup: kernel names hold brackets."""
    fleet = report["executor"]["kind"] == "ray"
    traces: list[str] = []
    for r in report["results"]:
        profile = r.get("profile")
        if not profile:
            continue
        where = f"bucket {r['bucket']}" + (f" rank {r['rank']}" if fleet else "")
        kinds = {v["time_kind"] for v in profile["variants"].values()}
        measure = "GPU kernel time" if kinds == {"cuda"} else "self CPU time of ops (no GPU)" if kinds else "-"
        console.print(
            f"profile {where}: serves {profile['served'] or '-'}; {measure}",
            highlight=False,
            markup=False,
            style="bold",
        )
        for name, v in profile["variants"].items():
            traces.append(v["trace"])
            console.print(
                f"  {name + (' *' if name == profile['served'] else ''):<16} {v['per_call_us']:10.1f} us/call   "
                f"inductor {v['inductor_kernels']:3d} ({v['inductor_share']:4.0%})   "
                f"aten {v['aten_kernels']:3d} ({v['aten_share']:4.0%})   "
                f"other {v['other_kernels']:3d} ({v['other_share']:4.0%})",
                highlight=False,
                markup=False,
            )
            for k in v["top"][:PROFILE_TOP]:
                console.print(
                    f"      {k['share']:4.0%} {k['total_us'] / v['calls']:9.1f} us  {k['calls'] / v['calls']:>4g}x  "
                    f"{k['kind']:<8} {k['name']}",
                    highlight=False,
                    markup=False,
                )
        for name, reason in profile["unavailable"].items():
            console.print(f"  {name}: no profile: {reason}", highlight=False, markup=False, style="yellow")
    if traces:
        directories = sorted({os.path.dirname(t) for t in traces})
        console.print(
            f"traces ({len(traces)}, Chrome/Perfetto format; * the served variant): {', '.join(directories)}",
            highlight=False,
            markup=False,
        )
