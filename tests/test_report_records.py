"""The report is built from typed records (orchestrator.reports.records): its JSON keys, their
nesting and values are those of schema_version 1, for a process report and a Ray fleet report."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.cache.namespace import Platform
from orchestrator.cache.sync import Transfer, combined
from orchestrator.config import load_spec
from orchestrator.fleet.plan import CompileUnit, Node, Target
from orchestrator.fleet.run import FleetRun, TaskRun
from orchestrator.jobs.records import BucketResult, ProcessRun
from orchestrator.reports.report import build_fleet_report, build_report

ROOT = Path(__file__).resolve().parents[1]
STARTED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
PLATFORM = Platform("2.13.0+cpu", "abc", None, None, "cpu-x86_64", "3.11.7")

HEADER = [
    "schema_version",
    "model",
    "namespace",
    "torch_version",
    "device",
    "gpu",
    "platform",
    "config_hash",
    "compile",
    "buckets",
    "started_at",
    "finished_at",
    "results",
]
SUMMARY = [
    "buckets_ok",
    "buckets_failed",
    "cache_state",
    "cache_hits",
    "cache_misses",
    "compile_seconds_total",
    "graph_record_seconds_total",
    "ready_seconds",
    "process_seconds_to_ready",
    "speedup_min",
    "speedup_median",
    "speedup_max",
    "throughput_speedup_median",
    "graph_breaks",
    "recompiles",
    "cache_bytes",
    "cache_files",
    "wall_seconds",
]
TRANSFER = ["generation", "files", "bytes", "shards", "seconds", "races", "skipped"]


def spec():
    return load_spec(ROOT / "examples" / "mlp.yaml")


def result(bucket: int, **kw) -> BucketResult:
    fields = dict(
        node="n1", cache_state="miss", compile_seconds=2.0, graph_record_seconds=0.5, cache_misses=2, speedup=2.0
    )
    return BucketResult(bucket=bucket, cache_hits=0, **{**fields, **kw})


def process_run(remote: bool):
    from orchestrator.jobs.engine import WarmupRun

    return WarmupRun(
        platform=PLATFORM,
        namespace="mlp-ns",
        device="cpu",
        cache_dir="/tmp/cache",
        results=[result(1), result(8, status="failed", error="compile: boom", speedup=None)],
        wall_seconds=9.5,
        setup_seconds=1.0,
        process_age_at_start=3.0,
        cache_bytes=100,
        cache_files=4,
        remote="s3://bucket/prefix" if remote else None,
        pull=None,
        publish=Transfer(generation=2, files=3, bytes=10, shards=1, seconds=0.25) if remote else None,
    )


def test_process_report_keeps_its_keys_and_values():
    report = build_report(spec(), process_run(remote=True), STARTED)
    assert list(report) == [*HEADER, "executor", "cache_dir", "summary", "remote"]
    assert report["executor"] == {"kind": "process"}
    assert report["platform"] == {
        "torch_version": "2.13.0+cpu",
        "torch_git": "abc",
        "triton_version": None,
        "cuda_version": None,
        "gpu_name": "cpu-x86_64",
        "python_version": "3.11.7",
    }
    assert report["results"] == [r.to_dict() for r in process_run(remote=True).results]
    assert list(report["summary"]) == SUMMARY
    assert report["summary"]["ready_seconds"] == 1.0 + 2 * 2.5
    assert report["summary"]["process_seconds_to_ready"] == 3.0 + 6.0
    assert (report["summary"]["buckets_ok"], report["summary"]["buckets_failed"]) == (1, 1)
    assert report["remote"] == {
        "url": "s3://bucket/prefix",
        "pull": None,
        "publish": dict(zip(TRANSFER, [2, 3, 10, 1, 0.25, 0, []], strict=True)),
        "publish_error": None,
    }
    assert report["started_at"] == "2026-01-02T03:04:05+00:00"
    assert build_report(spec(), process_run(remote=False), STARTED)["remote"] is None
    json.dumps(report)  # plain JSON types all the way down


def worker_account(node: str, started: float, ended: float, events: list[tuple[str, float]]) -> ProcessRun:
    """A GPU worker's account of itself, as a fleet task returns it (test_html_report.py too)."""
    return ProcessRun(
        namespace="mlp-ns",
        platform=Platform("2.13.0", "abc", None, None, "NVIDIA H200", "3.12.3"),
        device="cuda:0",
        node=node,
        pull=None,
        publish=Transfer(generation=3),
        publish_error=None,
        cache_bytes=100,
        cache_files=4,
        setup_seconds=1.0,
        process_age_at_start=None,
        process_started_at=started,
        ended_at=ended,
        events=events,
        gpu_ids=["0"],
    )


def fleet_run() -> FleetRun:
    node = Node("id1", "10.0.0.1", 1, 4, "H200")
    target = Target(0, node)
    compiled = result(8, rank=None, gpu="H200", node="10.0.0.1")
    warm = result(8, rank=0, gpu="H200", node="10.0.0.1", phase="warm", cache_state="hit", compile_seconds=0.5)
    process = worker_account("10.0.0.1", 100.0, 110.0, [("imported", 102.0)])
    return FleetRun(
        nodes=[node],
        targets=[target],
        units=[CompileUnit("H200", 8, 0.49)],
        results=[compiled, warm],
        runs=[
            TaskRun(process, "compile", None, 8, 111.0),
            TaskRun(
                replace(process, pull=Transfer(seconds=0.75), publish=None, publish_error="denied"),
                "warm",
                0,
                None,
                112.0,
            ),
        ],
        wall_seconds=20.0,
        wave_seconds={"start": 1.0, "compile": 10.0, "warm": 9.0},
        started_at=99.0,
    )


def test_fleet_report_keeps_its_keys_and_values():
    fleet = fleet_run()
    report = build_fleet_report(spec(), fleet, "s3://bucket/prefix", STARTED)
    assert list(report) == [*HEADER, "namespaces", "executor", "summary", "remote"]
    assert report["results"] == [asdict(r) for r in fleet.results]
    assert (report["gpu"], report["device"], report["platform"]) == (
        "H200",
        "cuda:0",
        asdict(fleet.runs[0].process.platform),
    )
    assert report["torch_version"] == "2.13.0"
    assert report["namespaces"] == ["mlp-ns"]
    executor = report["executor"]
    assert list(executor) == ["kind", "address", "nodes", "ranks", "compile_units", "wave_seconds", "timeline"]
    assert executor["kind"] == "ray" and executor["address"] == "local"
    assert executor["timeline"][0] == {
        "wave": "compile",
        "bucket": 8,
        "rank": None,
        "node": "10.0.0.1",
        "gpu_ids": ["0"],
        "started_s": 1.0,
        "ended_s": 11.0,
        "answered_s": 12.0,
        "events": [["imported", 3.0]],
    }
    summary = report["summary"]
    assert list(summary) == [*SUMMARY, "fleet"]
    assert summary["cache_state"] == "warm" and summary["ready_seconds"] == 1.0 + 0.5 + 0.5
    assert summary["fleet"] == {
        "buckets": {
            "8": {
                "cold_compile_seconds": 2.0,
                "warm_load_seconds": {"min": 0.5, "median": 0.5, "max": 0.5},
                "speedup": {"min": 2.0, "median": 2.0, "max": 2.0},
                "ranks_ok": 1,
                "ranks_failed": 0,
                "cache_state": "hit",
                "eager_ms": None,
                "served_ms": None,
                "served_speedup": {"min": 2.0, "median": 2.0, "max": 2.0},  # no variant: compiled served
                "served_speedup_interval": None,
                "served_variants": [],
                "ranks_noisy": 0,
                "noisy": False,
            }
        },
        "deviating_ranks": [],
        "pull_seconds": {"min": 0.75, "median": 0.75, "max": 0.75},
    }
    assert report["remote"] == {
        "url": "s3://bucket/prefix",
        "published_generations": [3],
        "publish_errors": ["denied"],
        "pull": dict(zip(TRANSFER, [None, 0, 0, 0, 0.75, 0, []], strict=True)),
        "publish": dict(zip(TRANSFER, [3, 0, 0, 0, 0.0, 0, []], strict=True)),
    }
    json.dumps(report)


BUCKETS = (1, 8, 32)


def store_fleet(warm: bool) -> FleetRun:
    """Three compile tasks and two ranks on one node, with a store. Cold: the compile tasks find
    nothing to pull and publish generations 1-3 (one per bucket), the ranks pull generation 3 and
    rank 0 publishes the serving plans as generation 4. Warm rerun: every process pulls generation 4
    and publishes nothing new (each publish answers with the generation that stands)."""
    base = fleet_run()
    node = base.nodes[0]
    account = base.runs[0].process
    compiled = [result(b, rank=None, gpu="H200", node=node.ip) for b in BUCKETS]
    loaded = [
        result(b, rank=rank, gpu="H200", node=node.ip, phase="warm", cache_state="hit", compile_seconds=0.5)
        for b in BUCKETS
        for rank in (0, 1)
    ]

    def transfer(generation: int, files: int, **kw) -> Transfer:
        return Transfer(generation=generation, files=files, bytes=files * 1000, shards=1 if files else 0, **kw)

    def task(i: int, bucket: int) -> TaskRun:
        pull = transfer(4, 100, seconds=0.5) if warm else None
        publish = transfer(4, 0, seconds=0.1) if warm else transfer(i + 1, 100, seconds=1.0, races=i, skipped=[f"b{i}"])
        events = [("pulled generation 4", 101.0)] if warm else []
        process = replace(account, pull=pull, publish=publish, events=[*events, ("published", 105.0)])
        return TaskRun(process, "compile", None, bucket, 106.0)

    def rank(number: int) -> TaskRun:
        pull = transfer(4 if warm else 3, 0 if warm else 300, seconds=0.25)
        publish = None if number else transfer(4, 0, seconds=0.1) if warm else transfer(4, 3, seconds=0.2)
        events = [(f"pulled generation {pull.generation}", 107.0)] + (
            [("published serving plans", 109.0)] if publish else []
        )
        process = replace(account, pull=pull, publish=publish, events=events)
        return TaskRun(process, "warm", number, None, 110.0)

    return replace(
        base,
        targets=[Target(0, node), Target(1, node)],
        units=[CompileUnit("H200", b, 0.49) for b in BUCKETS],
        results=compiled + loaded,
        runs=[*(task(i, b) for i, b in enumerate(BUCKETS)), rank(0), rank(1)],
    )


def test_fleet_remote_sums_the_transfers_of_every_task_and_rank():
    cold = build_fleet_report(spec(), store_fleet(warm=False), "s3://bucket/prefix", STARTED)["remote"]
    assert cold["published_generations"] == [1, 2, 3, 4] and cold["publish_errors"] == []
    assert cold["pull"] == dict(zip(TRANSFER, [3, 600, 600_000, 2, 0.5, 0, []], strict=True))  # the two ranks
    # three buckets and the serving plans: files, bytes, shards, seconds and races summed, the
    # highest generation, every skipped file
    assert cold["publish"] == dict(zip(TRANSFER, [4, 303, 303_000, 4, 3.2, 3, ["b0", "b1", "b2"]], strict=True))
    warm = build_fleet_report(spec(), store_fleet(warm=True), "s3://bucket/prefix", STARTED)["remote"]
    assert warm["published_generations"] == [4]
    assert warm["pull"] == dict(zip(TRANSFER, [4, 300, 300_000, 3, 2.0, 0, []], strict=True))  # tasks and ranks
    assert warm["publish"] == dict(zip(TRANSFER, [4, 0, 0, 0, pytest.approx(0.4), 0, []], strict=True))
    # no process pulled or published: none, not a transfer of zeros
    fleet = store_fleet(warm=False)
    quiet = replace(fleet, runs=[replace(t, process=replace(t.process, pull=None, publish=None)) for t in fleet.runs])
    remote = build_fleet_report(spec(), quiet, "s3://bucket/prefix", STARTED)["remote"]
    assert (remote["pull"], remote["publish"], remote["published_generations"]) == (None, None, [])


def test_several_pulls_of_one_process_are_one_transfer():
    pulls = [
        Transfer(generation=2, files=3, bytes=30, shards=1, seconds=0.5),
        Transfer(generation=5, files=1, bytes=10, shards=1, seconds=0.25),
    ]
    assert combined(pulls) == Transfer(generation=5, files=4, bytes=40, shards=2, seconds=0.75)
    assert combined([]) is None
    assert combined([Transfer()]) == Transfer()  # a transfer that names no generation keeps none
