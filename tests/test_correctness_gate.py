"""The gate in a real run: broken compilers and non-finite models fail their buckets through the
CLI, the report says why, and a failed bucket's artifacts never reach the store."""

import json
import textwrap

import pytest
from conftest import orchestrate

SIGNED = {"ORCHESTRATE_CACHE_SIGNING_KEY": "6b" * 32}  # an Ed25519 private key (seed, hex)

MODEL = textwrap.dedent("""
    from dataclasses import dataclass

    import torch
    from torch._dynamo import register_backend
    from torch._inductor.compile_fx import compile_fx


    def _plus_one(out):
        if isinstance(out, (tuple, list)):
            return type(out)(o + 1.0 if o.is_floating_point() else o for o in out)
        return out + 1.0


    @register_backend
    def off_by_one(gm, example_inputs):
        # a broken compiler: right shapes, wrong values
        return lambda *args: _plus_one(gm(*args))


    @register_backend
    def wrong_after_first(gm, example_inputs):
        # right on the first call, wrong on every later one (as a stale CUDA-graph replay would be)
        calls = []
        def run(*args):
            calls.append(1)
            out = gm(*args)
            return out if len(calls) == 1 else _plus_one(out)
        return run


    @register_backend
    def inductor_wrong_at_2(gm, example_inputs):
        # Inductor's real artifacts, but bucket 2's outputs are off
        compiled = compile_fx(gm, example_inputs)
        wrong = any(isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == 2 for t in example_inputs)
        return (lambda *args: _plus_one(compiled(*args))) if wrong else compiled


    def tiny():
        return torch.nn.Linear(8, 8)


    class AllNaN(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * float("nan")


    def all_nan():
        return AllNaN(8, 8)


    @dataclass
    class Prediction:
        logits: torch.Tensor
        labels: torch.Tensor


    class Classifier(torch.nn.Linear):
        def forward(self, x):
            logits = super().forward(x)
            return Prediction(logits, logits.argmax(-1))


    def classifier():
        return Classifier(8, 8)


    class Float32Only(torch.nn.Linear):
        def forward(self, x):
            if x.dtype != torch.float32:  # as a model with a float32-only kernel refuses
                raise TypeError(f"float32 only, got {x.dtype}")
            return super().forward(x)


    def float32_only():
        return Float32Only(8, 8)
""")


def warmup(tmp_path, factory, backend, *extra, buckets="1,4", check="{}", env=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "m.py").write_text(MODEL)
    (tmp_path / "cfg.yaml").write_text(
        textwrap.dedent(f"""
        model: {{factory: m.py:{factory}}}
        inputs: [{{shape: [batch, 8]}}]
        compile: {{mode: null, backend: {backend}}}
        check: {check}
        bench: {{iterations: 3, warmup: 1}}
    """)
    )
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(tmp_path / "cfg.yaml"),
        "--device",
        "cpu",
        "--json",
        "--buckets",
        buckets,
        *extra,
        cache_dir=tmp_path / "cache",
        env=env,
    )
    return proc, json.loads(proc.stdout) if proc.stdout else None


def test_output_mismatch_fails_the_bucket(tmp_path):
    proc, report = warmup(tmp_path, "tiny", "off_by_one")
    assert proc.returncode == 1, proc.stderr
    assert report["summary"]["buckets_failed"] == 2
    for result in report["results"]:
        assert result["status"] == "failed"
        assert result["error"].startswith(
            "check: OutputMismatch: output of the compiled first call is further from a float64 run than "
            "eager is: RMS error 1 against eager's"
        )
        assert result["max_abs_error"] == pytest.approx(1.0, abs=1e-5)
    # explicit tolerances judge against eager, as they always did
    proc, report = warmup(tmp_path / "explicit", "tiny", "off_by_one", buckets="4", check="{atol: 0.5, rtol: 0}")
    assert proc.returncode == 1, proc.stderr
    assert report["results"][0]["error"].startswith(
        "check: OutputMismatch: output of the compiled first call differs from eager: max abs error 1 exceeds atol=0.5"
    )


def test_a_wrong_replay_fails_even_when_the_first_call_is_right(tmp_path):
    proc, report = warmup(tmp_path, "tiny", "wrong_after_first", buckets="4")
    assert proc.returncode == 1, proc.stderr
    (result,) = report["results"]
    assert result["error"].startswith("check: OutputMismatch: output of the compiled replay is further from a float64")


def test_tensors_inside_a_dataclass_output_are_checked(tmp_path):
    passed, report = warmup(tmp_path / "eager", "classifier", "eager", buckets="4")
    assert passed.returncode == 0, passed.stderr
    (result,) = report["results"]
    assert result["checked_outputs"] == 3  # the dataclass, its logits and its labels
    assert result["max_abs_error"] == 0.0
    assert 0 < result["tolerance_used"] <= 1 / 3  # eager's own error, against 3 times it and a floor
    # judged against a float64 run: eager's own error and the compiled one's (the same here)
    assert result["gate_reference"] == "float64" and result["gate_note"] is None and result["gate_multiple"] == 3.0
    assert 0 < result["float64_eager_error"] == result["float64_error"] < 1e-6
    assert result["numerics"] == {"float32_matmul_precision": "highest"}
    # the plan holds what a replica's check at load allows, from eager's distance to float64
    (plan,) = (tmp_path / "eager" / "cache").rglob("plan-b4-*.json")
    bounds = json.loads(plan.read_text())["load_bounds"]
    assert set(bounds) == {"output.logits"} and 4 * result["float64_eager_error"] < bounds["output.logits"] < 1e-5

    failed, report = warmup(tmp_path / "broken", "classifier", "off_by_one", buckets="4")
    assert failed.returncode == 1, failed.stderr
    (result,) = report["results"]
    assert "output.logits of the compiled first call is further from a float64 run" in result["error"]


def test_nonfinite_eager_output_fails_before_compiling_and_publishes_nothing(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    proc, report = warmup(tmp_path, "all_nan", "off_by_one", "--remote", f"file://{store}", env=SIGNED)
    assert proc.returncode == 1, proc.stderr
    for result in report["results"]:
        assert result["status"] == "failed" and result["compile_seconds"] is None
        assert result["error"].startswith("eager reference: NonFiniteOutput: eager output is not finite: output holds")
        assert "check.allow_nonfinite: true" in result["error"]
    assert report["remote"]["publish"] is None
    assert not [p for p in store.rglob("*") if p.is_file()]


def test_allowed_nonfinite_outputs_pass_when_compiled_matches_them(tmp_path):
    proc, report = warmup(tmp_path, "all_nan", "eager", check="{allow_nonfinite: true}")
    assert proc.returncode == 0, proc.stderr
    assert all(r["status"] == "ok" and r["max_abs_error"] == 0.0 for r in report["results"])


@pytest.mark.slow
def test_a_failed_bucket_is_never_published(tmp_path):
    """Bucket 2 compiles real Inductor artifacts, then fails the gate: the store gets bucket 1 alone,
    and a node that pulls it finds nothing of bucket 2 (it compiles it again, all misses)."""
    store = tmp_path / "store"
    store.mkdir()
    remote = ["--remote", f"file://{store}"]
    proc, report = warmup(tmp_path / "a", "tiny", "inductor_wrong_at_2", *remote, buckets="1,2", env=SIGNED)
    assert proc.returncode == 1, proc.stderr
    by_bucket = {r["bucket"]: r for r in report["results"]}
    assert by_bucket[1]["status"] == "ok" and by_bucket[2]["status"] == "failed"
    assert by_bucket[2]["cache"]["fx_graph_misses"] >= 1  # it did compile something
    assert report["remote"]["publish"]["generation"] == 1

    proc, again = warmup(tmp_path / "b", "tiny", "inductor_wrong_at_2", *remote, buckets="1,2", env=SIGNED)
    assert again["remote"]["pull"]["generation"] == 1
    by_bucket = {r["bucket"]: r for r in again["results"]}
    assert by_bucket[1]["cache_state"] == "hit"
    assert by_bucket[2]["cache"]["fx_graph_hits"] == 0 and by_bucket[2]["cache"]["fx_graph_misses"] >= 1


def test_without_a_float64_run_the_gate_judges_against_eager_and_says_why(tmp_path):
    proc, report = warmup(tmp_path, "float32_only", "eager", buckets="4")
    assert proc.returncode == 0, proc.stderr
    (result,) = report["results"]
    assert result["gate_reference"] == "eager" and (result["atol"], result["rtol"]) == (1e-3, 1e-3)
    assert result["gate_note"] == "no float64 run: TypeError: float32 only, got torch.float64"
    assert result["float64_error"] is None and result["gate_multiple"] is None


def test_a_float64_run_that_would_not_fit_in_memory_is_not_tried(monkeypatch):
    import torch

    from orchestrator.jobs import engine
    from orchestrator.jobs.gate import snapshot

    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    reference = snapshot(model(x))
    runs, note = engine.float64_outputs(model, [((x,), {})], torch.device("cpu"), reference)
    assert note is None and runs is not None and runs[0][0].value.dtype == torch.float64
    monkeypatch.setattr(engine, "_free_memory", lambda device: 1000)
    assert engine.float64_outputs(model, [((x,), {})], torch.device("cpu"), reference) == (
        None,
        "a float64 run of the model needs about 0.0 GiB, 0.0 GiB free",
    )
    rotation = torch.nn.Linear(8, 8)
    rotation.register_buffer("phase", torch.ones(8, dtype=torch.complex64))
    assert engine.float64_outputs(rotation, [((x,), {})], torch.device("cpu"), reference) == (
        None,
        "complex parameters: no float64 copy of the model",
    )
    labels = snapshot(model(x).argmax(-1))
    assert engine.float64_outputs(model, [((x,), {})], torch.device("cpu"), labels) == (
        None,
        "no floating-point output",
    )
