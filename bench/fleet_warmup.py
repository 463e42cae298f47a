"""Fleet warmup through Ray against the naive way, and against the fleet's target.

    python bench/fleet_warmup.py --example mlp --buckets 1,8,32 [--ranks N] [--cluster existing|local|both]
        [--rounds 3]  (the machine varies by ~15% between runs: decide a ratio on the median of rounds)

Everything starts cold (--fresh, empty directories) and every time is from a process spawn to the
moment its result exists (the report on stdout), as a replica or a job would feel it:

- fleet: one `orchestrate warmup` on Ray: every bucket compiled once, every rank warm and
  benchmarked. "existing": on a cluster that is already up (started here with `ray start --head`,
  as a RayJob's cluster is); "local": the embedded default, which starts Ray itself.
- naive: every rank compiles every bucket itself: N `orchestrate warmup --no-ray` processes at once.
- alone: one fresh process compiling a single bucket (spawn, imports, CUDA, model, compile, CUDA
  graphs, check), for every bucket, one after the other, with Inductor's default compile threads
  and with one; the faster counts. The target is
  fleet <= 1.25 x (slowest bucket alone + the slowest rank's pulls).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY_PORT = 6399
ALONE_SETTINGS = {"default threads": {}, "1 thread": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, str, int]:
    """Run `cmd`; (seconds until its first stdout bytes, seconds until it exited, stdout, stderr, rc).
    Unbuffered, so the first bytes arrive when the child writes its result, not when it exits."""
    spawned = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
    )
    first: list[float] = []
    chunks: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            first or first.append(time.time())
            chunks.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    err = proc.stderr.read()
    proc.wait()
    reader.join()
    exited = time.time()
    return (first[0] if first else exited) - spawned, exited - spawned, "".join(chunks), err, proc.returncode


def warmup_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "warmup", *args]


def alone(model: str, bucket: int, cache_dir: str) -> None:
    """The child of the "alone" measurement: compile one bucket from a fresh process, print when ready."""
    sys.path.insert(0, str(ROOT))
    from orchestrator.config import load_spec
    from orchestrator.jobs.engine import run_warmup

    spec = load_spec(model)
    run = run_warmup(spec.replaced(buckets=[bucket]), Path(cache_dir), fresh=True, benchmark=False, publish=False)
    result = run.results[0]
    from orchestrator.jobs.timing import process_age_seconds

    spawned = time.time() - (process_age_seconds() or 0.0)
    print(
        json.dumps(
            {
                "status": result.status,
                "compile_seconds": result.compile_seconds,
                "events": [[what, round(at - spawned, 2)] for what, at in run.events],
            }
        ),
        flush=True,
    )


def fleet(args: argparse.Namespace, model: str, work: Path, address: str | None) -> dict:
    cmd = warmup_cmd(
        "--model",
        model,
        "--buckets",
        args.buckets,
        "--fresh",
        "--json",
        "--cache-dir",
        str(work / f"fleet-{address and 'existing' or 'local'}"),
    )
    cmd += ["--ranks", str(args.ranks)] if args.ranks else []
    cmd += ["--ray-address", address] if address else []
    ready, exited, out, err, rc = timed(cmd)
    if rc != 0:
        raise SystemExit(f"fleet run failed ({rc}):\n{err[-3000:]}")
    return {"ready": ready, "exited": exited, "report": json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--buckets", default="1,8,32")
    parser.add_argument("--ranks", type=int, default=None)
    parser.add_argument("--cluster", choices=["existing", "local", "both"], default="both")
    parser.add_argument("--no-naive", action="store_true", help="Skip the naive run (when comparing fleet variants).")
    parser.add_argument("--save", type=Path, help="Also copy the fleet reports into this directory.")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="Repeat every measurement, fleet and alone interleaved; ratios get medians.",
    )
    parser.add_argument("--alone", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = str(ROOT / "examples" / f"{args.example}.yaml")
    if args.alone is not None:
        return alone(model, args.alone, args.cache_dir)
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    buckets = [int(b) for b in args.buckets.split(",")]

    # Read torch, Ray and the model's factory module (torchvision) from disk once: every run below
    # then starts them from the page cache, as on a node that has run anything before; otherwise
    # whichever run comes first pays the disk alone, seconds more for its workers' imports on a
    # fresh machine (docs/performance.md, "Do the workers' torch threads slow the fleet?").
    warm = (
        "import ray, torch, torch._inductor.compile_fx; from orchestrator.config import load_spec; "
        f"from orchestrator.jobs.model import load_factory; spec = load_spec({model!r}); load_factory(spec.model, spec.base_dir)"
    )
    subprocess.run([sys.executable, "-c", warm], cwd=ROOT, check=True)

    ratios: dict[str, list[tuple[float, float, float]]] = {}  # cluster -> (fleet, slowest alone + pulls, ratio)
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"## round {number} of {args.rounds}\n")
        for name, row in measure(args, model, work / f"round-{number}", buckets).items():
            ratios.setdefault(name, []).append(row)
    if args.rounds > 1:
        print(f"## {args.rounds} rounds\n")
        print("| cluster | fleet, each round | slowest alone + pulls, each round | ratio, each round | median ratio |")
        print("|---|---|---|---|---|")
        for name, rows in ratios.items():
            fleets, references, each = zip(*rows, strict=True)
            print(
                f"| {name} | {', '.join(f'{x:.1f}' for x in fleets)} s | {', '.join(f'{x:.1f}' for x in references)} s "
                f"| {', '.join(f'{x:.2f}' for x in each)} | **{statistics.median(each):.2f}** (target <= 1.25) |"
            )


def measure(
    args: argparse.Namespace, model: str, work: Path, buckets: list[int]
) -> dict[str, tuple[float, float, float]]:
    """One round: the fleet (each cluster kind), naive, every bucket alone; prints the round and
    returns, per cluster kind, (fleet, slowest bucket alone + pulls, their ratio)."""
    runs = {}
    if args.cluster in ("existing", "both"):
        # Ray's CLI through this interpreter: the `ray` script of a --target install may not be on PATH
        ray = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
        # token authentication, as a production cluster has it; children inherit the token
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        started = subprocess.run(
            [
                *ray,
                "start",
                "--head",
                "--node-ip-address",
                "127.0.0.1",
                "--port",
                str(RAY_PORT),
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
            ],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            raise SystemExit(f"ray start failed:\n{started.stdout[-2000:]}\n{started.stderr[-3000:]}")
        # A cluster that has been up has had drivers before: Ray starts a worker per CPU for the
        # first one only. Have that happen now, then let the cluster settle.
        subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{RAY_PORT}'); ray.shutdown()"],
            check=True,
            capture_output=True,
        )
        time.sleep(10)
        try:
            runs["existing"] = fleet(args, model, work, f"127.0.0.1:{RAY_PORT}")
        finally:
            subprocess.run([*ray, "stop", "--force"], capture_output=True)
    if args.cluster in ("local", "both"):
        runs["local"] = fleet(args, model, work, None)
    ranks = next(iter(runs.values()))["report"]["executor"]["ranks"]

    # one process per rank, each on a GPU of its own as the fleet's ranks are (harmless without GPUs)
    naive = (
        []
        if args.no_naive
        else [
            subprocess.Popen(
                warmup_cmd(
                    "--model",
                    model,
                    "--buckets",
                    args.buckets,
                    "--fresh",
                    "--json",
                    "--no-ray",
                    "--cache-dir",
                    str(work / f"naive-{i}"),
                ),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)},
            )
            for i in range(ranks)
        ]
    )
    started = time.time()
    naive_reports = [json.loads(p.communicate()[0]) for p in naive]
    naive_wall = (time.time() - started) if naive else float("nan")

    # Each bucket alone both ways Inductor compiles: with its default pool (a worker process per
    # CPU) and in-process (one thread). Whichever is faster is the bar: the target is measured
    # against the best a single process does, not against the setting the fleet happens to use.
    single: dict[int, dict[str, dict]] = {}
    for i, bucket in enumerate(buckets):
        settings = list(ALONE_SETTINGS.items())
        for setting, extra in settings if i % 2 == 0 else settings[::-1]:
            ready, _, out, err, rc = timed(
                [
                    sys.executable,
                    __file__,
                    "--example",
                    args.example,
                    "--alone",
                    str(bucket),
                    "--cache-dir",
                    str(work / f"alone-{bucket}-{len(single.get(bucket, {}))}"),
                ],
                extra,
            )
            if rc != 0:
                raise SystemExit(f"alone {bucket} ({setting}) failed:\n{err[-3000:]}")
            single.setdefault(bucket, {})[setting] = {"ready": ready, **json.loads(out)}
    best = {bucket: min(runs_.values(), key=lambda r: r["ready"]) for bucket, runs_ in single.items()}
    slowest = max(best, key=lambda b: best[b]["ready"])

    first = next(iter(runs.values()))["report"]
    print(f"{first['gpu'] or first['device']}, {args.example}, buckets {args.buckets}, {ranks} ranks\n")
    print("| run | ready | exited | detail |")
    print("|---|---|---|---|")
    for name, run in runs.items():
        report = run["report"]
        waves = report["executor"]["wave_seconds"]
        pull = (report["summary"]["fleet"]["pull_seconds"] or {}).get("max", 0.0)
        compiled = {r["bucket"]: r["compile_seconds"] for r in report["results"] if r["phase"] == "compile"}
        warm = [r for r in report["results"] if r["phase"] == "warm" and r["status"] == "ok"]
        # the load after the publish; a rank that traced ahead did the rest of its first call before
        loads = [r["stage_seconds"]["compile"] for r in warm]
        traces = [r["stage_seconds"]["trace ahead"] for r in warm if "trace ahead" in r["stage_seconds"]]
        traced = f" after traces ahead of {min(traces):.2f}-{max(traces):.2f} s" if traces else ""
        timeline = report["executor"]["timeline"]
        compile_end = max(row["ended_s"] for row in timeline if row["wave"] == "compile")
        print(
            f"| fleet, {name} cluster | {run['ready']:.1f} s | {run['exited']:.1f} s | until plan "
            f"{waves['start']:.1f} s, compile wave {waves['compile']:.1f} s (tasks' first calls "
            f"{', '.join(f'{compiled[b]:.1f}' for b in buckets)} s; last task done at {compile_end:.1f} s), "
            f"after it {waves['warm']:.1f} s; ranks' loads {min(loads):.2f}-{max(loads):.2f} s per bucket{traced}, "
            f"pulls {pull:.2f} s per rank |"
        )
        run["pull"] = pull
    naive_first = [sum(r["compile_seconds"] or 0 for r in n["results"]) for n in naive_reports]
    if naive:
        print(
            f"| naive: {ranks} x every bucket | {naive_wall:.1f} s | | first calls per process "
            f"{', '.join(f'{c:.1f}' for c in naive_first)} s |"
        )
    for bucket in buckets:
        for setting, result in single[bucket].items():
            events = ", ".join(f"{what} {at:.1f}" for what, at in result["events"])
            print(
                f"| bucket {bucket} alone, {setting} | {result['ready']:.1f} s | | first call "
                f"{result['compile_seconds']:.1f} s; from spawn: {events} |"
            )
    print()
    ratios = {}
    for name, run in runs.items():
        reference = best[slowest]["ready"] + run["pull"]
        ratios[name] = (run["ready"], reference, run["ready"] / reference)
        print(
            f"{name} cluster: fleet / naive {run['ready'] / naive_wall:.2f}; fleet / (slowest bucket alone "
            f"{best[slowest]['ready']:.1f} s + pulls {run['pull']:.2f} s) = {run['ready'] / reference:.2f} "
            f"(target <= 1.25)"
        )
        # The same clock stopped when the last rank loaded its last bucket: what is left after it is
        # the ranks' benchmarks (and the answers), work the bucket alone does not do
        timeline = run["report"]["executor"]["timeline"]
        loaded = max(
            at for row in timeline if row["wave"] == "warm" for what, at in row["events"] if what.startswith("loaded")
        )
        warm_at = run["ready"] - (max(row["answered_s"] for row in timeline) - loaded)
        print(
            f"{name} cluster: every rank loaded every bucket at {warm_at:.1f} s: {warm_at / reference:.2f} of the "
            f"same reference; the benchmarks and answers after it took {run['ready'] - warm_at:.1f} s"
        )
    for name, run in runs.items():
        print(f"\n{name} cluster, timeline (s from the start of the waves):")
        for row in run["report"]["executor"]["timeline"]:
            who = f"rank {row['rank']}" if row["wave"] == "warm" else f"compile b{row['bucket']}"
            events = ", ".join(f"{what} {at:.1f}" for what, at in row["events"])
            print(
                f"- {who}: started {row['started_s']:.1f}, {events}, ended {row['ended_s']:.1f}, "
                f"answer at the driver {row['answered_s']:.1f}"
            )
    for directory in filter(None, [work, args.save and args.save / work.name]):
        directory.mkdir(parents=True, exist_ok=True)
        for name, run in runs.items():
            (directory / f"fleet-{name}.json").write_text(json.dumps(run["report"], indent=2))
    print(f"\nreports: {args.save / work.name if args.save else work}\n")
    return ratios


if __name__ == "__main__":
    main()
