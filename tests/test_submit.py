"""`orchestrate submit` against a real Ray head with its dashboard (Jobs API) on loopback."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, free_ports, orchestrate
from ray_heads import HEAD_OPTIONS, HEADS, stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(HEADS)]
BIN = Path(sys.executable).parent


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
    dashboard, gcs, agent = free_ports(3)
    # A job's driver joins "the cluster started last" (<temp dir>/ray_current_cluster, which every
    # Ray instance on the machine writes): a temp dir of its own keeps that file this head's, with
    # a test beside this one starting local instances. Short: Ray's sockets live under it.
    temp = tempfile.mkdtemp(prefix="ray-head-", dir="/tmp")
    subprocess.run(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--temp-dir",
            temp,
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(gcs),
            *HEAD_OPTIONS,
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard),
            # jobs are submitted through this agent: Ray's default port may be held by a local
            # instance of a test running beside this one
            "--dashboard-agent-listen-port",
            str(agent),
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
        stop_cluster(f"127.0.0.1:{gcs}")
        shutil.rmtree(temp, ignore_errors=True)


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


@pytest.fixture(scope="module")
def submitted(ray_head, tmp_path_factory):
    """One job, run to its end (`submit --wait --report`), submitted from an environment holding
    credentials that must stay with the submitter: the tests below read it from both sides."""
    tmp = tmp_path_factory.mktemp("submitted")
    withheld = {
        "AWS_SECRET_ACCESS_KEY": "marker-aws-secret-" + secrets_hex(),
        "AWS_SESSION_TOKEN": "marker-aws-session-" + secrets_hex(),
        "ORCHESTRATE_CACHE_SIGNING_KEY": "marker-signing-key-" + secrets_hex(),
    }
    head = {**ray_head, "env": {**ray_head["env"], **withheld, "AWS_REGION": "eu-west-1"}}
    cfg = config(tmp, "models.py:tiny")
    proc = submit(head, cfg, "--wait", "--report", str(tmp / "report.json"))
    return {"head": head, "config": cfg, "proc": proc, "report": tmp / "report.json", "withheld": withheld}


def test_a_job_runs_to_success_and_its_report_comes_back(submitted):
    proc = submitted["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout)
    assert outcome["status"] == "SUCCEEDED" and outcome["new"] is True
    report = json.loads(submitted["report"].read_text())
    assert report["model"] == "submitted-tiny" and report["executor"]["kind"] == "ray"
    assert all(r["status"] == "ok" for r in report["results"])
    assert "[orchestrate-submitted-tiny-" in proc.stderr  # the job's logs were followed

    again = submit(submitted["head"], submitted["config"])
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["submission_id"] == outcome["submission_id"] and second["new"] is False
    assert "already submitted (SUCCEEDED)" in again.stderr


def test_a_broken_config_fails_the_job_and_the_cli_says_why(ray_head, tmp_path):
    # the token alone, as a user sets it: it is sent without RAY_AUTH_MODE=token beside it
    env = {k: v for k, v in ray_head["env"].items() if k != "RAY_AUTH_MODE"}
    proc = submit({**ray_head, "env": env}, config(tmp_path, "no_such_module:make"), "--wait")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["status"] == "FAILED"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error: job ")]
    assert len(errors) == 1 and "no_such_module" in errors[0]


def test_submit_needs_an_address(tmp_path):
    proc = orchestrate("submit", "--model", str(config(tmp_path, "models.py:tiny")))
    assert proc.returncode == 2 and "--ray-address" in proc.stderr


# Reads back, through the Jobs API and the dashboard's HTTP answer, everything Ray keeps of a job.
JOB_RECORDS = """
import dataclasses, json, sys, urllib.request, os
from ray.job_submission import JobSubmissionClient
client = JobSubmissionClient(sys.argv[1])
def plain(job):  # JobDetails: a pydantic model in this Ray, a dataclass in older ones
    return job.model_dump() if hasattr(job, "model_dump") else dataclasses.asdict(job)
info = client.get_job_info(sys.argv[2])
listed = [job for job in client.list_jobs() if job.submission_id == sys.argv[2]]
request = urllib.request.Request(sys.argv[1] + "/api/jobs/", headers={"Authorization": "Bearer " + os.environ["RAY_AUTH_TOKEN"]})
print(json.dumps({"info": plain(info), "listed": [plain(j) for j in listed]}, default=str))
print(urllib.request.urlopen(request).read().decode())
"""


def test_no_secret_reaches_rays_job_records(ray_head, submitted):
    """Ray shows a job's runtime_env and entrypoint to anyone who reaches its dashboard: the
    submitter's credentials stay with it, and the job still runs (its store's key is a file)."""
    proc, withheld = submitted["proc"], submitted["withheld"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = json.loads(proc.stdout)["submission_id"]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: note:")]
    assert len(notes) == 1 and all(name in notes[0] for name in withheld)
    records = subprocess.run(
        [sys.executable, "-c", JOB_RECORDS, ray_head["address"], job_id],
        env=ray_head["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert records.returncode == 0, records.stderr
    assert job_id in records.stdout and "eu-west-1" in records.stdout  # the records are there, settings included
    for name, value in withheld.items():
        assert value not in records.stdout, name
        assert value not in proc.stdout + proc.stderr, name


def secrets_hex() -> str:
    return secrets.token_hex(8)


def test_the_readmes_cluster_commands_run_as_written(ray_head, tmp_path):
    """README's "On a Ray cluster or Kubernetes", taken from the Markdown (test_docs_examples.py):
    submitted to this Ray head's Jobs API, rendered, and applied to a recording API server."""
    from test_docs_examples import block, shell
    from test_k8s_apply import ApiServer, kubeconfig

    image = "example.com/orchestrate:1"
    cfg = config(tmp_path, "models.py:tiny")
    cfg.rename(tmp_path / "cfg.yaml")
    api = ApiServer()
    try:
        (tmp_path / "kubeconfig").write_text(kubeconfig(api.url))
        commands = block("README.md", "orchestrate render k8s").text
        script = commands.replace("IMAGE:TAG", image).replace("http://head:8265", ray_head["address"])
        ran = shell(script, {**ray_head["env"], "KUBECONFIG": str(tmp_path / "kubeconfig")}, tmp_path)
        assert ran.returncode == 0, ran.stderr[-4000:]
    finally:
        api.httpd.shutdown()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["buckets_ok"] == 2 and report["summary"]["buckets_failed"] == 0
    rendered = (tmp_path / "model.yaml").read_text()
    assert image in rendered and "s3://bucket/compile-cache" in rendered and "NVIDIA-H200" in rendered  # a label value
    assert {"RayJob", "Deployment"} <= {request["body"]["kind"] for request in api.requests}
