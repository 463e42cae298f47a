"""Submit a warmup to a running Ray cluster through the Jobs API (the dashboard's HTTP address).

The config travels with the job as its working_dir (the config's folder, so factory files next to
it come along). The submission id is derived from the config's identity and the buckets: the same
warmup submitted twice is recognised and followed, not run twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from orchestrator.cache.namespace import slug
from orchestrator.config import format_bucket_dims
from orchestrator.errors import ClusterUnreachable
from orchestrator.fleet.job_env import job_env_vars, note_withheld, send_the_ray_token_given
from orchestrator.jobs.spec import WarmupSpec

FINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# The Jobs API's answer while no job agent is ready (a head that has just started, or a busy one):
# nothing was submitted, and Ray asks to be tried again later.
AGENT_NOT_READY = "No available agent to submit job"
AGENT_WAIT_SECONDS = 120.0


@dataclass
class Submission:
    submission_id: str
    status: str
    new: bool
    message: str = ""
    report: Optional[dict[str, Any]] = None


def submission_id(spec: WarmupSpec) -> str:
    key = json.dumps(
        {"identity": spec.identity_hash(), "buckets": spec.buckets, "device": spec.device, "remote": spec.remote}
        | ({"grid": spec.grid, "points": spec.points and spec.points.model_dump()} if spec.grid else {}),
        sort_keys=True,
    )
    return f"orchestrate-{slug(spec.label, 32, keep='-')}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def runtime_env(config_path: Path) -> dict[str, Any]:
    """The job's runtime_env: the config's folder as its working_dir, and the environment every
    warmup job gets (job_env.job_env_vars, as `orchestrate warmup` on Ray passes it)."""
    return {"working_dir": str(config_path.parent), "env_vars": job_env_vars()}


def submit(
    address: str, spec: WarmupSpec, config_path: Path, *, extra_args: list[str], wait: bool, log: Callable[[str], None]
) -> Submission:
    send_the_ray_token_given()
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, or a RuntimeError naming the address
        raise ClusterUnreachable(
            f"cannot reach the Ray Jobs API at {address}: {str(exc).splitlines()[0]}; "
            "pass the dashboard address (e.g. http://head:8265) and, where the cluster uses token "
            "authentication, its RAY_AUTH_TOKEN"
        ) from None
    job_id, existing = _reusable(client, submission_id(spec))
    if existing is None:
        note_withheld(log=log)
        args = [
            "orchestrate",
            "warmup",
            "--model",
            config_path.name,
            "--ray-address",
            "auto",
            "--json",
            "--buckets",
            format_bucket_dims(spec),
            *extra_args,
        ]
        _submit_once_an_agent_answers(
            client,
            entrypoint=shlex.join(args),
            submission_id=job_id,
            runtime_env=runtime_env(config_path),
            metadata={"orchestrate.model": spec.label},
        )
        log(f"submitted {job_id} to {address}")
    else:
        log(f"{job_id} was already submitted ({_status(existing)}); following it instead of running it again")
    if not wait:
        info = _job_info(client, job_id)
        return Submission(job_id, _status(info), existing is None, info.message or "")
    asyncio.run(_follow(client, job_id, log))
    info = client.get_job_info(job_id)
    logs = client.get_job_logs(job_id)
    return Submission(job_id, _status(info), existing is None, _reason(info, logs), _report(logs))


def _submit_once_an_agent_answers(client: Any, **job: Any) -> None:
    """`client.submit_job(**job)`, tried again while Ray says no job agent is ready, for at most
    AGENT_WAIT_SECONDS; any other refusal is raised at once."""
    for attempt in Retrying(
        retry=retry_if_exception(lambda exc: isinstance(exc, RuntimeError) and AGENT_NOT_READY in str(exc)),
        stop=stop_after_delay(AGENT_WAIT_SECONDS),
        wait=wait_exponential_jitter(initial=0.5, max=10.0),
        reraise=True,
    ):
        with attempt:
            client.submit_job(**job)


def _status(info: Any) -> str:
    return getattr(info.status, "value", str(info.status))


def _reusable(client: Any, base_id: str) -> tuple[str, Any]:
    """The id to use and the job already under it: a pending, running or succeeded job is followed;
    after a failed or stopped one, the next attempt gets the next id (`-2`, `-3`, ...)."""
    for attempt in range(1, 100):
        job_id = base_id if attempt == 1 else f"{base_id}-{attempt}"
        info = _job_info(client, job_id)
        if info is None or _status(info) not in ("FAILED", "STOPPED"):
            return job_id, info
    raise RuntimeError(f"{base_id}: 99 failed attempts; stop and inspect the job logs")


def _job_info(client: Any, job_id: str) -> Any:
    try:
        return client.get_job_info(job_id)
    except RuntimeError as exc:  # the Jobs API answers 404 as RuntimeError
        if "does not exist" in str(exc) or "404" in str(exc):
            return None
        raise


async def _follow(client: Any, job_id: str, log: Callable[[str], None]) -> None:
    async for lines in client.tail_job_logs(job_id):
        for line in lines.splitlines():
            log(f"[{job_id}] {line}")


def _reason(info: Any, logs: str) -> str:
    """The job's own one-line error where it printed one, else what Ray says."""
    errors = [line for line in logs.splitlines() if line.startswith("orchestrate: error:")]
    return errors[-1].removeprefix("orchestrate: error: ") if errors else (info.message or "")


def _report(logs: str) -> Optional[dict[str, Any]]:
    """The JSON report the job printed with --json (its stderr progress is interleaved in the logs)."""
    lines = logs.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    for start in reversed(starts):
        ends = [i for i in range(start, len(lines)) if lines[i] == "}"]
        if ends:
            try:
                return json.loads("\n".join(lines[start : ends[-1] + 1]))
            except ValueError:
                continue
    return None


def exit_code_for(submission: Submission) -> int:
    return {"SUCCEEDED": 0, "PENDING": 0, "RUNNING": 0}.get(submission.status, 1)
