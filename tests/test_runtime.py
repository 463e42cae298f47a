"""The serving runtime on the CPU: a replica loads what warmup chose per bucket, pads every request
to its bucket and slices the outputs back, splits oversize requests, refuses bad ones without
breaking, and may be called from any thread."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, fresh_python, loads_settled, orchestrate

from orchestrator import runtime
from orchestrator.config import load_spec
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.engine import float64_outputs
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.model import build_model, make_inputs
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.replica import BucketedModel, BucketUsage, load_replica
from orchestrator.jobs.variants import write_plan

MODELS = """
import torch

class Rows(torch.nn.Module):
    # row-independent, so a padded row cannot change another row's output
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.linear(x))

class Tokens(torch.nn.Module):
    # a sequence bucket: ids [2, seq] and a mask [2, seq]; a dict output with the sequence at dim 1
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 4)

    def forward(self, ids, mask):
        hidden = self.embed(ids) * mask.unsqueeze(-1)
        return {"hidden": hidden, "count": mask.sum(), "first": hidden[:, :1]}

class Lies(Rows):
    # compiled, it answers twice what eager answers: the check at load must catch it
    def forward(self, x):
        out = super().forward(x)
        return out * 2 if torch.compiler.is_compiling() else out

class Coarse(Rows):
    # eager rounds its float32 answer to bfloat16's 8 bits, as TF32 kernels round their operands;
    # compiled, it answers exactly: closer to a float64 run than eager, and far from eager
    def forward(self, x):
        out = 100 * super().forward(x)
        if out.dtype == torch.float32 and not torch.compiler.is_compiling():
            return out.bfloat16().float()
        return out

def rows():
    return Rows()

def coarse():
    return Coarse()

def lies():
    return Lies()

def tokens():
    return Tokens()
"""


def config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def rows_config(tmp_path):
    return config(
        tmp_path,
        "model: {factory: models.py:rows}\ninputs: [{shape: [batch, 6]}]\nbuckets: [1, 4]\ndevice: cpu\n"
        "compile: {mode: default}\nbench: {iterations: 20, warmup: 2}\n",
    )


def eager_of(path: Path, n: int):
    spec = load_spec(path)
    model = build_model(spec, torch.device("cpu"))
    args, kwargs = make_inputs(spec, n, torch.device("cpu"))
    with torch.no_grad():
        return args, kwargs, model(*args, **kwargs)


def test_a_replica_whose_buckets_need_no_compile_never_imports_dynamo(rows_config, tmp_path):
    """Importing Dynamo costs seconds of a replica's start: only compiled buckets may pay it."""
    code = (
        "import sys, torch; from orchestrator import runtime; "
        f"served = runtime.load({str(rows_config)!r}, cache_dir={str(tmp_path / 'cache')!r}); "
        "served(torch.zeros(3, 6)); "
        "print(sorted({b.variant for b in served.info().buckets.values()}), 'torch._dynamo' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['eager']", "False"]


def test_a_trace_after_a_tracing_thread_has_exited_does_not_crash_the_process(rows_config, tmp_path):
    """torch 2.11 built for CUDA, on a machine without a usable GPU, crashes the process at the first
    trace with dynamic shapes after a thread that traced (a replica's loader) has exited, unless
    CUDA's device guard was set from a thread that outlives it: a load sets it from the caller's
    thread (torch_internals). Where CUDA is usable, or torch has no CUDA, or from 2.13 on, nothing
    crashes either way."""
    code = f"""
import threading, torch
from orchestrator import runtime
runtime.load({str(rows_config)!r}, cache_dir={str(tmp_path / "cache")!r})
def trace(dynamic):
    compiled = torch.compile(torch.nn.Linear(8, 8), dynamic=dynamic, backend="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 8))
loader = threading.Thread(target=trace, args=(False,))  # traces, as a loader does, and exits
loader.start()
loader.join()
trace(True)
print("traced")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["traced"]


def test_without_a_serving_plan_every_bucket_serves_eager_and_says_so(rows_config, tmp_path):
    served = runtime.load(rows_config, cache_dir=tmp_path / "cache")
    info = served.info()
    assert sorted(info.buckets) == [1, 4]
    for bucket_info in info.buckets.values():
        assert bucket_info.variant == "eager" and bucket_info.planned is None
        assert "no serving plan" in bucket_info.reason
    assert info.ready_seconds > 0 and info.dynamo_frames_compiled == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9])  # at, between and beyond the buckets (split)
def test_any_request_size_gives_the_models_own_answer(rows_config, tmp_path, n):
    served = runtime.load(rows_config, cache_dir=tmp_path / "cache")
    args, _, want = eager_of(rows_config, n)
    got = served(*args)
    assert got.shape == want.shape == (n, 3)
    torch.testing.assert_close(got, want)


def test_oversize_error_refuses_a_request_larger_than_the_largest_bucket(rows_config, tmp_path):
    text = rows_config.read_text() + "serve: {oversize: error}\n"
    rows_config.write_text(text)
    served = runtime.load(rows_config, cache_dir=tmp_path / "cache")
    with pytest.raises(runtime.BadRequest, match="larger than the largest bucket 4"):
        served(torch.randn(5, 6))
    assert served(torch.randn(4, 6)).shape == (4, 3)


@pytest.mark.parametrize(
    "args, kwargs, names",
    [
        ((), {}, "input"),  # nothing given
        ((torch.randn(2, 6), torch.randn(2, 6)), {}, "input"),  # one too many
        ((torch.randn(2, 6).double(),), {}, "float64"),
        ((torch.randn(2, 6, 1),), {}, "inputs[0]"),  # rank
        ((torch.randn(2, 5),), {}, "inputs[0]"),  # a fixed dimension of the wrong size
        (([[0.0] * 6],), {}, "inputs[0]"),  # not a tensor
        ((torch.randn(0, 6),), {}, "inputs[0]"),  # empty
        ((torch.randn(2, 6, device="meta"),), {}, "meta"),
    ],
)
def test_a_bad_request_is_refused_in_one_line_and_the_model_stays_usable(rows_config, tmp_path, args, kwargs, names):
    served = runtime.load(rows_config, cache_dir=tmp_path / "cache")
    with pytest.raises(runtime.BadRequest) as refused:
        served(*args, **kwargs)
    message = str(refused.value)
    assert names in message and "\n" not in message
    good, _, want = eager_of(rows_config, 3)
    torch.testing.assert_close(served(*good), want)


def test_a_sequence_bucket_pads_the_sequence_and_slices_dict_outputs(tmp_path):
    path = config(
        tmp_path,
        "model: {factory: models.py:tokens}\nbucket_symbol: seq\nbuckets: [4, 8]\ndevice: cpu\n"
        "inputs:\n  - {shape: [2, seq], dtype: int64, range: [1, 50], pad: 0}\n"
        "  - {shape: [2, seq], dtype: float32, pad: 0}\n",
    )
    served = runtime.load(path, cache_dir=tmp_path / "cache")
    ids = torch.randint(1, 50, (2, 6))
    mask = torch.ones(2, 6)
    got = served(ids, mask)
    spec = load_spec(path)
    with torch.no_grad():
        want = build_model(spec, torch.device("cpu"))(ids, mask)
    assert set(got) == {"hidden", "count", "first"}
    assert got["hidden"].shape == (2, 6, 4)
    torch.testing.assert_close(got["hidden"], want["hidden"])
    torch.testing.assert_close(got["first"], want["first"])
    # the mask's padding is 0: the masked sum over the padded bucket is the request's own
    torch.testing.assert_close(got["count"], want["count"])


def test_calls_from_other_threads_than_the_loaders_are_served(rows_config, tmp_path):
    served = runtime.load(rows_config, cache_dir=tmp_path / "cache")
    # references first, in this thread: building a model seeds torch's global generator
    expected = {n: eager_of(rows_config, n) for n in range(1, 9)}
    results: dict[int, torch.Tensor] = {}
    failures: list[BaseException] = []

    def call(n: int) -> None:
        try:
            args, _, want = expected[n]
            got = served(*args)
            torch.testing.assert_close(got, want)
            results[n] = got
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(n,)) for n in expected]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and sorted(results) == list(expected)


def test_a_planned_compiled_bucket_that_misses_the_cache_is_refused_with_require_warm(rows_config, tmp_path):
    spec = load_spec(rows_config)
    planned = {"eager": VariantMeasure(ok=True, ms=1.0), "compiled": VariantMeasure(ok=True, ms=0.5)}

    def cold_cache(name: str) -> Path:  # a plan that says compiled, and nothing compiled
        served = runtime.load(rows_config, cache_dir=tmp_path / name)
        write_plan(
            tmp_path / name / served.info().namespace,
            spec,
            BucketResult(bucket=4, variant="compiled", variants=planned),
        )
        return tmp_path / name

    with pytest.raises(runtime.NotWarm, match="bucket 4: variant compiled missed the cache"):
        runtime.load(rows_config, cache_dir=cold_cache("planned"), require_warm=True, ready="planned")
    # answering first: the bucket keeps serving eager with the refusal, and waiting for the plan raises it
    answering = runtime.load(rows_config, cache_dir=cold_cache("answering"), require_warm=True)
    with pytest.raises(runtime.NotWarm, match="bucket 4: variant compiled missed the cache"):
        answering.wait_loaded()
    row = answering.info().buckets[4]
    assert (row.variant, row.on_plan, row.loading) == ("eager", False, False)
    assert row.reason is not None and "missed the cache" in row.reason
    args, _, want = eager_of(rows_config, 4)
    torch.testing.assert_close(answering(*args), want)


def planned_cache(config: Path, root: Path, variant: str, buckets: tuple[int, ...], bounded: bool = False) -> Path:
    """A cache root whose namespace holds a serving plan naming `variant` for `buckets`, and nothing
    compiled: a replica compiles them (in the background) when it loads. `bounded`: each plan holds
    the bounds at load that warmup's gate sets from eager's distance to a float64 run."""
    spec = load_spec(config)
    measured = {"eager": VariantMeasure(ok=True, ms=1.0), variant: VariantMeasure(ok=True, ms=0.5)}
    namespace = root / runtime.load(config, cache_dir=root).info().namespace
    for bucket in buckets:
        bounds = load_bounds(config, bucket) if bounded else None
        write_plan(namespace, spec, BucketResult(bucket=bucket, variant=variant, variants=measured), None, bounds)
    return root


def load_bounds(path: Path, n: int) -> dict[str, float]:
    """What warmup's gate records for a replica's check at load: from eager and a float64 run."""
    cpu = torch.device("cpu")
    spec = load_spec(path)
    model = build_model(spec, cpu)
    args, kwargs = make_inputs(spec, n, cpu)
    with torch.no_grad():
        reference = snapshot(model(*args, **kwargs))
    runs, note = float64_outputs(model, [(args, kwargs)], cpu, reference)
    assert runs is not None, note
    return Gate().load_bounds(reference, runs[0])


def test_a_fault_of_the_loader_itself_leaves_every_bucket_on_eager_and_never_hangs(rows_config, tmp_path, monkeypatch):
    """Whatever breaks on the loader's thread, the replica keeps answering on eager, says why, and
    whoever waits for the plan gets the error instead of waiting for ever."""
    from orchestrator.jobs import torch_internals

    cache = planned_cache(rows_config, tmp_path / "cache", "compiled", (1, 4))

    def broken(**kwargs):
        raise RuntimeError("the compiler would not import")

    monkeypatch.setattr(torch_internals, "import_compiler", broken)
    with pytest.raises(RuntimeError, match="the compiler would not import"):
        runtime.load(rows_config, cache_dir=cache, ready="planned")
    served = runtime.load(rows_config, cache_dir=cache)
    with pytest.raises(RuntimeError, match="the compiler would not import"):
        served.wait_loaded(timeout=60)
    for row in served.info().buckets.values():
        assert (row.variant, row.on_plan, row.loading) == ("eager", False, False)
        assert row.reason == "compiled not loaded, serving eager: RuntimeError: the compiler would not import"
    args, _, want = eager_of(rows_config, 3)
    torch.testing.assert_close(served(*args), want)


def test_the_loader_hashes_tritons_build_beside_the_build_and_only_where_a_plan_compiles(
    rows_config, tmp_path, monkeypatch
):
    """Inductor's first cache load hashes Triton's build (seconds' worth of file hashing that lets
    go of the interpreter lock): the loader does it while the model builds, before the replica
    answers, on its own thread, and not at all where every bucket is planned on eager."""
    from orchestrator.jobs import torch_internals

    hashed: list[str] = []

    def hash_triton_build() -> bool:
        hashed.append(threading.current_thread().name)
        return True

    def no_compiler(**kwargs):  # nothing to load after answering: this test is about before it
        raise RuntimeError("the compiler is not imported in this test")

    monkeypatch.setattr(torch_internals, "hash_triton_build", hash_triton_build)
    monkeypatch.setattr(torch_internals, "import_compiler", no_compiler)
    monkeypatch.setattr(torch_internals, "cpu_vector_isa_probe", lambda: lambda: None)
    served = runtime.load(rows_config, cache_dir=planned_cache(rows_config, tmp_path / "compiled", "compiled", (1, 4)))
    with pytest.raises(RuntimeError, match="not imported in this test"):
        served.wait_loaded(timeout=60)
    events = [what for what, _ in served.info().events]
    assert hashed == ["orchestrate-replica-loader"]
    assert events.index("triton's build hashed") < events.index("answering")

    hashed.clear()
    served = runtime.load(rows_config, cache_dir=planned_cache(rows_config, tmp_path / "eager", "eager", (1, 4)))
    assert served.wait_loaded(timeout=60)
    assert hashed == [] and "triton's build hashed" not in [what for what, _ in served.info().events]


HASH_IN_A_FRESH_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])  # a Triton whose build hash records its calls
import torch
from orchestrator.jobs import torch_internals as ti
before = set(sys.modules)
hashed = ti.hash_triton_build()
import triton.runtime.cache as cache
imported = sorted(name for name in set(sys.modules) - before if name.startswith("torch"))
print(json.dumps({"hashed": hashed, "calls": cache.calls, "imported": imported}))
"""


def test_the_loaders_hash_of_tritons_build_imports_nothing_of_torch(tmp_path):
    """The hash runs on the loader's thread while the caller builds the model, whose imports (timm's,
    Hugging Face's) bring in Dynamo and Inductor's package: the hash must import none of torch's
    modules, or the two threads' imports can deadlock. It calls Triton's own memoised hash, the
    one Inductor's first load reads back."""
    runtime_dir = tmp_path / "triton" / "runtime"
    runtime_dir.mkdir(parents=True)
    (tmp_path / "triton" / "__init__.py").write_text("")
    (runtime_dir / "__init__.py").write_text("")
    (runtime_dir / "cache.py").write_text(
        "import functools\ncalls = []\n\n@functools.lru_cache()\ndef triton_key():\n"
        "    calls.append('hashed')\n    return 'a build'\n"
    )
    seen = json.loads(fresh_python(HASH_IN_A_FRESH_PROCESS, str(tmp_path)))
    assert seen == {"hashed": True, "calls": ["hashed"], "imported": []}


def test_on_the_cpu_the_loader_probes_the_cpu_beside_the_compilers_imports(rows_config, tmp_path, monkeypatch):
    """Inductor's first C++ kernel load probes the CPU's vector instructions in a child Python: on
    the CPU the loader runs that probe on a thread of its own while it imports the compiler (the
    probe waits here until the imports have begun, so it passes only if the two overlap), and the
    loads begin only once the probe is over."""
    from orchestrator.jobs import torch_internals

    importing = threading.Event()
    probed: list[tuple[str, bool]] = []
    steps: list[str] = []

    def cpu_vector_isa_probe():
        def probe() -> None:
            probed.append((threading.current_thread().name, importing.wait(timeout=60)))
            steps.append("probed")

        return probe

    def import_compiler(**kwargs):
        importing.set()
        steps.append("compiler imported")
        raise RuntimeError("nothing loads in this test")

    monkeypatch.setattr(torch_internals, "cpu_vector_isa_probe", cpu_vector_isa_probe)
    monkeypatch.setattr(torch_internals, "import_compiler", import_compiler)
    served = runtime.load(rows_config, cache_dir=planned_cache(rows_config, tmp_path / "cache", "compiled", (1, 4)))
    with pytest.raises(RuntimeError, match="nothing loads in this test"):
        served.wait_loaded(timeout=60)
    assert probed == [("orchestrate-isa-probe", True)]
    assert steps == ["compiler imported", "probed"]
    events = [what for what, _ in served.info().events]
    assert events.index("answering") < events.index("cpu probed") < events.index("settled")
    for row in served.info().buckets.values():  # the probe is over before anything loads: nothing did
        assert row.variant == "eager" and "nothing loads in this test" in (row.reason or "")


def test_a_load_holds_off_full_collections_until_its_buckets_settle(rows_config, tmp_path, monkeypatch):
    """A load makes most of the objects a replica will hold, and each of Python's full collections
    walks all of them: they wait until the buckets settle, and the collector is then given back as
    it was found, whether the buckets got their plans or not."""
    from orchestrator.jobs import torch_internals

    assert loads_settled(), "a replica's load in this process never settled"
    found = gc.get_threshold()

    def given_back() -> bool:  # the loader's thread gives it back just after it settles the buckets
        return loads_settled() and gc.get_threshold() == found

    served = runtime.load(rows_config, cache_dir=tmp_path / "plain")
    assert served.wait_loaded(timeout=60) and given_back()

    cache = planned_cache(rows_config, tmp_path / "cache", "compiled", (1, 4))
    during = []

    def importing(**kwargs):
        during.append(gc.get_threshold())
        raise RuntimeError("the compiler would not import")

    monkeypatch.setattr(torch_internals, "import_compiler", importing)
    served = runtime.load(rows_config, cache_dir=cache)
    with pytest.raises(RuntimeError, match="would not import"):
        served.wait_loaded(timeout=60)
    assert during and during[0][:2] == found[:2] and during[0][2] > found[2]
    assert given_back()


@pytest.mark.slow
def test_requests_sent_while_buckets_switch_get_the_models_answer_at_every_moment(rows_config, tmp_path):
    """A replica answers on eager while its planned variants compile in the background, switches
    each bucket between two calls, and no answer, before, during or after, differs from eager's."""
    cache = planned_cache(rows_config, tmp_path / "cache", "compiled", (1, 4))
    expected = {n: eager_of(rows_config, n) for n in range(1, 9)}  # before the load: a build seeds torch
    served = runtime.load(rows_config, cache_dir=cache)  # answering: the compiles run behind it
    assert served.info().ready == "answering"
    seen: list[tuple[bool, str]] = []  # per answer: still loading?, the variant serving its bucket
    failures: list[BaseException] = []

    def client(offset: int) -> None:
        deadline, after = time.monotonic() + 300, 0
        n = offset
        try:
            while after < 20 and time.monotonic() < deadline:
                loading = served.loading
                args, _, want = expected[n % 8 + 1]
                torch.testing.assert_close(served(*args), want)
                seen.append((loading, served.variant(1 if n % 8 + 1 == 1 else 4)))
                after += 0 if loading else 1
                n += 1
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    clients = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert failures == []
    assert served.wait_loaded(timeout=0)
    assert any(loading for loading, _ in seen) and any(variant == "compiled" for _, variant in seen)
    info = served.info()
    for row in info.buckets.values():
        assert (row.variant, row.on_plan, row.loading, row.reason) == ("compiled", True, False, None)
        assert row.on_plan_seconds is not None and row.on_plan_seconds >= info.answering_seconds
    assert info.on_plan and info.on_plan_seconds is not None and info.on_plan_seconds >= info.answering_seconds
    # in order: nothing of the loader's but its pull before the replica answers (the compiler's
    # imports and the loads would slow the build and the eager references), settled last
    events = [what for what, _ in info.events]
    assert events[0] == "model built" and events[-1] == "settled"
    assert events.index("answering") < events.index("compiler imported") < events.index("bucket 4 on compiled")
    assert events.index("bucket 4 on compiled") < events.index("bucket 1 on compiled")

    # ready="planned" returns only with every bucket on its plan: here from the cache just filled
    planned = runtime.load(rows_config, cache_dir=cache, ready="planned", require_warm=True)
    info = planned.info()
    assert info.ready == "planned" and not planned.loading and info.on_plan
    assert {b: (r.variant, r.on_plan) for b, r in info.buckets.items()} == {
        1: ("compiled", True),
        4: ("compiled", True),
    }
    assert info.on_plan_seconds is not None and info.ready_seconds >= info.on_plan_seconds >= info.answering_seconds
    args, _, want = expected[3]
    torch.testing.assert_close(planned(*args), want)


def test_a_replica_part_of_a_larger_whole_loads_nothing_before_the_whole_answers(rows_config, tmp_path, monkeypatch):
    """A grid's slice answers on eager and holds its loads until every slice answers: the loads
    would otherwise run beside the later slices' eager references, which the grid's answering
    waits on."""
    cache = planned_cache(rows_config, tmp_path / "cache", "compiled", (4,))
    began = threading.Event()  # the loader's first step after its pull: the compiler's imports
    importing = ti.import_compiler

    def import_compiler(*args, **kwargs):
        began.set()
        return importing(*args, **kwargs)

    monkeypatch.setattr(ti, "import_compiler", import_compiler)
    answered = threading.Event()
    served = load_replica(load_spec(rows_config), cache, answered=answered)
    args, _, want = eager_of(rows_config, 3)
    torch.testing.assert_close(served(*args), want)  # answering, on eager
    assert not began.wait(timeout=2.0)  # the whole has not answered: nothing loads
    assert served.variant(4) == "eager" and served.info().buckets[4].loading
    answered.set()
    assert began.wait(timeout=60) and served.wait_loaded(timeout=300)
    assert served.variant(4) == "compiled"
    torch.testing.assert_close(served(*args), want)


@pytest.mark.slow
def test_a_variant_that_fails_its_check_at_load_keeps_serving_eager_with_the_reason(tmp_path):
    lies = config(
        tmp_path,
        "model: {factory: models.py:lies}\ninputs: [{shape: [batch, 6]}]\nbuckets: [1, 4]\ndevice: cpu\n"
        "compile: {mode: default}\n",
    )
    cache = planned_cache(lies, tmp_path / "cache", "compiled", (4,))
    served = runtime.load(lies, cache_dir=cache, ready="planned")
    row = served.info().buckets[4]
    assert (row.variant, row.planned, row.on_plan, row.loading) == ("eager", "compiled", False, False)
    assert row.reason is not None and row.reason.startswith("compiled unavailable here, serving eager: ")
    assert "compiled at load" in row.reason  # the gate's own line: which call, which output, how far off
    assert not served.info().on_plan and not served.loading
    args, _, want = eager_of(lies, 4)
    torch.testing.assert_close(served(*args), want)
    # held to warmup's bound from float64: still far beyond it
    cache = planned_cache(lies, tmp_path / "bounded", "compiled", (4,), bounded=True)
    row = runtime.load(lies, cache_dir=cache, ready="planned").info().buckets[4]
    assert row.variant == "eager" and "output of the compiled at load is further from eager than warmup's" in str(
        row.reason
    )


def test_a_variant_closer_to_exact_than_eager_is_served_within_the_bound_warmup_set(tmp_path):
    """Eager that rounds (TF32 kernels, here bfloat16) is far from a compiled variant that does
    not, and a fixed float32 tolerance at load refused what warmup's float64 check had passed."""
    coarse = config(
        tmp_path,
        "model: {factory: models.py:coarse}\ninputs: [{shape: [batch, 6]}]\nbuckets: [4]\ndevice: cpu\n"
        "compile: {mode: null, backend: eager}\n",
    )
    bounds = load_bounds(coarse, 4)
    assert set(bounds) == {"output"} and bounds["output"] > 0
    row = runtime.load(coarse, cache_dir=planned_cache(coarse, tmp_path / "a", "compiled", (4,)), ready="planned")
    row = row.info().buckets[4]
    assert row.variant == "eager" and "exceeds atol=0.001" in str(row.reason)  # a plan without bounds

    cache = planned_cache(coarse, tmp_path / "b", "compiled", (4,), bounded=True)
    served = runtime.load(coarse, cache_dir=cache, ready="planned")
    row = served.info().buckets[4]
    assert (row.variant, row.on_plan, row.reason) == ("compiled", True, None)
    args, _, want = eager_of(coarse, 3)
    got = served(*args)
    assert got.shape == want.shape and not torch.equal(got, want)  # the exact answer, not eager's
    torch.testing.assert_close(got, want, atol=0.0, rtol=2**-8)


@pytest.mark.slow
def test_a_replica_serves_what_warmup_chose_from_the_published_store(rows_config, tmp_path, monkeypatch):
    """Warmup measures and publishes its choice; a replica on an empty cache directory pulls the
    signed store and loads each bucket on the chosen variant; a compiled one loads from the cache
    alone (require_warm)."""
    (tmp_path / "store").mkdir()
    store = f"file://{tmp_path / 'store'}"
    key = {"ORCHESTRATE_CACHE_SIGNING_KEY": "6b" * 32}  # an Ed25519 private key (seed, hex)
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(rows_config),
        "--remote",
        store,
        "--json",
        cache_dir=tmp_path / "warm",
        env=key,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    chosen = {r["bucket"]: r["variant"] for r in report["results"]}
    for result in report["results"]:
        assert list(result["variants"]) == ["eager", "compiled"]
        assert all(v["ok"] and v["ms"] > 0 for v in result["variants"].values())
        assert result["variant"] in ("eager", "compiled")
    monkeypatch.setenv("ORCHESTRATE_CACHE_SIGNING_KEY", key["ORCHESTRATE_CACHE_SIGNING_KEY"])
    served = runtime.load(rows_config, cache_dir=tmp_path / "replica", remote=store, require_warm=True, ready="planned")
    info = served.info()
    assert info.pull is not None and info.pull.files > 0
    assert {b: i.planned for b, i in info.buckets.items()} == chosen
    assert {b: i.variant for b, i in info.buckets.items()} == chosen
    assert all(i.cache_misses == 0 for i in info.buckets.values())
    args, _, want = eager_of(rows_config, 3)
    torch.testing.assert_close(served(*args), want)

    # whatever was chosen, the compiled artifacts of every bucket were published: a plan that
    # says `compiled` loads them with no miss
    spec = load_spec(rows_config)
    measured = {"eager": VariantMeasure(ok=True, ms=1.0), "compiled": VariantMeasure(ok=True, ms=0.5)}
    for bucket in (1, 4):
        write_plan(
            tmp_path / "replica" / info.namespace, spec, BucketResult(bucket, variant="compiled", variants=measured)
        )
    compiled = runtime.load(rows_config, cache_dir=tmp_path / "replica", require_warm=True, ready="planned")
    assert {b: i.variant for b, i in compiled.info().buckets.items()} == {1: "compiled", 4: "compiled"}
    assert all(i.cache_misses == 0 and i.cache_hits > 0 for i in compiled.info().buckets.values())
    for n in (1, 3, 4, 6):
        args, _, want = eager_of(rows_config, n)
        torch.testing.assert_close(compiled(*args), want)
    # a bucket-shaped request of the wrong dtype is not taken for the bucket: refused in one line
    with pytest.raises(runtime.BadRequest, match="float64, expected float32"):
        compiled(torch.zeros(4, 6, dtype=torch.float64))


def test_a_replica_refuses_a_tampered_store_and_leaves_no_namespace_behind(rows_config, tmp_path):
    """The replica pulls before it loads anything: a shard altered in the store fails the load
    with the store's error, and the namespace directory it made for the pull goes with it."""
    from orchestrator.cache import sync
    from orchestrator.cache.namespace import namespace
    from orchestrator.cache.store import open_store
    from orchestrator.jobs import torch_internals as ti

    spec = load_spec(rows_config)
    name = namespace(spec.label, ti.current_platform(torch.device("cpu")), spec.identity_hash())
    published = tmp_path / "published" / name
    (published / "inductor").mkdir(parents=True)
    (published / "inductor" / "entry").write_bytes(b"artifact")
    (tmp_path / "store").mkdir()
    store = open_store(f"file://{tmp_path / 'store'}")
    sync.publish(store, published, name, None, allow_unsigned=True)
    shard = next(p for p in (tmp_path / "store" / "v1" / "objects").rglob("*") if p.is_file())
    shard.write_bytes(shard.read_bytes()[:-8] + b"tampered")  # its declared size, other bytes

    replica = tmp_path / "replica"
    with pytest.raises(sync.BadShard, match="does not match its sha256"):
        runtime.load(rows_config, cache_dir=replica, remote=store.url, allow_unsigned=True)
    assert not (replica / name).exists()


def test_a_model_never_warmed_here_is_refused_with_require_warm(rows_config, tmp_path):
    never = r"bucket \d+: no serving plan in .*; warm this platform first \(orchestrate warmup\)"
    with pytest.raises(runtime.NotWarm, match=never):
        runtime.load(rows_config, cache_dir=tmp_path / "planned", require_warm=True, ready="planned")
    # answering first: every bucket serves eager with the refusal, and waiting for the plan raises it
    answering = runtime.load(rows_config, cache_dir=tmp_path / "answering", require_warm=True)
    with pytest.raises(runtime.NotWarm, match=never):
        answering.wait_loaded()
    assert all(row.variant == "eager" and "not warm" in str(row.reason) for row in answering.info().buckets.values())
    args, _, want = eager_of(rows_config, 4)
    torch.testing.assert_close(answering(*args), want)
    # without require_warm, the same cache serves eager as before: nothing was asked to be warm
    assert runtime.load(rows_config, cache_dir=tmp_path / "answering").wait_loaded(60)


def test_warmups_served_figure_is_a_replica_call_of_its_variant():
    """What warmup times as a bucket's served latency (engine: _as_a_replica_serves) is a replica's
    own call of the bucket's exact shapes: the request's lookup, the lock and the runner, counted
    as a replica counts a call."""
    spec = load_spec(ROOT / "tests/configs/mlp.yaml")
    cpu = torch.device("cpu")
    model = build_model(spec, cpu)
    seen = []

    def runner(*args, **kwargs):
        seen.append(tuple(args[0].shape))
        return model(*args, **kwargs)

    served = BucketedModel.serving(spec, cpu, model, 8, "compiled", runner)
    args, kwargs = make_inputs(spec, 8, cpu)
    with torch.no_grad():
        torch.testing.assert_close(served(*args, **kwargs), model(*args, **kwargs))
        served(*args, **kwargs)
    assert seen == [tuple(args[0].shape)] * 2
    assert served.info().buckets[8].variant == "compiled" and served.info().buckets[8].on_plan
    assert served.usage()[8] == BucketUsage(calls=2, rows=16, padded_rows=0)
