import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray_heads import HEADS
from s3fixtures import *  # noqa: F401,F403  moto_server, fault_proxy
from served import eager, server  # noqa: F401  one served examples/mlp.yaml for the whole session

ROOT = Path(__file__).resolve().parent.parent

# Tests talk to loopback only: never let boto3 look for credentials on the instance-metadata address.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
# Inductor's CPU backend otherwise compiles and loads two probe programs into every fresh cache
# directory to learn which vector instructions work (about 5 s of a 2-core machine): every process
# that compiles or loads a test's model in a cache of its own would pay it. The CPU's own flags
# decide the same instructions; it is set here, for the whole session, so that every process of a
# test (CLI runs, Ray workers, replicas) and every plain-torch process beside them agree on it.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# Inductor's compile workers: a pool of processes, each importing torch, started by every process
# that compiles (about 7 s of a 2-core machine each), for models whose few kernels compile faster
# in the process itself. The product's own choice of pools is tested in test_plan.py.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# examples/mlp.yaml, 2 layers deep: for tests that warm "mlp" for real but check nothing its depth
# changes (the README's main job itself runs examples/mlp.yaml in test_ray_local.py)
MLP = "tests/configs/mlp.yaml"


def orchestrate(
    *args: str, cache_dir: Path | None = None, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process, as a user (or a new replica) would."""
    env = {**os.environ, **(env or {})}
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "orchestrator", *args]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def fresh_python(script: str, *args: str, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    """Run `script` in a fresh interpreter with the repository importable, as a new replica
    process starts; its stdout, once it has exited 0 (else the test fails with its stderr)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def assert_measured(record: dict, *, benchmarked: bool = True) -> None:
    """An "ok" bucket record (orchestrator.jobs.records.BucketResult as a dict) holds real measurements, not
    just any value: NaN passes `> 0` and `is not None` checks, so every number is checked finite.

    - The correctness gate ran: `max_abs_error` is finite and >= 0. Judged against a float64
      run, so are eager's and the compiled output's RMS errors against it, the compiled one within
      `gate_multiple` times eager's plus a floor; judged against eager, so are the `atol`/`rtol`
      it was held to (and `max_abs_error` within atol where rtol is 0). Either way
      `tolerance_used`, how close it came to failing, is within [0, 1]. Exactly 0 is not
      asserted: compiled and eager need not be bit-identical.
    - With `benchmarked`: both median latencies are finite and > 0 and `speedup` is their ratio.
    """
    assert record["status"] == "ok", record.get("error_detail") or record.get("error")
    error = record["max_abs_error"]
    judged = ("float64_eager_error", "float64_error", "gate_multiple")
    if record["gate_reference"] == "float64":
        assert record["atol"] is None and record["rtol"] is None, record
        measured = [("max_abs_error", error), *((name, record[name]) for name in judged)]
    else:
        assert record["gate_reference"] == "eager", record
        measured = [("max_abs_error", error), ("atol", record["atol"]), ("rtol", record["rtol"])]
    for name, value in measured:
        assert value is not None and math.isfinite(value) and value >= 0, (name, value, record)
    assert record["tolerance_used"] is not None and 0 <= record["tolerance_used"] <= 1, record
    if record["gate_reference"] == "eager" and record["rtol"] == 0:
        assert error <= record["atol"], record
    if benchmarked:
        eager, compiled, speedup = record["eager_ms"], record["compiled_ms"], record["speedup"]
        for name, value in (("eager_ms", eager), ("compiled_ms", compiled), ("speedup", speedup)):
            assert value is not None and math.isfinite(value) and value > 0, (name, value, record)
        assert speedup == pytest.approx(eager / compiled), record


def loads_settled(timeout: float = 60.0) -> bool:
    """Whether no replica's load in this process holds Python's full collections off, waiting up
    to `timeout` for the loads that earlier tests in this process started to settle."""
    from orchestrator.jobs import collector

    deadline = time.monotonic() + timeout
    while collector.deferred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not collector.deferred()


def free_ports(count: int) -> list[int]:
    """Distinct free ports: every socket stays bound until all are chosen, so the kernel cannot
    hand the same port out twice (one released at once can come straight back)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


@pytest.fixture
def root() -> Path:
    return ROOT


@dataclass
class ProfiledRun:
    """One real warmup of "mlp" (tests/configs/mlp.yaml) on the CPU with `--profile`, which several test modules
    read (the profile, the page, the screen): compiling it once per session keeps CI short."""

    run: subprocess.CompletedProcess
    report: dict
    traces: Path
    cache: Path
    page: Path | None = None


@pytest.fixture(scope="session")
def profiled_warmup(tmp_path_factory) -> ProfiledRun:
    """`warmup --no-ray --buckets 1,2 --profile DIR --report R --html P`."""
    where = tmp_path_factory.mktemp("profiled")
    traces, report, page = where / "prof", where / "report.json", where / "pages" / "mlp.html"
    run = orchestrate(
        "warmup",
        "--no-ray",
        *("--model", MLP, "--buckets", "1,2", "--device", "cpu"),
        *("--profile", str(traces), "--report", str(report), "--html", str(page)),
        cache_dir=where / "cache",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return ProfiledRun(run, json.loads(report.read_text()), traces, where / "cache", page)


@pytest.fixture(scope="session")
def profiled_ray_warmup(tmp_path_factory) -> ProfiledRun:
    """`warmup --buckets 1 --profile DIR --json` on a local Ray: one rank, its report on stdout."""
    where = tmp_path_factory.mktemp("profiled-ray")
    traces = where / "prof"
    run = orchestrate(
        "warmup",
        *("--model", MLP, "--buckets", "1", "--device", "cpu", "--json"),
        *("--profile", str(traces)),
        cache_dir=where / "cache",
        env={"RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return ProfiledRun(run, json.loads(run.stdout), traces, where / "cache")


# The session's expensive fixtures: every module that asks for one of them runs in the same
# pytest-xdist worker, so that each is made once.
SHARED_FIXTURES = ("server", "profiled_warmup", "profiled_ray_warmup")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    serve_in_one_stretch(items)
    group_for_workers(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker of `--dist loadgroup` whose tests carry no group suffix would have its groups
    split across workers (heads started twice on one port, session fixtures made twice): stop
    before any test runs."""
    if getattr(session.config.option, "loadgroup", False) and any("@" not in item.nodeid for item in session.items):
        raise pytest.UsageError(
            "pytest-xdist did not mark the tests' groups (--dist loadgroup with pytest 9.2 or newer, "
            "pytest-xdist#1386): install the dev extra's pytest (pip install -e '.[dev]'), or run with -n 0"
        )


def serve_in_one_stretch(items: list[pytest.Item]) -> None:
    """The tests that ask the session's shared server run together, where the last of them was,
    and the one that stops it (`stops_server`) right after them: its Ray instance stops as soon
    as no test needs it."""
    stopping = [item for item in items if item.get_closest_marker("stops_server")]
    users = [item for item in items if item not in stopping and "server" in getattr(item, "fixturenames", ())]
    if not users:
        return
    last = items.index(users[-1])
    rest = [item for item in items if item not in stopping and item not in users]
    at = sum(1 for item in items[:last] if item in rest)
    items[:] = [*rest[:at], *users, *stopping, *rest[at:]]


def group_for_workers(items: list[pytest.Item]) -> None:
    """The unit `-n 2 --dist loadgroup` (pyproject.toml) hands a worker: a whole module, so that
    its module fixtures are made once; modules that share a session fixture (SHARED_FIXTURES) join
    one group; a module that names its own group (`xdist_group`, as the Ray heads do) keeps it.
    The groups that compile (`slow`) go first, the heads' group before them, so that the quick
    modules fill the end and both workers finish together."""
    module_of = {item: item.nodeid.split("::", 1)[0] for item in items}
    named = {module_of[item]: mark.args[0] for item in items if (mark := item.get_closest_marker("xdist_group"))}
    group = {module: Path(module).stem for module in module_of.values()}
    for fixture in SHARED_FIXTURES:
        sharing = {module_of[item] for item in items if fixture in getattr(item, "fixturenames", ())} - set(named)
        joined = {group[module] for module in sharing}
        name = "+".join(sorted(joined))
        for module, current in group.items():
            if current in joined:
                group[module] = name
    group.update(named)
    slow = {group[module_of[item]] for item in items if item.get_closest_marker("slow")}
    for item in items:
        if module_of[item] not in named:
            item.add_marker(pytest.mark.xdist_group(group[module_of[item]]))

    def rank(item: pytest.Item) -> int:
        name = group[module_of[item]]
        return 0 if name == HEADS else 1 if name in slow else 2

    items.sort(key=rank)  # stable: the order within a group stays
