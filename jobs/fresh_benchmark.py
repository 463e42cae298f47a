"""A warmup's benchmark in a fresh process, which loads every bucket from the warm cache and
compiles nothing (`bench.process: fresh`), as a replica does.

It separates what a benchmark measures from whatever a compile leaves in its process. A Ray warmup
already benchmarks on ranks that only load what the compile wave published; this is the same for
`warmup --no-ray`. It is not the default: its figures match those timed in the compiling process
within their spread, and its second process costs every warmup seconds (docs/performance.md, "Where
the report is timed does not move it").

The child builds a Session over the same namespace directory, loads and checks every bucket (each
a cache hit) and benchmarks them as Session.benchmark does, writing the serving plans into the
namespace. The parent keeps its own records of the compiles and takes the child's figures
(`take_benchmark`). Progress comes back over the pipe the results do.

    python -m orchestrator.jobs.fresh_benchmark PARENT_PID   (the job pickled on stdin)
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from orchestrator.jobs import child_process
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.spec import WarmupSpec

# A fresh process holds its own copy of what the warmup holds (weights, graphs, the benchmark's
# memory) beside the warmup process, plus a CUDA context of its own.
CONTEXT_BYTES = 1 << 30

# What a benchmark sets on a bucket's record (Session.benchmark: the timing, the choice, the
# padding proof, the profile); the record's other fields are the compile's.
BENCHMARK_FIELDS = (
    "eager_ms",
    "eager_p90_ms",
    "compiled_ms",
    "compiled_p90_ms",
    "speedup",
    "speedup_interval",
    "eager_throughput_ms",
    "compiled_throughput_ms",
    "throughput_speedup",
    "variant",
    "served_ms",
    "served_speedup",
    "served_speedup_interval",
    "noisy",
    "bench_rounds",
    "host_slowed_rounds",
    "host_steady",
    "host_reading_us",
    "host_best_us",
    "choice_reason",
    "profile",
    "padding_proof",
)
BENCHMARK_STAGES = ("benchmark", "padding proof", "profile")

Where = Literal["same", "fresh"]


@dataclass(frozen=True)
class Decision:
    where: Where
    why: str


_SPARE = child_process.Spare("orchestrator.jobs.fresh_benchmark")


def prestart(spec: WarmupSpec) -> Optional[int]:
    """Start the process a fresh benchmark will use, now, where `spec` asks for one: its start and
    imports then run beside the warmup's compiles. Returns its pid, if one was started."""
    if spec.bench.process == "fresh":
        return _SPARE.start()
    return None


def discard_spare() -> None:
    """The benchmark runs in the warmup's process after all: end the spare waiting for it."""
    _SPARE.discard()


def decide(asked: str, device_type: str, records: Sequence[BucketResult], free_bytes: Optional[int] = None) -> Decision:
    """Where a warmup process's benchmark runs: `asked` is the config's `bench.process`. A fresh
    process needs GPU memory for a second copy of the largest bucket's peak: with less free
    (`free_bytes`), the benchmark stays here and says why; so it does where the compiled graphs
    bypass Inductor's cache, which a fresh process would compile again."""
    if asked == "same":
        return Decision("same", "bench.process is same")
    if not any(r.status == "ok" for r in records):
        return Decision("same", "no bucket to benchmark")
    if any(r.status == "ok" and r.cache.get("fx_graph_bypasses") for r in records):
        return Decision("same", "the compiled graphs bypass Inductor's cache: a fresh process would compile them again")
    needed = max((r.peak_memory_bytes or 0) for r in records) + CONTEXT_BYTES
    if device_type == "cuda" and free_bytes is not None and free_bytes < needed:
        return Decision(
            "same",
            f"a fresh process needs about {needed / 2**30:.1f} GiB of GPU memory and "
            f"{free_bytes / 2**30:.1f} GiB are free: benchmarked in the compiling process",
        )
    return Decision("fresh", "bench.process is fresh")


def take_benchmark(into: BucketResult, measured: BucketResult) -> None:
    """The figures a fresh process measured, written into the compiling process's record `into`:
    every field of BENCHMARK_FIELDS, each variant's timing (its build as the compile recorded
    it: the child only loaded it), the benchmark's stages' seconds, and the larger peak memory.
    A bucket the child could not load, check or time fails with the child's reason."""
    if measured.status != "ok":
        into.status, into.stage, into.error = measured.status, measured.stage, measured.error
        into.error_detail = measured.error_detail
        return
    for name in BENCHMARK_FIELDS:
        setattr(into, name, getattr(measured, name))
    built = {name: variant.build_seconds for name, variant in into.variants.items()}
    if into.compile_seconds is not None:
        built["compiled"] = into.compile_seconds + (into.graph_record_seconds or 0.0)
    variants: dict[str, VariantMeasure] = {}
    for name, variant in measured.variants.items():
        ours = into.variants.get(name)
        if not variant.ok and ours is not None and not ours.ok:
            variants[name] = ours  # unavailable to both: the compile's reason says why first
            continue
        variant.build_seconds = built.get(name) if variant.ok else None
        variants[name] = variant
    into.variants = variants
    for stage in BENCHMARK_STAGES:
        if stage in measured.stage_seconds:
            into.stage_seconds[stage] = measured.stage_seconds[stage]
    into.recompiles = max(into.recompiles or 0, measured.recompiles or 0)
    if measured.peak_memory_bytes is not None:
        into.peak_memory_bytes = max(into.peak_memory_bytes or 0, measured.peak_memory_bytes)


@dataclass
class Benchmarked:
    """The child's answer: a record per bucket it reached, the serving plans it wrote and the
    files it quarantined (relative to the namespace directory), and its milestones."""

    results: dict[int, BucketResult] = field(default_factory=dict)
    serving_files: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    events: list[tuple[str, float]] = field(default_factory=list)
    error: Optional[str] = None  # how the child ended, where it answered for no bucket or not all


def run(
    spec: WarmupSpec,
    cache_root: Path,
    buckets: Sequence[int],
    *,
    rank: int,
    progress: Any,
    profile_dir: Optional[Path] = None,
    profile_prefix: Optional[str] = None,
) -> Benchmarked:
    """Benchmark `buckets` of `spec` in a fresh child process over the namespace under `cache_root`,
    forwarding its progress to `progress` (engine.Progress) as it comes."""
    child = _SPARE.take()
    assert child.stdin is not None and child.stdout is not None
    answer = Benchmarked()
    try:
        job = (spec, cache_root, list(buckets), rank, profile_dir, profile_prefix)
        try:
            child.stdin.write(pickle.dumps(job))
            child.stdin.close()
        except OSError:  # it died at once: its exit code says so below
            pass
        for line in child.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "progress" in message:
                method, *args = message["progress"]
                if method in ("step", "phase", "advance"):
                    getattr(progress, method)(*args)
            elif "answer" in message:  # a dict: this module is the child's __main__, not importable by name
                answer = Benchmarked(**pickle.loads(base64.b64decode(message["answer"])))
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    missing = [b for b in buckets if b not in answer.results]
    if missing:
        answer.error = (
            f"the benchmark process exited with code {code} before bucket "
            f"{', '.join(map(str, missing))} was timed (its output is in the run log)"
        )
    return answer


class _Forward:
    """engine.Progress in the child: each call a line on the answer's pipe, the phases named as
    the fresh process's; a bucket's end is the parent's to say, once it has the figures."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.lock = threading.Lock()

    def _send(self, *call: Any) -> None:
        with self.lock:
            self.out.write(json.dumps({"progress": list(call)}) + "\n")
            self.out.flush()

    def step(self, name: str) -> None:
        self._send("step", f"fresh process: {name}")

    def phase(self, bucket: int, name: str, total: Optional[int] = None) -> None:
        self._send("phase", bucket, f"fresh process: {name}", total)

    def advance(self, bucket: int) -> None:
        self._send("advance", bucket)

    def finish(self, result: BucketResult) -> None:
        pass


def main(parent: int) -> int:
    out = child_process.become_child(parent)
    # imported before the job is read: a spare (prestart) has torch, Dynamo and Inductor loaded by
    # the time it comes (imports only: this process compiles nothing)
    from orchestrator.jobs import torch_internals as ti
    from orchestrator.jobs.engine import Session

    ti.import_compiler(to_compile=True)

    job = sys.stdin.buffer.read()
    if not job:  # a spare no benchmark took
        return 0
    spec, cache_root, buckets, rank, profile_dir, profile_prefix = pickle.loads(job)
    session = Session(
        spec,
        cache_root,
        rank=rank,
        progress=_Forward(out),
        profile_dir=profile_dir,
        profile_prefix=profile_prefix,
        loads_only=True,
    )
    session.event("fresh process set up")
    try:
        for bucket in buckets:  # every bucket loaded before the first is timed, as the parent compiled them
            session.warm(bucket, benchmark=False)
        for bucket in buckets:
            session.benchmark(bucket)
    finally:
        session.close()
    answer = {
        "results": {r.bucket: r for r in session.run().results},
        "serving_files": list(session.serving_files),
        "quarantined": session.quarantined,
        "events": list(session.events),
    }
    out.write(json.dumps({"answer": base64.b64encode(pickle.dumps(answer)).decode()}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    child_process.end_child(main(int(sys.argv[1])))
