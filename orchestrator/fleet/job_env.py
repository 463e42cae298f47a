"""The environment a job's processes get through Ray's runtime_env: one rule for every way a job
starts, `orchestrate warmup` on Ray (orchestrator.fleet.driver: ray.init), `orchestrate submit` (the Jobs API)
and `orchestrate serve` (the replica's ray_actor_options).

Ray keeps a runtime_env in its records: the Jobs API, the dashboard and `ray list jobs` show it
to anyone who can reach the cluster. So the rule is an allow-list of settings that are never
secret, and nothing else goes there:

- TORCHINDUCTOR_* and TRITON_*: how the driver's user asked for compiling;
- the store's settings: ORCHESTRATE_REMOTE, ORCHESTRATE_CACHE_DIR, ORCHESTRATE_CACHE_TRUSTED_KEYS
  (public key files), ORCHESTRATE_STORE_* (retries and
  timeouts), ORCHESTRATE_TORCH_THREADS, ORCHESTRATE_GPU_WAIT_SECONDS; AWS_REGION,
  AWS_DEFAULT_REGION, AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE>, AWS_PROFILE, AWS_ROLE_ARN,
  AWS_ROLE_SESSION_NAME, AWS_CA_BUNDLE and botocore's other plain settings (PASSED_NAMES);
- under ORCHESTRATE_ and AWS_, any name ending in _FILE: a path, such as
  ORCHESTRATE_CACHE_SIGNING_KEY_FILE, AWS_SHARED_CREDENTIALS_FILE or AWS_WEB_IDENTITY_TOKEN_FILE.
  The path travels, never the file's content; the file must be there on the workers (a mounted
  Secret).

Everything else under ORCHESTRATE_ and AWS_ stays with the driver: ORCHESTRATE_CACHE_SIGNING_KEY,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, and AWS_ACCESS_KEY_ID too (alone it is no use, and an id
without its secret makes botocore fail instead of trying the node's own identity). A worker on a
cluster gets its credentials from its own environment: the variables its node was started with,
the node's identity through boto3's default chain (IRSA, an instance profile, Workload Identity),
or a mounted file whose path is passed. A local Ray instance that `orchestrate` starts itself is
the exception that needs nothing: its processes are children of this one and inherit its
environment, secrets included, without any runtime_env. Nothing outside these prefixes is passed
either: not RAY_AUTH_TOKEN, not any other variable of the driver's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Optional

from orchestrator.jobs.workers import TORCH_THREADS_ENV

PASSED_PREFIXES = ("TORCHINDUCTOR_", "TRITON_", "ORCHESTRATE_STORE_", "AWS_ENDPOINT_URL_")
PASSED_NAMES = frozenset(
    {
        "ORCHESTRATE_REMOTE",
        "ORCHESTRATE_CACHE_DIR",
        "ORCHESTRATE_CACHE_TRUSTED_KEYS",  # paths of public keys: nothing in them is secret
        TORCH_THREADS_ENV,
        "ORCHESTRATE_GPU_WAIT_SECONDS",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_CA_BUNDLE",
        "AWS_STS_REGIONAL_ENDPOINTS",
        "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT",
        "AWS_USE_FIPS_ENDPOINT",
        "AWS_USE_DUALSTACK_ENDPOINT",
        "AWS_MAX_ATTEMPTS",
        "AWS_RETRY_MODE",
        "AWS_EC2_METADATA_DISABLED",
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    }
)
# The families whose other names are withheld (and named in the notice): credentials live here.
WITHHELD_PREFIXES = ("ORCHESTRATE_", "AWS_")


def is_passed(name: str) -> bool:
    """Whether the variable `name` may go into a runtime_env: on the allow-list, or a path."""
    if name in PASSED_NAMES or name.startswith(PASSED_PREFIXES):
        return True
    return name.startswith(WITHHELD_PREFIXES) and name.endswith("_FILE")


def job_env_vars(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The runtime_env `env_vars` of a job started from `environ` (default: this process's)."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if is_passed(k)}
    if "OMP_NUM_THREADS" in environ:  # the driver's own count, for workers as for a plain process
        env.setdefault(TORCH_THREADS_ENV, environ["OMP_NUM_THREADS"])
    return env


def withheld(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The names under ORCHESTRATE_ and AWS_ that are set in `environ` but not passed, sorted."""
    environ = os.environ if environ is None else environ
    return sorted(k for k, v in environ.items() if k.startswith(WITHHELD_PREFIXES) and v and not is_passed(k))


_noted: set[str] = set()


def note_withheld(environ: Optional[Mapping[str, str]] = None, log: Optional[Callable[[str], None]] = None) -> None:
    """Say once per process, in one line on stderr, which variables the cluster's workers do not
    get from here and how they get them instead. Names only: a value is never printed."""
    names = [name for name in withheld(environ) if name not in _noted]
    if not names:
        return
    _noted.update(names)
    (log or _stderr)(
        f"orchestrate: note: not passing {', '.join(names)} to the cluster's workers (Ray shows a job's "
        "environment to anyone who can reach it); workers get credentials from their own nodes' "
        "environment or identity (IRSA, instance profile, Workload Identity) or from a mounted file "
        "named by ORCHESTRATE_CACHE_SIGNING_KEY_FILE / AWS_SHARED_CREDENTIALS_FILE"
    )


def send_the_ray_token_given(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Ray's clients send RAY_AUTH_TOKEN (or the file RAY_AUTH_TOKEN_PATH names) only where
    RAY_AUTH_MODE is `token`; a user who set the token means it to be sent. An explicit
    RAY_AUTH_MODE is kept. Called before this process first talks to a cluster."""
    environ = os.environ if environ is None else environ
    if (environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")) and not environ.get("RAY_AUTH_MODE"):
        environ["RAY_AUTH_MODE"] = "token"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
