"""The real CLI in a subprocess: every bad input is one `orchestrate: error:` line and exit 2.

Error cases fail before torch.compile runs (config errors before torch is even imported; factory and
device errors while the model is set up), so this file stays quick apart from the one `slow` test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import assert_measured

from orchestrator.cache.manifest import SigningKey

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "orchestrate: error: "

GOOD_CONFIG = """\
model:
  factory: {factory}
inputs:
  - shape: [batch, 8]
buckets: [1, 2]
bench: {{iterations: 2, warmup: 0}}
"""

FACTORIES = """\
from torch import nn


def good():
    return nn.Linear(8, 8)


def boom():
    raise RuntimeError("factory exploded\\nsecond line of detail")


def not_a_module():
    return 42


def exits():
    import sys

    sys.exit(3)


NOT_CALLABLE = 3


class AlwaysFails(nn.Module):
    def forward(self, x):
        raise ValueError("forward always fails")


def always_fails():
    return AlwaysFails()
"""


def orchestrate(*args: str, tmp_path: Path, cache: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")  # nothing lands in the real ~/.cache
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, "-m", "orchestrator", *args]
    if cache and args and args[0] == "warmup" and "--cache-dir" not in args:
        command += ["--cache-dir", str(tmp_path / "cache")]
    if args and args[0] == "warmup" and "--help" not in args:
        command.append("--no-ray")  # input validation and the in-process executor; Ray has its own tests
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, exactly one non-empty stderr line `orchestrate: error: ...` naming the problem."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one stderr line, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith(PREFIX), line
    assert len(line) > len(PREFIX) + 5, line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert result.returncode == 2, (result.returncode, result.stderr)
    return line


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return path


def config(tmp_path: Path, factory: str, name: str = "model.yaml", text: str = GOOD_CONFIG) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text.format(factory=factory)))
    return path


# --- help ---------------------------------------------------------------------------------------


def test_help(tmp_path):
    result = orchestrate("--help", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warmup" in result.stdout
    assert "Traceback" not in result.stderr


def test_warmup_help(tmp_path):
    result = orchestrate("warmup", "--help", tmp_path=tmp_path, cache=False)
    assert result.returncode == 0, result.stderr
    for option in ("--model", "--buckets", "--device", "--cache-dir", "--json", "--report", "--fresh"):
        assert option in result.stdout
    assert "Traceback" not in result.stderr


def test_version(tmp_path):
    result = orchestrate("--version", tmp_path=tmp_path)
    assert result.returncode == 0
    assert "orchestrate" in result.stdout


def test_no_arguments_is_help_or_one_line_error(tmp_path):
    result = orchestrate(tmp_path=tmp_path)
    assert "Traceback" not in result.stderr
    if result.returncode == 0:
        assert "Usage" in result.stdout
    else:
        assert_user_error(result)


# --- usage errors -------------------------------------------------------------------------------


def test_missing_model_option(tmp_path):
    assert_user_error(orchestrate("warmup", tmp_path=tmp_path), "--model")


def test_unknown_command(tmp_path):
    assert_user_error(orchestrate("warmpu", tmp_path=tmp_path), "warmpu")


def test_unknown_option(tmp_path):
    path = config(tmp_path, "factories.py:good")
    assert_user_error(orchestrate("warmup", "--model", str(path), "--bukets", "1", tmp_path=tmp_path), "--bukets")


def test_a_negative_grace_for_cache_gc_is_refused(tmp_path):
    """A negative grace would count every generation as old at once."""
    assert_user_error(orchestrate("cache", "gc", "--grace-seconds", "-5", tmp_path=tmp_path), "--grace-seconds")


def test_unknown_device_choice(tmp_path):
    path = config(tmp_path, "factories.py:good")
    line = assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "gpu", tmp_path=tmp_path), "--device", "'gpu'"
    )
    assert "cpu" in line and "cuda" in line


@pytest.mark.parametrize(
    "buckets, problem",
    [
        ("0", "'0' is not a positive integer"),
        ("-1", "is not a positive integer"),
        ("a", "'a' is not a positive integer"),
        ("1,x", "'x' is not a positive integer"),
        ("8,8", "bucket 8 is listed twice"),
    ],
)
def test_bad_buckets(tmp_path, buckets, problem):
    path = config(tmp_path, "factories.py:good")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--buckets", buckets, tmp_path=tmp_path), "--buckets", problem
    )


def test_empty_buckets(tmp_path, factories):
    # a factory that fails at setup keeps this quick if --buckets '' is wrongly ignored
    path = config(tmp_path, "no_such_module_xyz:make")
    assert_user_error(orchestrate("warmup", "--model", str(path), "--buckets", "", tmp_path=tmp_path), "--buckets")


def test_superscript_buckets(tmp_path):
    path = config(tmp_path, "factories.py:good")
    assert_user_error(orchestrate("warmup", "--model", str(path), "--buckets", "²", tmp_path=tmp_path), "--buckets")


@pytest.mark.parametrize(
    "command",
    [("warmup",), ("submit", "--k8s", "--image", "img"), ("render", "k8s", "--image", "img"), ("serve",)],
)
def test_every_command_with_buckets_reads_them_by_one_rule(tmp_path, command):
    help_text = " ".join(orchestrate(*command, "--help", tmp_path=tmp_path).stdout.split())  # unwrapped
    assert (
        "--buckets 1,8,32 Bucket sizes, or a grid's by dimension ('batch=1,8 seq=32,128'); overrides the config's "
        "`buckets`." in help_text
    )
    path = config(tmp_path, "factories.py:good")
    assert_user_error(
        orchestrate(*command, "--model", str(path), "--buckets", "8,8", tmp_path=tmp_path),
        "--buckets: bucket 8 is listed twice",
    )


# --- config errors (before torch is imported) ---------------------------------------------------


def test_missing_config_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert_user_error(orchestrate("warmup", "--model", str(missing), tmp_path=tmp_path), str(missing), "no such file")


def test_config_is_a_directory(tmp_path):
    assert_user_error(orchestrate("warmup", "--model", str(tmp_path), tmp_path=tmp_path), "cannot read")


def test_bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  factory: factories.py:good\ninputs: [\n")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), str(path), "invalid YAML", "line ", "column "
    )


def test_yaml_nested_past_the_parser_is_one_line(tmp_path):
    """Past the parser's recursion, the config is refused as any malformed one is."""
    path = tmp_path / "deep.yaml"
    path.write_text("model: " + "[" * 100000 + "]" * 100000 + "\n")
    assert_user_error(orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), str(path), "nests deeper")


def test_a_report_nested_past_the_parser_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    assert_user_error(orchestrate("report", str(path), tmp_path=tmp_path), str(path), "nests deeper")


def test_yaml_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert_user_error(orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), "expected a mapping")


def test_unknown_key(tmp_path):
    path = config(tmp_path, "factories.py:good", text=GOOD_CONFIG + "compile:\n  moed: default\n")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), tmp_path=tmp_path),
        "compile.moed: unknown field (did you mean 'mode'?)",
    )


def test_invalid_input_dtype(tmp_path):
    text = "model: {{factory: '{factory}'}}\ninputs:\n  - shape: [batch, 8]\n    dtype: float33\n"
    path = config(tmp_path, "factories.py:good", text=text)
    assert_user_error(orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), "inputs[0].dtype")


def test_missing_required_field(tmp_path):
    path = tmp_path / "noinputs.yaml"
    path.write_text("model: {factory: 'factories.py:good'}\n")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), "inputs: required field is missing"
    )


def test_invalid_factory_form(tmp_path):
    path = config(tmp_path, "factories.py")
    assert_user_error(orchestrate("warmup", "--model", str(path), tmp_path=tmp_path), "model.factory")


def test_config_file_stem_not_a_valid_name(tmp_path, factories):
    path = config(tmp_path, "no_such_module_xyz:make", name="_model.yaml")
    result = orchestrate("warmup", "--model", str(path), tmp_path=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2


# --- model setup errors (torch imported, nothing compiled) --------------------------------------


def test_unimportable_module_factory(tmp_path):
    path = config(tmp_path, "no_such_module:make")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "no_such_module",
    )


def test_missing_factory_file(tmp_path):
    path = config(tmp_path, "nope.py:make")
    line = assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "nope.py",
        "does not exist",
    )
    assert str(tmp_path.resolve() / "nope.py") in line  # resolved against the config's directory


def test_missing_attribute_in_file(tmp_path, factories):
    path = config(tmp_path, "factories.py:missing_factory")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "missing_factory",
    )


def test_missing_attribute_in_module(tmp_path):
    path = config(tmp_path, "json:no_such_function")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "no_such_function",
    )


def test_factory_not_callable(tmp_path, factories):
    path = config(tmp_path, "factories.py:NOT_CALLABLE")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "not callable",
    )


def test_factory_file_fails_to_import(tmp_path):
    (tmp_path / "broken.py").write_text("def make(:\n")
    path = config(tmp_path, "broken.py:make")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "SyntaxError",
    )


def test_a_bucket_whose_inputs_cannot_fit_the_host_is_refused_before_anything_runs(tmp_path, factories):
    """2^31 - 1 rows of 8 floats, 69 GB: refused before the model is built, not when allocating."""
    if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 2 * 68.7e9:
        pytest.skip("this host holds twice such a bucket's inputs")
    path = config(tmp_path, "factories.py:good")
    line = assert_user_error(
        orchestrate("warmup", "--model", str(path), "--buckets", "2147483647", tmp_path=tmp_path),
        "bucket 2147483647: its inputs take 68.7 GB, more than half of this host's",
    )
    assert line.endswith("pick smaller buckets")


def test_inputs_are_sized_as_the_host_makes_them():
    from orchestrator.jobs.errors import SetupError
    from orchestrator.jobs.spec import WarmupSpec, check_inputs_fit

    spec = WarmupSpec.model_validate(
        {
            "model": {"factory": "m.py:f"},
            "buckets": [1, 1000],
            "inputs": [
                {"shape": ["batch", 10], "dtype": "float16"},
                {"shape": ["batch"], "dtype": "int8", "range": [0, 2]},
            ],
        }
    )
    check_inputs_fit(spec, host_bytes=2 * (1000 * 10 * 4 + 1000))  # float16 is drawn in float32 first
    with pytest.raises(SetupError, match="bucket 1000: its inputs take 0.0 GB"):
        check_inputs_fit(spec, host_bytes=2 * (1000 * 10 * 4 + 1000) - 2)


def test_a_factory_that_calls_sys_exit_is_one_line_exit_2(tmp_path, factories):
    """SystemExit is no Exception: the factory's exit must not become the process's, unexplained."""
    path = config(tmp_path, "factories.py:exits")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "factories.py:exits(**kwargs) called sys.exit(3)",
    )


def test_factory_raises(tmp_path, factories):
    path = config(tmp_path, "factories.py:boom")
    line = assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "RuntimeError",
        "factory exploded",
    )
    assert "second line of detail" not in line


def test_factory_returns_non_module(tmp_path, factories):
    path = config(tmp_path, "factories.py:not_a_module")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path),
        "model.factory",
        "int",
        "torch.nn.Module",
    )


def test_factory_kwargs_rejected(tmp_path, factories):
    text = GOOD_CONFIG.replace("  factory: {factory}\n", "  factory: {factory}\n  kwargs: {{bogus: 1}}\n")
    path = config(tmp_path, "factories.py:good", text=text)
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", tmp_path=tmp_path), "model.factory", "TypeError"
    )


def test_cuda_requested_without_gpu(tmp_path, factories):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    path = config(tmp_path, "factories.py:good")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cuda", tmp_path=tmp_path), "cuda", "--device cpu"
    )


def test_unusable_cache_dir(tmp_path, factories):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = config(tmp_path, "factories.py:good")
    assert_user_error(
        orchestrate(
            "warmup", "--model", str(path), "--device", "cpu", "--cache-dir", str(blocker / "cache"), tmp_path=tmp_path
        ),
        str(blocker),
    )


def test_unwritable_report_path(tmp_path, factories):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # every bucket fails at its eager call, so this reaches the report without compiling anything
    path = config(tmp_path, "factories.py:always_fails")
    assert_user_error(
        orchestrate(
            "warmup",
            "--model",
            str(path),
            "--device",
            "cpu",
            "--report",
            str(blocker / "report.json"),
            tmp_path=tmp_path,
        ),
        "report",
    )


def test_report_path_is_directory(tmp_path, factories):
    path = config(tmp_path, "factories.py:good")
    assert_user_error(
        orchestrate("warmup", "--model", str(path), "--device", "cpu", "--report", str(tmp_path), tmp_path=tmp_path),
        "--report",
    )


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory this process cannot create files in; root writes through modes, so /proc for root."""
    if os.geteuid() == 0:
        return Path("/proc")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return locked


@pytest.mark.parametrize("command", ["warmup", "submit"])
def test_report_in_an_unwritable_directory_fails_before_any_work(tmp_path, factories, command):
    path = config(tmp_path, "factories.py:good")
    target = unwritable_dir(tmp_path) / "report.json"
    # submit: an address nothing listens on, so the report's check must come before the cluster's (exit 6)
    extra = ["--ray-address", "http://127.0.0.1:9", "--wait"] if command == "submit" else ["--device", "cpu"]
    line = assert_user_error(
        orchestrate(command, "--model", str(path), *extra, "--report", str(target), tmp_path=tmp_path),
        f"--report {target}",
        "not writable",
    )
    assert "writable directory" in line  # the fix


def test_submit_report_whose_directory_cannot_be_made_fails_before_submitting(tmp_path, factories):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = config(tmp_path, "factories.py:good")
    proc = orchestrate(
        "submit",
        "--model",
        str(path),
        "--ray-address",
        "http://127.0.0.1:9",
        "--report",
        str(blocker / "r.json"),
        tmp_path=tmp_path,
    )
    assert_user_error(proc, "--report", "cannot create its directory")


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize(
    "command",
    [
        ["pull", "--to", "out"],
        ["warmup", "--device", "cpu"],
        ["serve"],
    ],
)
def test_a_store_whose_backend_is_not_installed_is_one_line(tmp_path, factories, command):
    if _installed("gcsfs"):
        pytest.skip("gcsfs is installed here")
    path = config(tmp_path, "factories.py:good")
    name, *rest = command
    proc = orchestrate(name, "--model", str(path), *rest, "--remote", "gs://bucket/cache", tmp_path=tmp_path)
    assert_user_error(proc, "gs://bucket/cache", "gcsfs", "pip install gcsfs")


def test_a_store_with_an_unknown_protocol_is_one_line(tmp_path, factories):
    path = config(tmp_path, "factories.py:good")
    proc = orchestrate("pull", "--model", str(path), "--to", "out", "--remote", "nosuch://x/y", tmp_path=tmp_path)
    assert_user_error(proc, "nosuch://", "s3://")


def test_a_store_whose_host_is_not_found_when_opened_is_one_line_exit_3(tmp_path, factories):
    """fsspec's ftp:// connects when the filesystem is made: a host not found is the store's line."""
    path = config(tmp_path, "factories.py:good")
    proc = orchestrate("pull", "--model", str(path), "--to", "out", "--remote", "ftp://x/y", tmp_path=tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode == 3, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith(f"{PREFIX}store ftp://x/y: cannot connect (") and line.endswith(
        "check the URL's host and port"
    )


@pytest.mark.parametrize(
    "command",
    [["warmup"], ["pull"], ["serve", "--port", "1"], ["cache", "ls"]],
    ids=["warmup", "pull", "serve", "cache ls"],
)
def test_a_cache_dir_that_is_a_file_is_one_line_before_anything_starts(tmp_path, factories, command):
    """Checked with the config: serve would otherwise start Ray and the replica before meeting the
    file, and cache ls would list nothing and exit 0."""
    path = config(tmp_path, "factories.py:good")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    model = [] if command[0] == "cache" else ["--model", str(path)]
    proc = orchestrate(*command, *model, "--cache-dir", str(afile), tmp_path=tmp_path, cache=False)
    assert_user_error(proc, f"--cache-dir {afile}: a file, not a directory")
    assert afile.read_text() == "mine"


def test_pull_to_a_file_is_refused_and_leaves_it_alone(tmp_path, factories):
    """A pull would move the file aside into a .incoming-* folder and fill a directory in its place."""
    path = config(tmp_path, "factories.py:good")
    target = tmp_path / "out"
    target.write_text("mine")
    proc = orchestrate("pull", "--model", str(path), "--to", str(target), "--device", "cpu", tmp_path=tmp_path)
    assert_user_error(proc, f"--to {target}: a file, not a directory")
    assert target.read_text() == "mine" and not list(tmp_path.glob(".incoming*"))


def test_a_cache_command_on_a_backend_that_is_not_installed_is_one_line(tmp_path):
    if _installed("pyarrow"):
        pytest.skip("pyarrow is installed here")
    # hdfs:// imports its package only when the filesystem is made
    assert_user_error(orchestrate("cache", "ls", "--remote", "hdfs://namenode/cache", tmp_path=tmp_path), "pyarrow")


@pytest.mark.parametrize(
    "command, option",
    [
        (["warmup", "--device", "cpu"], "--signing-key-file"),
        (["cache", "repair"], "--signing-key-file"),
        (["pull", "--to", "out"], "--trust"),
        (["cache", "verify"], "--trust"),
    ],
)
def test_a_missing_key_file_is_a_usage_error(tmp_path, factories, command, option):
    missing = tmp_path / "no-such-key"
    args = ["--remote", f"file://{tmp_path / 'store'}", option, str(missing)]
    if command[0] != "cache":
        args += ["--model", str(config(tmp_path, "factories.py:good"))]
    proc = orchestrate(*command, *args, tmp_path=tmp_path)
    assert_user_error(proc, f"{option} {missing}", "does not exist")


@pytest.mark.parametrize(
    "named_by, mistake, expected",
    [
        ("environment", "missing", "cannot read it (No such file or directory); name a readable public key file"),
        ("environment", "private", "is a private key; give readers the public key (.pub file) only"),
        ("--trust", "private", "is a private key; give readers the public key (.pub file) only"),
    ],
    ids=["env-missing", "env-private", "trust-private"],
)
@pytest.mark.parametrize(
    "command", [["pull", "--device", "cpu", "--to", "out"], ["cache", "verify"]], ids=["pull", "cache-verify"]
)
def test_a_wrong_trusted_key_is_a_usage_error_wherever_it_is_named(
    tmp_path, factories, monkeypatch, command, named_by, mistake, expected
):
    """A trusted key file that is missing or holds the private key is the reader's configuration
    at fault (exit 2), as a missing --trust file is: no cache data was refused. `pull` names a
    store (--remote); `cache verify` uses the one beside the cache, whose keys config.py adds."""
    private = tmp_path / "cache-signing.key"
    SigningKey.create_file(private)
    key = tmp_path / "no-such-key" if mistake == "missing" else private
    args = ["--trust", str(key)] if named_by == "--trust" else []
    if named_by == "environment":
        monkeypatch.setenv("ORCHESTRATE_CACHE_TRUSTED_KEYS", str(key))
    if command[0] == "pull":
        (tmp_path / "store").mkdir()
        args += ["--model", str(config(tmp_path, "factories.py:good")), "--remote", f"file://{tmp_path / 'store'}"]
    else:
        args += ["--cache-dir", str(tmp_path / "cache")]
    where = "$ORCHESTRATE_CACHE_TRUSTED_KEYS names" if named_by == "environment" else "trusted key file"
    assert_user_error(orchestrate(*command, *args, tmp_path=tmp_path), f"{where} {key}: {expected}")


# --- a run where one bucket fails ---------------------------------------------------------------


def test_every_bucket_failing_exits_1(tmp_path, factories):
    """Forward raises for every bucket: exit 1 (not 2), each bucket reported, nothing compiled."""
    path = config(tmp_path, "factories.py:always_fails")
    report_path = tmp_path / "out" / "report.json"
    result = orchestrate(
        "warmup", "--model", str(path), "--device", "cpu", "--json", "--report", str(report_path), tmp_path=tmp_path
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert json.loads(report_path.read_text()) == report
    assert [r["bucket"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["status"] == "failed"
        assert r["error"].startswith("eager reference: ValueError")
    assert report["summary"]["buckets_failed"] == 2 and report["summary"]["buckets_ok"] == 0


TINY_MODEL = """\
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] == 2:
            raise ValueError("batch size 2 is not supported")
        return self.linear(x)


def make():
    return Tiny()
"""


@pytest.mark.slow
def test_one_failing_bucket_does_not_stop_the_others(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY_MODEL)
    path = tmp_path / "tiny.yaml"
    path.write_text(
        textwrap.dedent("""\
        model:
          factory: tiny.py:make
        inputs:
          - shape: [batch, 8]
        buckets: [1, 8]
        bench:
          iterations: 3
          warmup: 1
    """)
    )
    report_path = tmp_path / "report.json"
    result = orchestrate(
        "warmup",
        "--model",
        str(path),
        "--buckets",
        "1,2,3",
        "--device",
        "cpu",
        "--json",
        "--report",
        str(report_path),
        tmp_path=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)  # --json: stdout is the report alone
    assert json.loads(report_path.read_text()) == report
    assert report["model"] == "tiny"
    assert report["buckets"] == [1, 2, 3]
    by_bucket = {r["bucket"]: r for r in report["results"]}
    assert sorted(by_bucket) == [1, 2, 3]

    failed = by_bucket[2]
    assert failed["status"] == "failed"
    assert "ValueError" in failed["error"]
    assert "batch size 2 is not supported" in failed["error"]

    for bucket in (1, 3):
        ok = by_bucket[bucket]
        assert ok["status"] == "ok", ok
        assert ok["error"] is None
        assert_measured(ok)
        assert ok["compile_seconds"] is not None

    assert report["summary"]["buckets_ok"] == 2
    assert report["summary"]["buckets_failed"] == 1
    assert str(tmp_path / "cache") in report["cache_dir"]


# --- serve: refused before Ray starts -----------------------------------------------------------


def test_serve_missing_config_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert_user_error(orchestrate("serve", "--model", str(missing), tmp_path=tmp_path), str(missing), "no such file")


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_serve_port_out_of_range(tmp_path, port):
    path = config(tmp_path, "factories.py:good")
    assert_user_error(orchestrate("serve", "--model", str(path), "--port", port, tmp_path=tmp_path), "--port")


def test_serve_port_in_use(tmp_path, factories):
    path = config(tmp_path, "factories.py:good")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_user_error(
            orchestrate("serve", "--model", str(path), "--port", str(port), tmp_path=tmp_path),
            f"cannot listen on 127.0.0.1:{port}",
            "--port",
        )


def test_serve_missing_factory_file(tmp_path):
    path = config(tmp_path, "nope.py:make")
    assert_user_error(orchestrate("serve", "--model", str(path), tmp_path=tmp_path), "model.factory", "does not exist")


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("StoreError", 3),
        ("StoreUnreachable", 3),
        ("DiskFull", 3),
        ("IntegrityError", 4),
        ("BadShard", 4),
        ("NotWarm", 2),
        ("SetupError", 2),
        ("KeyConfigError", 2),
        ("UnsupportedStore", 2),
        ("ConfigError", 2),
        ("ClusterUnreachable", 6),
        ("RuntimeError", 2),
    ],
)
def test_a_serve_replicas_exception_means_the_exit_code_of_its_family(kind, code):
    """A replica's exception reaches `orchestrate serve` as its class name alone; a subclass
    (BadShard, DiskFull) ends the command as its family does, and as the exception itself would
    end any other command."""
    from orchestrator.config import ConfigError
    from orchestrator.errors import _families, _with_subclasses, exit_code_named, exit_code_of

    assert exit_code_named(kind) == code
    assert exit_code_of(ConfigError("x")) == 2
    known = {cls.__name__: cls for family, _ in _families() for cls in _with_subclasses(family)}
    if kind in known:
        assert exit_code_of(known[kind]("x")) == code
    else:
        assert exit_code_of(RuntimeError("x")) is None  # not ours: the CLI shows its traceback


# A Python whose site-packages lack what the `serve` extra installs: the modules are reported
# missing by importlib, as they are where the extra was left out (the rest of the CLI is real)
WITHOUT_SERVE = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in ("starlette", "fastapi", "uvicorn") else real(name, *a)
from orchestrator.cli import main
sys.argv = ["orchestrate", *sys.argv[1:]]
main()
"""


def test_serve_without_the_serve_extra_names_the_install_in_one_line(tmp_path):
    path = config(tmp_path, "factories.py:good")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVE, "serve", "--model", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_user_error(result, "needs Ray Serve", "pip install 'torch-warmup-orchestrator[serve]'")
