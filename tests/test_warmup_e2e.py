"""A real `orchestrate warmup` of "mlp" (tests/configs/mlp.yaml) on the CPU: cold, warm, then --fresh."""

import json

import jsonschema
import pytest
from conftest import MLP, assert_measured, orchestrate

from orchestrator.reports.schemas import report_schema

pytestmark = pytest.mark.slow

CONTRACT_TOP = {"schema_version", "model", "namespace", "torch_version", "device", "buckets", "results", "summary"}
CONTRACT_RESULT = {
    "rank",
    "node",
    "gpu",
    "bucket",
    "phase",
    "status",
    "compile_seconds",
    "graph_record_seconds",
    "cache_hits",
    "cache_misses",
    "eager_ms",
    "compiled_ms",
    "speedup",
    "graph_breaks",
    "recompiles",
    "max_abs_error",
}


def warmup(cache_dir, *extra):
    return orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        MLP,
        "--buckets",
        "1,2",
        "--device",
        "cpu",
        *extra,
        cache_dir=cache_dir,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three processes against one cache directory: cold (--json), warm (table), cold again (--fresh)."""
    cache_dir = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("reports")
    cold = warmup(cache_dir, "--json", "--report", str(out / "cold.json"))
    warm = warmup(cache_dir, "--report", str(out / "warm.json"))
    fresh = warmup(cache_dir, "--fresh", "--json")
    return {"cold": cold, "warm": warm, "fresh": fresh, "out": out, "cache_dir": cache_dir}


def test_real_reports_satisfy_the_report_schema(runs):
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for report in (json.loads(runs["cold"].stdout), json.loads((runs["out"] / "warm.json").read_text())):
        jsonschema.Draft202012Validator(schema).validate(report)


def test_cold_run_reports_the_contract(runs):
    cold = runs["cold"]
    assert cold.returncode == 0, cold.stderr
    report = json.loads(cold.stdout)  # --json: stdout carries the report and nothing else
    assert json.loads((runs["out"] / "cold.json").read_text()) == report
    assert CONTRACT_TOP <= report.keys()
    assert report["schema_version"] == 1
    assert report["model"] == "mlp"
    assert report["device"] == "cpu"
    assert report["buckets"] == [1, 2]
    assert [r["bucket"] for r in report["results"]] == [1, 2]
    for result in report["results"]:
        assert CONTRACT_RESULT <= result.keys()
        assert result["status"] == "ok", result["error"]
        assert result["phase"] == "compile"
        assert result["rank"] == 0 and result["node"]
        assert result["cache"]["fx_graph_misses"] == 1 and result["cache_hits"] == 0
        assert result["compile_seconds"] > 0 and result["graph_record_seconds"] > 0
        assert_measured(result)  # benchmarked, and checked against eager
        assert result["graph_breaks"] == 0 and result["recompiles"] == 0
        assert result["cudagraphs"] is False
        assert "CPU" in result["cudagraph_skip_reasons"][0]
    assert report["summary"]["cache_state"] == "cold"
    assert report["summary"]["buckets_failed"] == 0
    assert report["summary"]["cache_files"] > 0
    # progress went to stderr, one line per phase and bucket
    assert "bucket 2: compile" in cold.stderr


def test_second_run_is_warm_and_says_so(runs):
    cold = json.loads(runs["cold"].stdout)
    warm = runs["warm"]
    assert warm.returncode == 0, warm.stderr
    assert "cache warm" in warm.stdout and "bucket" in warm.stdout  # the table for people
    report = json.loads((runs["out"] / "warm.json").read_text())
    assert report["namespace"] == cold["namespace"]
    assert report["summary"]["cache_state"] == "warm"
    assert report["summary"]["cache_misses"] == 0
    for result in report["results"]:
        assert result["status"] == "ok"
        assert result["phase"] == "warm"
        assert result["cache"]["fx_graph_hits"] == 1
        assert result["cache"]["fx_graph_misses"] == 0
        assert result["recompiles"] == 0


def test_fresh_forces_a_cold_compile(runs):
    fresh = runs["fresh"]
    assert fresh.returncode == 0, fresh.stderr
    report = json.loads(fresh.stdout)
    assert report["summary"]["cache_state"] == "cold"
    assert all(r["cache"]["fx_graph_misses"] == 1 for r in report["results"])
    # nothing but the namespace directory, the store and the run logs beside the cache (no
    # leftovers of the wipe); a torch that writes nothing leaves no log folder
    beside = {"store", ".signing-key", ".signing-key.pub", "logs"}
    assert [p.name for p in runs["cache_dir"].iterdir() if p.name not in beside] == [report["namespace"]]
