"""The Dockerfile's pins against pyproject.toml and the Kubernetes manifests: the image cannot be
built here, so what it promises is read from the file. A version or a torch range bumped in
pyproject.toml without the Dockerfile fails here."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from conftest import ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from orchestrator.deployment.k8s import RUN_AS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# torch's own pin of Triton (its wheel's Requires-Dist, `triton==X; platform_system == "Linux"`):
# a torch bumped in the Dockerfile needs its Triton here, read from that torch's metadata
TRITON_OF_TORCH = {"2.11.0": "3.6.0"}
# the Python an Ubuntu release's python3 is: the version the image's apt package gives
PYTHON_OF_UBUNTU = {"22.04": "3.10", "24.04": "3.12"}
# the CUDA a torch build's local version tag names
CUDA_OF_TAG = {"cu126": "12.6", "cu128": "12.8", "cu130": "13.0"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments and blanks dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\").strip() if pending else stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            keyword, _, rest = pending.partition(" ")
            found.append((keyword.upper(), rest.strip()))
            pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return found


INSTRUCTIONS = instructions()


def stages() -> list[list[tuple[str, str]]]:
    """The instructions per build stage, each beginning with its FROM."""
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in INSTRUCTIONS:
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def arg_defaults() -> dict[str, str]:
    """Every `ARG NAME=default` anywhere in the file (one default per name: the test says so)."""
    defaults: dict[str, str] = {}
    for keyword, rest in INSTRUCTIONS:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            assert defaults.get(name, value) == value, f"ARG {name} has two defaults"
            defaults[name] = value.strip('"')
    return defaults


ARGS = arg_defaults()
STAGES = stages()
RUNTIME = STAGES[-1]


def assignments(stage: list[tuple[str, str]], instruction: str) -> dict[str, str]:
    """The key=value pairs of every LABEL or ENV instruction of a stage."""
    found = {}
    for keyword, rest in stage:
        if keyword == instruction:
            for word in shlex.split(rest):
                key, _, value = word.partition("=")
                found[key] = value
    return found


def labels(stage: list[tuple[str, str]]) -> dict[str, str]:
    return assignments(stage, "LABEL")


def env(stage: list[tuple[str, str]]) -> dict[str, str]:
    return assignments(stage, "ENV")


def runs(stage: list[tuple[str, str]]) -> str:
    return "\n".join(rest for keyword, rest in stage if keyword == "RUN")


def test_two_stages_the_runtime_takes_only_the_built_venv():
    assert len(STAGES) >= 2
    names = [re.search(r"\bAS (\S+)", stage[0][1], re.IGNORECASE) for stage in STAGES]
    assert all(names) and names[0] and names[0].group(1) == "build"
    copies = [rest for keyword, rest in RUNTIME if keyword == "COPY"]
    assert copies == ["--from=build /opt/orchestrate /opt/orchestrate"]
    assert "pip install" not in runs(RUNTIME)


def test_the_base_is_a_cuda_runtime_image_of_the_cuda_torch_is_built_for():
    base = ARGS["BASE"]
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-ubuntu(\d+\.\d+)", base)
    assert match, base
    assert all(stage[0][1].split()[0] == "${BASE}" for stage in STAGES)
    torch = Version(ARGS["TORCH_VERSION"])
    assert torch.local in CUDA_OF_TAG, f"torch {torch}: name its CUDA build (+cu130, ...)"
    assert CUDA_OF_TAG[torch.local] == f"{match.group(1)}.{match.group(2)}"
    assert ARGS["TORCH_INDEX_URL"].rstrip("/").endswith(f"/whl/{torch.local}")


def test_torch_is_pinned_within_pyprojects_range_with_its_own_triton():
    [torch_requirement] = [dep for dep in PYPROJECT["dependencies"] if re.match(r"torch\b", dep)]
    supported = SpecifierSet(torch_requirement.removeprefix("torch"))
    torch = Version(ARGS["TORCH_VERSION"])
    assert torch in supported, f"the image's torch {torch} is outside pyproject.toml's {supported}"
    assert ARGS["TRITON_VERSION"] == TRITON_OF_TORCH[torch.public]
    build = runs(STAGES[0])
    assert '"torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}"' in build
    assert "--constraint /opt/constraints.txt" in build  # the package's install cannot move them


def test_python_is_ubuntus_own_and_within_requires_python():
    ubuntu = re.search(r"ubuntu(\d+\.\d+)$", ARGS["BASE"])
    assert ubuntu
    python = PYTHON_OF_UBUNTU[ubuntu.group(1)]
    for stage in STAGES:
        assert f"python{python} " in runs(stage)
    assert f"python{python} -m venv /opt/orchestrate" in runs(STAGES[0])
    assert Version(python) in SpecifierSet(PYPROJECT["requires-python"])


def test_the_extras_installed_exist_and_are_the_runtime_ones():
    installs = re.findall(r'"\.\[([^\]]+)\]"', runs(STAGES[0]))
    assert len(installs) == 1
    extras = set(installs[0].split(","))
    assert extras <= set(PYPROJECT["optional-dependencies"]), extras - set(PYPROJECT["optional-dependencies"])
    assert extras == {"k8s", "metrics", "serve"}
    assert any(dep.startswith("boto3") for dep in PYPROJECT["dependencies"])  # S3 needs no extra


def test_the_version_label_is_the_packages_version():
    found = labels(RUNTIME)
    assert found["org.opencontainers.image.version"] == PYPROJECT["version"]
    assert found["org.opencontainers.image.title"] == PYPROJECT["name"]
    assert found["org.opencontainers.image.licenses"] == PYPROJECT["license"]["text"]


def test_it_runs_as_the_numeric_non_root_user_the_manifests_run_as():
    [user] = [rest for keyword, rest in RUNTIME if keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == RUN_AS != 0
    assert gid == "" or int(gid) == RUN_AS
    assert f"useradd --uid {RUN_AS} --gid {RUN_AS} " in runs(RUNTIME)
    assert [keyword for keyword, _ in RUNTIME][-2:] == ["ENTRYPOINT", "CMD"]  # nothing runs as root after USER


def test_a_read_only_root_filesystem_leaves_it_a_writable_home_and_the_caches_to_orchestrate():
    variables = env(RUNTIME)
    assert variables["HOME"] == "/tmp"  # an emptyDir in every rendered pod
    assert variables["PYTHONDONTWRITEBYTECODE"] == "1"
    assert variables["PATH"].startswith("/opt/orchestrate/bin:")
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "ORCHESTRATE_CACHE_DIR"):
        assert all(name not in env(stage) for stage in STAGES), f"{name} is set per namespace by orchestrate"


def test_the_entrypoint_is_the_orchestrate_script():
    [entrypoint] = [rest for keyword, rest in RUNTIME if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["orchestrate"]
    assert "orchestrate" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("source", ["pyproject.toml", "README.md", "cache", "jobs", "orchestrator"])
def test_the_build_context_holds_what_the_build_copies(source):
    """.dockerignore leaves out everything but the package's sources; the links orchestrator/cache
    and orchestrator/jobs need cache/ and jobs/ beside it."""
    copied = {word for keyword, rest in STAGES[0] if keyword == "COPY" for word in rest.split()[:-1]}
    assert source in copied
    allowed = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert source in allowed
    assert (ROOT / source).exists()
