import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def orchestrate(*args: str, cache_dir: Path | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process, as a user (or a new replica) would."""
    env = dict(os.environ)
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "orchestrator", *args]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def root() -> Path:
    return ROOT
