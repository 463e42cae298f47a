"""Every command and request in README.md and docs/*.md, taken from the Markdown and run as
written in a shell whose HOME is empty, so that they cannot drift from what the tool does; a block
that is no command (a layout, a synopsis, a config excerpt) or that needs what these checks lack
(a GPU, Docker, hours) is named as such below, and its document says what it needs. Only the placeholders a reader
replaces are mapped to what this machine has: `cfg.yaml`/`model.yaml` to a small config,
`s3://bucket/compile-cache` to a bucket on a moto S3 server, `/nvme/cache` and `~` to temporary
directories, and `localhost:8000` to the session's real `orchestrate serve` (tests/served.py).
The README's set-up and main job are run by test_install.py and test_ray_local.py, and its
cluster commands by test_submit.py, against its Ray head and a recording Kubernetes API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, free_ports

pytestmark = pytest.mark.slow

DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^( *)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # the fence's, 1-based
    language: str
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks(document: str) -> list[Block]:
    """The fenced code blocks of a Markdown file, indented ones (inside a list item) included."""
    found, lines = [], (ROOT / document).read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened:
            indent, start = len(opened.group(1)), i
            i += 1
            body = []
            while not FENCE.match(lines[i]):
                body.append(lines[i][indent:])
                i += 1
            found.append(Block(document, start + 1, opened.group(2), "\n".join(body)))
        i += 1
    return found


def block(document: str, containing: str) -> Block:
    (found,) = [b for b in blocks(document) if containing in b.text]
    return found


# How each block is covered: run by one of this module's tests (by a line it contains), or not a
# command at all. A new block fails test_every_block_is_run_or_is_no_command until it is placed.
RUN_HERE = {
    "orchestrate keys new": "test_the_fleet_commands_run_as_written",
    "curl -s localhost:8000/predict": "test_the_readme_request_is_answered_as_eager",
    "np.savez(buf, x)": "test_the_readme_npz_request_is_answered_as_eager",
    "out = model(x)": "test_the_runtime_example_serves_what_the_fleet_commands_published",
    "httpclient.InferenceServerClient": "test_the_tritonclient_example_is_answered_as_eager",
    "orchestrate render k8s": "test_submit.py, beside its Ray head with the Jobs API",
    "scripts/install.sh && .venv/bin/orchestrate warmup": "test_install.py and test_ray_local.py",
    "prepare_replica()": "test_prepare_replica_runs_as_written",
    "prometheus_client.start_http_server(9400": "test_the_metrics_example_serves_the_replicas_registry",
    "orchestrate report runs/mlp.json": "test_the_report_commands_run_as_written",
    "--profile prof/ --report report.json": "test_the_profiling_command_runs_as_written",
}
NO_COMMAND = {
    "orchestrate warmup --model CFG.yaml [": "the command's synopsis (test_help.py checks the options)",
    "orchestrate serve --model CFG.yaml [": "the command's synopsis (test_help.py checks the options)",
    "name: mlp": "a config (test_schemas.py validates the examples)",
    "orchestrator/   CLI,": "the layout",
    "orchestrator/  __init__.py": "the layout (docs/architecture.md)",
    "driver (orchestrate warmup)": "a diagram of the fleet's processes",
    "was never published to s3://bucket/cache:": "an error, as `pull` prints it",
    "<url>/v1/objects/": "the store's layout",
    "orchestrate cache verify [--remote URL": "the cache commands' synopsis (test_help.py checks the options)",
    "orchestrate plan --model CFG.yaml --traffic": "the command's synopsis (test_help.py checks the options)",
    "max_product: 4096": "a config excerpt (test_config.py loads the same grid)",
    "factory: huggingface.py:gpt2": "a config excerpt (examples/gpt2.yaml is the whole config)",
    "docker build": "needs Docker, as docs/image.md says (test_image.py checks the Dockerfile)",
    "bench/warmup_examples.py": "benchmarks, minutes each, as docs/performance.md says",
    "# the dev extras, and as root": "the test suite's own set-up and run (.ci/run)",
    "scripts/mutation.py": "mutation testing, minutes to an hour a module (docs/testing.md)",
}


def test_every_block_is_run_or_is_no_command():
    for document in DOCUMENTS:
        for found in blocks(document):
            places = [key for key in (*RUN_HERE, *NO_COMMAND) if key in found.text]
            assert len(places) == 1, (
                f"{document}:{found.line} ({found.first!r}) is run by no test: run it in "
                "tests/test_docs_examples.py and name it in RUN_HERE"
            )


def shell(script: str, env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """A block's commands in bash, stopping at the first that fails, as a reader pasting them would
    notice; `orchestrate` is the installed one."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-xeuo", "pipefail", "-c", script],  # -x: a failure shows the command that failed
        cwd=cwd,
        env={**os.environ, **env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python(program: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """A Python block run as its own program, as a reader saving it to a file would."""
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def trusting(fleet) -> dict[str, str]:
    """The fleet's environment, trusting the key its commands made: what a replica of it runs with."""
    return {**fleet["env"], "ORCHESTRATE_CACHE_TRUSTED_KEYS": str(fleet["home"] / "keys" / "cache-signing.key.pub")}


MODELS = """
from torch import nn

def small():
    return nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
"""
CONFIG = """
name: small
model: {factory: models.py:small}
inputs: [{shape: [batch, 16]}]
device: cpu
buckets: [1, 4]
bench: {iterations: 5, warmup: 1}
"""


@pytest.fixture(scope="module")
def fleet(moto_server, tmp_path_factory):
    """README's "Sharing the cache across a fleet", run as written: keys, a warmup on a local Ray
    instance that publishes to S3, a replica's pull, and the store's maintenance commands."""
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    (work / "models.py").write_text(MODELS)
    (work / "cfg.yaml").write_text(CONFIG)
    (work / "model.yaml").write_text(CONFIG)
    bucket = moto_server.make_bucket()
    nvme = tmp_path_factory.mktemp("nvme")
    script = (
        block("README.md", "orchestrate keys new")
        .text.replace("s3://bucket/compile-cache", f"s3://{bucket}/compile-cache")
        .replace("/nvme/cache", str(nvme / "cache"))
    )
    env = {
        "HOME": str(home),
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "AWS_ACCESS_KEY_ID": moto_server.access_key,
        "AWS_SECRET_ACCESS_KEY": moto_server.secret_key,
        "AWS_DEFAULT_REGION": moto_server.region,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    ran = shell(script, env, work)
    assert ran.returncode == 0, ran.stderr[-4000:]
    return {"env": env, "work": work, "home": home, "bucket": bucket, "nvme": nvme, "ran": ran}


def test_the_fleet_commands_run_as_written(fleet):
    keys = fleet["home"] / "keys"
    assert (keys / "cache-signing.key").is_file() and (keys / "cache-signing.key.pub").is_file()
    # the replica's pull filled <cache dir>/<namespace>: what `serve --cache-dir /nvme/cache` loads
    (namespace,) = [p for p in (fleet["nvme"] / "cache").iterdir() if p.is_dir() and p.name.startswith("small-")]
    assert any(namespace.rglob("*"))
    assert "orchestrate: error" not in fleet["ran"].stderr


def test_the_runtime_example_serves_what_the_fleet_commands_published(fleet):
    example = block("docs/serving.md", "out = model(x)").text.replace(
        "s3://bucket/compile-cache", f"s3://{fleet['bucket']}/compile-cache"
    )
    program = "import torch\nx = torch.randn(3, 16)\n" + example + "\nprint(tuple(out.shape))\n"
    ran = python(program, trusting(fleet), fleet["work"])
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert ran.stdout.splitlines()[-1] == "(3, 16)"


def served(text: str, server) -> str:
    return text.replace("localhost:8000", f"127.0.0.1:{server.port}")


def test_the_readme_request_is_answered_as_eager(server, eager, tmp_path):
    lines = block("README.md", "curl -s localhost:8000/predict").text.splitlines()
    command = "\n".join(line for line in lines if not line.startswith("{"))  # the rest is its answer
    ran = shell(served(command, server), {}, tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    answer = torch.tensor(json.loads(ran.stdout)["outputs"])
    torch.testing.assert_close(answer, eager(torch.full((2, 256), 0.1)), atol=1e-4, rtol=1e-4)


def test_the_readme_npz_request_is_answered_as_eager(server, eager):
    names: dict = {}
    exec(served(block("README.md", "np.savez(buf, x)").text, server), names)  # as written: its imports, its input
    x, y = names["x"], names["y"]
    assert y.shape == x.shape
    torch.testing.assert_close(torch.from_numpy(y), eager(torch.from_numpy(x)), atol=1e-4, rtol=1e-4)


def test_the_tritonclient_example_is_answered_as_eager(server, eager):
    names: dict = {}
    exec(served(block("docs/serving.md", "httpclient.InferenceServerClient").text, server), names)
    x, y = names["x"], names["y"]
    assert y.shape == (3, 256) and y.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(y.copy()), eager(torch.from_numpy(x)), atol=1e-4, rtol=1e-4)


def test_prepare_replica_runs_as_written(tmp_path):
    ran = python(block("docs/cache.md", "prepare_replica()").text, {"HOME": str(tmp_path)}, tmp_path)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr[-4000:]


def test_the_metrics_example_serves_the_replicas_registry(fleet):
    (unused_port,) = free_ports(1)
    example = (
        block("docs/metrics.md", "prometheus_client.start_http_server(9400")
        .text.replace("s3://bucket/compile-cache", f"s3://{fleet['bucket']}/compile-cache")
        .replace("9400", str(unused_port))
    )
    scrape = f"\nimport requests\nprint(requests.get('http://127.0.0.1:{unused_port}/metrics', timeout=30).text)\n"
    ran = python(example + scrape, trusting(fleet), fleet["work"])
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert re.search(r'^orchestrate_replica_\w+\{[^}]*bucket="4"', ran.stdout, re.MULTILINE), ran.stdout[-3000:]


@pytest.fixture(scope="module")
def examples_home(tmp_path_factory):
    """A reader's working copy of examples/ (its configs name their factories relative to
    themselves) and an empty HOME, whose cache the blocks below share."""
    import shutil

    work = tmp_path_factory.mktemp("reader")
    shutil.copytree(ROOT / "examples", work / "examples")
    return work, {"HOME": str(tmp_path_factory.mktemp("home")), "RAY_USAGE_STATS_ENABLED": "0"}


def test_the_report_commands_run_as_written(examples_home):
    work, env = examples_home
    ran = shell(block("docs/report.md", "orchestrate report runs/mlp.json").text, env, work)
    assert ran.returncode == 0, ran.stderr[-4000:]
    report = json.loads((work / "runs" / "mlp.json").read_text())
    assert [r["bucket"] for r in report["results"] if r.get("rank") == 0] == [1, 8, 32]
    assert "<html" in (work / "runs" / "mlp.html").read_text()[:200].lower()


def test_the_profiling_command_runs_as_written(examples_home):
    work, env = examples_home
    ran = shell(block("docs/profiling.md", "--profile prof/").text, env, work)
    assert ran.returncode == 0, ran.stderr[-4000:]
    report = json.loads((work / "report.json").read_text())
    assert [r["bucket"] for r in report["results"]] == [1, 8, 32]
    traces = {path.name for path in (work / "prof").iterdir()}
    assert {f"mlp-b{bucket}-eager.json.gz" for bucket in (1, 8, 32)} <= traces, traces
