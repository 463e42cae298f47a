"""Distributed warmup on a real Ray cluster: a head on the host plus two worker nodes in network
namespaces (tests/tools/netns-hosts), each declaring one GPU of class H200, so GPU scheduling
is exercised on a machine without GPUs (the workers compile on the CPU)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_measured, orchestrate
from ray_heads import HEAD_OPTIONS, HEADS, cluster_pids, stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(HEADS)]

NETNS_HOSTS = ROOT / "tests" / "tools" / "netns-hosts"  # vendored: see tests/tools/README.md
RAY = str(Path(sys.executable).with_name("ray"))
HEAD_IP, PORT = "10.201.0.1", 6390
MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    def tiny():
        return nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32))

    class RaisesAtTwo(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny()

        def forward(self, x):
            if x.shape[0] == 2:
                raise ValueError("this model refuses batch 2")
            return self.inner(x)

    def raises_at_two():
        return RaisesAtTwo()

    def broken_factory():
        raise RuntimeError("weights not found")
""")


def config(tmp_path: Path, factory: str, buckets: str = "[1, 2]") -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    path = tmp_path / f"{factory}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        name: tiny
        model: {{factory: models.py:{factory}}}
        inputs: [{{shape: [batch, 32]}}]
        buckets: {buckets}
        bench: {{iterations: 5, warmup: 1}}
    """)
    )
    return path


@contextlib.contextmanager
def netns_cluster(port: int, workers: list[tuple[str, dict[str, str]]]):
    """A Ray head on the host (one CPU, no GPU) plus a worker node per (GPU class, extra env) in a
    network namespace of its own (10.201.0.2, .3, ...), each declaring 2 CPUs and one GPU of that
    class; yields the env a driver needs (token) and the head's address."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    full_env = {**os.environ, **env}

    def run(*cmd: str, extra: dict[str, str]) -> None:
        subprocess.run(cmd, env={**full_env, **extra}, check=True, capture_output=True, timeout=180)

    subprocess.run(["bash", str(NETNS_HOSTS), "up", str(len(workers))], check=True, capture_output=True)
    try:
        run(
            RAY,
            "start",
            "--head",
            "--node-ip-address",
            HEAD_IP,
            "--port",
            str(port),
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
            "--include-dashboard",
            "false",
            *HEAD_OPTIONS,
            extra={},
        )
        for i, (gpu_class, extra) in enumerate(workers, start=1):
            run(
                "ip",
                "netns",
                "exec",
                f"orch-h{i}",
                RAY,
                "start",
                "--address",
                f"{HEAD_IP}:{port}",
                "--node-ip-address",
                f"10.201.0.{i + 1}",
                "--num-cpus",
                "2",
                "--num-gpus",
                "1",
                "--resources",
                json.dumps({f"accelerator_type:{gpu_class}": 1}),
                extra=extra,
            )
        yield {**env, "address": f"{HEAD_IP}:{port}"}
    finally:
        stop_cluster(f"{HEAD_IP}:{port}")
        subprocess.run(["bash", str(NETNS_HOSTS), "down"], capture_output=True)


@pytest.fixture(scope="module")
def cluster():
    with netns_cluster(PORT, [("H200", {}), ("H200", {})]) as env:
        yield env


def warmup(cluster: dict, cfg: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in cluster.items() if k != "address"}
    return orchestrate(
        "warmup", "--model", str(cfg), "--ray-address", cluster["address"], "--json", *extra, cache_dir=cache, env=env
    )


def _pids(pattern: str, cluster: dict) -> set[int]:
    """The cluster's processes matching `pattern`: a test beside this one may run its own."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return {int(pid) for pid in found} & cluster_pids(cluster["address"])


def _kill_one(pattern: str, cluster: dict, driver: subprocess.Popen, earlier: set[int], settle: float) -> int | None:
    """SIGKILL one process of this job matching `pattern`, `settle` seconds after it appeared."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and driver.poll() is None:
        for pid in sorted(_pids(pattern, cluster) - earlier):
            time.sleep(settle)
            try:
                os.kill(pid, signal.SIGKILL)
                return pid
            except ProcessLookupError:  # gone meanwhile: try the next one
                earlier.add(pid)
        time.sleep(0.1)
    return None


@pytest.fixture(scope="module")
def warmed(cluster, tmp_path_factory):
    """One warmup of the tiny model on the cluster: (its directory, the finished process)."""
    where = tmp_path_factory.mktemp("warmed")
    return where, warmup(cluster, config(where, "tiny"), where / "cache")


def test_each_bucket_compiles_once_and_every_rank_is_warm(cluster, warmed):
    tmp_path, proc = warmed
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    executor = report["executor"]
    assert (executor["kind"], executor["address"], executor["nodes"], executor["ranks"], executor["compile_units"]) == (
        "ray",
        cluster["address"],
        3,
        2,
        2,
    )
    assert set(executor["wave_seconds"]) == {"start", "compile", "warm"}
    compiled = [r for r in report["results"] if r["phase"] == "compile"]
    warm = [r for r in report["results"] if r["phase"] == "warm"]
    # compile wave: one task per (class, bucket), each a genuine compile
    assert sorted(r["bucket"] for r in compiled) == [1, 2]
    assert all(r["status"] == "ok" and r["cache"]["fx_graph_misses"] == 1 for r in compiled)
    # warm wave: every (rank, bucket) loaded from the cache, on both worker nodes
    assert sorted((r["rank"], r["bucket"]) for r in warm) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert {r["node"] for r in warm} == {"10.201.0.2", "10.201.0.3"}
    for r in warm:
        assert r["status"] == "ok", r["error"]
        assert r["cache_state"] == "hit" and r["cache"]["fx_graph_misses"] == 0
        assert r["gpu"] is None  # declared GPUs, CPU compute
        assert_measured(r)
    assert report["summary"]["cache_state"] == "warm"
    assert report["summary"]["fleet"]["buckets"]["1"]["ranks_ok"] == 2
    # both nodes pulled into their own directory: nothing was shared through the filesystem
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("node-")) == [
        "node-10.201.0.2",
        "node-10.201.0.3",
    ]
    assert "compile bucket 1 [H200]" in proc.stderr and "warm rank 1" in proc.stderr
    # one wave in time: the ranks' processes were up before compiling ended, and each loaded a
    # bucket as soon as it was published
    timeline = executor["timeline"]
    compile_end = max(row["ended_s"] for row in timeline if row["wave"] == "compile")
    ranks = [row for row in timeline if row["wave"] == "warm"]
    assert len(ranks) == 2 and all(row["started_s"] < compile_end for row in ranks)
    assert all(row["started_s"] < row["ended_s"] <= row["answered_s"] for row in timeline)
    assert "rank 0 (" in proc.stderr and "loaded bucket 2: ok" in proc.stderr


def test_a_rank_killed_mid_job_is_restarted_and_finishes(cluster, warmed, tmp_path):
    """From the store a warmup published (the nodes' own directories left behind): what is
    under test is the rank's restart, which a cold compile wave would only delay."""
    published, _ = warmed
    shutil.copytree(published / "cache", tmp_path / "cache", ignore=shutil.ignore_patterns("node-*", "logs"))
    env = {**os.environ, **{k: v for k, v in cluster.items() if k != "address"}}
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "warmup",
        "--model",
        str(config(tmp_path, "tiny")),
        "--ray-address",
        cluster["address"],
        "--json",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    earlier = _pids("ray::RankWorker", cluster)  # a previous job's ranks may still be dying
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = _kill_one("ray::RankWorker", cluster, driver, earlier, settle=2.0)  # into its set-up or its first load
    out, err = driver.communicate(timeout=600)
    assert killed is not None, "never saw a rank running"
    assert driver.returncode == 0, err
    report = json.loads(out)
    warm = [r for r in report["results"] if r["phase"] == "warm"]
    assert sorted((r["rank"], r["bucket"]) for r in warm) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    # the restarted rank loaded from the cache like the other: nothing compiled, anywhere
    assert all(r["status"] == "ok" and r["cache_state"] == "hit" for r in warm)
    assert all(r["cache"]["fx_graph_misses"] == 0 for r in report["results"])


def test_a_worker_killed_mid_compile_is_retried(cluster, tmp_path):
    env = {**os.environ, **{k: v for k, v in cluster.items() if k != "address"}}
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "warmup",
        "--model",
        str(config(tmp_path, "tiny", "[4]")),
        "--ray-address",
        cluster["address"],
        "--json",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    earlier = _pids("ray::CompileWorker", cluster)
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = _kill_one("ray::CompileWorker", cluster, driver, earlier, settle=1.0)  # let it get into the compile
    out, err = driver.communicate(timeout=600)
    assert killed is not None, "never saw a compile task running"
    assert driver.returncode == 0, err
    report = json.loads(out)
    assert all(r["status"] == "ok" for r in report["results"])
    assert [r["bucket"] for r in report["results"] if r["phase"] == "compile"] == [4]
    # the retried unit removed the killed one's private directory, which its own clean-up never reached
    assert not list((tmp_path / "cache").glob("node-*/.compile-*"))


def _job_ended_like_one_process(proc: subprocess.CompletedProcess, cache: Path, code: int, says: str) -> None:
    """Ended as `warmup --no-ray` ends on the same store: the exit code, the store's one line and
    nothing else of the job's (no traceback, no table, no report on stdout), nothing in the cache."""
    assert proc.returncode == code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "FAILED" not in proc.stderr and "None" not in proc.stderr
    assert proc.stdout == ""
    # no node directory, no compile scratch, no namespace: only the run's log of Ray's own lines
    assert sorted(p.name for p in cache.iterdir()) in ([], ["logs"]), list(cache.rglob("*"))


def test_a_tampered_store_ends_the_job_with_exit_4_and_leaves_nothing(cluster, warmed, tmp_path):
    """Every rank and compile unit pulls first; the first to find the store's shard altered
    ends the job at once, everywhere."""
    published, _ = warmed
    store = tmp_path / "store"
    shutil.copytree(published / "cache" / "store", store)
    shard = next(p for p in (store / "v1" / "objects").rglob("*") if p.is_file())
    shard.write_bytes(shard.read_bytes()[:-8] + b"tampered")  # its declared size, other bytes
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = warmup(
        cluster,
        config(tmp_path, "tiny"),
        cache,
        "--remote",
        f"file://{store}",
        "--trust",
        str(published / "cache" / ".signing-key.pub"),
    )
    _job_ended_like_one_process(proc, cache, 4, "does not match its sha256")


def test_a_store_the_nodes_cannot_reach_ends_the_job_with_exit_3(cluster, moto_server, tmp_path):
    """The driver reaches the store (its own checks pass); the nodes, in network namespaces of
    their own, do not: their loopback is not the driver's."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {moto_server.access_key}\naws_secret_access_key = {moto_server.secret_key}\n"
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {k: v for k, v in cluster.items() if k != "address"}
    proc = orchestrate(
        "warmup",
        "--model",
        str(config(tmp_path, "tiny")),
        "--ray-address",
        cluster["address"],
        "--json",
        "--remote",
        f"s3://{moto_server.make_bucket()}/cache",
        "--allow-unsigned",
        cache_dir=cache,
        env={
            **env,
            "AWS_ENDPOINT_URL_S3": moto_server.endpoint,
            "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
            "AWS_DEFAULT_REGION": moto_server.region,
            "ORCHESTRATE_STORE_ATTEMPTS": "2",
            "ORCHESTRATE_STORE_RETRY_SECONDS": "2",
        },
    )
    _job_ended_like_one_process(proc, cache, 3, "gave up after 2 attempts")


def test_a_failing_bucket_is_reported_and_the_rest_succeed(cluster, tmp_path):
    proc = warmup(cluster, config(tmp_path, "raises_at_two"), tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    by_bucket = {b: [r for r in report["results"] if r["bucket"] == b] for b in (1, 2)}
    assert all(r["status"] == "ok" for r in by_bucket[1]) and len(by_bucket[1]) == 3  # 1 compile + 2 ranks
    assert len(by_bucket[2]) == 3
    for r in by_bucket[2]:
        assert r["status"] == "failed" and "refuses batch 2" in r["error"]
    assert report["summary"]["fleet"]["buckets"]["2"]["ranks_failed"] == 2
    # counted per bucket, not per record; a rank's record names the rank's node even where the
    # driver wrote it (the compile failed, so the rank never loaded the bucket)
    assert (report["summary"]["buckets_ok"], report["summary"]["buckets_failed"]) == (1, 1)
    nodes = {r["rank"]: r["node"] for r in by_bucket[1] if r["phase"] == "warm"}
    assert all(r["node"] == nodes[r["rank"]] for r in by_bucket[2] if r["phase"] == "warm")
    assert "None" not in proc.stderr, proc.stderr


def test_a_factory_that_fails_everywhere_is_a_config_error(cluster, tmp_path):
    proc = warmup(cluster, config(tmp_path, "broken_factory"), tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error:")]
    assert len(errors) == 1 and "weights not found" in errors[0]


def test_unreachable_cluster_is_one_line(tmp_path):
    proc = orchestrate(
        "warmup",
        "--model",
        str(config(tmp_path, "tiny")),
        "--ray-address",
        "127.0.0.1:9",
        cache_dir=tmp_path / "cache",
        env={"RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert proc.returncode == 6
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error: cannot join")]


def test_ctrl_c_stops_the_job_cleanly(cluster, tmp_path):
    env = {**os.environ, **{k: v for k, v in cluster.items() if k != "address"}}
    cache = tmp_path / "cache"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "warmup",
        "--model",
        str(config(tmp_path, "tiny", "[8, 16]")),
        "--ray-address",
        cluster["address"],
        "--cache-dir",
        str(cache),
    ]
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and driver.poll() is None:
        if _pids("ray::CompileWorker", cluster):
            break
        time.sleep(0.1)
    time.sleep(1.0)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err
    assert "orchestrate: error: interrupted" in err
    # the cancelled compile tasks and the ranks are gone, and the store holds only whole, verifiable states
    for _ in range(100):
        if not _pids("ray::CompileWorker|ray::RankWorker", cluster):
            break
        time.sleep(0.1)
    else:
        pytest.fail("compile tasks or ranks still running after Ctrl-C")
    store = cache / "store"
    assert not [p for p in store.rglob("*") if p.name.startswith(".tmp-")]
    verify = orchestrate("cache", "verify", "--remote", f"file://{store}", "--trust", str(cache / ".signing-key.pub"))
    assert verify.returncode == 0, verify.stdout + verify.stderr
