"""The README's main command: `orchestrate warmup` on its embedded defaults, a local Ray instance
and a local directory store, here on the CPU."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, orchestrate

pytestmark = pytest.mark.slow

# A serving replica as users write one: plain torch, the model from its own code, compiled as
# examples/mlp.yaml says, pointed at what `orchestrate pull` fetched; prints Inductor's cache counters.
SERVER = """
import importlib.util, json, torch
from torch._dynamo.utils import counters
spec = importlib.util.spec_from_file_location("models", "examples/models.py")
models = importlib.util.module_from_spec(spec); spec.loader.exec_module(models)
model = models.mlp(layers=24, width=256).eval()
server = torch.compile(model, mode="reduce-overhead", dynamic=False)
with torch.no_grad():
    server(torch.randn(1, 256))
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    cache = tmp_path_factory.mktemp("local") / "cache"
    proc = orchestrate(
        "warmup",
        "--model",
        "examples/mlp.yaml",
        "--buckets",
        "1",  # one compile unit of the README's 24-layer model: more buckets on Ray are tested elsewhere
        "--device",
        "cpu",
        "--json",
        cache_dir=cache,
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    return cache, proc


def test_default_path_runs_on_a_local_ray_instance(fleet):
    cache, proc = fleet
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["executor"]["kind"] == "ray" and report["executor"]["address"] == "local"
    assert sorted((r["phase"], r["bucket"]) for r in report["results"]) == [("compile", 1), ("warm", 1)]
    assert all(r["status"] == "ok" for r in report["results"])
    assert report["summary"]["cache_state"] == "warm"  # the rank loaded what the compile wave published
    # the compile unit's generation, then rank 0's serving plans
    assert report["remote"]["url"].startswith("file://") and report["remote"]["published_generations"] == [1, 2]
    assert all(r["variant"] in ("eager", "compiled") for r in report["results"] if r["phase"] == "warm")
    # the embedded store is signed with a key pair made once, the private key readable by its owner only
    key = cache / ".signing-key"
    assert key.stat().st_mode & 0o777 == 0o600 and (cache / ".signing-key.pub").is_file()


def test_a_plain_torch_server_starts_warm_from_what_the_fleet_published(fleet, tmp_path):
    """The promise to serving pods: init container pulls, the server's own torch.compile hits.
    Inductor keys CPU kernels on torch's thread count, so the server would miss if Ray's
    OMP_NUM_THREADS reached the compile units; it runs with the count the driver had, as the units do."""
    cache, proc = fleet
    assert proc.returncode == 0, proc.stderr
    replica = tmp_path / "replica"
    pulled = orchestrate(
        "pull",
        "--model",
        "examples/mlp.yaml",
        "--device",
        "cpu",
        "--to",
        str(replica),
        "--remote",
        json.loads(proc.stdout)["remote"]["url"],
        "--trust",
        str(cache / ".signing-key.pub"),
    )
    assert pulled.returncode == 0, pulled.stderr
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(replica / "inductor"),
        "TRITON_CACHE_DIR": str(replica / "triton"),
    }
    served = subprocess.run(
        [sys.executable, "-c", SERVER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout.splitlines()[-1]) == {"hits": 1, "misses": 0}


def test_a_runtime_replica_serves_the_plan_the_fleet_published(fleet, tmp_path, monkeypatch):
    """The fleet's rank chose a variant per bucket and published it; a replica with an empty
    cache directory pulls the store and serves each bucket on that variant, from the cache alone."""
    from orchestrator import runtime

    cache, proc = fleet
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    chosen = {r["bucket"]: r["variant"] for r in report["results"] if r["phase"] == "warm"}
    monkeypatch.setenv("ORCHESTRATE_CACHE_TRUSTED_KEYS", str(cache / ".signing-key.pub"))
    served = runtime.load(
        "examples/mlp.yaml",
        cache_dir=tmp_path / "replica",
        remote=report["remote"]["url"],
        buckets=[1],
        device="cpu",
        require_warm=True,
        ready="planned",
    )
    info = served.info()
    assert {b: i.planned for b, i in info.buckets.items()} == chosen
    assert {b: i.variant for b, i in info.buckets.items()} == chosen


# A local instance started as `orchestrate warmup` starts one (orchestrator.fleet.driver._join, no address), with
# a secret in this process's environment that job_env keeps out of the runtime_env.
INHERITS = """
import json, os, ray
from orchestrator.fleet.job_env import job_env_vars
from orchestrator.fleet.driver import _join
assert "AWS_SECRET_ACCESS_KEY" not in job_env_vars()
_join(ray, None, job_env_vars())

@ray.remote(max_restarts=1)
class Worker:
    def env(self):
        return {k: os.environ.get(k) for k in ("AWS_SECRET_ACCESS_KEY", "ORCHESTRATE_CACHE_SIGNING_KEY")}

print(json.dumps(ray.get(Worker.remote().env.remote())))
ray.shutdown()
"""


def test_a_local_instances_workers_inherit_what_the_runtime_env_withholds():
    """Credentials stay out of the runtime_env (Ray's records); the local instance's raylet is
    started from the driver, so its workers still have them without it."""
    secrets = {"AWS_SECRET_ACCESS_KEY": "local-secret-1f3a", "ORCHESTRATE_CACHE_SIGNING_KEY": "local-key-9b2c" * 3}
    env = {
        **os.environ,
        **secrets,
        "PYTHONPATH": str(ROOT),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", INHERITS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == secrets
