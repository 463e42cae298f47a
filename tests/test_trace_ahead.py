"""A rank traces its buckets while the compile wave runs, and its load after a publish is then
only Inductor's cache hit (orchestrator.jobs.torch_internals.TraceAhead). Each step runs in a fresh process,
as on the fleet: a compile unit compiles with plain torch.compile, a rank loads what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, assert_measured

pytestmark = pytest.mark.slow

MODELS = """
import torch
from torch import nn


class Broken(nn.Module):
    # a graph break: two graphs per bucket, each handed to Inductor on its own
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        x = torch.relu(self.first(x))
        torch._dynamo.graph_break()
        return self.second(x)


def broken():
    return Broken()
"""

# a compile unit: plain torch.compile, everything published to the cache directory
COMPILE = """
from pathlib import Path
from orchestrator.jobs.engine import run_warmup
from orchestrator.config import load_spec
run = run_warmup(load_spec(CFG), Path(CACHE), fresh=True, benchmark=False, publish=False)
assert all(r.status == "ok" and r.cache_state == "miss" for r in run.results), run.results
"""

# a rank: trace every bucket first (no artifact is read), then load them
RANK = """
import json
from pathlib import Path
from orchestrator.jobs.engine import Session
from orchestrator.jobs import torch_internals as ti
from orchestrator.config import load_spec
spec = load_spec(CFG)
session = Session(spec, Path(CACHE), trace_ahead=True)
window = ti.CounterWindow()
for bucket in spec.buckets:
    session.trace(bucket)
during = window.stats()
results = [session.warm(bucket, benchmark=False) for bucket in spec.buckets]
print(json.dumps({"lookups_while_tracing": during.cache_hits + during.cache_misses,
                  "frames_while_tracing": during.frames_compiled,
                  "events": [what for what, _ in session.run().events],
                  "results": [r.to_dict() for r in results]}))
"""


def python(script: str, cfg: Path, cache: Path) -> subprocess.CompletedProcess:
    code = f"CFG, CACHE = {str(cfg)!r}, {str(cache)!r}\n" + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(
        "name: broken\nmodel: {factory: models.py:broken}\ninputs: [{shape: [batch, 16]}]\nbuckets: [1, 4]\n"
    )
    return cfg


def rank(cfg: Path, cache: Path) -> dict:
    proc = python(RANK, cfg, cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_rank_that_traced_ahead_loads_the_units_artifacts_as_cache_hits(model, tmp_path):
    cache = tmp_path / "cache"
    unit = python(COMPILE, model, cache)
    assert unit.returncode == 0, unit.stderr[-3000:]

    report = rank(model, cache)
    # tracing is Dynamo's alone: both graphs of both buckets traced, nothing looked up yet
    assert report["lookups_while_tracing"] == 0 and report["frames_while_tracing"] >= 4
    assert [e for e in report["events"] if e.startswith("traced")] == ["traced bucket 1", "traced bucket 4"]
    for result in report["results"]:
        # the deferred compile found what plain torch.compile wrote: same cache keys
        assert result["status"] == "ok" and result["cache_state"] == "hit", result["error_detail"]
        assert result["cache"]["fx_graph_hits"] == 2 and result["cache"]["aot_autograd_hits"] == 2
        # the trace's frames and graph break are the bucket's, though counted before its load
        assert result["frames_compiled"] >= 2 and result["graph_breaks"] >= 1
        assert result["recompiles"] == 0
        assert_measured(result, benchmarked=False)
        stages = result["stage_seconds"]  # the trace ahead counts in the bucket's first call
        assert 0.9 * stages["trace ahead"] <= result["compile_seconds"] <= stages["trace ahead"] + stages["compile"]


def test_a_rank_that_traced_ahead_compiles_itself_when_nothing_was_published(model, tmp_path):
    report = rank(model, tmp_path / "empty")
    for result in report["results"]:
        assert result["status"] == "ok" and result["cache_state"] == "miss", result
        assert result["recompiles"] == 0
        assert_measured(result, benchmarked=False)
