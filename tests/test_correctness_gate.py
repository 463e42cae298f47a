"""Compiled output that differs from eager fails its bucket: a backend that perturbs outputs."""

import json

import pytest
import textwrap

from conftest import orchestrate

MODEL = textwrap.dedent("""
    import torch
    from torch._dynamo import register_backend

    @register_backend
    def off_by_one(gm, example_inputs):
        # a broken compiler: right shapes, wrong values
        def run(*args):
            out = gm(*args)
            return type(out)(o + 1.0 for o in out) if isinstance(out, (tuple, list)) else out + 1.0
        return run

    def tiny():
        return torch.nn.Linear(8, 8)
""")


def test_output_mismatch_fails_the_bucket(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    (tmp_path / "cfg.yaml").write_text(textwrap.dedent("""
        model: {factory: m.py:tiny}
        inputs: [{shape: [batch, 8]}]
        compile: {mode: null, backend: off_by_one}
        buckets: [1, 4]
        bench: {iterations: 3, warmup: 1}
    """))
    proc = orchestrate("warmup", "--no-ray", "--model", str(tmp_path / "cfg.yaml"), "--device", "cpu", "--json",
                       cache_dir=tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["summary"]["buckets_failed"] == 2
    for result in report["results"]:
        assert result["status"] == "failed"
        assert result["error"].startswith("check: OutputMismatch: compiled output differs from eager")
        assert result["max_abs_error"] == pytest.approx(1.0, abs=1e-6)
