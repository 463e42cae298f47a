"""The `aot` serving variant on the CPU: warmup compiles one function per bucket ahead of time and
publishes it signed; a fresh replica process pulls it into an empty directory and serves the
bucket from that file, with no Dynamo frame compiled and no Inductor cache to read. A model that
cannot be compiled whole keeps its bucket, served by the next-best variant, with torch's reason
in the report."""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import ROOT, fresh_python, orchestrate

from orchestrator.cache.manifest import SigningKey
from orchestrator.cache.namespace import Platform
from orchestrator.config import load_spec
from orchestrator.jobs import aot, aot_builds
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.aot_builds import AheadBuildError, AheadBuilds, remove_stale
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.variants import read_plans, write_plan

MODELS = """
import os, sys, time
import torch

class Deep(torch.nn.Module):
    # launch-bound: many small layers, where one compiled C++ call beats eager's per-op overhead
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            *[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.GELU()) for _ in range(12)]
        )

    def forward(self, x):
        return self.layers(x)

class Branchy(torch.nn.Module):
    # control flow on a value: Dynamo breaks the graph and carries on, a whole-graph compile cannot
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        if y.sum() > 0:
            return y * 2
        return y - 1

def deep():
    if os.environ.get("MODEL_BUILDS"):  # which processes build the model
        with open(os.environ["MODEL_BUILDS"], "a") as builds:
            builds.write(f"{os.getpid()}\\n")
    if os.environ.get("MODEL_EXITS"):  # which of them run their exit handlers
        import atexit
        atexit.register(lambda: open(os.environ["MODEL_EXITS"], "a").write(f"{os.getpid()}\\n"))
    if os.environ.get("MODEL_CACHES"):  # and in which Inductor cache
        with open(os.environ["MODEL_CACHES"], "a") as caches:
            caches.write(f"{os.environ.get('TORCHINDUCTOR_CACHE_DIR')}\\n")
    if "aot_builds" in sys.argv[0] and os.environ.get("AOT_BUILDER") == "fails":
        raise RuntimeError("this model does not build in the aot builder")
    if "aot_builds" in sys.argv[0] and os.environ.get("AOT_BUILDER") == "slow":
        time.sleep(120)
    return Deep()

def branchy():
    return Branchy()
"""

KEY = "5a" * 32  # an Ed25519 private key (seed, hex): the publisher's

# A replica in a fresh process: load from what was pulled, report what it did as JSON.
REPLICA = """
import json, sys, torch
from orchestrator import runtime
from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model, make_inputs

config, cache_dir = sys.argv[1], sys.argv[2]
remote = sys.argv[3] if len(sys.argv) > 3 else None
trust = sys.argv[4:5]
served = runtime.load(config, cache_dir=cache_dir, remote=remote, trust=trust, require_warm=True, ready="planned")
spec = load_spec(config)
model = build_model(spec, torch.device("cpu"))
errors = {}
for n in (1, 3, 4, 9):
    args, kwargs = make_inputs(spec, n, torch.device("cpu"))
    with torch.no_grad():
        errors[n] = (served(*args, **kwargs) - model(*args, **kwargs)).abs().max().item()
info = served.info()
print(json.dumps({
    "namespace": info.namespace,
    "frames": info.dynamo_frames_compiled,
    "buckets": {b: {"variant": i.variant, "planned": i.planned, "reason": i.reason,
                    "hits": i.cache_hits, "misses": i.cache_misses} for b, i in info.buckets.items()},
    "errors": errors,
    "pulled": info.pull.files if info.pull else None,
}))
"""


def config(tmp_path: Path, factory: str) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    path = tmp_path / f"{factory}.yaml"
    path.write_text(
        f"model: {{factory: models.py:{factory}}}\ninputs: [{{shape: [batch, {32 if factory == 'deep' else 8}]}}]\n"
        "buckets: [4]\ndevice: cpu\ncompile: {mode: default}\nserve: {variants: [aot]}\n"
        "bench: {iterations: 40, warmup: 4}\n"
    )
    return path


def replica(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", REPLICA, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_aot_bucket_is_published_pulled_and_served_by_a_process_that_compiles_nothing(tmp_path):
    cfg = config(tmp_path, "deep")
    (tmp_path / "store").mkdir()
    store = f"file://{tmp_path / 'store'}"
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(cfg),
        "--remote",
        store,
        "--json",
        cache_dir=tmp_path / "warm",
        env={
            "ORCHESTRATE_CACHE_SIGNING_KEY": KEY,
            "MODEL_BUILDS": str(tmp_path / "builds"),
            "MODEL_EXITS": str(tmp_path / "exits"),
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "ok"
    assert list(result["variants"]) == ["eager", "compiled", "aot"]
    built = result["variants"]["aot"]
    assert built["ok"] and built["ms"] > 0 and built["build_seconds"] > 0, built
    # every built variant says what it took, compiled too (the bucket's compile and recording)
    assert result["variants"]["compiled"]["build_seconds"] == pytest.approx(
        result["compile_seconds"] + (result["graph_record_seconds"] or 0)
    )
    assert result["variants"]["eager"]["build_seconds"] is None
    # the function was compiled by a second process, beside the warmup's own compile, whose
    # staging directory is gone with it
    builders = (tmp_path / "builds").read_text().split()
    assert len(builders) == 2 and len(set(builders)) == 2, builders
    # the warmup's process exits as a process does; the builder ends once its result is written,
    # without the exit handlers (nor the collections and pool shutdown) the warmup would wait for
    assert len(_read(tmp_path / "exits")) == 1 and set(_read(tmp_path / "exits")) < set(builders)
    assert not list((tmp_path / "warm").glob(".aot-build-*"))

    public = tmp_path / "publisher.pub"  # the replica holds only the public half
    public.write_text(SigningKey.from_text(KEY.encode(), "test key").public.pem())

    # a fresh process on an empty directory: pulls, then serves what warmup chose
    pulled = replica(str(cfg), str(tmp_path / "replica"), store, str(public))
    assert pulled["pulled"] > 0
    assert pulled["buckets"]["4"]["planned"] == pulled["buckets"]["4"]["variant"] == result["variant"]
    assert all(error < 1e-4 for error in pulled["errors"].values()), pulled["errors"]
    # every module Inductor generated came with its bytecode, for the replica to read
    namespace_dir = tmp_path / "replica" / pulled["namespace"]
    generated = sorted((namespace_dir / "inductor").glob("*/*.py"))
    assert generated and all(ti._bytecode_path(source).is_file() for source in generated)
    # and with the key of torch's sources, for the replica to take instead of hashing them
    from torch._inductor.codecache import torch_key

    assert (namespace_dir / "inductor" / ti.TORCH_KEY_FILE).read_text() == torch_key().hex()

    # the plan names the function whatever was chosen; served from it (a plan that says so), without
    # the Inductor and Triton caches at all: the saved function is all a replica needs
    saved = sorted(p.name for p in (namespace_dir / aot.AOT_DIR).iterdir())
    assert len(saved) == 1 and saved[0].startswith("b4-") and saved[0].endswith(".bin")
    plan = read_plans(namespace_dir)[4]
    assert plan["artifacts"]["aot"]["path"] == f"{aot.AOT_DIR}/{saved[0]}"
    measured = {name: VariantMeasure(**m) for name, m in plan["variants"].items()}
    write_plan(namespace_dir, load_spec(cfg), BucketResult(4, variant="aot", variants=measured), plan["artifacts"])
    for cache in ("inductor", "triton"):
        shutil.rmtree(namespace_dir / cache, ignore_errors=True)
    alone = replica(str(cfg), str(tmp_path / "replica"))
    assert alone["buckets"]["4"] == {"variant": "aot", "planned": "aot", "reason": None, "hits": 0, "misses": 0}
    assert alone["frames"] == 0
    assert all(error < 1e-4 for error in alone["errors"].values()), alone["errors"]
    assert not list((namespace_dir / "inductor").glob("fxgraph/**/*")), "a compiled graph was written"

    # a function built for another platform is refused before it is loaded: the bucket serves eager
    plan = read_plans(namespace_dir)[4]
    assert plan["variant"] == "aot"
    plan["artifacts"]["aot"]["platform"]["torch_version"] = "0.0.1"
    plan["measured_at"] = "9999-01-01T00:00:00.000000+00:00"
    (namespace_dir / "serving" / "plan-b4-elsewhere.json").write_text(json.dumps(plan))
    elsewhere = replica(str(cfg), str(tmp_path / "replica"))
    bucket = elsewhere["buckets"]["4"]
    assert bucket["variant"] == "eager" and bucket["planned"] == "aot"
    assert "built for another platform" in bucket["reason"] and "torch_version '0.0.1'" in bucket["reason"]


@pytest.mark.slow
def test_a_model_that_cannot_compile_whole_falls_back_with_torchs_reason(tmp_path):
    cfg = config(tmp_path, "branchy")
    proc = orchestrate("warmup", "--no-ray", "--model", str(cfg), "--json", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "ok"
    refused = result["variants"]["aot"]
    assert refused["ok"] is False and refused["ms"] is None
    assert refused["reason"].startswith("Dynamo ahead-of-time compile:"), refused
    assert "data-dependent" in refused["reason"].lower() or "graph break" in refused["reason"].lower(), refused
    assert result["variant"] == "eager"  # the next-best of the candidates asked for
    namespace_dir = next(p for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name.startswith("branchy-"))
    assert not (namespace_dir / aot.AOT_DIR).exists() or not any((namespace_dir / aot.AOT_DIR).iterdir())


def test_a_package_is_refused_on_any_other_platform():
    here = Platform("2.11.0", "abc", "3.6.0", "13.0", "NVIDIA H200", "3.12.3")
    aot.check_platform(asdict(here), here)
    aot.check_platform({**asdict(here), "torch_git": "other"}, here)  # the version names the build
    for field, value in (("gpu_name", "NVIDIA A100-SXM4-80GB"), ("cuda_version", "12.8"), ("python_version", "3.11.9")):
        with pytest.raises(aot.PlatformMismatch, match=f"{field} '{value}' \\(this replica: "):
            aot.check_platform({**asdict(here), field: value}, here)


def test_the_function_compiles_whole_and_without_inductors_cuda_graphs_on_cuda():
    plain = aot.compile_kwargs("reduce-overhead", {}, "inductor", "cuda")
    assert plain == {
        "dynamic": False,
        "fullgraph": True,
        "backend": "inductor",
        "options": {"guard_filter_fn": ti.portable_guards},  # reduce-overhead's own options are CUDA graphs
    }
    tuned = aot.compile_kwargs(
        "max-autotune", {"triton.cudagraphs": True, "epilogue_fusion": False}, "inductor", "cuda"
    )
    assert tuned["fullgraph"] is True and tuned["options"]["max_autotune"] is True
    assert not tuned["options"].get("triton.cudagraphs") and tuned["options"]["epilogue_fusion"] is False
    on_cpu = aot.compile_kwargs("default", {}, "inductor", "cpu")
    assert on_cpu["fullgraph"] is True and on_cpu["options"] == {"guard_filter_fn": ti.portable_guards}


def test_a_saved_function_lives_under_its_bucket_and_content(tmp_path):
    saved = tmp_path / "f.bin"
    saved.write_bytes(b"function bytes")
    name = aot.file_name(8, saved)
    assert name.startswith("aot/b8-g1-") and len(name) == len("aot/b8-g1-") + 16 + len(".bin")
    saved.write_bytes(b"other bytes")
    assert aot.file_name(8, saved) != name


def test_a_warm_rerun_reuses_only_saved_functions_of_the_current_format(tmp_path):
    """A function saved in an earlier format (with the model's guards, whose rebuilding every load
    pays) is not what a rerun keeps: it builds the bucket's function again, while replicas whose
    plans name the old file still load it. One of the current format is kept, planned or not."""
    from orchestrator.jobs.engine import _existing_function

    spec = load_spec(config(tmp_path, "deep"))
    namespace_dir = tmp_path / "ns"
    (namespace_dir / aot.AOT_DIR).mkdir(parents=True)
    older = "aot/b4-0123456789abcdef.bin"  # as saved before the format was named
    (namespace_dir / older).write_bytes(b"a function with the model's guards")
    measured = {"eager": VariantMeasure(ok=True, ms=1.0), "aot": VariantMeasure(ok=True, ms=0.5)}
    write_plan(namespace_dir, spec, BucketResult(4, variant="aot", variants=measured), {"aot": {"path": older}})
    assert _existing_function(namespace_dir, 4) is None

    (namespace_dir / "current.bin").write_bytes(b"a function of the current format")
    current = aot.file_name(4, namespace_dir / "current.bin")
    (namespace_dir / "current.bin").rename(namespace_dir / current)
    assert current.startswith(f"aot/b4-{aot.FORMAT}-") and _existing_function(namespace_dir, 4) == current
    assert _existing_function(namespace_dir, 1) is None  # another bucket's is not this one's


@pytest.mark.slow
def test_on_ray_the_compile_wave_builds_each_function_once_and_the_ranks_serve_from_it(tmp_path):
    """The README's main path: a local Ray instance and the local store. The compile wave builds and
    publishes each bucket's function; the rank pulls it, loads it and measures it (it builds none of
    its own), and the published plans name the files the store holds."""
    cfg = config(tmp_path, "deep")
    cfg.write_text(cfg.read_text().replace("buckets: [4]", "buckets: [1, 4]"))
    cache = tmp_path / "cache"
    proc = orchestrate(
        "warmup",
        "--model",
        str(cfg),
        "--json",
        cache_dir=cache,
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    ranks = [r for r in report["results"] if r["phase"] == "warm"]
    assert sorted(r["bucket"] for r in ranks) == [1, 4]
    for result in ranks:
        assert result["variants"]["aot"]["ok"], result["variants"]["aot"]

    # one function per bucket in the store, and the plans there name exactly those
    from orchestrator.cache import sync
    from orchestrator.cache.manifest import TrustedKeys
    from orchestrator.cache.store import open_store

    store = open_store(report["remote"]["url"])
    trusted = TrustedKeys.load([cache / ".signing-key.pub"], environ=False)
    (namespace,) = sync.namespaces(store)
    replica_dir = tmp_path / "replica" / namespace
    sync.pull(store, namespace, replica_dir, trusted, allow_unsigned=False)
    saved = sorted(p.relative_to(replica_dir).as_posix() for p in (replica_dir / aot.AOT_DIR).iterdir())
    assert [name.split("-")[0] for name in saved] == ["aot/b1", "aot/b4"]
    plans = read_plans(replica_dir)
    assert sorted(plans[b]["artifacts"]["aot"]["path"] for b in (1, 4)) == saved


OUTPUT_MODELS = """
import collections
import torch

class Out(collections.OrderedDict):  # as a Hugging Face ModelOutput is
    pass

class Named(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return Out(hidden=self.linear(x))
"""

FRESH_LOAD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import named_output
from orchestrator.jobs import aot, aot_builds
torch.manual_seed(0)
model = named_output.Named().eval()
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    got, want = aot.load(__import__("pathlib").Path(sys.argv[2]), model)(x), model(x)
print(type(got).__name__, (got["hidden"] - want["hidden"]).abs().max().item())
"""


class Keyworded(torch.nn.Module):
    """Submodules in a container, a buffer, an attribute read in forward and an input by keyword:
    the model state a saved function's guards would otherwise hold."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
        self.register_buffer("shift", torch.full((8,), 0.5))
        self.scale = 2.0

    def forward(self, x, mask):
        return self.layers(x) * self.scale * mask + self.shift


@pytest.mark.slow
def test_a_saved_function_guards_its_call_and_the_global_state_not_the_model(tmp_path, monkeypatch):
    kept: list[list[tuple[str, str]]] = []  # per compile
    shipped = ti.portable_guards

    def recording(entries):
        keep = shipped(entries)
        kept.append([(entry.guard_type, entry.name) for entry, k in zip(entries, keep, strict=True) if k])
        assert len(keep) > 3 * len(kept[-1])  # the model's own guards were there to drop
        return keep

    monkeypatch.setattr(ti, "portable_guards", recording)
    torch.manual_seed(0)
    model = Keyworded().eval()
    x, mask = torch.randn(4, 8), torch.ones(4, 8)
    (tmp_path / "ns").mkdir()
    options = aot.compile_kwargs("default", {}, "inductor", "cpu")
    rel = aot.build(model, [x], {"mask": mask}, tmp_path / "ns", 4, options)
    aot.build(model, [x[:2]], {"mask": mask[:2]}, tmp_path / "ns", 2, options)  # the same options again
    assert len(kept) == 2
    for guards in kept:
        assert {kind for kind, _ in guards} == {"TENSOR_MATCH", "GLOBAL_STATE", "SHAPE_ENV"}
        tensors = [name for kind, name in guards if kind == "TENSOR_MATCH"]
        assert len(tensors) == 2 and sum("mask" in name for name in tensors) == 1  # x and mask, no weight

    torch.manual_seed(0)
    replica_model = Keyworded().eval()  # the replica's own module, built the same way
    function = aot.load(tmp_path / "ns" / rel, replica_model)
    with torch.no_grad():
        other = torch.randn(4, 8)
        assert torch.allclose(function(other, mask=mask), replica_model(other, mask=mask), atol=1e-5)
        with pytest.raises(RuntimeError, match="[Gg]uard"):  # the call's own tensors are still guarded
            function(torch.randn(3, 8), mask=mask[:3])
    with pytest.raises(RuntimeError, match="[Gg]uard"):  # and the global state: grad mode here
        function(other, mask=mask)


@pytest.mark.slow
def test_a_function_loaded_to_serve_keeps_no_copy_to_save_while_other_loads_keep_theirs(tmp_path):
    """aot.load skips the deep copy torch makes at every load for a later save: the function
    answers as it should, and saving it says why it cannot. A load outside aot.load, on this
    thread or on another while a load here is under way, keeps the copy and saves."""
    torch.manual_seed(0)
    model = Keyworded().eval()
    x, mask = torch.randn(4, 8), torch.ones(4, 8)
    (tmp_path / "ns").mkdir()
    rel = aot.build(
        model, [x], {"mask": mask}, tmp_path / "ns", 4, aot.compile_kwargs("default", {}, "inductor", "cpu")
    )
    path = tmp_path / "ns" / rel

    served = aot.load(path, model)
    with torch.no_grad():
        assert torch.allclose(served(x, mask=mask), model(x, mask=mask), atol=1e-5)
    function = served.func if isinstance(served, functools.partial) else served
    with pytest.raises(pickle.PicklingError, match="loaded to be called, without the copy"):
        function.save_compiled_function(str(tmp_path / "again.bin"))

    def load_and_save(target: Path) -> None:
        with open(path, "rb") as file, ti.aot_compile_enabled():
            kept = torch.compiler.load_compiled_function(file, external_data={aot.MODEL_KEY: model})
        kept.save_compiled_function(str(target))

    load_and_save(tmp_path / "kept.bin")  # this thread, outside aot.load
    with ti.loaded_without_a_copy_to_save():  # another thread, while this one is inside
        beside = threading.Thread(target=load_and_save, args=(tmp_path / "beside.bin",))
        beside.start()
        beside.join()
    for saved in ("kept.bin", "beside.bin"):
        again = aot.load(tmp_path / saved, model)
        with torch.no_grad():
            assert torch.allclose(again(x, mask=mask), model(x, mask=mask), atol=1e-5), saved


@pytest.mark.slow
def test_a_function_whose_code_names_modules_and_builtins_loads_in_a_fresh_process(tmp_path, monkeypatch):
    """Dynamo's code for a model returning an OrderedDict subclass (as Hugging Face models do) names
    `collections` under a made-up global and the builtin `type`: both are saved with the function,
    also on a torch that leaves builtins out of what it saves (torch 2.11's behaviour, put back here)."""
    import builtins

    from torch._dynamo.convert_frame import GraphCaptureOutput

    recorded = GraphCaptureOutput.get_runtime_env
    recorded = getattr(recorded, "__wrapped__", recorded)  # torch's own, under any wrapper of ours

    def without_builtins(self):
        env = recorded(self)
        for name in [n for n, value in env.used_globals.items() if getattr(builtins, n, None) is value]:
            del env.used_globals[name]
        return env

    monkeypatch.setattr(GraphCaptureOutput, "get_runtime_env", without_builtins)
    (tmp_path / "named_output.py").write_text(OUTPUT_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import named_output

    torch.manual_seed(0)
    model = named_output.Named().eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    (tmp_path / "ns").mkdir()
    options = aot.compile_kwargs("default", {}, "inductor", "cpu")
    rel = aot.build(model, [x], {}, tmp_path / "ns", 4, options)
    kind, error = fresh_python(FRESH_LOAD, str(tmp_path), str(tmp_path / "ns" / rel)).split()
    assert kind == "Out" and float(error) < 1e-5


STACK_MODEL = """
import torch

class Stack(torch.nn.Module):  # library matmuls (extern kernels) between generated C++ kernels
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8)
        )

    def forward(self, x):
        return self.layers(x).relu()
"""

LOAD_WITHOUT_THE_COMPILER = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import stack_model
from orchestrator.jobs import aot

COMPILER = ["torch._inductor.lowering", "torch._inductor.graph", "torch._inductor.select_algorithm",
            "torch._inductor.codegen.memory_planning", "torch._inductor.debug", "torch._inductor.compile_fx"]
torch.manual_seed(0)
model = stack_model.Stack().eval()
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
before = [name for name in COMPILER if name in sys.modules]
function = aot.load(__import__("pathlib").Path(sys.argv[2]), model)
with torch.no_grad():
    error = (function(x) - model(x)).abs().max().item()
after = [name for name in COMPILER if name in sys.modules]
off = torch._inductor.debug.RECORD_GRAPH_EXECUTION  # read by every call: stays readable, and off
import torch._inductor.select_algorithm as real  # the compiler, once something imports it
import torch._inductor.debug
with torch.no_grad():
    again = (function(x) - model(x)).abs().max().item()
print(json.dumps({"before": before, "after": after, "error": error, "again": again, "off": off,
                  "real": hasattr(real, "autotune_select_algorithm"), "debug": type(torch._inductor.debug).__name__}))
"""


@pytest.mark.slow
def test_a_process_that_compiles_nothing_loads_a_saved_function_without_importing_the_compiler(tmp_path, monkeypatch):
    """Inductor's generated code and torch's loader import its compiler (the lowering table, every
    kernel template: most of a second of Python at a replica's first load) for names a load only
    reads: in a process that compiles nothing, the load reads stand-ins instead, the function
    answers as eager does, and a later import of the compiler gets the real modules."""
    (tmp_path / "stack_model.py").write_text(STACK_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import stack_model

    torch.manual_seed(0)
    model = stack_model.Stack().eval()
    (tmp_path / "ns").mkdir()
    rel = aot.build(model, [torch.randn(4, 8)], {}, tmp_path / "ns", 4, aot.compile_kwargs(None, {}, "inductor", "cpu"))
    seen = json.loads(fresh_python(LOAD_WITHOUT_THE_COMPILER, str(tmp_path), str(tmp_path / "ns" / rel)))
    assert seen["before"] == [] and seen["after"] == []
    assert seen["error"] < 1e-5 and seen["again"] < 1e-5 and seen["off"] is False
    assert seen["real"] and seen["debug"] == "module"


COMPILE_BESIDE_A_LOAD = """
import threading, torch
from orchestrator.jobs import torch_internals as ti

weight = torch.randn(16, 16)
def f(x):
    return torch.nn.functional.gelu(x @ weight) + 1

x, errors = torch.randn(8, 16), []
def compile_and_call():
    try:
        got = torch.compile(f)(x)
        errors.append((got - f(x)).abs().max().item())
    except Exception as exc:
        errors.append(repr(exc))

with ti.compiler_left_out():  # a load on this thread holds the stand-ins while the other compiles
    thread = threading.Thread(target=compile_and_call)
    thread.start()
    thread.join()
print(errors[0])
"""


@pytest.mark.slow
def test_a_thread_that_compiles_beside_a_load_without_the_compiler_gets_the_real_compiler(tmp_path):
    """A replica's loader threads may load saved functions while another compiles (a grid's
    slices): the stand-ins are placed for the whole process, and the compiling thread must get
    Inductor's real graph lowering, not the load's stand-in for it."""
    # an empty cache: a compile, where a cache hit would lower nothing
    out = fresh_python(COMPILE_BESIDE_A_LOAD, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert float(out.strip().splitlines()[-1]) < 1e-5, out[-2000:]


GENERATED = """
import triton_like

def kernel(x):
    return x + 1

class Runner:
    def call(self, x):
        return kernel(x) * 2
"""


def test_a_generated_module_loads_from_the_bytecode_saved_beside_it_and_only_for_its_own_source(tmp_path, monkeypatch):
    """Warmup saves each generated module's bytecode; a replica whose cache lies elsewhere loads
    the module through Inductor's loader without compiling it, every function naming the file it
    is in now (Triton reads a kernel's source from there). Bytecode of other source is not used."""
    from torch._inductor.runtime import compile_tasks

    (tmp_path / "warm" / "ab").mkdir(parents=True)
    (tmp_path / "warm" / "ab" / "cab.py").write_text(GENERATED)
    (tmp_path / "warm" / "ab" / "cbroken.py").write_text("def (:\n")
    assert ti.save_generated_bytecode(tmp_path / "warm") == 1  # the one that compiles
    assert ti.save_generated_bytecode(tmp_path / "warm") == 0  # saved already
    shutil.copytree(tmp_path / "warm", tmp_path / "replica")
    path = tmp_path / "replica" / "ab" / "cab.py"
    (tmp_path / "triton_like.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    compiled: list[str] = []

    def compiling(source, filename, *args, **kwargs):
        compiled.append(filename)
        return compile(source, filename, *args, **kwargs)

    monkeypatch.setattr(ti, "compile", compiling, raising=False)  # the fallback, counted
    monkeypatch.setattr(compile_tasks, "compile", compile, raising=False)
    ti.read_generated_bytecode()
    module = compile_tasks._reload_python_module("cab", str(path), set_sys_modules=False)
    assert compiled == [] and module.Runner().call(1) == 4
    assert module.kernel.__code__.co_filename == module.Runner.call.__code__.co_filename == str(path)
    assert inspect.getsource(module.kernel).startswith("def kernel(x):")

    path.write_text(GENERATED.replace("x + 1", "x + 2"))  # other source, same file: compiled
    assert compile_tasks._reload_python_module("cab", str(path), set_sys_modules=False).Runner().call(1) == 6
    assert compiled == [str(path)]


def test_a_replica_takes_the_key_of_torchs_sources_that_warmup_saved_and_hashes_nothing(tmp_path):
    """Warmup saves Inductor's key of torch's sources in the namespace; a fresh process that takes
    it gets that key from Inductor without hashing torch's sources, and takes nothing that is no
    key, nor over a key it has already."""
    from torch._inductor.codecache import torch_key

    (tmp_path / "warm").mkdir()
    ti.save_torch_key(tmp_path / "warm")
    assert (tmp_path / "warm" / ti.TORCH_KEY_FILE).read_text() == torch_key().hex()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ti.TORCH_KEY_FILE).write_text("ab" * 32)
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / ti.TORCH_KEY_FILE).write_text("ab" * 8)
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / ti.TORCH_KEY_FILE).write_text("not a key")
    out = fresh_python(
        """
import sys
from pathlib import Path
from torch._inductor import codecache
from orchestrator.jobs import torch_internals as ti
def hashing(*args, **kwargs):
    raise AssertionError("torch's sources hashed")
codecache.build_code_hash = hashing
root = Path(sys.argv[1])
refused = [ti.take_torch_key(root / name) for name in ("none", "short", "garbled")]
taken = ti.take_torch_key(root / "other")
print(refused, taken, ti.take_torch_key(root / "warm"), codecache.torch_key().hex())
""",
        str(tmp_path),
    )
    assert out.split() == ["[False,", "False,", "False]", "True", "False", "ab" * 32]


def test_the_kernels_a_saved_function_finds_by_torchs_names_are_torchs_own():
    """The stand-in registry gives a generated graph's library kernels by torch's own functions of
    their names: this torch's registry must hold those very functions under them."""
    from torch._inductor.select_algorithm import extern_kernels

    registered = vars(extern_kernels)
    for name in ti.TORCH_EXTERN_KERNELS:
        assert name in registered and registered[name] is getattr(torch, name), name
    assert not any(isinstance(module, ti._CompilerStandIn) for module in sys.modules.values())


def test_a_stand_in_gives_way_to_the_real_module_for_any_name_it_does_not_hold():
    """A name the stand-ins do not hold, or any name once the compiler is imported, is the
    compiler's own, and a kernel outside torch's names comes from the real registry."""
    import torch._inductor.graph as graph
    from torch._inductor.select_algorithm import extern_kernels

    stand_in = ti._CompilerStandIn("torch._inductor.graph", {"GraphLowering": object})
    assert stand_in.GraphLowering is graph.GraphLowering  # the real module is imported: it answers
    assert stand_in.__name__ == "torch._inductor.graph" and not hasattr(stand_in, "__wrapped__")
    kernels = ti._ExternKernels()
    assert kernels.mm is torch.mm and kernels.bias_addmm is extern_kernels.bias_addmm
    strided = torch.randn(4, 6).t()  # what an autotuning kernel clones, strides kept
    clone = ti._clone_preserve_strides(strided)
    assert clone.stride() == strided.stride() and torch.equal(clone, strided)
    assert clone.data_ptr() != strided.data_ptr()


def test_the_aot_builder_reports_why_it_built_nothing_and_leaves_nothing_staged(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_BUILDER", "fails")
    spec = load_spec(config(tmp_path, "deep"))
    builds = AheadBuilds(spec, [4], tmp_path / "cache")
    staging = builds.staging
    try:
        with pytest.raises(AheadBuildError, match="the aot build process exited with code 1"):
            builds.take(4, tmp_path / "cache" / "ns")
    finally:
        builds.close()
    assert not staging.exists()
    assert not (tmp_path / "cache" / "ns").exists()


def test_each_bucket_is_built_by_a_fresh_process_and_as_many_at_once_as_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_BUILDS", str(tmp_path / "builds"))
    monkeypatch.setenv("AOT_BUILDER", "fails")
    spec = load_spec(config(tmp_path, "deep"))
    builds = AheadBuilds(spec, [2, 4], tmp_path / "cache")
    try:
        for bucket in (2, 4):  # one at a time: the second starts once the first has ended
            with pytest.raises(AheadBuildError, match="exited with code 1"):
                builds.take(bucket, tmp_path / "cache" / "ns")
    finally:
        builds.close()
    assert len(set(_read(tmp_path / "builds"))) == 2, "each bucket's build runs in a process of its own"

    monkeypatch.setenv("AOT_BUILDER", "slow")
    builds = AheadBuilds(spec, [1, 2, 4], tmp_path / "cache")
    try:
        assert len(builds.running()) == 1
        builds.allow(2)  # the parent's model is built: room for one more
        running = builds.running()
        assert len(running) == 2
    finally:
        builds.close()
    with pytest.raises(AheadBuildError, match="stopped before"):
        builds.take(4, tmp_path / "cache" / "ns")
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in running) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_running(pid) for pid in running) and not builds.staging.exists()


def test_a_prestarted_builder_takes_the_first_bucket_with_the_cache_chosen_after_it_started(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_BUILDS", str(tmp_path / "builds"))
    monkeypatch.setenv("MODEL_CACHES", str(tmp_path / "caches"))
    monkeypatch.setenv("AOT_BUILDER", "fails")
    spec = load_spec(config(tmp_path, "deep"))
    spare = aot_builds.prestart(spec)
    assert spare is not None and aot_builds.prestart(spec) == spare, "one spare at a time"
    # the parent points the caches at its namespace after the spare started (torch_internals.point_caches_at)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "namespace-inductor"))
    builds = AheadBuilds(spec, [2, 4], tmp_path / "cache")
    try:
        assert builds.running() == [spare]
        for bucket in (2, 4):
            with pytest.raises(AheadBuildError, match="exited with code 1"):
                builds.take(bucket, tmp_path / "cache" / "ns")
    finally:
        builds.close()
    first, second = _read(tmp_path / "builds")
    assert first == str(spare) and second != first, "the spare built the first bucket, a new child the next"
    assert _read(tmp_path / "caches") == [str(tmp_path / "namespace-inductor")] * 2


def test_a_spare_started_in_another_environment_is_not_used_and_an_unused_one_exits(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_BUILDER", "fails")
    spec = load_spec(config(tmp_path, "deep"))
    spare = aot_builds.prestart(spec)
    assert spare is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read at a child's start: the spare started without it
    builds = AheadBuilds(spec, [4], tmp_path / "cache")
    try:
        assert spare not in builds.running() and not _running(spare)
        with pytest.raises(AheadBuildError, match="exited with code 1"):
            builds.take(4, tmp_path / "cache" / "ns")
    finally:
        builds.close()
    # a process that prestarts a builder and ends without a build: the spare ends with it
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from orchestrator.config import load_spec\n"
            "from orchestrator.jobs import aot_builds\n"
            "print(aot_builds.prestart(load_spec(sys.argv[1])))\n",
            str(config(tmp_path, "deep")),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    unused = int(parent.stdout)
    deadline = time.monotonic() + 60
    while _running(unused) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(unused), "a spare no build took outlived its parent"
    # on the CPU, aot is built only where the config asks for it: nothing to prestart
    plain = spec.model_copy(update={"serve": spec.serve.model_copy(update={"variants": None})})
    assert aot_builds.prestart(plain) is None


def test_the_aot_builder_dies_with_the_process_that_started_it(tmp_path):
    cfg = config(tmp_path, "deep")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, pathlib\n"
            "from orchestrator.config import load_spec\n"
            "from orchestrator.jobs.aot_builds import AheadBuilds\n"
            "builds = AheadBuilds(load_spec(sys.argv[1]), [4], pathlib.Path(sys.argv[2]))\n"
            "print(*builds.running(), flush=True)\n"
            "time.sleep(300)\n",
            str(cfg),
            str(tmp_path / "cache"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "AOT_BUILDER": "slow", "MODEL_BUILDS": str(tmp_path / "builds")},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and str(child) not in _read(tmp_path / "builds"):
        time.sleep(0.2)  # until the child is inside the model's factory, torch imported
    assert str(child) in _read(tmp_path / "builds")
    parent.kill()  # no clean-up of its own: SIGKILL
    parent.wait()
    deadline = time.monotonic() + 30
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(child), "the aot builder outlived the process that started it"
    # what it staged is removed by the next builder on that cache directory
    (stale,) = (tmp_path / "cache").glob(".aot-build-*")
    mine = tmp_path / "cache" / f".aot-build-{os.getpid()}-kept"
    mine.mkdir()
    remove_stale(tmp_path / "cache")
    assert not stale.exists() and mine.exists()


def _read(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def test_a_benchmark_waits_until_no_aot_build_runs_and_their_functions_stay_to_take(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_BUILDER", "fails")
    spec = load_spec(config(tmp_path, "deep"))
    builds = AheadBuilds(spec, [2, 4], tmp_path / "cache")
    try:
        assert builds.wait_idle() is True  # one ran, one waited to start: both have ended now
        assert builds.running() == []
        assert builds.wait_idle() is False  # nothing left to wait for
        for bucket in (2, 4):  # each child's outcome is kept for its bucket, as before the wait
            with pytest.raises(AheadBuildError, match="exited with code 1"):
                builds.take(bucket, tmp_path / "cache" / "ns")
    finally:
        builds.close()


# torch 2.11's refusal of T5ForConditionalGeneration (transformers 5.17 and 5.25), as Dynamo words it
T5_ON_TORCH_2_11 = """Unsupported copy.deepcopy()
  Explanation: Dynamo does not support copy.deepcopy()
  Developer debug context: copy.deepcopy(UserDefinedObjectVariable(T5Config))

from user code:
  File ".../transformers/models/t5/modeling_t5.py", line 688, in forward
    DynamicCache(config=self.config), DynamicCache(config=self.config)
  File ".../transformers/cache_utils.py", line 1809, in __init__
    decoder_config = config.get_text_config(decoder=True)
  File ".../transformers/configuration_utils.py", line 1361, in get_text_config
    config_to_return = copy.deepcopy(config_to_return)
"""


def test_a_refusal_whose_cause_is_known_says_what_to_do():
    fix = aot.known_fix(RuntimeError(T5_ON_TORCH_2_11))
    assert "`call: {kwargs: {use_cache: false}}`" in fix and "\n" not in fix
    # a deepcopy of the user's own, or any other refusal: torch's reason alone
    assert aot.known_fix(RuntimeError("Unsupported copy.deepcopy()\n  File model.py, in forward")) == ""
    assert aot.known_fix(RuntimeError("Unsupported: data-dependent branching")) == ""
