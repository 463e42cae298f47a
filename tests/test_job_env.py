"""The environment a warmup job gets through Ray's runtime_env (orchestrator.job_env): what it
passes, what it never passes, and that `orchestrate warmup` on Ray and `orchestrate submit` pass
the same. No Ray is started: the driver's ray.init is a fake that records its arguments."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator import ray_driver, submit
from orchestrator.errors import ClusterUnreachable
from orchestrator.job_env import PASSED_PREFIXES, TORCH_THREADS_ENV, job_env_vars
from orchestrator.jobs.records import Remote
from orchestrator.jobs.spec import WarmupSpec

PASSED = {
    "ORCHESTRATE_REMOTE": "s3://bucket/cache",
    "ORCHESTRATE_STORE_ATTEMPTS": "3",
    "AWS_REGION": "us-east-1",
    "AWS_ENDPOINT_URL": "http://minio:9000",
    "TORCHINDUCTOR_COMPILE_THREADS": "4",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TRITON_CACHE_DIR": "/nvme/triton",
}
NEVER = {
    "RAY_AUTH_TOKEN": "ray-token",  # the cluster's own credential
    "HF_TOKEN": "hf-token",
    "GITHUB_TOKEN": "gh-token",
    "HOME": "/home/someone",
    "PATH": "/usr/bin",
    "PYTHONPATH": "/src",
    "CUDA_VISIBLE_DEVICES": "0",
    "TORCH_LOGS": "recompiles",  # not TORCHINDUCTOR_
    "MY_AWS_SECRET_ACCESS_KEY": "x",  # the prefix must start the name
    "aws_secret_access_key": "x",  # names are case-sensitive
    "OMP_NUM_THREADS": "8",  # travels as ORCHESTRATE_TORCH_THREADS, never as itself
}


def test_passes_the_four_prefixes_and_nothing_else():
    env = job_env_vars({**PASSED, **NEVER})
    assert env == {**PASSED, TORCH_THREADS_ENV: "8"}
    assert not set(NEVER) & set(env)


def test_the_drivers_thread_count_travels_as_orchestrate_torch_threads():
    assert job_env_vars({"OMP_NUM_THREADS": "6"}) == {TORCH_THREADS_ENV: "6"}
    assert job_env_vars({"OMP_NUM_THREADS": "6", TORCH_THREADS_ENV: "2"}) == {TORCH_THREADS_ENV: "2"}  # explicit wins
    assert job_env_vars({}) == {}


def test_secrets_under_the_store_prefixes_are_passed_as_both_places_passed_them():
    """Both ray_driver and submit passed ORCHESTRATE_* and AWS_* before the rule was shared, secrets
    included: workers on other nodes sign and reach the store with them. Pinned so that changing
    it (a Secret mounted on the nodes instead, as the RayJob of k8s.py does) is a deliberate step."""
    secrets = {
        "ORCHESTRATE_CACHE_SIGNING_KEY": "k" * 32,
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
        "AWS_ACCESS_KEY_ID": "i",
    }
    assert job_env_vars(secrets) == secrets


def test_defaults_to_this_processs_environment(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/from/here")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-token")
    env = job_env_vars()
    assert env["TRITON_CACHE_DIR"] == "/from/here" and "RAY_AUTH_TOKEN" not in env


def set_environment(monkeypatch, variables: dict[str, str]) -> None:
    """This process's environment holds `variables` and none of the passed kind besides (an earlier
    test in the session may have set, say, TORCHINDUCTOR_CACHE_DIR)."""
    for name in [n for n in os.environ if n.startswith(PASSED_PREFIXES)]:
        monkeypatch.delenv(name)
    for name in ("OMP_NUM_THREADS", "RAY_JOB_CONFIG_JSON_ENV_VAR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_submit_passes_torchinductor_and_triton_variables(monkeypatch, tmp_path):
    set_environment(monkeypatch, {**PASSED, **NEVER})
    env = submit.runtime_env(tmp_path / "configs" / "mlp.yaml")
    assert env["working_dir"] == str(tmp_path / "configs")
    assert {k: v for k, v in env["env_vars"].items() if k.startswith(("TORCHINDUCTOR_", "TRITON_"))} == {
        "TORCHINDUCTOR_COMPILE_THREADS": "4",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TRITON_CACHE_DIR": "/nvme/triton",
    }
    assert not set(NEVER) & set(env["env_vars"])


def drivers_runtime_env(monkeypatch) -> dict:
    """What run_on_ray hands ray.init, with a fake `ray` whose init refuses after recording it."""
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise ConnectionError("fake ray: not started")

    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False, init=init))
    spec = WarmupSpec.model_validate(
        {"name": "m", "model": {"factory": "json:loads"}, "inputs": [{"shape": ["batch"]}]}
    )
    with pytest.raises(ClusterUnreachable):
        ray_driver.run_on_ray(spec, Path("/nonexistent"), Remote("file:///nonexistent", True))
    [call] = calls
    return call["runtime_env"]


def test_the_driver_and_submit_pass_the_same_environment(monkeypatch, tmp_path):
    set_environment(monkeypatch, {**PASSED, **NEVER})
    driver = drivers_runtime_env(monkeypatch)
    assert driver == {"env_vars": job_env_vars()}
    assert submit.runtime_env(tmp_path / "mlp.yaml")["env_vars"] == driver["env_vars"]
    assert driver["env_vars"][TORCH_THREADS_ENV] == "8"


class FlakyJobsAPI:
    """A Jobs API client whose first answers are Ray's 'no agent yet' refusal."""

    def __init__(
        self,
        refusals: int,
        error: str = "Request failed with status code 500: No available agent to submit job, please try again later..",
    ) -> None:
        self.refusals, self.error, self.calls = refusals, error, []

    def submit_job(self, **job):
        self.calls.append(job)
        if len(self.calls) <= self.refusals:
            raise RuntimeError(self.error)
        return job["submission_id"]


def test_submit_waits_for_a_job_agent(monkeypatch):
    monkeypatch.setattr(submit, "AGENT_WAIT_SECONDS", 30.0)
    client = FlakyJobsAPI(refusals=2)
    submit._submit_once_an_agent_answers(client, entrypoint="orchestrate warmup", submission_id="job-1")
    assert [call["submission_id"] for call in client.calls] == ["job-1"] * 3


def test_submit_gives_up_on_agents_after_its_deadline(monkeypatch):
    monkeypatch.setattr(submit, "AGENT_WAIT_SECONDS", 0.0)
    client = FlakyJobsAPI(refusals=100)
    with pytest.raises(RuntimeError, match="No available agent"):
        submit._submit_once_an_agent_answers(client, entrypoint="x", submission_id="job-1")
    assert len(client.calls) == 1


def test_submit_raises_any_other_refusal_at_once():
    client = FlakyJobsAPI(refusals=1, error="Request failed with status code 400: invalid runtime_env.")
    with pytest.raises(RuntimeError, match="invalid runtime_env"):
        submit._submit_once_an_agent_answers(client, entrypoint="x", submission_id="job-1")
    assert len(client.calls) == 1
