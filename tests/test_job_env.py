"""The environment a job gets through Ray's runtime_env (orchestrator.fleet.job_env): what it passes,
what it never passes (secrets: Ray shows a runtime_env to anyone who reaches the cluster), and that
`orchestrate warmup` on Ray, `orchestrate submit` and `orchestrate serve` pass the same. No Ray is
started: the driver's ray.init is a fake that records its arguments."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.deployment import submit
from orchestrator.errors import ClusterUnreachable
from orchestrator.fleet import driver as fleet_driver
from orchestrator.fleet import job_env
from orchestrator.fleet.job_env import TORCH_THREADS_ENV, WITHHELD_PREFIXES, is_passed, job_env_vars, withheld
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


def test_passes_the_allowed_settings_and_nothing_else():
    env = job_env_vars({**PASSED, **NEVER})
    assert env == {**PASSED, TORCH_THREADS_ENV: "8"}
    assert not set(NEVER) & set(env)


def test_the_drivers_thread_count_travels_as_orchestrate_torch_threads():
    assert job_env_vars({"OMP_NUM_THREADS": "6"}) == {TORCH_THREADS_ENV: "6"}
    assert job_env_vars({"OMP_NUM_THREADS": "6", TORCH_THREADS_ENV: "2"}) == {TORCH_THREADS_ENV: "2"}  # explicit wins
    assert job_env_vars({}) == {}


SECRETS = {
    "ORCHESTRATE_CACHE_SIGNING_KEY": "signing-key-value-0123456789",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "AWS_SESSION_TOKEN": "aws-session-value",
    "AWS_ACCESS_KEY_ID": "AKIDVALUE",  # without its secret, botocore would fail, not try the node's identity
    "AWS_SECURITY_TOKEN": "legacy-session-value",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN": "pod-identity-value",
    "ORCHESTRATE_SOMETHING_NEW": "not on the list: withheld until someone adds it",
}
PATHS = {
    "ORCHESTRATE_CACHE_SIGNING_KEY_FILE": "/var/run/secrets/orchestrate/signing-key",
    "AWS_SHARED_CREDENTIALS_FILE": "/var/run/secrets/aws/credentials",
    "AWS_CONFIG_FILE": "/var/run/secrets/aws/config",
    "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
}
SETTINGS = {
    "AWS_DEFAULT_REGION": "eu-west-1",
    "AWS_ENDPOINT_URL_S3": "http://minio:9000",
    "AWS_PROFILE": "cache-writer",
    "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/cache",
    "ORCHESTRATE_CACHE_DIR": "/nvme/orchestrate",
    "ORCHESTRATE_GPU_WAIT_SECONDS": "60",
    "ORCHESTRATE_STORE_READ_TIMEOUT": "30",
    TORCH_THREADS_ENV: "4",
}


def test_secrets_are_never_passed_paths_and_settings_are():
    """Ray keeps a runtime_env in its job records: only the allow-list goes there."""
    env = job_env_vars({**SECRETS, **PATHS, **SETTINGS})
    assert env == {**PATHS, **SETTINGS}
    assert not set(SECRETS.values()) & set(env.values())


def test_the_rule_is_an_allow_list():
    assert all(is_passed(name) for name in [*PASSED, *PATHS, *SETTINGS])
    assert not any(is_passed(name) for name in [*SECRETS, *NEVER])
    # a path is a path only under the two store families: anything else ending in _FILE is not passed
    assert not is_passed("HF_TOKEN_FILE") and not is_passed("RAY_AUTH_TOKEN_FILE")


def test_withheld_names_the_secrets_that_are_set():
    environ = {**SECRETS, **PATHS, **SETTINGS, **NEVER, "AWS_SESSION_TOKEN": ""}
    assert withheld(environ) == sorted(set(SECRETS) - {"AWS_SESSION_TOKEN"})  # an empty one is not set


def test_the_note_names_each_withheld_variable_once_and_never_a_value(monkeypatch):
    monkeypatch.setattr(job_env, "_noted", set())
    lines: list[str] = []
    job_env.note_withheld(SECRETS, log=lines.append)
    job_env.note_withheld(SECRETS, log=lines.append)  # said once per process
    [line] = lines
    assert "\n" not in line and all(name in line for name in SECRETS)
    assert not any(value in line for value in SECRETS.values())
    assert "ORCHESTRATE_CACHE_SIGNING_KEY_FILE" in line  # the way a worker gets the key instead
    job_env.note_withheld({**PATHS, **SETTINGS}, log=lines.append)
    assert len(lines) == 1  # nothing withheld: nothing said


def test_defaults_to_this_processs_environment(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/from/here")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-token")
    env = job_env_vars()
    assert env["TRITON_CACHE_DIR"] == "/from/here" and "RAY_AUTH_TOKEN" not in env


def set_environment(monkeypatch, variables: dict[str, str]) -> None:
    """This process's environment holds `variables` and none of the passed kind besides (an earlier
    test in the session may have set, say, TORCHINDUCTOR_CACHE_DIR)."""
    for name in [n for n in os.environ if is_passed(n) or n.startswith(WITHHELD_PREFIXES)]:
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
        fleet_driver.run_on_ray(spec, Path("/nonexistent"), Remote("file:///nonexistent", True))
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


def test_no_secret_reaches_the_drivers_or_a_submitted_jobs_runtime_env(monkeypatch, tmp_path):
    set_environment(monkeypatch, {**SECRETS, **PATHS, **SETTINGS})
    monkeypatch.setattr(job_env, "_noted", set())
    driver = drivers_runtime_env(monkeypatch)  # a local instance: its processes inherit ours instead
    submitted = submit.runtime_env(tmp_path / "mlp.yaml")
    for env in (driver["env_vars"], submitted["env_vars"]):
        assert env == {**PATHS, **SETTINGS}
        assert not set(SECRETS.values()) & set(env.values())


def test_joining_a_cluster_says_what_its_workers_do_not_get(monkeypatch, capsys):
    set_environment(monkeypatch, SECRETS)
    monkeypatch.setattr(job_env, "_noted", set())

    def init(**kwargs):
        raise ConnectionError("fake ray: not started")

    fake = SimpleNamespace(is_initialized=lambda: False, init=init)
    with pytest.raises(ClusterUnreachable):
        fleet_driver._join(fake, "auto", job_env_vars())
    notes = [line for line in capsys.readouterr().err.splitlines() if "orchestrate: note:" in line]
    assert len(notes) == 1 and "AWS_SECRET_ACCESS_KEY" in notes[0] and "aws-secret-value" not in notes[0]
    with pytest.raises(ClusterUnreachable):  # a local instance of our own: its workers inherit, nothing to say
        monkeypatch.setattr(job_env, "_noted", set())
        fleet_driver._join(fake, None, job_env_vars())
    assert "orchestrate: note:" not in capsys.readouterr().err


def test_serves_replica_options_carry_no_secret(monkeypatch):
    """`orchestrate serve` hands its replica the same runtime_env; Serve keeps deployment options in
    its controller's records and shows them through its API."""
    import ray

    from orchestrator.serving import server as serve

    set_environment(monkeypatch, {**SECRETS, **PATHS, **SETTINGS})
    options: list[dict] = []

    class Stop(Exception):
        pass

    class FakeDeployment:
        def options(self, **kwargs):
            options.append(kwargs)
            raise Stop

    monkeypatch.setattr(fleet_driver, "_join", lambda ray_, address, env: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(serve.serve, "start", lambda **kwargs: None)
    monkeypatch.setattr(serve, "ModelServer", FakeDeployment())
    spec = WarmupSpec.model_validate(
        {"name": "m", "model": {"factory": "json:loads"}, "inputs": [{"shape": ["batch"]}], "device": "cpu"}
    )
    with pytest.raises(Stop):
        serve.run_server(spec, host="127.0.0.1", port=8000)
    [call] = options
    env = call["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == {**PATHS, **SETTINGS}
    assert not any(value in repr(call) for value in SECRETS.values())


def test_a_ray_token_given_is_sent_unless_the_auth_mode_says_otherwise():
    from orchestrator.fleet.job_env import send_the_ray_token_given

    for given, mode in [
        ({"RAY_AUTH_TOKEN": "t"}, "token"),
        ({"RAY_AUTH_TOKEN_PATH": "/run/ray/token"}, "token"),
        ({"RAY_AUTH_TOKEN": "t", "RAY_AUTH_MODE": "disabled"}, "disabled"),  # an explicit mode is kept
        ({}, None),  # no token: nothing to send
    ]:
        environ = dict(given)
        send_the_ray_token_given(environ)
        assert environ.get("RAY_AUTH_MODE") == mode, given
