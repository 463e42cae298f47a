"""On a CUDA machine: reduce-overhead really records CUDA graphs and the second process is warm.
Skipped where torch sees no GPU (CI); run on the GPU machine with `pytest tests/test_gpu_e2e.py`."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, assert_measured, orchestrate

# A serving replica on what `orchestrate pull` fetched, compiled as examples/resnet18.yaml says:
# argv[1] "bare" is plain torch, "prepared" first makes the one call docs/cache.md asks of a server.
SERVER = """
import json, sys, torch, torchvision
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.serving import prepare_replica
if sys.argv[1] == "prepared":
    prepare_replica()
model = torchvision.models.resnet18(weights=None, num_classes=1000).cuda().eval()
server = torch.compile(model, mode="reduce-overhead", dynamic=False)
window = ti.CounterWindow()
with torch.no_grad():
    for batch in map(int, sys.argv[2:]):
        server(torch.randn(batch, 3, 224, 224, device="cuda"))
stats = window.stats()
print(json.dumps({"hits": stats.fx_hits, "misses": stats.fx_misses, "autotuned": stats.autotuned_kernels}))
"""

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_graphs_recorded_and_second_process_warm(tmp_path):
    runs = []
    for _ in range(2):
        proc = orchestrate(
            "warmup",
            "--no-ray",
            "--model",
            "examples/mlp.yaml",
            "--buckets",
            "1,4",
            "--device",
            "cuda",
            "--json",
            cache_dir=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout))
    cold, warm = runs
    assert cold["device"] == "cuda:0" and cold["gpu"] == torch.cuda.get_device_name(0)
    assert cold["namespace"] == warm["namespace"]
    assert cold["summary"]["cache_state"] == "cold" and warm["summary"]["cache_state"] == "warm"
    for result in cold["results"] + warm["results"]:
        assert result["status"] == "ok", result["error"]
        assert result["cudagraphs"] is True and result["cudagraph_skip_reasons"] == []
        assert result["peak_memory_kind"] == "cuda_allocated" and result["peak_memory_bytes"] > 0
        assert result["recompiles"] == 0
    assert all(r["cache"]["fx_graph_misses"] == 0 for r in warm["results"])
    # the Triton kernels were written under the namespace, not torch's default /tmp directory
    assert any((tmp_path / cold["namespace"] / "triton").rglob("*.cubin"))


def test_ray_fleet_on_the_gpu_compiles_once_and_every_rank_replays_graphs(tmp_path):
    """The default path: a local Ray instance, the rank beside the compile tasks on one GPU.
    resnet18, because its kernels have launch configs to tune (the MLP's have one each)."""
    pytest.importorskip("torchvision")
    proc = orchestrate(
        "warmup",
        "--model",
        "examples/resnet18.yaml",
        "--buckets",
        "1,4,16",
        "--device",
        "cuda",
        "--json",
        cache_dir=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    compiled = [r for r in report["results"] if r["phase"] == "compile"]
    warm = [r for r in report["results"] if r["phase"] == "warm"]
    assert sorted(r["bucket"] for r in compiled) == [1, 4, 16]
    assert len(warm) == 3 * torch.cuda.device_count()
    for result in warm:
        assert result["status"] == "ok", result["error"]
        assert result["cache_state"] == "hit" and result["gpu"] == torch.cuda.get_device_name(0)
        # loaded bucket by bucket, benchmarked after all: still one graph per bucket, no recompile
        assert result["cudagraphs"] is True and result["recompiles"] == 0
        assert_measured(result)
        # a rank's copy of the units' tuned configs is found where it pulled them (the autotuners
        # in the cache entries name the units' private directories, deleted by now)
        assert result["cache"]["autotuned_kernels"] == 0
    assert sum(r["cache"]["autotuned_kernels"] for r in compiled) > 0
    assert not list(tmp_path.rglob(".compile-*")), "something was written under a unit's private directory"

    # serving replicas: the init container pulls, the server's own torch.compile hits everything;
    # a bare one re-tunes the kernels' launch configs, a prepared one finds the published ones
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for kind in ("prepared", "bare"):
        replica = tmp_path / f"replica-{kind}"
        pulled = orchestrate(
            "pull",
            "--model",
            "examples/resnet18.yaml",
            "--device",
            "cuda",
            "--to",
            str(replica),
            "--remote",
            report["remote"]["url"],
            "--trust",
            str(tmp_path / ".signing-key.pub"),
        )
        assert pulled.returncode == 0, pulled.stderr
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(replica / "inductor"),
            "TRITON_CACHE_DIR": str(replica / "triton"),
            "PYTHONPATH": path,
        }
        served = subprocess.run(
            [sys.executable, "-c", SERVER, kind, "1", "4", "16"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert served.returncode == 0, served.stderr
        stats = json.loads(served.stdout.splitlines()[-1])
        assert (kind, stats["hits"], stats["misses"]) == (kind, 3, 0)
        if kind == "prepared":
            assert stats["autotuned"] == 0
