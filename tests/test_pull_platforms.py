"""A replica whose platform differs from the warmup's misses the cache, and `orchestrate pull` says
so in one line naming both platforms; without --to it fills the directory that `orchestrate serve
--cache-dir` and runtime.load(cache_dir=...) load from."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from conftest import ROOT, orchestrate
from test_pull_no_torch import pull_mlp

from orchestrator.cache import sync
from orchestrator.cache.manifest import SigningKey, TrustedKeys
from orchestrator.cache.namespace import Platform, describe, differing, model_prefix, namespace
from orchestrator.cache.store import LocalStore, StoreUnreachable, open_store
from orchestrator.config import cache_root, load_spec_with_overrides
from orchestrator.errors import EXIT_MISS
from orchestrator.jobs import platform_probe

KEY = SigningKey.generate()
STRANGER = SigningKey.generate()  # a key the replica does not trust
SPEC = load_spec_with_overrides(str(ROOT / "examples" / "mlp.yaml"), device="cpu")
HERE = platform_probe.cache_platform(SPEC)
# the warmup's machine: an H200 with a torch no machine running these tests has (2.11 to 2.13),
# so that the torch it names always differs from this pod's
H200 = Platform(
    torch_version="2.10.0+cu128",
    torch_git="70d99e998b4955e0049d13a98d77ae1b14db1f45",
    triton_version="3.5.1",
    cuda_version="12.8",
    gpu_name="NVIDIA H200",
    python_version="3.12.3",
)


def publish_for(store, tmp_path: Path, platform: Platform, *, key=KEY, meta=None, config=None) -> str:
    """A namespace of examples/mlp.yaml published as a warmup on `platform` would publish it. The
    files are stand-ins and the platform is made up: what this pull sees of another machine's
    warmup is its namespace's name and its manifest, and both are exactly what that warmup writes
    (jobs/engine.py's meta)."""
    config = config or SPEC.identity_hash()
    name = namespace(SPEC.label, platform, config)
    files = tmp_path / "published" / name / "inductor"
    files.mkdir(parents=True)
    (files / "entry").write_bytes(name.encode())
    if meta is None:
        meta = {"model": SPEC.name, "config": config, "platform": asdict(platform)}
    sync.publish(store, files.parent, name, key, allow_unsigned=False, meta=meta)
    return name


@pytest.fixture
def store(tmp_path):
    (tmp_path / "store").mkdir()
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture
def trust(tmp_path):
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    return str(public)


def error_lines(stderr: str) -> list[str]:
    """stderr without the line the test wrapper adds about torch."""
    return [line for line in stderr.splitlines() if not line.startswith("torch imported:")]


def test_a_pod_on_another_platform_fails_with_one_line_naming_both(store, trust, tmp_path):
    warmed = publish_for(store, tmp_path, H200)
    # neither of these explains the miss: another config of the model, and a manifest the pod cannot verify
    publish_for(store, tmp_path, replace(H200, gpu_name="NVIDIA L4"), config="0" * 64)
    publish_for(store, tmp_path, replace(H200, gpu_name="NVIDIA B200"), key=STRANGER)
    proc = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"))
    assert proc.returncode == EXIT_MISS, proc.stderr
    [line] = error_lines(proc.stderr)
    mine = platform_probe.cache_namespace(SPEC)
    assert line.startswith(f"orchestrate: error: namespace {mine} was never published to {store.url}: ")
    assert "this model's config was warmed for NVIDIA H200, torch 2.10.0+cu128" in line
    assert f", but this pod is {describe(asdict(HERE), differing(HERE, [asdict(H200)]))};" in line
    assert HERE.gpu_name.removeprefix("cpu-") in line and "on a node with that GPU" in line
    assert "L4" not in line and "B200" not in line
    assert "torch imported: False" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["hit"] is False and summary["platform"] == asdict(HERE)
    assert [(p["namespace"], p["platform"], p["same_config"]) for p in summary["published"]] == [
        (warmed, asdict(H200), True)
    ]
    assert not (tmp_path / "replica").exists()


def test_allow_miss_starts_cold_and_warns_with_the_same_reason(store, trust, tmp_path):
    publish_for(store, tmp_path, H200)
    failed = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"))
    allowed = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"), "--allow-miss")
    assert allowed.returncode == 0, allowed.stderr
    [warning] = error_lines(allowed.stderr)
    reason = error_lines(failed.stderr)[0].removeprefix("orchestrate: error: ")
    assert warning == f"orchestrate: warning: {reason}; starting cold (--allow-miss)"


def test_a_store_without_this_model_says_to_warm_it(store, trust, tmp_path):
    proc = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"))
    assert proc.returncode == EXIT_MISS
    [line] = error_lines(proc.stderr)
    assert line.endswith("; run `orchestrate warmup --remote` first, or pass --allow-miss to start cold")
    assert json.loads(proc.stdout)["published"] == []
    # given --allow-miss, the warning does not ask for it again
    allowed = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"), "--allow-miss")
    assert allowed.returncode == 0, allowed.stderr
    [warning] = error_lines(allowed.stderr)
    assert warning.endswith("; run `orchestrate warmup --remote` first; starting cold (--allow-miss)")


def test_a_manifest_without_a_config_matches_by_model_name_and_says_probably(store, trust, tmp_path):
    """Manifests written before they recorded the config hash: the model's name is all there is."""
    publish_for(store, tmp_path, H200, meta={"model": SPEC.name, "platform": asdict(H200)})
    proc = pull_mlp("--remote", store.url, "--trust", trust, "--to", str(tmp_path / "replica"))
    [line] = error_lines(proc.stderr)
    assert f"a model named {SPEC.label} was warmed (probably this config" in line and "NVIDIA H200" in line
    assert json.loads(proc.stdout)["published"][0]["same_config"] is False


def test_the_search_reads_a_bounded_number_of_manifests_the_newest_first(store, tmp_path, monkeypatch):
    names = [publish_for(store, tmp_path, replace(H200, gpu_name=f"GPU {n}")) for n in range(4)]
    reads: list[str] = []
    read = LocalStore.read
    monkeypatch.setattr(LocalStore, "read", lambda self, key, limit: reads.append(key) or read(self, key, limit))
    found = sync.published_elsewhere(store, SPEC.label, SPEC.identity_hash(), None, allow_unsigned=False, limit=2)
    assert len(reads) == 2
    assert not found  # nothing trusted: unverifiable manifests are left out
    trusted = TrustedKeys.from_pems([KEY.public.pem()])
    found = sync.published_elsewhere(store, SPEC.label, SPEC.identity_hash(), trusted, allow_unsigned=False, limit=2)
    assert {f.namespace for f in found} <= set(names) and len(found) == 2


def test_a_store_that_fails_the_listing_leaves_the_miss_a_miss(store, tmp_path, monkeypatch):
    """The reason is worth one listing; a store that refuses it still gives exit 5, not 3."""
    publish_for(store, tmp_path, H200)

    def refuse(self, prefix):
        raise StoreUnreachable("store down")

    monkeypatch.setattr(LocalStore, "list", refuse)
    assert sync.published_elsewhere(store, SPEC.label, SPEC.identity_hash(), None, allow_unsigned=False) == []


def test_a_store_lists_by_string_prefix_as_s3_does(store, tmp_path):
    """published_elsewhere lists `v1/namespaces/<model>-torch`: a prefix, not a folder."""
    mine = publish_for(store, tmp_path, H200)
    listed = {item.key.split("/")[2] for item in store.list(f"v1/namespaces/{model_prefix(SPEC.label)}")}
    assert listed == {mine}
    assert store.list("v1/namespaces/nosuch-torch") == []
    assert {item.key for item in store.list("v1/names")} == {item.key for item in store.list("v1/namespaces/")}


def test_only_the_fields_that_differ_are_named():
    other = replace(H200, gpu_name="NVIDIA A100-SXM4-80GB")
    assert differing(H200, [asdict(other)]) == ["gpu_name"]
    assert describe(asdict(other), ["gpu_name"]) == "NVIDIA A100-SXM4-80GB"
    older = replace(other, torch_version="2.9.1+cu128", torch_git="abc")
    assert differing(H200, [asdict(older)]) == ["gpu_name", "torch_version"]  # a version names its commit
    assert differing(H200, [asdict(replace(H200, torch_git="abc"))]) == ["torch_git"]
    cpu = replace(H200, gpu_name="cpu-x86_64", cuda_version=None, triton_version=None)
    assert describe(asdict(cpu)) == (
        f"CPU x86_64, torch 2.10.0+cu128, torch commit {H200.torch_git[:12]}, no Triton, no CUDA, Python 3.12.3"
    )


def test_a_miss_on_s3_names_the_warmed_platform(moto_server, monkeypatch, tmp_path, trust):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", moto_server.region)
    url = f"s3://{moto_server.make_bucket()}/cache"
    publish_for(open_store(url), tmp_path, H200)
    proc = pull_mlp("--remote", url, "--trust", trust, "--to", str(tmp_path / "replica"))
    assert proc.returncode == EXIT_MISS, proc.stderr
    [line] = error_lines(proc.stderr)
    assert "this model's config was warmed for NVIDIA H200" in line and url in line


# --- pull without --to ------------------------------------------------------------------------------


def test_without_to_the_namespace_lands_under_the_cache_root(store, trust, tmp_path):
    name = publish_for(store, tmp_path, HERE)
    proc = pull_mlp("--remote", store.url, "--trust", trust, "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    spec = load_spec_with_overrides(
        str(ROOT / "examples" / "mlp.yaml"), device="cpu", cache_dir=str(tmp_path / "cache")
    )
    assert json.loads(proc.stdout)["to"] == str(cache_root(spec) / name)
    assert (tmp_path / "cache" / name / "inductor" / "entry").read_bytes() == name.encode()
    assert not (tmp_path / "cache" / "store").exists()  # a --remote pull makes no local store


ROWS = """
import torch

class Rows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.linear(x))

def rows():
    return Rows()
"""


@pytest.mark.slow
def test_a_pull_without_to_is_what_the_replica_loads_with_no_second_pull(tmp_path, monkeypatch):
    """The init container's `pull --cache-dir ROOT` and then the server's runtime.load(cache_dir=ROOT)
    with no store at all: every bucket loads on what warmup chose, compiled ones from the cache."""
    import torch

    from orchestrator import runtime
    from orchestrator.config import load_spec
    from orchestrator.jobs.model import build_model, make_inputs

    (tmp_path / "models.py").write_text(ROWS)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "model: {factory: models.py:rows}\ninputs: [{shape: [batch, 6]}]\nbuckets: [1, 4]\ndevice: cpu\n"
        "compile: {mode: default}\nbench: {iterations: 20, warmup: 2}\n"
    )
    (tmp_path / "store").mkdir()
    store = f"file://{tmp_path / 'store'}"
    key = SigningKey.generate()
    key_file = tmp_path / "signing.key"
    key_file.write_bytes(key.pem())
    key_file.chmod(0o600)
    public = tmp_path / "signing.pub"
    public.write_text(key.public.pem())
    signing = {"ORCHESTRATE_CACHE_SIGNING_KEY_FILE": str(key_file)}
    warm = orchestrate("warmup", "--no-ray", "--model", str(cfg), "--remote", store, "--json", env=signing)
    assert warm.returncode == 0, warm.stderr
    chosen = {r["bucket"]: r["variant"] for r in json.loads(warm.stdout)["results"]}

    root = tmp_path / "replica"
    pulled = orchestrate(
        "pull", "--model", str(cfg), "--remote", store, "--trust", str(public), "--json", cache_dir=root
    )
    assert pulled.returncode == 0, pulled.stderr
    summary = json.loads(pulled.stdout)
    assert summary["hit"] is True and summary["files"] > 0

    model = runtime.load(cfg, cache_dir=root, require_warm=True, ready="planned")
    info = model.info()
    assert info.pull is None  # nothing to pull from: what it serves is what the init container put there
    assert str(root.resolve() / info.namespace) == summary["to"]
    assert {b: i.variant for b, i in info.buckets.items()} == chosen
    assert all(i.cache_misses == 0 for i in info.buckets.values())
    spec = load_spec(cfg)
    args, kwargs = make_inputs(spec, 3, torch.device("cpu"))
    with torch.no_grad():
        want = build_model(spec, torch.device("cpu"))(*args, **kwargs)
    torch.testing.assert_close(model(*args), want)
