"""A warmup's benchmark in a fresh process that loads what the warmup compiled
(orchestrator/jobs/fresh_benchmark.py): where it runs, how its figures join the compile's
records, and a real `warmup --no-ray` that benchmarks apart, on the CPU."""

import json
from pathlib import Path

import pytest
from conftest import ROOT, assert_measured, orchestrate

from orchestrator.jobs.child_process import Spare
from orchestrator.jobs.fresh_benchmark import CONTEXT_BYTES, decide, take_benchmark
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.variants import read_plans

GIB = 1 << 30


def record(bucket: int, cache_state: str = "miss", **fields) -> BucketResult:
    return BucketResult(bucket=bucket, cache_state=cache_state, **fields)


@pytest.mark.parametrize(
    ("asked", "device", "states", "free", "where", "why"),
    [
        ("same", "cuda", ["miss", "miss"], None, "same", "bench.process is same"),
        ("fresh", "cuda", ["miss", "hit"], None, "fresh", "bench.process is fresh"),
        ("fresh", "cpu", ["hit", "hit"], None, "fresh", "bench.process is fresh"),
        ("fresh", "cuda", ["miss", "miss"], 2 * GIB, "same", "needs about 4.0 GiB of GPU memory and 2.0 GiB are free"),
        ("fresh", "cuda", ["miss", "miss"], 4 * GIB, "fresh", "bench.process is fresh"),
    ],
)
def test_the_benchmark_goes_fresh_where_asked_and_the_gpu_holds_a_second_copy(asked, device, states, free, where, why):
    records = [record(i + 1, state, peak_memory_bytes=3 * GIB - CONTEXT_BYTES * i) for i, state in enumerate(states)]
    decision = decide(asked, device, records, free)
    assert decision.where == where and why in decision.why


def test_graphs_that_bypass_inductors_cache_are_benchmarked_where_they_were_compiled():
    records = [record(1), record(2, cache={"fx_graph_bypasses": 1})]
    decision = decide("fresh", "cuda", records, None)
    assert decision.where == "same" and "bypass" in decision.why


def test_without_a_bucket_to_time_no_fresh_process_starts():
    assert decide("fresh", "cuda", [record(1, status="failed")], None).why == "no bucket to benchmark"


def compiled_record() -> BucketResult:
    """A bucket as the compiling process leaves it: compiled, checked, aot unavailable, not timed."""
    result = record(8, compile_seconds=6.0, graph_record_seconds=0.5, recompiles=0, peak_memory_bytes=5 * GIB)
    result.stage_seconds = {"compile": 6.0, "check": 0.2}
    result.variants = {
        "eager-graphed": VariantMeasure(ok=True, build_seconds=0.3),
        "aot": VariantMeasure(ok=False, reason="Unsupported: copy.deepcopy()"),
    }
    return result


def measured_record() -> BucketResult:
    """The same bucket as a fresh process leaves it: loaded (a hit) and timed."""
    result = record(8, "hit", compile_seconds=0.4, graph_record_seconds=0.1, recompiles=1, peak_memory_bytes=4 * GIB)
    result.stage_seconds = {"compile": 0.4, "benchmark": 2.5, "padding proof": 0.3}
    result.eager_ms, result.compiled_ms, result.speedup = 2.0, 1.0, 2.0
    result.variant, result.served_ms, result.served_speedup, result.noisy = "eager-graphed", 0.5, 4.0, False
    result.bench_rounds, result.host_slowed_rounds, result.host_steady = 6, 1, True
    result.variants = {
        "eager": VariantMeasure(ok=True, ms=2.0, samples_ms=[2.0, 2.0]),
        "compiled": VariantMeasure(ok=True, ms=1.0, build_seconds=0.5, samples_ms=[1.0, 1.0]),
        "eager-graphed": VariantMeasure(ok=True, ms=0.5, build_seconds=0.05, samples_ms=[0.5, 0.5]),
        "aot": VariantMeasure(ok=False, reason="the namespace holds no aot function for this bucket to load"),
    }
    return result


def test_the_fresh_figures_join_the_compiles_record():
    into = compiled_record()
    take_benchmark(into, measured_record())
    # the figures are the fresh process's
    assert (into.eager_ms, into.compiled_ms, into.speedup) == (2.0, 1.0, 2.0)
    assert (into.variant, into.served_ms, into.served_speedup, into.noisy) == ("eager-graphed", 0.5, 4.0, False)
    assert (into.bench_rounds, into.host_slowed_rounds, into.host_steady) == (6, 1, True)
    assert into.variants["eager-graphed"].ms == 0.5 and into.variants["compiled"].samples_ms == [1.0, 1.0]
    # what it cost to build is the compile's: the fresh process only loaded
    assert (into.compile_seconds, into.graph_record_seconds, into.cache_state) == (6.0, 0.5, "miss")
    assert into.variants["compiled"].build_seconds == pytest.approx(6.5)
    assert into.variants["eager-graphed"].build_seconds == 0.3 and into.variants["eager"].build_seconds is None
    # a variant neither could build keeps the compile's reason, which says why
    assert into.variants["aot"].reason == "Unsupported: copy.deepcopy()"
    assert into.stage_seconds == {"compile": 6.0, "check": 0.2, "benchmark": 2.5, "padding proof": 0.3}
    assert into.peak_memory_bytes == 5 * GIB and into.recompiles == 1


def test_a_bucket_the_fresh_process_failed_fails_with_its_reason():
    into, measured = compiled_record(), record(8, "hit", status="failed", stage="check")
    measured.error = "check: output 0 differs from eager"
    take_benchmark(into, measured)
    assert (into.status, into.stage, into.error) == ("failed", "check", "check: output 0 differs from eager")
    assert into.speedup is None


CONFIG = """
name: {name}
model:
  factory: {factory}
  kwargs: {{layers: 2, width: 64}}
inputs:
  - shape: [batch, 64]
device: cpu
compile:
  mode: default
buckets: [1, 4]
bench:
  iterations: 20
  warmup: 2
  process: fresh
"""

# The model builds in the first process that asks for it and refuses in any other: the warmup
# process compiles it, and the fresh benchmark process cannot build it.
ONE_PROCESS = """
import os
import sys
from pathlib import Path

sys.path.insert(0, {examples!r})
import models


def mlp(**kwargs):
    first = Path(__file__).with_name("built-by")
    if not first.exists():
        first.write_text(str(os.getpid()))
    elif first.read_text() != str(os.getpid()):
        raise RuntimeError("built once already, by process " + first.read_text())
    return models.mlp(**kwargs)
"""


def warm(tmp_path: Path, name: str, factory: str, *extra: str):
    config = tmp_path / f"{name}.yaml"
    config.write_text(CONFIG.format(name=name, factory=factory))
    report = tmp_path / "report.json"
    run = orchestrate(
        "warmup", "--no-ray", "--model", str(config), "--report", str(report), *extra, cache_dir=tmp_path / "cache"
    )
    return run, report


@pytest.mark.slow
def test_warmup_benchmarks_in_a_fresh_process_what_it_compiled(tmp_path):
    run, report = warm(
        tmp_path, "apart", f"{ROOT}/examples/models.py:mlp", "--profile", str(tmp_path / "prof"), "--json"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["results"], "stdout holds the report alone: the child writes nothing there"
    assert "benchmark in a fresh process: bench.process is fresh" in run.stderr
    assert "bucket 4: fresh process: benchmark" in run.stderr  # its progress, forwarded
    data = json.loads(report.read_text())
    namespace = tmp_path / "cache" / data["namespace"]
    plans = read_plans(namespace)
    for result in data["results"]:
        assert_measured(result)
        # the compile's record (this process compiled it cold), the fresh process's figures
        assert result["cache_state"] == "miss" and result["cache_misses"] > 0
        compiled = result["variants"]["compiled"]
        assert compiled["build_seconds"] == pytest.approx(result["compile_seconds"] + result["graph_record_seconds"])
        assert compiled["ms"] == result["compiled_ms"] and len(compiled["samples_ms"]) >= 20
        assert result["stage_seconds"]["benchmark"] > 0
        # the fresh process wrote the plan that serves its choice, and profiled its variants
        assert plans[result["bucket"]]["variant"] == result["variant"]
        assert (tmp_path / "prof" / f"apart-b{result['bucket']}-eager.json.gz").is_file()
    # a warm rerun compiles nothing and is timed apart all the same
    rerun, report = warm(tmp_path, "apart", f"{ROOT}/examples/models.py:mlp")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "benchmark in a fresh process: bench.process is fresh" in rerun.stderr
    assert all(r["cache_state"] == "hit" for r in json.loads(report.read_text())["results"])


@pytest.mark.slow
def test_a_fresh_process_that_cannot_benchmark_fails_its_buckets_and_publishes_nothing(tmp_path):
    models = tmp_path / "one_process.py"
    models.write_text(ONE_PROCESS.format(examples=str(ROOT / "examples")))
    run, report = warm(tmp_path, "lonely", f"{models}:mlp")
    assert run.returncode == 1, run.stderr[-3000:]
    (log,) = (tmp_path / "cache" / "logs").glob("warmup-lonely-*.log")
    assert "RuntimeError: built once already, by process" in log.read_text()  # the child's traceback
    results = json.loads(report.read_text())["results"]
    for result in results:
        assert result["status"] == "failed" and result["stage"] == "benchmark"
        assert result["error"] == (
            "benchmark: the benchmark process exited with code 1 before bucket 1, 4 was timed "
            "(its output is in the run log)"
        )
    assert not list((tmp_path / "cache" / "store").rglob("*.json"))  # nothing published
    (namespace,) = (p for p in (tmp_path / "cache").iterdir() if p.name.startswith("lonely-"))
    assert not read_plans(namespace)  # nor a serving plan left for a later run to trust


def test_a_spare_survives_what_a_compile_sets_in_the_environment_and_exits_unused(monkeypatch):
    spare = Spare("orchestrator.jobs.fresh_benchmark")
    pid = spare.start()
    assert spare.start() == pid, "one spare at a time"
    # what the warmup's own compile sets after the spare started: its caches, Inductor's marker
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    monkeypatch.setenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "140141761580064")
    child = spare.take()
    assert child.pid == pid
    child.stdin.close()  # no job: a spare nobody took
    assert child.wait(timeout=120) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read at a child's start: a new one must start with it
    pid = spare.start()
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    child = spare.take()
    assert child.pid != pid
    child.kill()
    child.wait()
