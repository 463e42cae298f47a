"""Names a signed manifest or a store hands to the file system, and pulls that run side by side.

Each test is a case where a validly signed manifest, a stray store object or a sibling pull would
otherwise make a pull, `cache verify` or `cache repair` write, delete or crash outside what it
owns; the checks are where manifests and store keys are parsed (cache/manifest.py `_check_names`,
`decode`; cache/sync.py `_parse_manifest_key`) and in how a pull names its staging.

Fast and CPU only: generated files, a directory store (and moto for S3), no torch."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, orchestrate
from test_cache_integrity import envelope, store, write_signed  # noqa: F401  (store: a fixture)
from test_cache_protocol import ARTIFACTS, KEY, NS, TRUST, make_cache, tree
from test_pull_no_torch import pull_mlp

from orchestrator.cache import manifest as manifest_module
from orchestrator.cache import sync
from orchestrator.cache.manifest import FileEntry, IntegrityError, Manifest, decode
from orchestrator.cache.store import NotFound, open_store
from orchestrator.config import load_spec_with_overrides
from orchestrator.errors import EXIT_MISS, EXIT_UNTRUSTED
from orchestrator.jobs import platform_probe

ESCAPE = "../../../escaped"  # a shard "name" three folders up from wherever it is joined on


def second_generation(store, tmp_path: Path) -> dict:
    """Generation 1 of ARTIFACTS published; the body a generation 2 would start from."""
    sync.publish(store, make_cache(tmp_path / "published", ARTIFACTS), NS, KEY, allow_unsigned=False)
    body = envelope(store, NS, 1)["body"]
    body["generation"] = 2
    return body


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


# --- shard names: a sha256, nothing else ------------------------------------------------------------


@pytest.fixture
def deep_store(tmp_path, monkeypatch):
    """A directory store three folders below tmp_path, and temporary folders as deep, so that a
    shard name of ESCAPE, joined onto the store's object folder, onto a pull's staging folder or
    onto a temporary folder, lands inside tmp_path where the test can see it."""
    root = tmp_path / "a" / "b" / "store"
    root.mkdir(parents=True)
    (tmp_path / "x" / "y").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "x" / "y"))
    return open_store(f"file://{root}")


def _point_every_file_at(body: dict, shard: str) -> None:
    for entry in body["files"].values():
        entry["shard"] = shard
    body["shards"] = {shard: 10240}


def _plant_outside(store, content: bytes) -> Path:
    """The file that shard ESCAPE's key names when joined onto the directory store: outside it."""
    planted = Path(os.path.normpath(Path(store.root) / sync._object_key(ESCAPE)))
    assert not planted.is_relative_to(Path(store.root))
    planted.write_bytes(content)
    return planted


def test_a_shard_name_that_is_a_path_is_refused_before_anything_is_written(deep_store, tmp_path):
    """A signed manifest whose shard is `../../../escaped`: the store object it names is there
    (the attacker put it there), and a pull or a verify downloading it would write it three
    folders above its staging or temporary folder, outside every cache, and then call the local
    cache untouched."""
    store = deep_store
    body = second_generation(store, tmp_path)
    _plant_outside(store, b"whatever the attacker wants written")
    _point_every_file_at(body, ESCAPE)
    write_signed(store, NS, body)
    before = files_under(tmp_path)
    node = tmp_path / "d" / "node"
    message = (
        f"{store.url}/{sync._manifest_key(NS, 2)}: manifest of {NS} names shard {ESCAPE!r}, which is not a sha256 "
        "(64 lowercase hex digits); refusing it"
    )
    with pytest.raises(IntegrityError) as pulled:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    with pytest.raises(IntegrityError) as verified:
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    assert not (tmp_path / "escaped").exists() and files_under(tmp_path) == before  # nothing written anywhere
    assert str(pulled.value) == message and str(verified.value) == message
    assert not node.exists() and not list(node.parent.iterdir())


def test_repair_deletes_no_key_it_has_not_validated(deep_store, tmp_path):
    """`cache repair` deletes the damaged shards it finds: a shard named `../../../escaped` is
    "missing" from the store, and its key, joined onto a directory store, is a file outside it."""
    store = deep_store
    body = second_generation(store, tmp_path)
    victim = _plant_outside(store, b"someone else's file")
    body["files"]["inductor/pr/cprf.py"]["shard"] = ESCAPE
    body["shards"][ESCAPE] = 10240
    write_signed(store, NS, body)
    with pytest.raises(IntegrityError, match=re.escape(f"names shard {ESCAPE!r}, which is not a sha256")):
        sync.repair(store, NS, None, KEY, allow_unsigned=False, trusted=TRUST)
    assert victim.read_bytes() == b"someone else's file"
    assert sync.generations(store, NS) == [1, 2]  # nothing deleted, nothing published


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_cache_commands_refuse_a_shard_name_that_is_a_path_with_exit_4(deep_store, tmp_path, command):
    store = deep_store
    body = second_generation(store, tmp_path)
    victim = _plant_outside(store, b"someone else's file")
    _point_every_file_at(body, ESCAPE)
    write_signed(store, NS, body)
    key_file, public = tmp_path / "signing.key", tmp_path / "signing.pub"
    key_file.write_bytes(KEY.pem())
    public.write_text(KEY.public.pem())
    extra = ["--signing-key-file", str(key_file)] if command == "repair" else []
    # before it was checked, the name led three folders up from a temporary folder: keep that in tmp_path
    env = {"TMPDIR": str(tmp_path / "x" / "y"), "HOME": str(tmp_path / "home")}
    proc = orchestrate("cache", command, "--remote", store.url, "--trust", str(public), *extra, env=env)
    assert proc.returncode == EXIT_UNTRUSTED, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("orchestrate: error: ")
    if command == "repair":
        assert f"names shard {ESCAPE!r}, which is not a sha256" in line
    else:
        assert f"names shard {ESCAPE!r}, which is not a sha256" in proc.stdout
    assert victim.read_bytes() == b"someone else's file" and sync.generations(store, NS) == [1, 2]


def _signed(body: dict) -> str:
    return json.dumps({"body": body, "signature": {"alg": "ed25519", "key_id": KEY.key_id, "value": KEY.sign(body)}})


BODY = Manifest(
    namespace=NS,
    generation=1,
    files={"inductor/a.py": FileEntry(sha256="ab" * 32, size=1, shard="cd" * 32)},
    shards={"cd" * 32: 10240},
).body()


@pytest.mark.parametrize(
    "shard",
    ["CD" * 32, "cd" * 31, "cd" * 32 + "0", "cd" * 32 + "\n", "", "..", "cd/" + "cd" * 31 + "c", "\u0660" * 64],
)
@pytest.mark.parametrize("where", ["files", "shards"])
def test_a_shard_name_other_than_64_lowercase_hex_digits_is_refused(shard, where):
    body = json.loads(json.dumps(BODY))
    if where == "files":
        body["files"]["inductor/a.py"]["shard"] = shard
    else:
        body["shards"][shard] = 1
    with pytest.raises(IntegrityError, match=r"^w: manifest of .* names shard .*, which is not a sha256") as info:
        decode(_signed(body).encode(), TRUST, allow_unsigned=False, where="w")
    assert "\n" not in str(info.value)
    assert decode(_signed(BODY).encode(), TRUST, allow_unsigned=False, where="w").shards == {"cd" * 32: 10240}


def test_a_shard_name_that_is_a_path_is_refused_on_s3(moto_server, monkeypatch, tmp_path):
    """Over S3 the key is literal, but the download lands on the local path the name makes."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", moto_server.region)
    store = open_store(f"s3://{moto_server.make_bucket()}/cache")
    body = second_generation(store, tmp_path)
    planted = tmp_path / "planted"
    planted.write_bytes(b"whatever the attacker wants written")
    store.upload(sync._object_key(ESCAPE), planted)
    _point_every_file_at(body, ESCAPE)
    write_signed(store, NS, body)
    before = files_under(tmp_path)
    node = tmp_path / "d" / "node"
    with pytest.raises(IntegrityError) as pulled:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert not list(tmp_path.glob("escaped*")) and files_under(tmp_path) == before  # nothing written anywhere
    assert f"names shard {ESCAPE!r}, which is not a sha256" in str(pulled.value)


# --- generation keys: exactly what _manifest_key makes ------------------------------------------------


@pytest.mark.parametrize(
    "stray",
    ["gen-3.json", "x/gen-00000009.json", "gen-000000002.json", "old-gen-00000005.json", "gen-0000000\u0665.json"],
)
def test_an_object_named_almost_like_a_generation_is_no_generation(store, tmp_path, stray):
    """Left there by hand or by another tool: a pull, a verify and a listing go on as if it were
    not there, instead of reading a generation that does not exist (exit 3, "not found")."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    path = Path(store.root) / "v1" / "namespaces" / NS / stray
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"junk")
    assert sync.generations(store, NS) == [1]
    assert sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False).generation == 1
    assert tree(tmp_path / "node") == ARTIFACTS
    assert sync.verify(store, NS, TRUST, allow_unsigned=False).generation == 1
    assert [(info.namespace, info.error) for info in sync.describe(store, TRUST, allow_unsigned=False)] == [(NS, None)]


def test_a_generation_nested_in_a_folder_makes_no_namespace(store, tmp_path):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    nested = Path(store.root) / "v1" / "namespaces" / "other" / "x" / "gen-00000001.json"
    nested.parent.mkdir(parents=True)
    nested.write_bytes(store.read(sync._manifest_key(NS, 1), 1 << 26))
    assert sync.namespaces(store) == [NS] and sync.generations(store, "other") == []
    with pytest.raises(NotFound):
        sync.verify(store, "other", TRUST, allow_unsigned=False)


def test_a_manifest_key_is_parsed_exactly():
    assert sync._parse_manifest_key(sync._manifest_key(NS, 7)) == (NS, 7)
    assert sync._parse_manifest_key(sync._manifest_key(NS, 123_456_789)) == (NS, 123_456_789)
    for key in (
        f"v1/namespaces/{NS}/gen-7.json",
        f"v1/namespaces/{NS}/x/gen-00000007.json",
        "v1/namespaces/../gen-00000007.json",
        "v1/namespaces/./gen-00000007.json",
        f"x/v1/namespaces/{NS}/gen-00000007.json",
        f"v1/namespaces/{NS}/gen-00000007.json.tmp",
        "v1/namespaces/gen-00000007.json",
    ):
        assert sync._parse_manifest_key(key) is None, key


# --- paths: within what a filesystem allows -----------------------------------------------------------


def _shard_holding(store, members: dict[str, bytes]) -> str:
    """A shard holding `members` (names no local file could have), uploaded under its hash."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    sha = sync._sha256(data)
    target = Path(store.root) / sync._object_key(sha)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return sha


def _second_generation_adding(store, tmp_path, members: dict[str, bytes]) -> None:
    """Publish, signed, a second generation that adds `members` in one shard of their own."""
    body = second_generation(store, tmp_path)
    shard = _shard_holding(store, members)
    for rel, data in members.items():
        body["files"][rel] = {"sha256": sync._sha256(data), "size": len(data), "shard": shard}
    body["shards"][shard] = (Path(store.root) / sync._object_key(shard)).stat().st_size
    write_signed(store, NS, body)


@pytest.mark.parametrize(
    "rel",
    [
        "inductor/" + "a" * 256,  # one name over NAME_MAX
        "inductor/" + "\u00e9" * 128,  # 128 characters, 256 bytes
        "/".join(["d" * 250] * 9),  # each name fits, the whole does not
    ],
    ids=["256-bytes", "256-bytes-in-128-characters", "2258-bytes-in-all"],
)
def test_a_path_longer_than_a_filesystem_allows_is_refused_when_parsed(store, tmp_path, rel):
    """A shard can hold such a member and verify; only writing it fails (ENAMETOOLONG)."""
    _second_generation_adding(store, tmp_path, {rel: b"code"})
    message = re.escape(f"names a path longer than a filesystem allows (255 bytes a name, 2048 in all): {rel[:100]!r}")
    node = tmp_path / "node"
    with pytest.raises(IntegrityError, match=message) as info:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert "\n" not in str(info.value) and rel not in str(info.value)  # quoted in part: one short line
    assert not node.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".incoming")]
    with pytest.raises(IntegrityError, match=message):
        sync.verify(store, NS, TRUST, allow_unsigned=False)


def test_the_longest_names_a_filesystem_allows_are_pulled(store, tmp_path):
    longest = {"inductor/" + "a" * 255: b"one", "inductor/" + "\u00e9" * 127 + "b": b"two"}
    _second_generation_adding(store, tmp_path, longest)
    sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    assert tree(tmp_path / "node") == {**ARTIFACTS, **longest}


@pytest.mark.parametrize(("last", "refused"), [(40, False), (41, True)], ids=["2048-bytes", "2049-bytes"])
def test_a_whole_path_of_2048_bytes_is_the_longest_taken(store, tmp_path, last, refused):
    """The limit on a whole path counts its names and the slashes between them, exactly."""
    rel = "/".join(["d" * 250] * 8 + ["e" * last])  # 8 x 250 + 8 slashes + the last name
    assert len(rel) == 2008 + last
    _second_generation_adding(store, tmp_path, {rel: b"code"})
    if refused:
        with pytest.raises(IntegrityError, match="names a path longer than a filesystem allows"):
            sync.verify(store, NS, TRUST, allow_unsigned=False)
    else:
        assert sync.verify(store, NS, TRUST, allow_unsigned=False).files[rel].size == 4


def test_recovery_without_a_pull_finishes_what_a_killed_one_left(store, tmp_path):
    """sync.recover, as a node is tidied after a job: the directory's own staging goes and a
    directory moved aside by a swap comes back; a sibling's staging stays."""
    node = tmp_path / "cache"
    make_cache(tmp_path / f".previous-{node.name}", ARTIFACTS)
    ours = tmp_path / f".incoming-{node.name}-0123abcd"
    sibling = tmp_path / f".incoming-{node.name}-v2-0123abcd"
    for staging in (ours, sibling):
        (staging / "inductor").mkdir(parents=True)
    sync.recover(node)
    assert tree(node) == ARTIFACTS and not ours.exists() and sibling.is_dir()
    assert not (tmp_path / f".previous-{node.name}").exists() and not (tmp_path / f".{node.name}.pull-lock").exists()
    sync.recover(tmp_path / "nowhere" / "cache")  # a directory whose parent is not there: nothing to do


# --- the manifest's own size and depth ----------------------------------------------------------------


DEEP = b'{"body": {"meta": ' + b"[" * 100_000 + b"]" * 100_000 + b'}, "signature": null}'
DEEP_REFUSED = "manifest nests deeper than 32 levels (corrupt or tampered); refusing it"


def test_a_manifest_nested_past_the_stack_is_refused_in_one_line_by_every_reader(store, tmp_path):
    """Anyone who can write to the store can put one there: it is refused before its signature
    is looked at, as a manifest, not a crash (RecursionError) of pull, verify, ls or gc."""
    other = NS.replace("0123456789abcdef", "fedcba9876543210")
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), other, KEY, allow_unsigned=False)
    assert store.create(sync._manifest_key(NS, 1), DEEP)
    message = f"{store.url}/{sync._manifest_key(NS, 1)}: {DEEP_REFUSED}"
    with pytest.raises(IntegrityError, match=f"^{re.escape(message)}$"):
        sync.pull(store, NS, tmp_path / "node", TRUST, allow_unsigned=False)
    with pytest.raises(IntegrityError, match=f"^{re.escape(message)}$"):
        sync.verify(store, NS, TRUST, allow_unsigned=False)
    rows = {row.namespace: row.error for row in sync.listing(store, TRUST, allow_unsigned=False)}
    assert rows == {NS: message, other: None}
    done = sync.gc(store, 1, TRUST, allow_unsigned=False, grace_seconds=0, dry_run=True)
    assert done.unverified == [NS] and done.objects == []  # an unreadable namespace might need any shard
    assert sync.published_elsewhere(store, "mlp", "0" * 64, TRUST, allow_unsigned=False) == []
    assert not (tmp_path / "node").exists()


def _nested(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_manifest_may_nest_32_levels_deep_and_no_deeper():
    # the envelope, its body and meta are 3 levels; the lists in meta the rest
    fits = {**BODY, "meta": {"x": _nested(29)}}
    assert decode(_signed(fits).encode(), TRUST, allow_unsigned=False, where="w").meta == fits["meta"]
    deeper = {**BODY, "meta": {"x": _nested(30)}}
    with pytest.raises(IntegrityError, match=r"^w: manifest nests deeper than 32 levels"):
        decode(_signed(deeper).encode(), TRUST, allow_unsigned=False, where="w")


def test_a_manifest_larger_than_the_limit_is_refused_before_it_is_parsed(monkeypatch):
    data = _signed(BODY).encode()
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(data))
    assert decode(data, TRUST, allow_unsigned=False, where="w").files == {
        "inductor/a.py": FileEntry(sha256="ab" * 32, size=1, shard="cd" * 32)
    }
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(data) - 1)
    with pytest.raises(IntegrityError, match=r"^w: manifest takes 0 MiB, more than the 0 MiB a manifest may"):
        decode(data, TRUST, allow_unsigned=False, where="w")


# --- the CLI: one line and the documented exit code ---------------------------------------------------

SPEC = load_spec_with_overrides(str(ROOT / "examples" / "mlp.yaml"), device="cpu")


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if not line.startswith("torch imported:")]
    assert line.startswith("orchestrate: error: ")
    return line


def test_the_cli_refuses_a_deep_manifest_and_an_overlong_name_in_one_line(store, tmp_path):
    """What this pod pulls (`pull --model examples/mlp.yaml`), published as a manifest nested past
    the stack: exit 4. The same for a name no filesystem takes. And a namespace of this model on
    another platform holding such a manifest leaves the miss's explanation, not the pull, to fail."""
    mine = platform_probe.cache_namespace(SPEC)
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    args = ("--remote", store.url, "--trust", str(public))

    elsewhere = mine[:-16] + "0" * 16
    assert store.create(sync._manifest_key(elsewhere, 1), DEEP)
    missed = pull_mlp(*args, "--to", str(tmp_path / "replica"))
    assert missed.returncode == EXIT_MISS, missed.stderr
    assert f"namespace {mine} was never published" in _one_error_line(missed)

    assert store.create(sync._manifest_key(mine, 1), DEEP)
    refused = pull_mlp(*args, "--to", str(tmp_path / "replica"))
    assert refused.returncode == EXIT_UNTRUSTED, refused.stderr
    assert "manifest nests deeper than 32 levels" in _one_error_line(refused)
    verified = orchestrate("cache", "verify", *args)
    assert verified.returncode == EXIT_UNTRUSTED and "manifest nests deeper than 32 levels" in verified.stdout
    _one_error_line(verified)
    listed = orchestrate("cache", "ls", *args)  # ls reports a namespace it cannot read and goes on
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    [row] = [row for row in listed.stdout.splitlines() if row.startswith(mine)]
    assert row.endswith(f"{store.url}/{sync._manifest_key(mine, 1)}: {DEEP_REFUSED}")
    collected = orchestrate("cache", "gc", *args)
    assert collected.returncode == 0 and f"kept every shard: {mine}'s kept generations" in collected.stderr

    (tmp_path / "store2").mkdir()
    other_store = open_store(f"file://{tmp_path / 'store2'}")
    rel = "inductor/" + "a" * 256
    shard = _shard_holding(other_store, {rel: b"code"})
    body = Manifest(namespace=mine, generation=1, files={rel: FileEntry(sync._sha256(b"code"), 4, shard)}, shards={})
    write_signed(other_store, mine, {**body.body(), "shards": {shard: 10240}})
    overlong = pull_mlp("--remote", other_store.url, "--trust", str(public), "--to", str(tmp_path / "replica"))
    assert overlong.returncode == EXIT_UNTRUSTED, overlong.stderr
    assert "names a path longer than a filesystem allows" in _one_error_line(overlong)
    assert not (tmp_path / "replica").exists()


# --- sibling directories: each pull recovers only its own ------------------------------------------------


def test_recovery_removes_only_its_own_staging_and_never_a_siblings(tmp_path):
    """`D/cache` and `D/cache-v2` (or `D/c[1]` and `D/c1`) are pulled under different locks: what
    one pull recovers must be a name no pull into another directory ever makes."""
    parent = tmp_path / "D"
    own = [".incoming-cache-0123abcd", ".incoming-c[1]-89abcdef"]
    siblings = [
        ".incoming-cache-v2-0123abcd",  # D/cache-v2, staging
        ".incoming-cache-deadbeef-0123abcd",  # D/cache-deadbeef
        ".incoming-cache-0123abcd-0123abcd",  # D/cache-0123abcd
        ".incoming-cache.v2-0123abcd",  # D/cache.v2
        ".incoming-c1-89abcdef",  # D/c1: the glob `c[1]` matches it
        ".previous-cache-v2",
    ]
    for name in own + siblings:
        (parent / name / "inductor").mkdir(parents=True)
    sync._recover(parent / "cache")
    sync._recover(parent / "c[1]")
    assert sorted(p.name for p in parent.iterdir()) == sorted(siblings)


HELD_PULLER = """
import sys, time
from pathlib import Path
from orchestrator.cache import sync
from orchestrator.cache.manifest import TrustedKeys
from orchestrator.cache.store import open_store
url, namespace, target, public, gate = sys.argv[1:6]
store = open_store(url)
download = store.download
def held(key, path, size):  # the shard is in the staging folder: say where, and wait to be let go
    download(key, path, size)
    Path(gate, "staging").write_text(str(path.parent.parent))
    while not Path(gate, "go").exists():
        time.sleep(0.01)
store.download = held
sync.pull(store, namespace, Path(target), TrustedKeys.from_pems([Path(public).read_text()]), allow_unsigned=False)
"""


def test_a_pull_into_a_sibling_directory_leaves_a_live_pull_alone(store, tmp_path):
    """Two processes: one pulls into D/cache-v2 and is held with its staging folder full; the
    other pulls into D/cache meanwhile, recovering what killed pulls into D/cache left. Both end
    with every file in place."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    public, gate, parent = tmp_path / "publisher.pub", tmp_path / "gate", tmp_path / "D"
    public.write_text(KEY.public.pem())
    gate.mkdir()
    held = subprocess.Popen(
        [sys.executable, "-c", HELD_PULLER, store.url, NS, str(parent / "cache-v2"), str(public), str(gate)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (gate / "staging").exists():
            assert held.poll() is None and time.monotonic() < deadline, held.stderr.read() if held.stderr else ""
            time.sleep(0.02)
        staging = Path((gate / "staging").read_text())
        assert staging.parent == parent and staging.name.startswith(".incoming-cache-v2-")
        assert sync.pull(store, NS, parent / "cache", TRUST, allow_unsigned=False).files == len(ARTIFACTS)
        assert staging.is_dir()
    finally:
        (gate / "go").touch()
        _, stderr = held.communicate(timeout=120)
    assert held.returncode == 0, stderr
    assert tree(parent / "cache") == ARTIFACTS and tree(parent / "cache-v2") == ARTIFACTS
    assert sorted(p.name for p in parent.iterdir()) == ["cache", "cache-v2"]


# --- a full disk and other readers ------------------------------------------------------------------------


def _full_disk_after_creating(monkeypatch):
    """Path.write_text as a full disk does it: the file is created, its bytes refused."""

    def write_text(self, data, *args, **kwargs):
        with open(self, "w"):
            pass
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("state", ["complete", "absent"])
def test_a_pull_that_needs_nothing_leaves_nothing_behind_on_a_full_disk(store, tmp_path, monkeypatch, state):
    """Complete already, it only records the generation; absent, an empty namespace is all there
    is to pull. Either way a full disk is exit 3 and the directory is as it was, not a scratch
    file richer each run, nor a directory that was not there."""
    files = ARTIFACTS if state == "complete" else {}
    sync.publish(store, make_cache(tmp_path / "a", files), NS, KEY, allow_unsigned=False)
    node = tmp_path / "d" / "node"
    if state == "complete":
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    else:
        node.parent.mkdir()
    before = sorted(p.relative_to(tmp_path / "d") for p in (tmp_path / "d").rglob("*"))
    _full_disk_after_creating(monkeypatch)
    for _ in range(2):
        with pytest.raises(sync.DiskFull, match=r"the directory is unchanged$"):
            sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    monkeypatch.undo()
    assert sorted(p.relative_to(tmp_path / "d") for p in (tmp_path / "d").rglob("*")) == before


@pytest.mark.parametrize("what", ["lock", "parent"])
def test_a_full_disk_when_taking_the_lock_is_disk_full(store, tmp_path, monkeypatch, what):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "d" / "node"
    if what == "lock":
        node.parent.mkdir()

        def no_space(path, *args, **kwargs):
            if str(path).endswith(".pull-lock"):
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return open(path, *args, **kwargs)

        monkeypatch.setattr(sync, "open", no_space, raising=False)
    else:

        def no_space(self, *args, **kwargs):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(self))

        monkeypatch.setattr(Path, "mkdir", no_space)
    with pytest.raises(sync.DiskFull) as caught:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    monkeypatch.undo()
    assert str(caught.value) == (
        f"no space left on the device of {node.parent} while pulling {NS}; free space there or pull to a "
        "larger disk; the directory is unchanged"
    )
    assert isinstance(caught.value, sync.StoreError)  # what the CLI exits 3 for
    assert not node.exists()


def _read_only(monkeypatch, parent: Path) -> None:
    """`parent` as a read-only volume shows it (EROFS): no lock file, no file, no folder in it.
    Root writes through mode bits, so the filesystem's answer is made here, at sync's own calls."""

    def refused(path, *args, **kwargs):
        if Path(path).parent == parent and "a" in (args[0] if args else kwargs.get("mode", "r")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(sync, "open", refused, raising=False)


def test_a_current_directory_on_a_read_only_volume_pulls_as_current(store, tmp_path, monkeypatch):
    """A serving pod may mount its pulled cache read-only: the lock needs a write, and a current
    directory has nothing to write, so the pull goes on without the lock."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "ro" / "node"
    sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    before = {p: p.stat().st_mtime_ns for p in node.parent.rglob("*")}
    _read_only(monkeypatch, node.parent)
    again = sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert again is not None and again.files == 0 and again.generation == 1
    assert {p: p.stat().st_mtime_ns for p in node.parent.rglob("*")} == before


def test_a_stale_directory_on_a_read_only_volume_is_one_line(store, tmp_path, monkeypatch):
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    node = tmp_path / "ro" / "node"
    node.mkdir(parents=True)
    _read_only(monkeypatch, node.parent)
    with pytest.raises(sync.LocalDirectoryError) as caught:
        sync.pull(store, NS, node, TRUST, allow_unsigned=False)
    assert str(caught.value) == (
        f"{node}: cannot write in {node.parent} (Read-only file system); pull into a directory this user can "
        "write (--to, --cache-dir), or make it current where it can be written"
    )
    assert list(node.parent.iterdir()) == [node] and list(node.iterdir()) == []


def test_pull_to_a_directory_that_cannot_be_made_is_one_line_exit_2(store, tmp_path):
    """/proc takes no new file, even from root: the lock's FileNotFoundError is the user's line."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), platform_probe.cache_namespace(SPEC), KEY,
                 allow_unsigned=False)  # fmt: skip
    public = tmp_path / "publisher.pub"
    public.write_text(KEY.public.pem())
    proc = orchestrate("pull", "--model", str(ROOT / "examples" / "mlp.yaml"), "--device", "cpu", "--to",
                       "/proc/orchestrate-x", "--remote", store.url, "--trust", str(public))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert _one_error_line(proc).startswith("orchestrate: error: /proc/orchestrate-x: cannot write in /proc (")


def test_a_directory_stores_objects_are_readable_by_other_users(store, tmp_path):
    """Readers (a serving pod, `cache verify`) may run under another uid than the publisher."""
    old = os.umask(0o022)
    try:
        sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    finally:
        os.umask(old)
    objects = files_under(Path(store.root))
    assert len(objects) == 2  # one shard, one manifest
    assert {path.stat().st_mode & 0o777 for path in objects} == {0o644}


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_verify_and_repair_on_a_full_scratch_disk_are_disk_full_and_leave_no_scratch(
    store, tmp_path, monkeypatch, command
):
    """Shards are read into a scratch directory; a full disk there is exit 3 naming it, not a
    traceback and not a bad namespace."""
    sync.publish(store, make_cache(tmp_path / "a", ARTIFACTS), NS, KEY, allow_unsigned=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()

    def no_space(key, path, size):
        Path(path).write_bytes(b"")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "download", no_space)
    with pytest.raises(sync.DiskFull, match=rf"device of {re.escape(str(tmp_path / 'scratch'))} while .* {NS}; "):
        if command == "verify":
            sync.verify(store, NS, TRUST, allow_unsigned=False)
        else:
            sync.repair(store, NS, make_cache(tmp_path / "b", ARTIFACTS), KEY, allow_unsigned=False, trusted=TRUST)
    assert list((tmp_path / "scratch").iterdir()) == []
