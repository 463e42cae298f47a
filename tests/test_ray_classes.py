"""Two GPU classes in one cluster: a node declaring an A10G and one declaring an H200 (network
namespaces, as in test_ray_cluster). Each class compiles every bucket for itself, and what one
class's compile does must not change what the other class's ranks report."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import assert_measured
from ray_heads import HEADS
from test_ray_cluster import netns_cluster, warmup

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(HEADS)]

PORT = 6392
A10G_IP, H200_IP = "10.201.0.2", "10.201.0.3"
# Batch 2 fails only where the node says so (the A10G node's raylet, hence its workers, has the variable)
MODELS = textwrap.dedent("""
    import os
    from torch import nn

    class RefusesTwoOnSomeNodes(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))

        def forward(self, x):
            if x.shape[0] == 2 and os.environ.get("REFUSE_BATCH_2"):
                raise ValueError("this node refuses batch 2")
            return self.inner(x)

    def model():
        return RefusesTwoOnSomeNodes()
""")


@pytest.fixture(scope="module")
def cluster():
    # host 1 (A10G_IP) refuses batch 2, host 2 (H200_IP) does not
    with netns_cluster(PORT, [("A10G", {"REFUSE_BATCH_2": "1"}), ("H200", {})]) as env:
        yield env


def test_a_bucket_failed_on_one_class_stays_warm_and_benchmarked_on_the_other(cluster, tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    cfg = tmp_path / "two.yaml"
    cfg.write_text(
        textwrap.dedent("""
        name: two-classes
        model: {factory: models.py:model}
        inputs: [{shape: [batch, 32]}]
        buckets: [1, 2]
        bench: {iterations: 5, warmup: 1}
    """)
    )
    proc = warmup(cluster, cfg, tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr  # a bucket failed somewhere
    report = json.loads(proc.stdout)
    assert (report["executor"]["ranks"], report["executor"]["compile_units"]) == (2, 4)  # 2 classes x 2 buckets
    # compile units run on their class's node (declared GPUs: the records' "gpu" is the CPU's None)
    compiled = {(r["node"], r["bucket"]): r for r in report["results"] if r["phase"] == "compile"}
    warm = {(r["node"], r["bucket"]): r for r in report["results"] if r["phase"] == "warm"}
    assert sorted(compiled) == [(A10G_IP, 1), (A10G_IP, 2), (H200_IP, 1), (H200_IP, 2)]
    assert compiled[A10G_IP, 2]["status"] == "failed" and "refuses batch 2" in compiled[A10G_IP, 2]["error"]
    assert all(compiled[key]["status"] == "ok" for key in [(A10G_IP, 1), (H200_IP, 1), (H200_IP, 2)])
    # the A10G rank: bucket 2 failed for its class's reason, bucket 1 warm from the cache
    assert warm[A10G_IP, 1]["status"] == "ok" and warm[A10G_IP, 1]["cache_state"] == "hit"
    a10g_rank = warm[A10G_IP, 1]["rank"]
    a10g_two = next(
        r for r in report["results"] if r["phase"] == "warm" and r["rank"] == a10g_rank and r["bucket"] == 2
    )
    assert a10g_two["status"] == "failed" and a10g_two["error"].startswith("not loaded:")
    # the H200 rank keeps both buckets, loaded and benchmarked: the other class's failure is not its own
    for bucket in (1, 2):
        record = warm[H200_IP, bucket]
        assert record["status"] == "ok" and record["cache_state"] == "hit"
        assert_measured(record)
    # each class benchmarks once its own units (on its own node) have ended
    timeline = report["executor"]["timeline"]
    for rank in (row for row in timeline if row["wave"] == "warm"):
        units_here = [row["ended_s"] for row in timeline if row["wave"] == "compile" and row["node"] == rank["node"]]
        benchmarked = [at for what, at in rank["events"] if what.startswith("benchmarked")]
        assert len(units_here) == 2 and benchmarked and min(benchmarked) >= max(units_here)
