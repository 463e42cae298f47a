"""The README's main command: `orchestrate warmup` on its embedded defaults, a local Ray instance
and a local directory store, here on the CPU."""

import json

import pytest

from conftest import orchestrate

pytestmark = pytest.mark.slow


def test_default_path_runs_on_a_local_ray_instance(tmp_path):
    proc = orchestrate("warmup", "--model", "examples/mlp.yaml", "--buckets", "1,2", "--device", "cpu", "--json",
                       cache_dir=tmp_path / "cache", env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                                                          "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["executor"]["kind"] == "ray" and report["executor"]["address"] == "local"
    assert sorted((r["phase"], r["bucket"]) for r in report["results"]) == [
        ("compile", 1), ("compile", 2), ("warm", 1), ("warm", 2)]
    assert all(r["status"] == "ok" for r in report["results"])
    assert report["summary"]["cache_state"] == "warm"  # the rank loaded what the compile wave published
    assert report["remote"]["url"].startswith("file://") and report["remote"]["published_generations"] == [1, 2]
    # the embedded store is signed with a key made once, readable by its owner only
    key = tmp_path / "cache" / ".signing-key"
    assert key.stat().st_mode & 0o777 == 0o600
