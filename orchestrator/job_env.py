"""The environment a warmup job's processes get through Ray's runtime_env: one rule for both ways a
job starts, `orchestrate warmup` on Ray (ray_driver: ray.init) and `orchestrate submit` (the Jobs
API). A worker on another node does not see the driver's environment; these are what it needs to
reach and trust the store (ORCHESTRATE_*, AWS_*) and to compile as the driver's user asked
(TORCHINDUCTOR_*, TRITON_*).

Secrets: ORCHESTRATE_* and AWS_* include ORCHESTRATE_CACHE_SIGNING_KEY, AWS_SECRET_ACCESS_KEY
and AWS_SESSION_TOKEN. Both places passed those two prefixes before this rule was shared, so they
still do; nothing beyond the four prefixes (and the thread count below) is passed: not
RAY_AUTH_TOKEN, not any other variable of the driver's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

from orchestrator.jobs.workers import TORCH_THREADS_ENV

PASSED_PREFIXES = ("ORCHESTRATE_", "AWS_", "TORCHINDUCTOR_", "TRITON_")


def job_env_vars(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The runtime_env `env_vars` of a job started from `environ` (default: this process's)."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(PASSED_PREFIXES)}
    if "OMP_NUM_THREADS" in environ:  # the driver's own count, for workers as for a plain process
        env.setdefault(TORCH_THREADS_ENV, environ["OMP_NUM_THREADS"])
    return env
