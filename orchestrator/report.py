"""The warmup report: one JSON document (the contract other tools read) and a table for people."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jobs.engine import WarmupRun
from jobs.spec import WarmupSpec

SCHEMA_VERSION = 1


def build_report(spec: WarmupSpec, run: WarmupRun, started_at: datetime) -> dict[str, Any]:
    results = [r.to_dict() for r in run.results]
    return {
        "schema_version": SCHEMA_VERSION,
        "model": spec.name,
        "namespace": run.namespace,
        "torch_version": run.platform.torch_version,
        "device": run.device,
        "gpu": run.results[0].gpu if run.results else None,
        "platform": asdict(run.platform),
        "config_hash": spec.identity_hash(),
        "compile": spec.compile.model_dump(mode="json"),
        "cache_dir": run.cache_dir,
        "buckets": list(spec.buckets),
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
        "summary": summarize(run),
        "remote": None if run.remote is None else {
            "url": run.remote,
            "pull": asdict(run.pull) if run.pull else None,  # None: nothing published yet (or --fresh)
            "publish": asdict(run.publish) if run.publish else None,
            "publish_error": run.publish_error,
        },
    }


def summarize(run: WarmupRun) -> dict[str, Any]:
    ok = [r for r in run.results if r.status == "ok"]
    phases = {r.phase for r in ok}
    speedups = [r.speedup for r in ok if r.speedup is not None]
    throughput = [r.throughput_speedup for r in ok if r.throughput_speedup is not None]
    age = run.process_age_at_start
    compile_total = sum(r.compile_seconds or 0.0 for r in run.results)
    record_total = sum(r.graph_record_seconds or 0.0 for r in run.results)
    return {
        "buckets_ok": len(ok),
        "buckets_failed": len(run.results) - len(ok),
        # warm: every bucket loaded from the cache without a single miss
        "cache_state": "warm" if phases == {"warm"} else "cold" if phases == {"compile"} else "partial",
        "cache_hits": sum(r.cache_hits or 0 for r in run.results),
        "cache_misses": sum(r.cache_misses or 0 for r in run.results),
        "compile_seconds_total": compile_total,
        "graph_record_seconds_total": record_total,
        # from job start (model built, nothing compiled) to every bucket compiled and its graphs recorded
        "ready_seconds": run.setup_seconds + compile_total + record_total,
        # the same counted from process spawn (imports, CUDA init): what a new replica waits
        "process_seconds_to_ready": None if age is None else age + run.setup_seconds + compile_total + record_total,
        "speedup_min": min(speedups, default=None),
        "speedup_median": statistics.median(speedups) if speedups else None,
        "speedup_max": max(speedups, default=None),
        "throughput_speedup_median": statistics.median(throughput) if throughput else None,
        "graph_breaks": sum(r.graph_breaks or 0 for r in run.results),
        "recompiles": sum(r.recompiles or 0 for r in run.results),
        "cache_bytes": run.cache_bytes,
        "cache_files": run.cache_files,
        "wall_seconds": run.wall_seconds,
    }


def write_json(report: dict[str, Any], path: Path) -> None:
    """Atomic: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)


def render_table(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{report['model']} on {report['gpu'] or report['device']} "
                        f"(torch {report['torch_version']}, mode={report['compile']['mode']})")
    for column in ("bucket", "phase", "status", "compile s", "record s", "cache hit/miss",
                   "eager ms", "compiled ms", "speedup", "b2b speedup", "breaks", "recompiles", "max |err|"):
        table.add_column(column, justify="right" if column not in ("phase", "status") else "left")
    for r in report["results"]:
        table.add_row(
            str(r["bucket"]), r["phase"], "ok" if r["status"] == "ok" else "[red]failed[/red]",
            _num(r["compile_seconds"], ".2f"), _num(r["graph_record_seconds"], ".3f"),
            f"{_num(r['cache_hits'], 'd')}/{_num(r['cache_misses'], 'd')}",
            _num(r["eager_ms"], ".3f"), _num(r["compiled_ms"], ".3f"), _num(r["speedup"], ".2f", "x"),
            _num(r["throughput_speedup"], ".2f", "x"),
            _num(r["graph_breaks"], "d"), _num(r["recompiles"], "d"), _num(r["max_abs_error"], ".1e"))
    console.print(table)
    for r in report["results"]:
        if r["error"]:
            console.print(f"[red]bucket {r['bucket']} failed[/red] at {r['error']}", highlight=False)
    skipped: dict[str, list[str]] = {}
    for r in report["results"]:
        for reason in r["cudagraph_skip_reasons"]:
            skipped.setdefault(reason, []).append(str(r["bucket"]))
    for reason, buckets in skipped.items():
        console.print(f"no CUDA graphs for bucket {', '.join(buckets)}: {reason}", highlight=False, style="yellow")
    s = report["summary"]
    remote = report["remote"]
    if remote:
        pulled, published = remote["pull"], remote["publish"]
        console.print(f"store {remote['url']}: pulled " + (
            f"generation {pulled['generation']} ({pulled['files']} files, {pulled['bytes'] / 1e6:.1f} MB, "
            f"{pulled['seconds']:.2f} s)" if pulled else "nothing") + "; published " + (
            f"generation {published['generation']} ({published['files']} new files, {published['seconds']:.2f} s)"
            if published else remote["publish_error"] or "nothing"), highlight=False)
    console.print(
        f"cache {s['cache_state']} ({s['cache_hits']} hits, {s['cache_misses']} misses) in {report['namespace']}; "
        f"ready in {s['ready_seconds']:.1f} s (compile {s['compile_seconds_total']:.1f} s + "
        f"graphs {s['graph_record_seconds_total']:.2f} s); {s['buckets_ok']} ok, {s['buckets_failed']} failed",
        highlight=False)


def _num(value: Any, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"
