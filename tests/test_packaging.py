"""How the package installs and what its layers may import: one import name, `orchestrator`, with
cache/ and jobs/ as its subpackages; imports only go orchestrator -> jobs -> cache."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestrator"


def imported_names(path: Path) -> list[str]:
    """Every absolute module name a file imports (`from x import y` counts as x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def python_files(*folders: str) -> list[Path]:
    # os.walk with followlinks: orchestrator/cache and orchestrator/jobs are links
    found = []
    for folder in folders:
        for root, _, files in os.walk(ROOT / folder, followlinks=True):
            found += [Path(root) / f for f in files if f.endswith(".py")]
    return found


def test_nothing_imports_cache_or_jobs_as_top_level_names():
    offending = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in python_files("orchestrator", "tests", "bench", "scripts", "examples")
        for name in imported_names(path)
        if name.partition(".")[0] in ("cache", "jobs")
    ]
    assert offending == []


@pytest.mark.parametrize(
    "layer, may_import, never",
    [
        ("cache", ("orchestrator.cache",), ("torch", "ray")),
        ("jobs", ("orchestrator.jobs", "orchestrator.cache"), ("ray",)),
    ],
)
def test_imports_go_one_way(layer, may_import, never):
    """cache knows nothing above it and no torch; jobs knows no orchestrator module and no Ray
    (the driver makes its workers Ray actors)."""
    imports = [(path, name) for path in python_files(f"orchestrator/{layer}") for name in imported_names(path)]
    ours = [(path, name) for path, name in imports if name.partition(".")[0] == "orchestrator"]
    assert ours, "the walk found no imports of our own: the links are missing"
    assert [f"{p.name}: {n}" for p, n in ours if not n.startswith(may_import)] == []
    assert [f"{p.name}: {n}" for p, n in imports if n.partition(".")[0] in never] == []


def test_a_wheel_holds_one_top_level_name(tmp_path):
    # built from a copy: a build in the checkout would leave build/ and *.egg-info behind
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("orchestrator", "cache", "jobs"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"orchestrator"}
    for module in ("orchestrator/cache/manifest.py", "orchestrator/jobs/serving.py", "orchestrator/cli.py"):
        assert module in names
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["orchestrator"]


def test_a_servers_own_cache_and_jobs_modules_do_not_collide(tmp_path):
    """A server beside its own `cache.py` and `jobs/` imports the public API, and they stay its own."""
    (tmp_path / "cache.py").write_text("MINE = 'cache'\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("MINE = 'jobs'\n")
    server = (
        "import sys, orchestrator\n"
        "assert 'torch' not in sys.modules, 'import orchestrator must not import torch'\n"
        "from orchestrator import prepare_replica\n"
        "import cache, jobs\n"
        "print(prepare_replica.__module__, cache.MINE, jobs.MINE)\n"
    )
    out = subprocess.run([sys.executable, "-c", server], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["orchestrator.jobs.serving", "cache", "jobs"]


def test_the_public_api_is_listed_and_unknown_names_fail():
    import orchestrator

    assert orchestrator.__all__ == ["prepare_replica", "runtime"]
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        orchestrator.nothing_here  # noqa: B018
