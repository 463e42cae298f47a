"""`orchestrate submit` against a real Ray head with its dashboard (Jobs API) on loopback."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, orchestrate

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    dashboard = free_port()
    subprocess.run(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard),
            "--num-cpus",
            "2",
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=180,
    )
    try:
        yield {"address": f"http://127.0.0.1:{dashboard}", "env": env}
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)


def config(tmp_path: Path, factory: str) -> Path:
    """The config's folder travels as the job's working_dir; the cache lives outside it."""
    (tmp_path / "models.py").write_text(
        textwrap.dedent("""
        from torch import nn

        def tiny():
            return nn.Sequential(nn.Linear(16, 16), nn.GELU())
    """)
    )
    path = tmp_path / f"{factory.split(':')[-1]}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        name: submitted-{factory.split(":")[-1]}
        model: {{factory: "{factory}"}}
        inputs: [{{shape: [batch, 16]}}]
        buckets: [1, 2]
        device: cpu
        bench: {{iterations: 5, warmup: 1}}
        cache_dir: {tmp_path.parent / (tmp_path.name + "-cache")}
    """)
    )
    return path


def submit(ray_head, cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "submit",
            "--model",
            str(cfg),
            "--ray-address",
            ray_head["address"],
            *extra,
        ],
        cwd=ROOT,
        env=ray_head["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_job_runs_to_success_and_its_report_comes_back(ray_head, tmp_path):
    cfg = config(tmp_path, "models.py:tiny")
    proc = submit(ray_head, cfg, "--wait", "--report", str(tmp_path / "report.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout)
    assert outcome["status"] == "SUCCEEDED" and outcome["new"] is True
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"] == "submitted-tiny" and report["executor"]["kind"] == "ray"
    assert all(r["status"] == "ok" for r in report["results"])
    assert "[orchestrate-submitted-tiny-" in proc.stderr  # the job's logs were followed

    again = submit(ray_head, cfg)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["submission_id"] == outcome["submission_id"] and second["new"] is False
    assert "already submitted (SUCCEEDED)" in again.stderr


def test_a_broken_config_fails_the_job_and_the_cli_says_why(ray_head, tmp_path):
    proc = submit(ray_head, config(tmp_path, "no_such_module:make"), "--wait")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["status"] == "FAILED"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error: job ")]
    assert len(errors) == 1 and "no_such_module" in errors[0]


def test_submit_needs_an_address(tmp_path):
    proc = orchestrate("submit", "--model", str(config(tmp_path, "models.py:tiny")))
    assert proc.returncode == 2 and "--ray-address" in proc.stderr
