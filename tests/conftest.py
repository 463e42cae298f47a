import os
import subprocess
import sys
from pathlib import Path

import pytest

from s3fixtures import *  # noqa: F401,F403  moto_server, fault_proxy

ROOT = Path(__file__).resolve().parent.parent

# Tests talk to loopback only: never let boto3 look for credentials on the instance-metadata address.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


def orchestrate(*args: str, cache_dir: Path | None = None, timeout: int = 900,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process, as a user (or a new replica) would."""
    env = {**os.environ, **(env or {})}
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "orchestrator", *args]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def root() -> Path:
    return ROOT
