"""Small pieces with exact answers: statistics, compile kwargs, cache identity, local store."""

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch
from conftest import ROOT

from orchestrator.cache.local import LocalCache
from orchestrator.cache.namespace import Platform, namespace
from orchestrator.jobs import timing
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.timing import LEAD_CALLS, Clock, HostMeter, block_plan, median, p90

PLATFORM = Platform(
    torch_version="2.11.0+cu130",
    torch_git="abc",
    triton_version="3.6.0",
    cuda_version="13.0",
    gpu_name="NVIDIA H200",
    python_version="3.12.3",
)


def test_median_and_p90():
    samples = [float(x) for x in range(1, 11)]
    assert median(samples) == 5.5
    assert p90(samples) == 9.0
    assert p90([3.0]) == 3.0


def test_interleaved_times_blocks_in_alternating_order():
    calls = []
    clock = Clock(torch.device("cpu"))
    samples = clock.interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, iterations=4, warmup=1
    ).samples
    # warm-up, then a block per variant per round (2 untimed lead calls + 1 timed), order reversed each round
    assert block_plan(4) == [1, 1, 1, 1]
    block = lambda v: [v] * (LEAD_CALLS + 1)  # noqa: E731
    assert calls == ["a", "b"] + block("a") + block("b") + block("b") + block("a") + block("a") + block("b") + block(
        "b"
    ) + block("a")
    assert len(samples["a"]) == len(samples["b"]) == 4
    assert all(s >= 0 for s in samples["a"] + samples["b"])


def test_a_warm_up_runs_its_calls_and_then_on_until_its_seconds_have_passed():
    """A GPU left idle by a compile runs slow for a while once busy again, and a small model's
    whole benchmark is a few ms: the untimed calls before it go on for a time, not only a count,
    each variant in turn and each call to its end."""
    now, calls = [0.0], []

    def call(name: str, ms: float) -> Callable[[], None]:
        def run() -> None:
            now[0] += ms / 1e3
            calls.append(name)

        return run

    clock = Clock(torch.device("cpu"), timer=lambda: now[0])
    clock.warm_up({"eager": call("eager", 0.02), "graphed": call("graphed", 0.01)}, calls=3, seconds=0.003)
    assert calls[:4] == ["eager", "graphed", "eager", "graphed"]
    assert len(calls) // 2 == pytest.approx(100, abs=1)  # turns of 30 µs until 3 ms had passed
    calls.clear()
    clock.warm_up({"eager": call("eager", 5.0)}, calls=3, seconds=0.003)
    assert calls == ["eager"] * 3  # a slow call: its count, the seconds long passed
    clock.warm_up({}, calls=3, seconds=1.0)  # nothing to call: nothing to wait for


def test_block_plan_keeps_five_rounds_and_the_count():
    assert block_plan(100) == [20] * 5
    assert block_plan(50) == [10] * 5
    assert block_plan(7) == [1] * 7
    assert block_plan(403) == [20] * 20 + [3]
    assert sum(block_plan(1)) == 1


def test_a_variant_timed_after_another_is_not_charged_for_the_switch():
    """Recorded timings: the tiny model's eager call took 0.079 ms after itself and 0.126 ms right
    after the reduce-overhead call (the switch). A replica serves one variant, so eager's figure
    must be 0.079, whatever ran before its block."""
    now = [0.0]
    last = [None]

    def call(name: str, steady_ms: float) -> Callable[[], None]:
        def run() -> None:
            now[0] += (0.126 if name == "eager" and last[0] == "compiled" else steady_ms) / 1e3
            last[0] = name

        return run

    clock = Clock(torch.device("cpu"), timer=lambda: now[0], host=HostMeter(lambda: 1.0))
    samples = clock.interleaved({"eager": call("eager", 0.079), "compiled": call("compiled", 0.050)}, 100, 5).samples
    assert max(samples["eager"]) == pytest.approx(0.079)
    assert median(samples["compiled"]) == pytest.approx(0.050)


class SlowedHost:
    """A host that runs host-bound work twice as slowly in some rounds, as a shared VM does for
    seconds at a time: the meter reads 2.0 there, 1.0 elsewhere. The clock reads the meter before
    each of a round's two blocks and after the round, so reading k falls in round k // 3."""

    def __init__(self, slowed_rounds: Callable[[int], bool]) -> None:
        self.slowed_rounds, self.readings, self.now = slowed_rounds, 0, 0.0
        self.meter = HostMeter(self.read)

    @property
    def slowed(self) -> bool:
        return self.slowed_rounds((self.readings - 1) // 3)

    def read(self) -> float:
        self.readings += 1
        return 2.0 if self.slowed else 1.0

    def call(self, host_bound_ms: float, device_ms: float) -> Callable[[], None]:
        def run() -> None:
            self.now += (host_bound_ms * (2 if self.slowed else 1) + device_ms) / 1e3

        return run


def test_rounds_the_host_ran_slowed_in_are_timed_again_and_left_out():
    """Recorded shape: BERT's bucket-1 eager read 1.7x slow in a warmup whose host was slowed,
    while the graph replay, bound by the device, did not move. The slowed rounds must not reach
    either variant's samples (the pairs stay whole), and the rounds asked for are made up."""
    host = SlowedHost(lambda i: i in (1, 2))
    clock = Clock(torch.device("cpu"), timer=lambda: host.now, host=host.meter)
    timed = clock.interleaved({"eager": host.call(4.7, 0.0), "graphed": host.call(0.0, 1.0)}, 50, 2)
    assert (timed.rounds, timed.slowed, timed.steady) == (7, 2, True)
    assert len(timed.samples["eager"]) == len(timed.samples["graphed"]) == 50
    assert max(timed.samples["eager"]) == pytest.approx(4.7)
    assert median(timed.samples["eager"]) / median(timed.samples["graphed"]) == pytest.approx(4.7)
    assert len(timed.host_ms) == 7 and max(timed.host_ms) == 2000.0
    assert timed.kept_host_ms == [1000.0] * 5  # the speed the kept samples were timed at


def test_a_record_says_what_speed_its_host_ran_at_in_the_rounds_it_kept():
    """Two runs of a bucket's benchmark (the first, then more rounds of two variants): the record
    gives the kept rounds' median reading over both, beside the best reading, in µs."""
    from orchestrator.jobs.engine import _HostRecord
    from orchestrator.jobs.records import BucketResult

    host = SlowedHost(lambda i: i in (1, 2))
    clock = Clock(torch.device("cpu"), timer=lambda: host.now, host=host.meter)
    result = BucketResult(bucket=8, status="ok")
    record = _HostRecord(result, clock.host)
    record.add(clock.interleaved({"eager": host.call(4.7, 0.0), "graphed": host.call(0.0, 1.0)}, 50, 2))
    record.add(clock.interleaved({"graphed": host.call(0.0, 1.0)}, 10, 1))
    assert (result.bench_rounds, result.host_slowed_rounds, result.host_steady) == (12, 2, True)
    assert result.host_reading_us == result.host_best_us == 1e6  # the meter's 1.0 s, in µs
    assert _HostRecord(BucketResult(bucket=8, status="ok"), None).result.host_reading_us is None  # CPU: no meter


def test_a_host_slowed_for_most_of_the_benchmark_keeps_every_round_and_is_not_steady():
    host = SlowedHost(lambda i: i > 0)
    clock = Clock(torch.device("cpu"), timer=lambda: host.now, host=host.meter)
    timed = clock.interleaved({"eager": host.call(4.7, 0.0), "graphed": host.call(0.0, 1.0)}, 50, 2)
    assert timed.steady is False
    assert timed.rounds == 5 + 3 * 5 and timed.slowed == timed.rounds - 1  # every retake spent
    assert len(timed.samples["eager"]) == 10 * timed.rounds  # nothing selected: all kept
    assert median(timed.samples["eager"]) == pytest.approx(9.4)


def test_a_benchmark_wholly_within_a_slowed_stretch_is_judged_by_the_process_s_best_reading():
    """Every round of the benchmark as planned reads alike, slowed: judged among themselves they
    would all pass. The meter's reading at an earlier stage of the process says what full speed
    is, so they are retaken until the host is back at it."""
    host = SlowedHost(lambda i: 1 <= i <= 5)
    host.meter()  # a stage before the benchmark, at full speed: round "0" of the script
    host.readings = 3
    clock = Clock(torch.device("cpu"), timer=lambda: host.now, host=host.meter)
    timed = clock.interleaved({"eager": host.call(4.7, 0.0), "graphed": host.call(0.0, 1.0)}, 50, 0)
    assert (timed.rounds, timed.slowed, timed.steady) == (10, 5, True)
    assert median(timed.samples["eager"]) == pytest.approx(4.7)


needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to choose from"
)


@needs_two_cores
def test_the_benchmark_thread_runs_on_the_core_the_meter_reads_fastest():
    """Recorded shape: on the H200's 16-core guest, 5 cores read the meter at 63-89 µs and the
    rest at 37-40 µs, at the same moment. The fastest core is chosen, each core read in turns."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    slow, fast = cores
    seen = []

    def meter() -> float:
        (core,) = os.sched_getaffinity(0)
        seen.append(core)
        return 80e-6 if core == slow else 38e-6

    before = os.sched_getaffinity(0)
    try:
        assert timing.fastest_core(cores, readings=3, meter=meter) == fast
        assert seen == cores * 3  # round-robin: a slowed moment falls on every core alike
    finally:
        os.sched_setaffinity(0, before)


@needs_two_cores
def test_a_benchmark_gives_its_thread_back_every_core_it_had():
    before = os.sched_getaffinity(0)
    with timing.on_fastest_core() as core:
        assert os.sched_getaffinity(0) == {core} and core in before
        assert timing.move_to_fastest_core() in before
    assert os.sched_getaffinity(0) == before
    assert timing.move_to_fastest_core() is None  # outside one, nothing moves
    with timing.on_fastest_core(enabled=False) as core:
        assert core is None and os.sched_getaffinity(0) == before


def test_back_to_back_times_blocks_of_calls():
    calls = []
    samples = Clock(torch.device("cpu")).back_to_back({"a": lambda: calls.append(1)}, rounds=3, calls=5)
    assert len(calls) == 3 * (1 + 5) and len(samples["a"]) == 3  # each round: one untimed call, five timed


class RecordedCuda:
    """torch.cuda's timing calls as they happen, in order: what a GPU sample holds between its
    two events. A record without a stream looks the current stream up itself, as torch's does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[str] = []
        log = self.log

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                pass

            def record(self, stream: object = None) -> None:
                if stream is None:
                    log.append("stream lookup")
                log.append("event")

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, other: "Event") -> float:
                return 0.05

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: log.append("stream lookup") or "stream")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))

    def between_events(self) -> list[list[str]]:
        events = [i for i, entry in enumerate(self.log) if entry == "event"]
        return [self.log[a + 1 : b] for a, b in zip(events[::2], events[1::2], strict=True)]


def test_a_gpu_sample_holds_the_calls_alone(monkeypatch):
    """Recorded shape: a host-bound model of 0.031 ms per call read 0.038-0.042 ms in the report,
    each sample's end event recorded on a stream looked up after the call. Only the calls lie
    between a sample's two events, in a latency block and a throughput block alike."""
    cuda = RecordedCuda(monkeypatch)
    clock = Clock(torch.device("cuda"), host=HostMeter(lambda: 1.0))
    timed = clock.interleaved({"eager": lambda: cuda.log.append("call")}, iterations=5, warmup=1)
    clock.back_to_back({"eager": lambda: cuda.log.append("call")}, rounds=2, calls=3)
    assert timed.samples["eager"] == [0.05] * 5
    assert cuda.between_events() == [["call"]] * 5 + [["call"] * 3] * 2


def test_a_benchmark_waits_for_the_compile_workers_inductor_is_still_starting(monkeypatch):
    """Inductor starts its pool of compile workers at a compile with CUDA inputs and does not wait
    for it; the pool's start-up (a sidecar that imports torch, a worker forked per compile thread)
    ran beside the first bucket's benchmark. The wait ends when the pool is ready, and never starts
    a pool where there is none."""
    import torch._inductor.async_compile as async_compile

    pool = async_compile.AsyncCompile.process_pool
    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", None)
    assert ti.wait_for_compile_workers() is False
    assert pool.cache_info().currsize == 0  # nothing started

    starting: Future[str] = Future()
    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", starting)
    threading.Timer(0.3, starting.set_result, ["ready"]).start()
    assert ti.wait_for_compile_workers() is True and starting.done()
    assert ti.wait_for_compile_workers() is False  # started: nothing left to wait for

    broken: Future[str] = Future()
    broken.set_exception(RuntimeError("BrokenProcessPool"))
    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", broken)
    assert ti.wait_for_compile_workers() is False  # ended, if badly: Inductor reports it at its next use
    hanging: Future[str] = Future()
    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", hanging)
    assert ti.wait_for_compile_workers(timeout=0.1) is True  # waited as long as allowed, then goes on
    assert ti.wait_for_compile_workers(timeout=30) is False  # and not again: the next bucket does not wait


@pytest.mark.slow  # one compile on the CPU
def test_no_benchmark_starts_before_the_compile_workers_have(tmp_path, monkeypatch):
    from orchestrator.config import load_spec
    from orchestrator.jobs import engine

    order: list[str] = []
    monkeypatch.setattr(ti, "wait_for_compile_workers", lambda: order.append("workers started") or True)
    timed = Clock.interleaved

    def interleaved(self, *args, **kwargs):
        order.append("timed")
        return timed(self, *args, **kwargs)

    monkeypatch.setattr(Clock, "interleaved", interleaved)
    session = engine.Session(load_spec(ROOT / "tests/configs/mlp.yaml"), tmp_path / "cache")
    try:
        result = session.warm(8)
    finally:
        session.close()
    assert result.status == "ok", result.error_detail
    assert order[0] == "workers started" and "timed" in order
    assert "compile workers started" in [what for what, _ in session.events]


def test_compile_kwargs_folds_mode_into_options():
    assert ti.compile_kwargs("reduce-overhead", False, False, "inductor", {}) == {
        "dynamic": False,
        "fullgraph": False,
        "backend": "inductor",
        "mode": "reduce-overhead",
    }
    merged = ti.compile_kwargs("reduce-overhead", False, True, "inductor", {"max_autotune": True})
    assert "mode" not in merged
    assert merged["options"]["triton.cudagraphs"] is True  # what reduce-overhead means
    assert merged["options"]["max_autotune"] is True
    # the merged options are accepted by torch.compile as they are
    torch.compile(torch.nn.Linear(2, 2), **merged)


@pytest.mark.parametrize(
    "field, value",
    [
        ("torch_version", "2.13.0"),
        ("torch_git", "def"),
        ("triton_version", None),
        ("cuda_version", "12.8"),
        ("gpu_name", "NVIDIA H100 80GB HBM3"),
        ("python_version", "3.11.7"),
    ],
)
def test_namespace_separates_every_incompatibility(field, value):
    assert namespace("mlp", PLATFORM, "c" * 64) != namespace("mlp", replace(PLATFORM, **{field: value}), "c" * 64)


def test_namespace_is_stable_and_readable():
    name = namespace("mlp", PLATFORM, "c" * 64)
    assert name == namespace("mlp", PLATFORM, "c" * 64)
    assert name != namespace("mlp", PLATFORM, "d" * 64)
    assert name.startswith("mlp-torch2.11.0-nvidia-h200-")


def test_local_cache_wipe_removes_only_its_namespace(tmp_path):
    mine, other = LocalCache(tmp_path, "a").prepare(), LocalCache(tmp_path, "b").prepare()
    (mine.inductor_dir / "entry").write_text("x")
    (other.inductor_dir / "entry").write_text("y")
    assert mine.usage() == (1, 1)
    mine.wipe()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert (other.inductor_dir / "entry").read_text() == "y"
    mine.wipe()  # nothing there: no error


def test_priming_the_compiler_leaves_the_real_cache_untouched(tmp_path, monkeypatch):
    """A rank primes Dynamo/Inductor with a throwaway compile while it waits; that compile must
    not land in the cache directory the rank loads from (and may be asked to serve)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    before = ti.CounterWindow()
    ti.prime_compiler(torch.device("cpu"))
    assert before.stats().frames_compiled == 1  # it did compile
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor") and "TRITON_CACHE_DIR" not in os.environ
    assert not cache.exists()


def test_trace_ahead_only_wraps_inductor():
    """Another backend (or options torch.compile itself pops) compiles plainly: nothing to defer."""
    model = torch.nn.Linear(4, 4)
    kwargs = ti.compile_kwargs(None, False, False, "eager", {})
    assert ti.compile_model(model, kwargs, trace_ahead=True)[1] is None
    inductor = ti.compile_kwargs("reduce-overhead", False, False, "inductor", {})
    assert ti.compile_model(model, inductor)[1] is None
    assert isinstance(ti.compile_model(model, inductor, trace_ahead=True)[1], ti.TraceAhead)


def test_a_traced_ahead_graph_runs_as_traced_until_the_block_ends():
    """Inside tracing_only the traced graph runs uncompiled (the right answer, nothing looked up);
    the next call hands it to the backend, once."""
    handed: list[int] = []

    def backend(gm, example_inputs):
        handed.append(len(example_inputs))
        return gm.forward

    tracer = ti.TraceAhead(backend)
    compiled = torch.compile(lambda x: torch.relu(x) * 2, backend=tracer)
    x = torch.randn(3)
    with tracer.tracing_only():
        assert torch.equal(compiled(x), torch.relu(x) * 2)
    assert handed == []
    assert torch.equal(compiled(x), torch.relu(x) * 2) and torch.equal(compiled(x), torch.relu(x) * 2)
    assert handed == [1]


def test_a_loaded_kernel_looks_for_its_tuned_config_in_this_processs_cache(tmp_path, monkeypatch):
    """A kernel autotuner unpickled from an FX-graph cache entry still names the compiling
    process's source path; the GPU test shows the cost (every config benchmarked again at a
    load). Here: the patch is on the torch CI runs, idempotent, and rebases only onto a copy that
    exists, through torch's own recheck."""
    from types import SimpleNamespace

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    ti.find_tuned_configs_where_loaded()
    ti.find_tuned_configs_where_loaded()
    recheck = CachingAutotuner.recheck_autotune_cache
    assert recheck._finds_tuned_configs_where_loaded
    assert not hasattr(recheck.__wrapped__, "_finds_tuned_configs_where_loaded")  # wrapped once

    class Unpickled(CachingAutotuner):
        def __init__(self, filename: str) -> None:  # the state torch's recheck reads, nothing more
            self.filename, self.compile_results, self.inductor_meta = filename, [], {}
            self.fn = SimpleNamespace()

        def is_statically_launchable(self) -> bool:
            return True

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "here"))
    (tmp_path / "here" / "ab").mkdir(parents=True)
    (tmp_path / "here" / "ab" / "cabkernel.py").write_text("# this process's copy\n")
    pulled = Unpickled("/elsewhere/compile-b8/inductor/ab/cabkernel.py")
    pulled.recheck_autotune_cache(reload_kernel_from_src=lambda: None)
    assert pulled.filename == str(tmp_path / "here" / "ab" / "cabkernel.py")
    assert pulled.autotune_cache_info is not None  # torch's own recheck ran after the rebase

    missing = Unpickled("/elsewhere/compile-b8/inductor/cd/ccdkernel.py")  # no copy here: left as it was
    missing.recheck_autotune_cache(reload_kernel_from_src=lambda: None)
    assert missing.filename == "/elsewhere/compile-b8/inductor/cd/ccdkernel.py"


# How this process pickles a torch constant, as every cache key does, before and after
# pickle_torch_names_as_a_plain_process.
PICKLED_NAME = """
import json, pickle, sys
{imported_first}
import torch
from orchestrator.jobs import torch_internals as ti
before = pickle.dumps(torch.contiguous_format).hex()
moved = ti.pickle_torch_names_as_a_plain_process()
print(json.dumps({{"before": before, "after": pickle.dumps(torch.contiguous_format).hex(), "moved": moved}}))
"""


def test_a_process_that_imported_cython_first_computes_a_plain_processs_cache_keys():
    """pydantic.v1 imports Cython's shadow module where Cython is installed (a Ray worker does, on
    the GPU image), and its `cython.cimports.libc` resolves any name: pickle then names torch's
    constants after it, and every cache key differs from a plain server's, which then hits nothing."""
    pytest.importorskip("Cython")

    def pickled(imported_first: str) -> dict:
        script = PICKLED_NAME.format(imported_first=imported_first)
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    plain, shadowed = pickled(""), pickled("import pydantic.v1")
    assert plain["moved"] == [] and plain["after"] == plain["before"]
    assert shadowed["before"] != plain["before"]  # a Ray worker's keys before the move, where Cython is installed
    assert "cython.cimports.libc" in shadowed["moved"]
    assert shadowed["after"] == plain["before"]


def test_ray_workers_run_torch_with_the_threads_a_plain_process_has(monkeypatch):
    """Ray's OMP_NUM_THREADS=max(1, num_cpus) would reach torch, and Inductor keys CPU kernels on
    torch's thread count: a worker drops it, or takes the driver's count when one was given."""
    from orchestrator.jobs.workers import TORCH_THREADS_ENV, threads_as_a_plain_process

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as Ray starts an actor with num_cpus=1
    monkeypatch.delenv(TORCH_THREADS_ENV, raising=False)
    threads_as_a_plain_process()
    assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(TORCH_THREADS_ENV, "6")
    threads_as_a_plain_process()
    assert os.environ["OMP_NUM_THREADS"] == "6"


def test_tidying_a_node_after_a_job_removes_only_what_the_jobs_stopped_workers_left(tmp_path):
    """After a job that ended early: its compile directories, a pull's staging and the model's
    empty namespace go; another job's compile directory, a cache holding files and another
    model's namespace stay."""
    from orchestrator.config import load_spec
    from orchestrator.jobs.records import Remote
    from orchestrator.jobs.workers import FleetJob, Host, tidy_node

    spec = load_spec(ROOT / "examples" / "mlp.yaml")
    job = FleetJob(spec, tmp_path, Remote("file:///nowhere"), lambda: Host("10.0.0.7", []))
    node = tmp_path / "node-10.0.0.7"
    ours = [job.compile_dir(1), job.compile_dir(8)]
    theirs = node / ".compile-0badcafe-b1-12345678"
    empty = node / namespace(spec.label, PLATFORM, "a" * 64)
    full = node / namespace(spec.label, replace(PLATFORM, gpu_name="NVIDIA A100"), "b" * 64)
    staging = node / f".incoming-{empty.name}-0123abcd"
    other_model = node / namespace("resnet", PLATFORM, "c" * 64)
    for folder in [*ours, theirs, empty / "inductor", full / "inductor", staging, other_model / "inductor"]:
        folder.mkdir(parents=True)
    (ours[0] / "half-written.so").write_bytes(b"x")
    (full / "inductor" / "entry").write_bytes(b"x")

    tidy_node(job)

    assert sorted(p.name for p in node.iterdir()) == sorted([theirs.name, full.name, other_model.name])
    assert (full / "inductor" / "entry").is_file()


def test_tidying_a_node_the_job_left_clean_removes_its_empty_directory(tmp_path):
    from orchestrator.config import load_spec
    from orchestrator.jobs.records import Remote
    from orchestrator.jobs.workers import FleetJob, Host, tidy_node

    job = FleetJob(
        load_spec(ROOT / "examples" / "mlp.yaml"), tmp_path, Remote("file:///x"), lambda: Host("10.0.0.7", [])
    )
    job.compile_dir(1).mkdir(parents=True)
    tidy_node(job)
    assert list(tmp_path.iterdir()) == []
    tidy_node(job)  # and a node it never reached is nothing to tidy


def test_every_thread_gets_a_manager_of_cuda_graph_trees_of_its_own():
    import threading

    from torch._inductor import cudagraph_trees as trees

    managers = {}

    def look(name: str) -> None:
        ti.cudagraph_trees_on_this_thread()
        ti.cudagraph_trees_on_this_thread()  # a second call keeps what the first gave
        managers[name] = trees.get_obj(trees.local, "tree_manager_containers")

    for name in ("a", "b"):
        thread = threading.Thread(target=look, args=(name,))
        thread.start()
        thread.join()
    look("main")
    assert managers["main"] is trees.get_obj(trees.local, "tree_manager_containers")
    # never one shared between threads: on torch 2.11 that crashes the process
    assert len({id(m) for m in managers.values()}) == 3


def test_a_missing_torchvision_is_told_the_build_that_matches_this_torch(monkeypatch):
    from importlib import metadata

    from orchestrator.jobs.errors import install_hint

    assert install_hint("mymodels.zoo") == "install it or use 'path/to/file.py:callable'"
    for torch_version, command in [
        ("2.13.0+cpu", "'torchvision==0.28.*' --index-url https://download.pytorch.org/whl/cpu"),
        ("2.11.0+cu130", "'torchvision==0.26.*' --index-url https://download.pytorch.org/whl/cu130"),
        ("2.13.0", "'torchvision==0.28.*'"),  # PyPI's own build: from PyPI
    ]:
        monkeypatch.setattr(metadata, "version", lambda name, v=torch_version: v)
        hint = install_hint("torchvision.models")
        assert hint.endswith(f".venv/bin/pip install {command} (scripts/install.sh --examples does it)"), hint
        assert torch_version in hint
