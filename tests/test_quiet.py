"""What a user sees, and what a run leaves behind: with --json stdout is the report alone and
stderr holds only progress and `orchestrate:` lines (torch's, Ray's and compilers' own output goes
to a log file the run names once); a failed run leaves no namespace, scratch or lock behind; and a
Ray warmup and an in-process one on the same machine share their cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import MLP, ROOT, orchestrate

from orchestrator.cache.namespace import is_namespace
from orchestrator.progress import RunLog

FACTORIES = """\
from torch import nn


def boom():
    raise RuntimeError("factory exploded\\nsecond line of detail")


class AlwaysFails(nn.Module):
    def forward(self, x):
        raise ValueError("forward always fails")


def always_fails():
    return AlwaysFails()
"""


def config(tmp_path: Path, factory: str) -> Path:
    (tmp_path / "factories.py").write_text(FACTORIES)
    path = tmp_path / f"{factory}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            model: {{factory: factories.py:{factory}}}
            inputs: [{{shape: [batch, 8]}}]
            buckets: [1, 2]
            device: cpu
            bench: {{iterations: 2, warmup: 0}}
            """
        )
    )
    return path


def left_behind(root: Path) -> list[str]:
    """What a run left in a cache root besides the store beside it and that store's key pair."""
    expected = {"store", ".signing-key", ".signing-key.pub"}
    found = [p for p in root.rglob("*") if p.relative_to(root).parts[0] not in expected]
    return sorted(str(p.relative_to(root)) for p in found)


def warmup_no_ray(tmp_path: Path, cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {"TMPDIR": str(tmp_path / "tmp")}  # Inductor's and our own scratch land here, checked below
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return orchestrate(
        "warmup", "--no-ray", "--model", str(cfg), "--json", *extra, cache_dir=tmp_path / "cache", env=env
    )


def test_a_model_that_does_not_build_leaves_nothing_but_the_store(tmp_path):
    proc = warmup_no_ray(tmp_path, config(tmp_path, "boom"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("orchestrate: error: model.factory:") and "factory exploded" in line
    assert left_behind(tmp_path / "cache") == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_buckets_that_fail_leave_no_empty_namespace_and_stdout_is_the_report(tmp_path):
    proc = warmup_no_ray(tmp_path, config(tmp_path, "always_fails"))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)  # the report alone, whatever torch printed meanwhile
    assert [r["status"] for r in report["results"]] == ["failed", "failed"]
    failures = [line for line in proc.stderr.splitlines() if "FAILED" in line]
    assert failures == [f"bucket {b}: FAILED at eager reference: ValueError: forward always fails" for b in (1, 2)]
    assert not [p for p in (tmp_path / "cache").iterdir() if is_namespace(p.name)]
    assert left_behind(tmp_path / "cache") == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_run_log_takes_what_c_code_and_children_write_and_goes_when_empty(tmp_path):
    """fd 1 and fd 2 themselves are redirected, not only sys.stdout: a child process (a compiler,
    Ray's raylet) and C code write there directly."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from pathlib import Path
        from orchestrator.progress import RunLog
        with RunLog(Path({str(tmp_path / "logs")!r}), "noisy") as log:
            os.write(1, b"from fd 1\\n")
            os.write(2, b"from fd 2\\n")
            subprocess.run(["sh", "-c", "echo from a child; echo child err >&2"], check=True)
            print("from print")
            log.screen.write("progress\\n")
        with RunLog(Path({str(tmp_path / "quiet")!r}), "quiet") as quiet:
            pass
        print("kept", log.kept, quiet.kept)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "progress\n"
    (kept,) = list((tmp_path / "logs").iterdir())
    assert proc.stdout == f"kept {kept} None\n"
    assert kept.read_text().splitlines() == ["from fd 1", "from fd 2", "from a child", "child err", "from print"]
    assert not (tmp_path / "quiet").exists()


def test_an_unwritable_log_directory_redirects_nothing(tmp_path):
    (tmp_path / "file").write_text("")
    with RunLog(tmp_path / "file" / "logs", "x") as log:
        assert log.screen is sys.stderr
    assert log.kept is None


@pytest.mark.slow
def test_a_ray_warmup_then_an_in_process_one_share_the_cache(profiled_ray_warmup):
    """On Ray, stdout is the report alone and Ray's token-authentication banner and log lines are
    off the screen, in the file the run names; then `--no-ray` on the same cache root hits only."""
    cache, on_ray, report = profiled_ray_warmup.cache, profiled_ray_warmup.run, profiled_ray_warmup.report
    common = ("--model", MLP, "--buckets", "1", "--device", "cpu", "--json")
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    assert report["executor"]["kind"] == "ray"
    assert "Token authentication" not in on_ray.stderr
    assert all(
        line.startswith(("orchestrate:", "ray:", "compile ", "rank ", "warm ", "Ray's log records:"))
        for line in on_ray.stderr.splitlines()
    ), on_ray.stderr
    (named,) = [line.split(": ", 1)[1] for line in on_ray.stderr.splitlines() if line.startswith("Ray's log records:")]
    ray_log = Path(named).read_text()
    if "RAY_AUTH_MODE" not in os.environ:  # Ray says it only when the mode is left to it
        assert "Token authentication is enabled" in ray_log

    in_process = orchestrate("warmup", "--no-ray", *common, cache_dir=cache, env=env)
    assert in_process.returncode == 0, in_process.stderr[-3000:]
    (result,) = json.loads(in_process.stdout)["results"]
    assert result["status"] == "ok" and result["cache_state"] == "hit", result
    assert result["cache_hits"] > 0 and result["cache_misses"] == 0
    assert json.loads(in_process.stdout)["summary"]["cache_state"] == "warm"
