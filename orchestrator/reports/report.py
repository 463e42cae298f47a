"""The warmup report: one JSON document (the contract other tools read) and a table for people."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.cache.files import write_whole
from orchestrator.cache.sync import combined
from orchestrator.fleet.run import FleetRun, TaskRun
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.jobs.stats import MIN_SAMPLES, NOISY_RELATIVE_HALF_WIDTH, is_noisy
from orchestrator.reports.records import (
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
            **{**vars(summary), **_bucket_counts(results)},
            fleet=fleet_stats(results, [task.process.pull.seconds for task in warm_tasks if task.process.pull]),
        ),
        remote=FleetRemote(
            url=remote_url,
            published_generations=sorted(
                {p.publish.generation for p in processes if p.publish and p.publish.generation is not None}
            ),
            publish_errors=[p.publish_error for p in processes if p.publish_error],
            pull=combined(p.pull for p in processes if p.pull),
            publish=combined(p.publish for p in processes if p.publish),
        ),
    )


def fleet_stats(results: list[BucketResult], pull_seconds: list[float]) -> FleetStats:
    """Per bucket: cold compile time, warm load time, what serves it and how fast across ranks; the
    ranks whose served speedup is far from the others' or that failed; the spread of the ranks' pulls."""
    buckets: dict[str, BucketFleetStats] = {}
    deviating: list[Deviation] = []
    for bucket in sorted({r.bucket for r in results}):
        compiled = [r for r in results if r.bucket == bucket and r.phase == "compile" and r.status == "ok"]
        warm = [r for r in results if r.bucket == bucket and r.phase == "warm"]
        ok_warm = [r for r in warm if r.status == "ok"]
        served_speedups = [v for v in map(served_speedup, ok_warm) if v is not None]
        intervals = [r.served_speedup_interval for r in ok_warm if r.served_speedup_interval]
        middle = statistics.median(served_speedups) if served_speedups else None
        interval = (
            [statistics.median(i[0] for i in intervals), statistics.median(i[1] for i in intervals)]
            if intervals
            else None
        )
        ranks_noisy = sum(1 for r in ok_warm if r.noisy)
        buckets[str(bucket)] = BucketFleetStats(
            cold_compile_seconds=max(
                (r.compile_seconds for r in compiled if r.compile_seconds is not None), default=None
            ),
            warm_load_seconds=spread([r.compile_seconds for r in ok_warm if r.compile_seconds is not None]),
            speedup=spread([r.speedup for r in ok_warm if r.speedup]),
            ranks_ok=len(ok_warm),
            ranks_failed=len(warm) - len(ok_warm),
            cache_state=cache_outcome(r.cache_state for r in ok_warm),
            eager_ms=spread([r.eager_ms for r in ok_warm if r.eager_ms is not None]),
            served_ms=spread([ms for ms in map(_served_ms, ok_warm) if ms is not None]),
            served_speedup=spread(served_speedups),
            served_speedup_interval=interval,
            served_variants=sorted({r.variant for r in ok_warm if r.variant}),
            ranks_noisy=ranks_noisy,
            noisy=None
            if middle is None
            else is_noisy(middle, interval, samples=None) or (ok_warm != [] and 2 * ranks_noisy >= len(ok_warm)),
        )
        for r in warm:
            value = served_speedup(r)
            if r.status != "ok":
                deviating.append(Deviation(rank=r.rank, bucket=bucket, why=r.error))
            elif middle and value and abs(value - middle) > 0.2 * middle:
                deviating.append(
                    Deviation(rank=r.rank, bucket=bucket, why=f"speedup {value:.2f}x vs median {middle:.2f}x")
                )
    return FleetStats(buckets=buckets, deviating_ranks=deviating, pull_seconds=spread(pull_seconds))


def _served_ms(r: BucketResult) -> Optional[float]:
    """The served variant's median latency (a record from before `served_ms`: its variant's)."""
    if r.served_ms is not None:
        return r.served_ms
    measure = r.variants.get(r.variant) if r.variant else None
    return measure.ms if measure else None


def served_speedup(r: BucketResult) -> Optional[float]:
    """Eager over what serves the bucket; a record from before `served_speedup`: from its variant's
    latency, or, from before variants, `speedup` (the compiled model was what served then). The
    table and the HTML page quote this one figure."""
    if r.served_speedup is not None:
        return r.served_speedup
    if r.variant is None:
        return r.speedup
    ms = _served_ms(r)
    return r.eager_ms / ms if r.eager_ms is not None and ms else None


def cache_outcome(states: Iterable[Optional[str]]) -> Optional[str]:
    """Records' cache states ("hit", "miss" or "mixed" each) as one: the state they share,
    "mixed" where they differ, None where none is known. The one rule every view of a set of
    records uses: a bucket across ranks, a compile wave, a whole run."""
    known = {s for s in states if s is not None}
    return None if not known else known.pop() if len(known) == 1 else "mixed"


# The summary's words for a whole run's outcome; a run without a known state counts as partial.
RUN_CACHE_STATE: dict[Optional[str], Literal["warm", "cold", "partial"]] = {
    "hit": "warm",
    "miss": "cold",
    "mixed": "partial",
}


def run_cache_state(states: Iterable[Optional[str]]) -> Literal["warm", "cold", "partial"]:
    return RUN_CACHE_STATE.get(cache_outcome(states), "partial")


def _noisy_others(r: BucketResult) -> list[str]:
    """The measured variants, other than the one serving, whose speedup over eager is noisy."""
    return [
        name
        for name, m in r.variants.items()
        if name != r.variant
        and m.ok
        and m.ms
        and r.eager_ms is not None
        and is_noisy(r.eager_ms / m.ms, m.speedup_interval, samples=None)
    ]


def _bucket_counts(results: list[BucketResult]) -> dict[str, int]:
    """Buckets, not records: a bucket is ok when every record of it (every wave, every rank) is ok."""
    buckets = {r.bucket for r in results}
    failed = {r.bucket for r in results if r.status != "ok"}
    return {"buckets_ok": len(buckets - failed), "buckets_failed": len(failed)}


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
    speedups = [r.speedup for r in ok if r.speedup is not None]
    throughput = [r.throughput_speedup for r in ok if r.throughput_speedup is not None]
    return Summary(
        buckets_ok=len(ok),
        buckets_failed=len(results) - len(ok),
        cache_state=run_cache_state(r.cache_state for r in ok),
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


def grid_report(spec: WarmupSpec, slices: list[dict[str, Any]]) -> dict[str, Any]:
    """A grid's warmup (`buckets` a mapping of dimensions): every slice's report as it is, under
    `slices`, and their records together under `results` with one summary over all of them; the
    header is the first slice's, with the grid's own dimensions and points."""
    first = slices[0]
    results = [record for part in slices for record in part["results"]]
    report = {**first}
    report.update(
        model=spec.name,
        config_hash=spec.identity_hash(),
        buckets=list(spec.buckets),
        grid={spec.bucket_symbol: list(spec.buckets), **(spec.grid or {})},
        points=["x".join(map(str, point)) for point in spec.grid_points()],
        namespaces=[name for part in slices for name in (part.get("namespaces") or [part["namespace"]])],
        results=results,
        finished_at=slices[-1]["finished_at"],
        slices=slices,
    )
    summaries = [part["summary"] for part in slices]
    summary = {**summaries[0]}
    for key, value in summaries[0].items():
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not key.startswith(("speedup", "throughput"))
        ):
            summary[key] = sum(s.get(key) or 0 for s in summaries)
    ok = [r for r in results if r["status"] == "ok"]
    speedups = [r["speedup"] for r in ok if r.get("speedup") is not None]
    throughput = [r["throughput_speedup"] for r in ok if r.get("throughput_speedup") is not None]
    states = {s["cache_state"] for s in summaries}
    summary.update(
        speedup_min=min(speedups, default=None),
        speedup_median=statistics.median(speedups) if speedups else None,
        speedup_max=max(speedups, default=None),
        throughput_speedup_median=statistics.median(throughput) if throughput else None,
        cache_state=states.pop() if len(states) == 1 else "partial",
    )
    report["summary"] = summary
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    write_whole(path, json.dumps(report, indent=2) + "\n")


WAVES = ("compile", "warm")  # the order a record's wave sorts in: compile tasks ran first


def render_table(report: dict[str, Any], console: Console, wide: bool = False) -> None:
    """The report for people: one row per bucket that fits 80 columns (on Ray, the warm wave's
    median across ranks, the ranks that deviate or failed named below), or with `wide` one row
    per record with every field. Text from records (errors, nodes, names) is never read as markup."""
    if report.get("slices"):  # a grid: each slice's table, named by the sizes it fixes
        for part in report["slices"]:
            point = part["results"][0].get("point") or {} if part["results"] else {}
            named = ", ".join(f"{dim} {point[dim]}" for dim in list(report["grid"])[1:] if dim in point)
            _line(console, f"{report['model']} at {named}" if named else report["model"], "bold")
            render_table(part, console, wide)
        return
    fleet = report["executor"]["kind"] == "ray"
    records = sorted(map(as_record, report["results"]), key=_order)
    title = Text(
        f"{report['model']} on {report['gpu'] or report['device']} ("
        # no worker that answered: the torch version is unknown
        + (f"torch {report['torch_version']}, " if report["torch_version"] else "")
        + f"mode={report['compile'].get('mode')})"
    )
    if wide:
        console.print(_wide_table(title, records, fleet))
        shown = records  # every record has its row: each failure gets its line
    else:
        console.print(_bucket_table(title, records, fleet, report["summary"].get("fleet", {}).get("buckets", {})))
        # on Ray, a failed compile task is repeated by its ranks' records ("not loaded: ..."), which say it once each
        shown = [r for r in records if r.phase == "warm"] if fleet else records
    _print_failures(console, [r for r in shown if r.status != "ok"], fleet)
    if fleet:
        failed = {(r.rank, r.bucket) for r in records if r.status != "ok"}
        for deviant in report["summary"]["fleet"]["deviating_ranks"]:
            if (deviant["rank"], deviant["bucket"]) not in failed:
                _line(
                    console, f"* bucket {deviant['bucket']} rank {deviant['rank']} deviates: {deviant['why']}", "yellow"
                )
    fleet_rows = report["summary"].get("fleet", {}).get("buckets", {}) if fleet and not wide else None
    if (
        any(row.get("noisy") for row in fleet_rows.values())
        if fleet_rows is not None
        else any(r.noisy for r in records)
    ):
        _line(
            console,
            f"noisy: the speedup's 95% interval is wider than ±{NOISY_RELATIVE_HALF_WIDTH:.0%} of it, or it rests on "
            f"fewer than {MIN_SAMPLES} samples: measure again on a quiet machine before trusting it",
            "yellow",
        )
    _print_host(console, [r for r in shown if r.status == "ok"], fleet)
    # eager serving at a clean 1.00x can rest on timings of the others too noisy to tell them apart
    unsettled = {r.bucket for r in shown if r.status == "ok" and _noisy_others(r)}
    if unsettled:
        _line(
            console,
            f"bucket {_buckets(unsettled)}: other variants' speedups are noisy (--wide shows them): "
            "the variant chosen to serve may change when measured on a quiet machine",
            "yellow",
        )
    for r in shown:  # why the fastest variant by median does not serve (orchestrator.jobs.variants)
        if r.status == "ok" and r.choice_reason:
            rank = f" rank {r.rank}" if fleet and r.rank is not None else ""
            _line(console, f"bucket {r.bucket}{rank}: {r.choice_reason}")
    unavailable: dict[tuple[str, str], set[int]] = {}
    skipped: dict[str, set[int]] = {}
    for r in records:
        for name, measure in r.variants.items():
            if not measure.ok and measure.reason:
                unavailable.setdefault((name, measure.reason), set()).add(r.bucket)
        for reason in r.cudagraph_skip_reasons:
            skipped.setdefault(reason, set()).add(r.bucket)
    for (name, reason), buckets in unavailable.items():
        # a variant left out by design (variants.twin_built) asks nothing of the reader: with
        # --wide only (and in the report), never as a warning
        by_design = reason.startswith("not built:")
        if by_design and not wide:
            continue
        _line(
            console,
            f"variant {name} not served for bucket {_buckets(buckets)}: {reason}",
            None if by_design else "yellow",
        )
    built = _build_seconds(records)
    if built:
        _line(console, f"serving variants built in (all buckets{', all ranks' if fleet else ''}): {built}")
    for reason, buckets in skipped.items():
        _line(console, f"no CUDA graphs for bucket {_buckets(buckets)}: {reason}", "yellow")
    s = report["summary"]
    if report["remote"]:
        _print_store(console, report, fleet)
    if fleet and wide:
        for bucket, row in s["fleet"]["buckets"].items():
            load, speedup = row["warm_load_seconds"], row["speedup"]
            _line(
                console,
                # the compile wave's first call: a compile, or a load where the cache was warm already
                f"bucket {bucket}: compile wave {_num(row['cold_compile_seconds'], '.2f')} s "
                f"({'cache load' if _wave_hit(records, bucket) else 'compile'}); warm load across "
                f"{row['ranks_ok']} ranks "
                + (f"{load['min']:.2f}/{load['median']:.2f}/{load['max']:.2f} s" if load else "-")
                + "; speedup "
                + (f"{speedup['min']:.2f}/{speedup['median']:.2f}/{speedup['max']:.2f}x" if speedup else "-")
                + " (min/median/max)",
            )
    buckets = s["buckets_ok"] + s["buckets_failed"]
    cache = f"cache {s['cache_state']} ({s['cache_hits']} hits, {s['cache_misses']} misses)"
    if fleet:  # the ranks load what the compile wave published: their cache is warm on a cold run too
        wave = [r for r in records if r.phase == "compile" and r.status == "ok"]
        hits, misses = sum(r.cache_hits or 0 for r in wave), sum(r.cache_misses or 0 for r in wave)
        state = run_cache_state(r.cache_state for r in wave)
        cache = f"compile wave {state} ({hits} hits, {misses} misses); ranks' {cache}"
    # what "ready" measured: the first calls (compile or load) and graph recording, on Ray per rank
    # after its set-up, for the slowest rank
    ready = "every rank ready" if fleet else "ready"
    _line(
        console,
        cache
        + (f" in {report['namespace']}; " if report["namespace"] else "; ")
        + (
            f"{ready} in {s['ready_seconds']:.1f} s (compile or load, and CUDA graphs, of every bucket); "
            if s["ready_seconds"] is not None
            else ""
        )
        + f"{buckets} bucket{'' if buckets == 1 else 's'}: {s['buckets_ok']} ok, {s['buckets_failed']} failed; {s['wall_seconds']:.1f} s in all",
    )


def _wave_hit(records: list[BucketResult], bucket: str) -> bool:
    """Whether the compile wave loaded the bucket from the cache rather than compiling it."""
    wave = [r for r in records if r.phase == "compile" and r.status == "ok" and str(r.bucket) == bucket]
    return bool(wave) and all(r.cache_state == "hit" for r in wave)


def _print_store(console: Console, report: dict[str, Any], fleet: bool) -> None:
    """The store's part of the run, one line per fact: what was pulled, what was published (or
    that nothing new was: a publish that adds nothing leaves the newest generation standing and
    answers with its number), each publish error."""
    remote = report["remote"]
    if fleet and "publish" not in remote:  # a fleet report from before it summed the transfers
        _line(console, f"store {remote['url']}: published generations {_listed(remote['published_generations'])}")
        return
    pulled, published = remote["pull"], remote["publish"]
    if pulled is None:
        pull = "pulled nothing"
    elif fleet:
        who = _pullers(report["executor"]["timeline"])
        pull = f"pulled {_amount(pulled)}" + (f" over {who}" if who else "")
    else:
        pull = f"pulled generation {pulled['generation']}, {_amount(pulled)}"
    _line(console, f"store {remote['url']}: {pull}")
    errors = remote["publish_errors"] if fleet else [remote["publish_error"]] if remote["publish_error"] else []
    if published is None:
        if not errors:
            _line(console, "published nothing")
    elif published["files"] == 0 and published["generation"] <= ((pulled or {}).get("generation") or 0):
        stood = remote["published_generations"] if fleet else [published["generation"]]
        several = len(stood) > 1
        _line(
            console,
            f"nothing new to publish (generation{'s' if several else ''} {_listed(stood)} "
            f"stand{'' if several else 's'})",
        )
    elif not fleet:
        _line(console, f"published generation {published['generation']}, {_amount(published)}")
    elif len(report["namespaces"]) > 1:  # each namespace numbers its own generations
        _line(
            console,
            f"published generations {_listed(remote['published_generations'])} of "
            f"{len(report['namespaces'])} namespaces, {_amount(published)}",
        )
    else:
        # each compile task publishes its bucket, and one rank the serving plans its benchmarks chose
        made = len(remote["published_generations"])
        every = made == report["executor"]["compile_units"] + 1
        _line(
            console,
            f"published {made} generation{'' if made == 1 else 's'}, {_amount(published)}"
            + (": one per compiled bucket and one of serving plans" if every else ""),
        )
    for error in errors:
        _line(console, f"publish error: {error}", "red")


def _amount(transfer: dict[str, Any]) -> str:
    return f"{transfer['files']} files ({transfer['bytes'] / 1e6:.1f} MB, {transfer['seconds']:.2f} s)"


def _pullers(timeline: list[dict[str, Any]]) -> str:
    """The processes of a fleet that pulled: the timeline marks each pull ("pulled generation N")."""
    rows = [row for row in timeline if any(str(what).startswith("pulled ") for what, _ in row["events"])]
    tasks = sum(1 for row in rows if row["rank"] is None)
    return " and ".join(
        f"{n} {noun}{'' if n == 1 else 's'}" for n, noun in ((tasks, "compile task"), (len(rows) - tasks, "rank")) if n
    )


def _listed(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))


def _bucket_table(title: Text, records: list[BucketResult], fleet: bool, stats: dict[str, Any]) -> Table:
    """One row per bucket; on Ray from the warm wave (every record where no rank got that far)."""
    # no vertical rules and one space of padding: eight columns of numbers fit 80 columns
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    # in one process, "first call": the first compiled call, a compile or a cache load; on Ray the
    # compile wave's first call with its cache outcome ("24.10 miss" on a cold run), then the
    # median of the ranks' loads of what it published
    middle = ("compile\ns", "load\ns") if fleet else ("first\ncall s", "cache")
    for column in ("bucket", "status", *middle, "eager\nms", "served\nms", "variant", "speedup"):
        # fold rather than cut: a value too long for the terminal wraps, it never loses characters
        table.add_column(
            column, justify="left" if column in ("status", "cache", "variant") else "right", overflow="fold"
        )
    for bucket in sorted({r.bucket for r in records}):
        mine = [r for r in records if r.bucket == bucket]
        rows = [r for r in mine if r.phase == "warm"] if fleet else mine
        rows = rows or mine
        if fleet:
            compiled = [r for r in mine if r.phase == "compile"]
            table.add_row(*_fleet_cells(bucket, rows, compiled, stats.get(str(bucket))))
        else:
            table.add_row(*_process_cells(rows[-1]))
    return table


def _process_cells(r: BucketResult) -> list[str | Text]:
    if r.status != "ok":
        return [str(r.bucket), Text("failed", style="red"), *["-"] * 6]
    return [
        str(r.bucket),
        Text("ok", style="green"),
        _num(r.compile_seconds, ".2f"),
        r.cache_state or "-",
        _num(r.eager_ms, ".3f"),
        _num(_served_ms(r), ".3f"),
        Text(r.variant or "-"),
        _speedup(served_speedup(r), r.served_speedup_interval, bool(r.noisy)),
    ]


def _fleet_cells(
    bucket: int, rows: list[BucketResult], compiled: list[BucketResult], row: Optional[dict[str, Any]]
) -> list[str | Text]:
    """The compile wave's outcome, then the median across ranks, from the fleet summary (a report
    without one: the counts alone)."""
    ok = [r for r in rows if r.status == "ok"]
    flagged = row is not None and (row.get("served_speedup") or {}).get("median") is not None and _deviates(row, ok)
    status = Text(
        f"{len(ok)}/{len(rows)} ok" + ("*" if flagged else ""), style="green" if len(ok) == len(rows) else "red"
    )
    if not ok or row is None:
        return [str(bucket), status, *["-"] * 6]

    def median(key: str, fmt: str) -> str:
        value = row.get(key)
        return _num(value["median"] if value else None, fmt)

    served = row.get("served_speedup")
    return [
        str(bucket),
        status,
        _compile_wave_cell(compiled),
        median("warm_load_seconds", ".2f"),
        median("eager_ms", ".3f"),
        median("served_ms", ".3f"),
        Text("/".join(row.get("served_variants") or []) or "-"),
        _speedup(served["median"] if served else None, row.get("served_speedup_interval"), bool(row.get("noisy"))),
    ]


def _compile_wave_cell(compiled: list[BucketResult]) -> str:
    """The bucket's compile tasks (one per GPU class): the slowest first call and whether all
    compiled (`miss`), all loaded what the store held (`hit`), or not all alike (`mixed`)."""
    done = [r for r in compiled if r.status == "ok" and r.compile_seconds is not None]
    if not done:
        return "-"
    state = cache_outcome(r.cache_state for r in done) or "-"
    return f"{max(r.compile_seconds or 0.0 for r in done):.2f} {state}"


def _deviates(row: dict[str, Any], ok: list[BucketResult]) -> bool:
    """An ok rank whose served speedup is more than 20% off the median (as fleet_stats flags it)."""
    middle = row["served_speedup"]["median"]
    return any((v := served_speedup(r)) is not None and abs(v - middle) > 0.2 * middle for r in ok)


def _speedup(point: Optional[float], interval: Optional[list[float]], noisy: bool) -> Text:
    """`4.10x ±0.20` (the larger side of the 95% interval); a noisy figure is not printed as one:
    `noisy 0.91-51x`, its interval, instead."""
    if point is None:
        return Text("-")
    if noisy:
        return Text(
            f"noisy {interval[0]:.2g}-{interval[1]:.2g}x" if interval else f"noisy ~{point:.2g}x", style="yellow"
        )
    if interval is None:
        return Text(f"{point:.2f}x")
    return Text(f"{point:.2f}x ±{max(point - interval[0], interval[1] - point):.2f}")


def _wide_table(title: Text, records: list[BucketResult], fleet: bool) -> Table:
    """Every record with every field the report holds for it, one variant's latency per column."""
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    # eager and compiled have their columns already
    variants = [
        name
        for name in dict.fromkeys(name for r in records for name in r.variants)
        if name not in ("eager", "compiled")
    ]
    columns = (["wave", "rank", "node"] if fleet else ["phase"]) + [
        "bucket",
        "status",
        "stage",
        "compile s",
        "record s",
        "cache hit/miss",
        "eager ms",
        "compiled ms",
        "speedup",
        "serves",
        "served speedup",
        "b2b speedup",
        "breaks",
        "recompiles",
        "max |err|",
        *(f"{name} ms" for name in variants),
    ]
    for column in columns:
        left = column in ("wave", "phase", "status", "stage", "node", "serves")
        table.add_column(column, justify="left" if left else "right", overflow="fold")
    for r in records:
        failed = r.status != "ok"
        # a record the driver wrote for a rank that never answered names no node ("unknown")
        where = [r.phase, _num(r.rank, "d"), "-" if failed and r.node == "unknown" else r.node]
        table.add_row(
            *(Text(cell) for cell in (where if fleet else where[:1])),
            str(r.bucket),
            Text("failed", style="red") if failed else Text("ok", style="green"),
            Text(r.stage if failed else "-"),
            _num(r.compile_seconds, ".2f"),
            _num(r.graph_record_seconds, ".3f"),
            "-"
            if r.cache_hits is None and r.cache_misses is None
            else f"{_num(r.cache_hits, 'd')}/{_num(r.cache_misses, 'd')}",
            _num(r.eager_ms, ".3f"),
            _num(r.compiled_ms, ".3f"),
            _speedup(r.speedup, r.speedup_interval, is_noisy(r.speedup, r.speedup_interval, samples=None)),
            Text(r.variant or "-"),
            _speedup(served_speedup(r), r.served_speedup_interval, bool(r.noisy)),
            _num(r.throughput_speedup, ".2f", "x"),
            _num(r.graph_breaks, "d"),
            _num(r.recompiles, "d"),
            _num(r.max_abs_error, ".1e"),
            *(_num(r.variants[name].ms if name in r.variants else None, ".3f") for name in variants),
        )
    return table


def _print_failures(console: Console, failed: list[BucketResult], fleet: bool) -> None:
    """One line per failure, the ranks that failed a bucket alike in one: the stage and the error."""
    alike: dict[tuple[int, str], list[BucketResult]] = {}
    for r in failed:
        alike.setdefault((r.bucket, _failure(r)), []).append(r)
    for (bucket, failure), rs in alike.items():
        ranks = sorted({r.rank for r in rs if r.rank is not None})
        who = f" rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if fleet and ranks else ""
        task = " compile task" if fleet and any(r.rank is None for r in rs) else ""
        _line(console, f"bucket {bucket}{task}{who} {failure}", "red")


def _failure(r: BucketResult) -> str:
    """`failed at STAGE: ERROR` (the error's first line); `failed: ERROR` for a record the driver
    wrote for a task that never reached a stage."""
    error = (r.error or "no error recorded").splitlines()[0] if (r.error or "").strip() else "no error recorded"
    if r.stage == "pending":
        return f"failed: {error}"
    return f"failed at {error}" if error.startswith(f"{r.stage}: ") else f"failed at {r.stage}: {error}"


def as_record(data: dict[str, Any]) -> BucketResult:
    """A report's record as the typed record; keys it does not know (a newer report's) are left out."""
    known = {f.name for f in fields(BucketResult)} - {"variants"}
    measure = {f.name for f in fields(VariantMeasure)}
    return BucketResult(
        **{k: v for k, v in data.items() if k in known},
        variants={
            name: VariantMeasure(**{k: v for k, v in m.items() if k in measure})
            for name, m in (data.get("variants") or {}).items()
        },
    )


def _order(r: BucketResult) -> tuple[int, int, int]:
    return (r.bucket, WAVES.index(r.phase) if r.phase in WAVES else -1, -1 if r.rank is None else r.rank)


def _print_host(console: Console, records: list[BucketResult], fleet: bool) -> None:
    """Where the host ran slowed during a benchmark (orchestrator.jobs.timing's host meter): its
    rounds were timed again and left out, or, slowed for most of it, kept with the figures noisy."""
    for r in records:
        if not r.host_slowed_rounds:
            continue
        where = f"bucket {r.bucket}" + (f" rank {r.rank}" if fleet and r.rank is not None else "")
        slowed = f"the host ran slowed in {r.host_slowed_rounds} of {r.bench_rounds} benchmark rounds"
        if r.host_steady is False:
            _line(console, f"{where}: {slowed}, most of them: every round kept, its figures are noisy", "yellow")
        else:
            _line(console, f"{where}: {slowed}; they were timed again and left out")


def _buckets(buckets: set[int]) -> str:
    return ", ".join(map(str, sorted(buckets)))


def _build_seconds(records: list[BucketResult]) -> str:
    """Each built variant's build seconds, summed: its compile (or the wait for its child process
    and the load), capture and check."""
    seconds: dict[str, float] = {}
    for r in records:
        for name, measure in r.variants.items():
            if measure.ok and measure.build_seconds is not None:
                seconds[name] = seconds.get(name, 0.0) + measure.build_seconds
    return ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items())


def _line(console: Console, text: str, style: Optional[str] = None) -> None:
    """A line of plain text: brackets in errors and names are printed, not read as markup."""
    console.print(text, style=style, markup=False, highlight=False)


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
