"""`orchestrate pull` works out its namespace without importing torch (jobs.platform_probe), and
that namespace is exactly the one a warmup's workers, which ask torch, publish under."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from orchestrator.cache import sync
from orchestrator.cache.manifest import SigningKey
from orchestrator.cache.store import open_store
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs import platform_probe

KEY = SigningKey.generate()  # the publisher's; the replica below holds only its public half
# The CLI as `python -m orchestrator`, saying on stderr at exit whether torch was ever imported.
WRAPPER = """
import atexit, runpy, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
sys.argv = ["orchestrate", *sys.argv[1:]]
runpy.run_module("orchestrator", run_name="__main__")
"""


def pull_mlp(*args: str) -> subprocess.CompletedProcess:
    """`orchestrate pull --json` of examples/mlp.yaml on the CPU in a fresh process, through
    WRAPPER; no ORCHESTRATE_* setting of this environment reaches it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ORCHESTRATE_")}
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, "pull", "--model", "examples/mlp.yaml", "--device", "cpu", "--json", *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_the_probe_names_the_namespace_torch_would(device, monkeypatch):
    from orchestrator.jobs.engine import cache_namespace as with_torch

    spec = load_spec_with_overrides(str(ROOT / "examples" / "mlp.yaml"), device=device)
    expected = with_torch(spec)
    monkeypatch.delitem(sys.modules, "torch")  # the probe reads torch/version.py, as in a fresh process
    assert platform_probe.probe(device) is not None
    assert platform_probe.cache_namespace(spec) == expected


def test_device_cuda_without_a_gpu_is_left_to_torch():
    """torch's error says why there is no GPU; the probe does not guess."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert platform_probe.probe("cuda") is None


def test_pull_fills_the_directory_without_importing_torch(tmp_path):
    from orchestrator.jobs.engine import cache_namespace

    spec = load_spec_with_overrides(str(ROOT / "examples" / "mlp.yaml"), device="cpu")
    published = tmp_path / "published"
    (published / "inductor" / "fxgraph").mkdir(parents=True)
    (published / "inductor" / "fxgraph" / "entry").write_bytes(b"compiled")
    store = tmp_path / "store"
    store.mkdir()
    sync.publish(
        open_store(f"file://{store}"),
        published,
        cache_namespace(spec),
        KEY,
        allow_unsigned=False,
    )
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    proc = pull_mlp("--to", str(tmp_path / "replica"), "--remote", f"file://{store}", "--trust", str(public))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hit"] is True
    assert (tmp_path / "replica" / "inductor" / "fxgraph" / "entry").read_bytes() == b"compiled"
    assert "torch imported: False" in proc.stderr


def test_pull_defaults_to_the_store_warmup_publishes_to(tmp_path):
    """No --remote and no `remote:`: pull reads the store beside the local cache, trusting its own
    key pair, as `warmup` writes it when it is given no store."""
    from orchestrator.config import embedded_store
    from orchestrator.jobs.engine import cache_namespace

    spec = load_spec_with_overrides(str(ROOT / "examples" / "mlp.yaml"), device="cpu")
    root = tmp_path / "cache"
    local = embedded_store(root, allow_unsigned=False)
    published = tmp_path / "published" / "inductor"
    published.mkdir(parents=True)
    (published / "entry").write_bytes(b"compiled")
    sync.publish(
        open_store(local.url),
        published.parent,
        cache_namespace(spec),
        SigningKey.from_env(local.key_file),
        allow_unsigned=False,
    )
    proc = pull_mlp("--to", str(tmp_path / "replica"), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["hit"] is True and summary["remote"] == local.url
    assert (tmp_path / "replica" / "inductor" / "entry").read_bytes() == b"compiled"
    assert "torch imported: False" in proc.stderr
