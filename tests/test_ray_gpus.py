"""GPU shares on one node with several GPUs: a Ray head declaring two H200s (no real GPU needed:
Ray schedules on declared resources and sets CUDA_VISIBLE_DEVICES; the work runs on the CPU).
Each rank must get a GPU of its own, and the compile units must fit beside the ranks. The head
declares 6 CPUs, one more than its 3 compile units and 2 ranks, so the ranks trace ahead."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap

import pytest
from conftest import orchestrate
from ray_heads import HEAD_OPTIONS, HEADS, stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(HEADS)]

PORT = 6391


@pytest.fixture(scope="module")
def head():
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    ray = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    full_env = {**os.environ, **env}
    subprocess.run(
        [
            *ray,
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(PORT),
            "--num-cpus",
            "6",
            "--num-gpus",
            "2",
            "--resources",
            '{"accelerator_type:H200": 1}',
            "--include-dashboard",
            "false",
            *HEAD_OPTIONS,
        ],
        env=full_env,
        check=True,
        capture_output=True,
        timeout=180,
    )
    try:
        yield env
    finally:
        stop_cluster(f"127.0.0.1:{PORT}")


def test_two_ranks_on_one_node_get_a_gpu_each_beside_the_compile_units(head, tmp_path):
    (tmp_path / "models.py").write_text(
        textwrap.dedent("""
        from torch import nn

        def tiny():
            return nn.Sequential(nn.Linear(16, 16), nn.GELU())
    """)
    )
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        textwrap.dedent("""
        name: tiny
        model: {factory: models.py:tiny}
        inputs: [{shape: [batch, 16]}]
        buckets: [1, 2, 3]
        bench: {iterations: 5, warmup: 1}
    """)
    )
    proc = orchestrate(
        "warmup",
        "--model",
        str(cfg),
        "--ray-address",
        f"127.0.0.1:{PORT}",
        "--json",
        cache_dir=tmp_path / "cache",
        env=head,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["executor"]["ranks"], report["executor"]["compile_units"]) == (2, 3)
    timeline = report["executor"]["timeline"]
    ranks = [row for row in timeline if row["wave"] == "warm"]
    units = [row for row in timeline if row["wave"] == "compile"]
    # one GPU per rank, never shared (0.51 each); every compile unit on one of the node's GPUs beside them
    assert sorted(gpu for row in ranks for gpu in row["gpu_ids"]) == ["0", "1"]
    assert len(units) == 3 and all(len(row["gpu_ids"]) == 1 and row["gpu_ids"][0] in ("0", "1") for row in units)
    # both ranks set up while the units compile: Ray packing the units' fractions onto GPU 0 first
    # would leave the second rank no GPU to start on until they ended
    assert max(row["started_s"] for row in ranks) < min(row["ended_s"] for row in units)
    assert all(sum(1 for row in units if row["gpu_ids"] == [gpu]) <= 2 for gpu in ("0", "1"))
    # the milestones show the pipeline: each rank traces every bucket while it waits (a CPU to
    # spare), loads a bucket after its unit published it, and benchmarks only after every unit ended
    published = {row["bucket"]: dict(row["events"])["published"] for row in units}
    for row in ranks:
        events = dict(row["events"])
        assert all(events[f"traced bucket {b}"] <= events[f"loaded bucket {b}"] for b in (1, 2, 3))
        assert all(events[f"loaded bucket {b}"] >= published[b] for b in (1, 2, 3))
        assert min(events[f"benchmarked bucket {b}"] for b in (1, 2, 3)) >= max(u["ended_s"] for u in units)
    warm = [r for r in report["results"] if r["phase"] == "warm"]
    # loads after a trace ahead are cache hits: Inductor found the units' artifacts under the same keys
    assert len(warm) == 6 and all(r["status"] == "ok" and r["cache_state"] == "hit" for r in warm)
    assert all("trace ahead" in r["stage_seconds"] for r in warm)


def test_gpus_held_by_another_job_fail_the_reservation_with_one_line_and_exit_6(head, tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time, ray
            ray.init(address="127.0.0.1:{PORT}")

            @ray.remote(num_gpus=1)
            class Holder:
                def ping(self):
                    return 1

            held = Holder.remote()
            ray.get(held.ping.remote())
            print("held", flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **head},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        cfg = tmp_path / "tiny.yaml"
        (tmp_path / "models.py").write_text("from torch import nn\n\ndef tiny():\n    return nn.Linear(4, 4)\n")
        cfg.write_text("name: tiny\nmodel: {factory: models.py:tiny}\ninputs: [{shape: [batch, 4]}]\nbuckets: [1]\n")
        proc = orchestrate(
            "warmup",
            "--model",
            str(cfg),
            "--ray-address",
            f"127.0.0.1:{PORT}",
            cache_dir=tmp_path / "cache",
            env={**head, "ORCHESTRATE_GPU_WAIT_SECONDS": "3"},
        )
        assert proc.returncode == 6, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if "could not reserve" in line]
        assert len(lines) == 1 and "2 GPUs" in lines[0] and "ORCHESTRATE_GPU_WAIT_SECONDS" in lines[0]
        assert "Traceback" not in proc.stderr and head["RAY_AUTH_TOKEN"] not in proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_grids_points_compile_at_once_across_the_ranks_and_every_rank_warms_them_all(head, tmp_path):
    (tmp_path / "models.py").write_text(
        "from torch import nn\n\ndef tiny():\n    return nn.Sequential(nn.Linear(16, 16), nn.GELU())\n"
    )
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        textwrap.dedent("""
        name: tinygrid
        model: {factory: models.py:tiny}
        inputs: [{shape: [batch, seq, 16], pad: 0}]
        buckets: {batch: [1, 2], seq: [4, 8]}
        bench: {iterations: 5, warmup: 1}
    """)
    )
    proc = orchestrate(
        "warmup", "--model", str(cfg), "--ray-address", f"127.0.0.1:{PORT}", "--json",
        cache_dir=tmp_path / "cache", env=head,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["grid"] == {"batch": [1, 2], "seq": [4, 8]} and report["points"] == ["1x4", "1x8", "2x4", "2x8"]
    assert [part["executor"]["compile_units"] for part in report["slices"]] == [2, 2]
    # one run of both waves for the whole grid: every point's unit compiles beside the others
    units = [row for part in report["slices"] for row in part["executor"]["timeline"] if row["wave"] == "compile"]
    assert len(units) == 4 and max(row["started_s"] for row in units) < min(row["ended_s"] for row in units)
    assert "(class, point) units" in proc.stderr and "compile point 2x8 [H200]" in proc.stderr
    warm = [r for r in report["results"] if r["phase"] == "warm"]
    by_rank: dict[int, list[str]] = {}
    for record in warm:
        assert record["status"] == "ok" and record["cache_state"] == "hit", record
        assert record["padding_proof"]["point"] == record["point"]
        by_rank.setdefault(record["rank"], []).append("x".join(map(str, record["point"].values())))
    assert {rank: sorted(points) for rank, points in by_rank.items()} == {r: report["points"] for r in (0, 1)}
    assert report["summary"]["buckets_failed"] == 0
    # the report reads as an in-process grid's does: a fleet table per slice, a heat map of the grid
    saved = tmp_path / "report.json"
    saved.write_text(proc.stdout)
    table = orchestrate("report", str(saved))
    assert table.returncode == 0 and "tinygrid at seq 4" in table.stdout and "tinygrid at seq 8" in table.stdout
    from orchestrator.reports.html import render_html

    assert render_html(report).count('data-chart="grid"') == 1
