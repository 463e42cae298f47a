"""Small pieces with exact answers: statistics, compile kwargs, cache identity, local store."""

import os
from dataclasses import replace

import pytest
import torch

from cache.local import LocalCache
from cache.namespace import Platform, namespace
from jobs import torch_internals as ti
from jobs.timing import Clock, median, p90

PLATFORM = Platform(torch_version="2.11.0+cu130", torch_git="abc", triton_version="3.6.0", cuda_version="13.0",
                    gpu_name="NVIDIA H200", python_version="3.12.3")


def test_median_and_p90():
    samples = [float(x) for x in range(1, 11)]
    assert median(samples) == 5.5
    assert p90(samples) == 9.0
    assert p90([3.0]) == 3.0


def test_interleaved_alternates_order_and_counts_calls():
    calls = []
    clock = Clock(torch.device("cpu"))
    samples = clock.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                iterations=4, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(samples["a"]) == len(samples["b"]) == 4
    assert all(s >= 0 for s in samples["a"] + samples["b"])


def test_back_to_back_times_blocks_of_calls():
    calls = []
    samples = Clock(torch.device("cpu")).back_to_back({"a": lambda: calls.append(1)}, rounds=3, calls=5)
    assert len(calls) == 15 and len(samples["a"]) == 3


def test_compile_kwargs_folds_mode_into_options():
    assert ti.compile_kwargs("reduce-overhead", False, False, "inductor", {}) == {
        "dynamic": False, "fullgraph": False, "backend": "inductor", "mode": "reduce-overhead"}
    merged = ti.compile_kwargs("reduce-overhead", False, True, "inductor", {"max_autotune": True})
    assert "mode" not in merged
    assert merged["options"]["triton.cudagraphs"] is True  # what reduce-overhead means
    assert merged["options"]["max_autotune"] is True
    # the merged options are accepted by torch.compile as they are
    torch.compile(torch.nn.Linear(2, 2), **merged)


@pytest.mark.parametrize("field, value", [
    ("torch_version", "2.13.0"), ("torch_git", "def"), ("triton_version", None), ("cuda_version", "12.8"),
    ("gpu_name", "NVIDIA H100 80GB HBM3"), ("python_version", "3.11.7")])
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
