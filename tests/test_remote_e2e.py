"""Node A compiles and publishes; node B and a serving replica's init container start warm."""

import json
import shutil

import pytest
from conftest import orchestrate

pytestmark = pytest.mark.slow

SIGNED = {"ORCHESTRATE_CACHE_SIGNING_KEY": "6b" * 32}  # an Ed25519 private key (seed, hex)


def one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("fleet")
    (base / "store").mkdir()
    remote = f"file://{base / 'store'}"
    common = [
        "warmup",
        "--no-ray",
        "--model",
        "examples/mlp.yaml",
        "--buckets",
        "1,2",
        "--device",
        "cpu",
        "--remote",
        remote,
        "--json",
    ]
    node_a = orchestrate(*common, cache_dir=base / "node-a", env=SIGNED)
    node_b = orchestrate(*common, cache_dir=base / "node-b", env=SIGNED)
    return {"base": base, "remote": remote, "a": node_a, "b": node_b}


def test_node_a_compiles_and_publishes(fleet):
    assert fleet["a"].returncode == 0, fleet["a"].stderr
    report = json.loads(fleet["a"].stdout)
    assert report["summary"]["cache_state"] == "cold"
    assert report["remote"]["pull"] is None  # nothing published yet
    assert report["remote"]["publish"]["generation"] == 1 and report["remote"]["publish"]["files"] > 0


def test_node_b_pulls_and_sees_only_hits(fleet):
    assert fleet["b"].returncode == 0, fleet["b"].stderr
    a, b = json.loads(fleet["a"].stdout), json.loads(fleet["b"].stdout)
    assert b["namespace"] == a["namespace"]
    assert b["remote"]["pull"]["generation"] == 1
    assert b["remote"]["pull"]["files"] == a["remote"]["publish"]["files"]
    assert b["summary"]["cache_state"] == "warm"
    assert all(r["cache"]["fx_graph_misses"] == 0 and r["cache"]["fx_graph_hits"] == 1 for r in b["results"])
    assert b["remote"]["publish"]["generation"] == 1  # nothing new: no new generation


def test_init_container_pull_then_server_starts_warm(fleet):
    base, namespace = fleet["base"], json.loads(fleet["a"].stdout)["namespace"]
    target = base / "replica" / namespace
    pulled = orchestrate(
        "pull",
        "--model",
        "examples/mlp.yaml",
        "--device",
        "cpu",
        "--to",
        str(target),
        "--remote",
        fleet["remote"],
        "--json",
        env=SIGNED,
    )
    assert pulled.returncode == 0, pulled.stderr
    summary = json.loads(pulled.stdout)
    assert summary["hit"] and summary["namespace"] == namespace and summary["files"] > 0
    served = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        "examples/mlp.yaml",
        "--buckets",
        "1,2",
        "--device",
        "cpu",
        "--json",
        cache_dir=base / "replica",
    )
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["summary"]["cache_state"] == "warm"


def test_pull_refuses_without_the_key(fleet, tmp_path):
    proc = orchestrate(
        "pull",
        "--model",
        "examples/mlp.yaml",
        "--device",
        "cpu",
        "--to",
        str(tmp_path / "x"),
        "--remote",
        fleet["remote"],
        env={"ORCHESTRATE_CACHE_SIGNING_KEY": ""},
    )
    assert proc.returncode == 4
    assert "which is not trusted" in one_error_line(proc)
    assert not (tmp_path / "x").exists()


def test_pull_of_an_unpublished_namespace(fleet, tmp_path):
    args = [
        "pull",
        "--model",
        "examples/transformer.yaml",
        "--device",
        "cpu",
        "--to",
        str(tmp_path / "x"),
        "--remote",
        fleet["remote"],
    ]
    miss = orchestrate(*args, env=SIGNED)
    assert miss.returncode == 5
    assert "was never published" in one_error_line(miss)
    assert orchestrate(*args, "--allow-miss", env=SIGNED).returncode == 0


def test_cache_ls_and_verify(fleet):
    listed = orchestrate("cache", "ls", "--remote", fleet["remote"], "--json", env=SIGNED)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["namespace"] == json.loads(fleet["a"].stdout)["namespace"] and row["buckets"] == [1, 2]
    verified = orchestrate("cache", "verify", "--remote", fleet["remote"], env=SIGNED)
    assert verified.returncode == 0 and verified.stdout.startswith("ok"), verified.stderr


def test_unreachable_store_fails_fast_with_one_line(tmp_path):
    proc = orchestrate(
        "pull",
        "--model",
        "examples/mlp.yaml",
        "--device",
        "cpu",
        "--to",
        str(tmp_path / "x"),
        "--remote",
        "s3://bucket/prefix",
        env={
            **SIGNED,
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "ORCHESTRATE_STORE_ATTEMPTS": "3",
        },
    )
    assert proc.returncode == 3
    line = one_error_line(proc)
    assert "gave up after 3 attempts" in line and "127.0.0.1:9" in line
    assert "secret" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_damaged_store_is_refused_with_exit_4_and_repaired(fleet, tmp_path):
    """A shard of the published namespace holds other bytes: warmup refuses it (exit 4, naming
    the namespace and the object, the local cache untouched) and so does verify; `cache repair`
    uploads it again from node A's files; and `warmup --fresh` replaces a damaged shard too."""
    store = tmp_path / "store"
    shutil.copytree(fleet["base"] / "store", store)
    remote = f"file://{store}"
    namespace = json.loads(fleet["a"].stdout)["namespace"]

    def damage() -> str:
        shard = max((p for p in (store / "v1" / "objects").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        shard.write_bytes(shard.read_bytes()[:-1] + b"!")
        return f"v1/objects/{shard.name[:2]}/{shard.name}"

    warm = ["warmup", "--no-ray", "--model", "examples/mlp.yaml", "--buckets", "1,2", "--device", "cpu"]
    damaged = damage()
    refused = orchestrate(*warm, "--remote", remote, cache_dir=tmp_path / "node-c", env=SIGNED)
    assert refused.returncode == 4, refused.stderr
    line = one_error_line(refused)
    assert namespace in line and damaged in line and "orchestrate cache repair" in line
    left = [p.name for p in (tmp_path / "node-c").rglob("*") if p.is_file()]
    assert all(name == ".signing-key" or name.endswith(".pull-lock") for name in left), left  # nothing pulled
    assert orchestrate("cache", "verify", "--remote", remote, env=SIGNED).returncode == 4

    repaired = orchestrate("cache", "repair", "--remote", remote, cache_dir=fleet["base"] / "node-a", env=SIGNED)
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.startswith(f"repaired  {namespace}: 1 of") and "1 uploaded again" in repaired.stdout
    verified = orchestrate("cache", "verify", "--remote", remote, env=SIGNED)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    damage()
    fresh = orchestrate(*warm, "--fresh", "--remote", remote, "--json", cache_dir=tmp_path / "node-d", env=SIGNED)
    assert fresh.returncode == 0, fresh.stderr
    verified = orchestrate("cache", "verify", "--remote", remote, env=SIGNED)
    assert verified.returncode == 0, verified.stdout + verified.stderr
