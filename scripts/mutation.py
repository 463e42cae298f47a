#!/usr/bin/env python3
"""Mutation testing of chosen modules against a chosen fast test selection, with mutmut 3.

    .venv/bin/python scripts/mutation.py                                   # pyproject's defaults
    .venv/bin/python scripts/mutation.py cache/manifest.py cache/sync.py
    .venv/bin/python scripts/mutation.py jobs/gate.py --tests tests/test_gate.py tests/test_units.py

Install the tool first: `.venv/bin/python -m pip install -e '.[mutation]'` (not part of `dev`: CI
does not run this). The checkout is copied to .mutation/ (a snapshot: edits made meanwhile do not
leak into a run) with a pyproject.toml whose [tool.mutmut] names this run's modules and tests;
mutmut then mutates there, under .mutation/mutants/. At the end: a table per module (mutants,
killed, survived, kill rate), the wall time, and the diff of every mutant no test killed.

Defaults for the modules, the test selection and the pytest arguments come from [tool.mutmut] in
pyproject.toml. Choose tests that are fast, CPU only, with no Ray and no torch.compile: mutmut
runs the tests that reach a mutated function once per mutant. docs/testing.md has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
KILLED = {"killed", "timeout", "caught by type check"}  # mutmut's own score counts these three


def parse_args(config: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "modules",
        nargs="*",
        default=config.get("only_mutate", []),
        help="files to mutate, relative to the checkout (default: [tool.mutmut] only_mutate: "
        "%(default)s); a missing one is skipped with a note",
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        default=config.get("pytest_add_cli_args_test_selection", []),
        metavar="PATH",
        help="pytest selection: files or node ids (default: [tool.mutmut] "
        "pytest_add_cli_args_test_selection: %(default)s)",
    )
    parser.add_argument(
        "--deselect",
        nargs="+",
        default=[],
        metavar="NODE",
        help="node ids of the selection to leave out (slow ones: each runs once per mutant it reaches)",
    )
    parser.add_argument(
        "--max-children",
        type=int,
        default=os.cpu_count() or 2,
        help="parallel test processes (default: the CPU count, %(default)s)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / ".mutation",
        help="scratch copy of the checkout, emptied first (default: %(default)s)",
    )
    parser.add_argument(
        "--fail-under",
        type=float,
        default=None,
        metavar="PERCENT",
        help="exit 1 when a module's kill rate is below this",
    )
    return parser.parse_args()


def run_pyproject(text: str, settings: dict) -> str:
    """The checkout's pyproject.toml with its [tool.mutmut] table replaced by `settings`."""
    kept, skipping = [], False
    for line in text.splitlines():
        if re.match(r"^\s*\[", line):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    table = ["[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(kept).rstrip("\n") + "\n\n" + "\n".join(table) + "\n"


def existing_tests(selection: list[str]) -> list[str]:
    """The selection without paths that do not exist (yet), each named; options and their values stay."""
    kept, value_next = [], False
    for item in selection:
        if value_next or item.startswith("-"):
            kept.append(item)
            value_next = item in ("--deselect", "-k", "-m", "--ignore", "-p") and not value_next
        elif (ROOT / item.split("::")[0]).exists():
            kept.append(item)
        else:
            print(f"note: {item} does not exist; leaving it out of the tests")
    return kept


def as_installed(module: str) -> str:
    """cache/ and jobs/ are the subpackages orchestrator.cache and orchestrator.jobs (through the links
    in orchestrator/): `cache/sync.py` is mutated as `orchestrator/cache/sync.py`, the file the tests import."""
    if Path(module).parts[0] in ("cache", "jobs"):
        return str(Path("orchestrator", module))
    return module


def copy_checkout(workdir: Path, source_paths: list[str], pyproject: str) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in [*source_paths, "tests", "examples"]:
        if (ROOT / name).is_dir():
            # links followed: orchestrator/cache and orchestrator/jobs become real folders, which
            # mutmut walks (it does not follow links) and mutates where the tests import them
            shutil.copytree(ROOT / name, workdir / name, ignore=ignore)
    (workdir / "pyproject.toml").write_text(pyproject)


# mutmut forks each mutant's test run from a process that has imported torch. torch's OpenMP
# pool does not survive a fork: a child whose test runs a parallel op waits for pool threads it
# does not have, until mutmut's timeout counts the mutant as killed. One thread has no pool.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mutmut(workdir: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mutmut", *args]
    env = {**os.environ, **SINGLE_THREADED}
    if log is None:
        return subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=env)
    with open(log, "w") as out:
        return subprocess.run(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


# One process for all the diffs (`mutmut show NAME` is one process per mutant, a second each)
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
diffs = {}
for name in json.load(sys.stdin):
    try:
        diffs[name] = get_diff_for_mutant(name)
    except Exception as exc:
        diffs[name] = f"(no diff: {type(exc).__name__}: {exc})"
json.dump(diffs, sys.stdout)
"""


def mutant_diffs(workdir: Path, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    done = subprocess.run(
        [sys.executable, "-c", _DIFFS], cwd=workdir, input=json.dumps(names), capture_output=True, text=True
    )
    if done.returncode == 0:
        return json.loads(done.stdout)
    # mutmut moved its internals: fall back to its command line
    return {name: (shown.stdout or shown.stderr).strip() for name in names for shown in [mutmut(workdir, "show", name)]}


def main() -> int:
    pyproject_text = (ROOT / "pyproject.toml").read_text()
    config = tomllib.loads(pyproject_text).get("tool", {}).get("mutmut", {})
    args = parse_args(config)
    try:
        import mutmut as _  # noqa: F401
    except ImportError:
        print(
            f"mutmut is not installed in {sys.executable}: run `{sys.executable} -m pip install -e '.[mutation]'`",
            file=sys.stderr,
        )
        return 2

    source_paths = config.get("source_paths", ["orchestrator"])
    modules = []
    for module in map(as_installed, args.modules):
        if not (ROOT / module).is_file():
            print(f"note: {module} does not exist; skipping it")
        elif not any(Path(module).parts[0] == Path(p).parts[0] for p in source_paths):
            print(f"{module} is outside [tool.mutmut] source_paths {source_paths}", file=sys.stderr)
            return 2
        else:
            modules.append(module)
    if not modules:
        print("nothing to mutate", file=sys.stderr)
        return 2

    tests = existing_tests(args.tests)
    if not any(not t.startswith("-") for t in tests):
        print("no tests to run", file=sys.stderr)
        return 2
    for node in args.deselect:
        tests += ["--deselect", node]
    extra = list(config.get("pytest_add_cli_args", []))
    settings = {
        **config,
        "source_paths": source_paths,
        "only_mutate": modules,
        "use_git_change_detection": False,
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": extra,
    }
    workdir = args.workdir.resolve()
    copy_checkout(workdir, source_paths, run_pyproject(pyproject_text, settings))

    print(
        f"mutating {' '.join(modules)}\ntests    {' '.join(tests + extra)}\n"
        f"in       {workdir} with {args.max_children} processes; mutmut's log: {workdir / 'mutmut.log'}",
        flush=True,
    )
    started = time.monotonic()
    run = mutmut(workdir, "run", "--max-children", str(args.max_children), log=workdir / "mutmut.log")
    wall = time.monotonic() - started
    if run.returncode != 0:
        print((workdir / "mutmut.log").read_text()[-6000:], file=sys.stderr)
        print(f"mutmut run failed (exit {run.returncode})", file=sys.stderr)
        return 1

    listing = mutmut(workdir, "results", "--all", "true")
    status_by_mutant = {}
    for line in listing.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            status_by_mutant[name] = status

    rows, survivors, lowest = [], [], 100.0
    for module in modules:
        dotted = module[:-3].replace("/", ".") + "."
        mine = {n: s for n, s in status_by_mutant.items() if n.startswith(dotted)}
        killed = sum(s in KILLED for s in mine.values())
        timeouts = sum(s == "timeout" for s in mine.values())
        not_killed = sorted(n for n, s in mine.items() if s not in KILLED)
        rate = 100.0 * killed / len(mine) if mine else 0.0
        lowest = min(lowest, rate)
        others = sorted({s for n, s in mine.items() if s not in KILLED and s != "survived"})
        rows.append((module, len(mine), killed, timeouts, len(not_killed), rate, ", ".join(others)))
        survivors += [(n, mine[n]) for n in not_killed]

    print(f"\nwall time {wall:.0f} s\n")
    # a timeout counts as killed (mutmut's own score does so), shown apart: a mutant that loops
    # is caught, but a run whose tests hang for another reason would inflate the rate
    print(f"| {'module':<24} | mutants | killed | of which timed out | not killed | kill rate | not killed includes |")
    print(f"|{'-' * 26}|---------|--------|--------------------|------------|-----------|---------------------|")
    for module, total, killed, timeouts, left, rate, others in rows:
        print(
            f"| {module:<24} | {total:>7} | {killed:>6} | {timeouts:>18} | {left:>10} | {rate:>8.1f}% | {others or '-':<19} |"
        )
    diffs = mutant_diffs(workdir, [name for name, _ in survivors])
    for name, status in survivors:
        print(f"\n=== {name}: {status}\n{diffs.get(name) or '(no diff: see `mutmut show` in the workdir)'}")
    if args.fail_under is not None and lowest < args.fail_under:
        print(f"\nkill rate {lowest:.1f}% is below {args.fail_under}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
