"""Fleet warmup through Ray against the naive way, and against the fleet's target.

    python bench/fleet_warmup.py --example mlp --buckets 1,8,32 [--ranks N] [--cluster existing|local|both]
        [--rounds 3]  (the machine varies by ~15% between runs: decide a ratio on the median of rounds)
    python bench/fleet_warmup.py --model bench/models/mixnet_l.yaml --buckets 1,8 ...  (any warmup config)

Everything starts cold (--fresh, empty directories) and every time is from a process spawn to the
moment its result exists (the report on stdout), as a replica or a job would feel it:

- fleet: one `orchestrate warmup` on Ray: every bucket compiled once, every rank warm and
  benchmarked. "existing": on a cluster that is already up (started here with `ray start --head`,
  as a RayJob's cluster is); "local": the embedded default, which starts Ray itself.
- naive: every rank compiles every bucket itself: N `orchestrate warmup --no-ray` processes at once.
- alone: one fresh process compiling a single bucket (spawn, imports, CUDA, model, compile, CUDA
  graphs, check), for every bucket, one after the other, with Inductor's default compile threads
  and with one; the faster counts. The targets, against the bar B = slowest bucket alone + the
  slowest rank's pulls:
  - on plan: every rank has benchmarked its last bucket (its serving plan is chosen) <= 1.1 x B,
    from the spawn of `orchestrate warmup` (the rank's events in the report's timeline);
  - job: the fleet's report <= 1.25 x B.
  For the slowest rank, "where the rest goes" splits its on-plan time by the events of its process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
RAY_PORT = 6399
ALONE_SETTINGS = {"default threads": {}, "1 thread": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}
ON_PLAN_TARGET = 1.1  # every rank on plan <= 1.1 x (slowest bucket alone + pulls)
JOB_TARGET = 1.25  # the whole job <= 1.25 x the same


@dataclass
class Timed:
    """A child's run on our clock, in seconds from its spawn."""

    ready: float  # its first stdout bytes: the result exists
    exited: float
    out: str
    err: str
    rc: int
    err_lines: list[tuple[float, str]] = field(default_factory=list)  # (arrival, line) of each stderr line


def timed(cmd: list[str], env: dict[str, str] | None = None) -> Timed:
    """Run `cmd` and time it from its spawn. Unbuffered, so the first stdout bytes arrive when the
    child writes its result, not when it exits; stderr lines are stamped as they arrive, for the
    progress lines that mark moments of the run on this clock (timeline_zero)."""
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
    err_lines = [(time.time() - spawned, line) for line in proc.stderr]
    proc.wait()
    reader.join()
    exited = time.time()
    return Timed(
        (first[0] if first else exited) - spawned,
        exited - spawned,
        "".join(chunks),
        "".join(line for _, line in err_lines),
        proc.returncode,
        err_lines,
    )


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
    run = timed(cmd)
    if run.rc != 0:
        raise SystemExit(f"fleet run failed ({run.rc}):\n{run.err[-3000:]}")
    return {"ready": run.ready, "exited": run.exited, "report": json.loads(run.out), "stderr": run.err_lines}


# The driver's line as it has planned the fleet (orchestrator.fleet.driver.run_on_ray); the timeline's zero is
# taken right after it
PLANNED_LINE = re.compile(r"ray: \d+ nodes, \d+ ranks")


def timeline_zero(run: dict) -> tuple[float, str]:
    """Seconds from the spawn of `orchestrate warmup` to the zero of its report's timeline, and how
    that was found. The timeline counts from FleetRun.started_at, a wall clock the driver reads when
    it has planned the fleet: after its interpreter, imports and Ray's start, none of which the
    report times (its wall_seconds start after `import ray`, its started_at has whole seconds). The
    driver prints "ray: N nodes, M ranks ..." on stderr right before, line-buffered even into a
    pipe (progress.RunLog), so that line's arrival on our clock is the zero, to a few milliseconds
    (late if anything: the times measured from it come out longer, never shorter)."""
    for at, line in run["stderr"]:
        if PLANNED_LINE.match(line):
            return at, "the driver's plan line on stderr"
    # Without that line: the driver's last answer put at the report's arrival. That is too late by
    # what the driver does after its last answer (Ray's shutdown, the report), so an upper bound.
    last_answer = max(row["answered_s"] for row in run["report"]["executor"]["timeline"])
    return run["ready"] - last_answer, "the report's arrival at the last answer: an upper bound"


def on_plan(report: dict, zero: float) -> dict[int, float | None]:
    """Per rank, seconds from the spawn until it benchmarked its last bucket (the moment it chooses
    its serving plan); None for a rank that benchmarked none."""
    moments: dict[int, float | None] = {}
    for row in report["executor"]["timeline"]:
        if row["wave"] == "warm":
            benchmarked = [float(at) for what, at in row["events"] if str(what).startswith("benchmarked bucket")]
            moments[row["rank"]] = zero + max(benchmarked) if benchmarked else None
    return moments


PHASES = (
    "process start",  # the driver, Ray, the rank's worker and interpreter: until "imported" (torch)
    "imports + CUDA",
    "model",
    "traces ahead",
    "layouts ahead",  # cuDNN's set-up of the convolutions in the compiled graph's layout
    "waiting for the compile wave, pulls included",
    "loads",
    "benchmarks",
    "other",
)


def phase_of(event: str) -> str | None:
    """The phase of the stretch an event closes: each event is stamped when its step has ended.
    A pull is stamped only at its end, so its transfer cannot be told from the wait before it
    (the rank is sent a bucket once its compile task has published it): both count as waiting,
    before the first load and between loads. A rank that missed the cache compiled the bucket
    itself: still its load step."""
    if event in ("worker up", "imported"):
        return "process start"
    if event == "device ready":
        return "imports + CUDA"
    if event == "model built":
        return "model"
    for prefix, phase in (
        ("traced bucket", "traces ahead"),
        ("layouts set up", "layouts ahead"),
        ("pulled generation", "waiting for the compile wave, pulls included"),
        ("loaded bucket", "loads"),
        ("compiled bucket", "loads"),
        ("benchmarked bucket", "benchmarks"),
    ):
        if event.startswith(prefix):
            return phase
    return None  # aot builds started, the compiler primed, profiles, publishes: "other"


def where_it_went(events: list[list], zero: float) -> dict[str, float | None]:
    """A rank's time from the spawn until on plan, by phase: every stretch between two of its
    events (the first from the spawn) goes to the phase of the event that closes it; what no
    phase claims is "other". A phase none of whose events happened is None: its time went to the
    next event's phase (without "device ready", say, the imports count as "model")."""
    times = sorted((zero + float(at), str(what)) for what, at in events)
    benchmarked = [at for at, what in times if what.startswith("benchmarked bucket")]
    phases: dict[str, float | None] = dict.fromkeys(PHASES)
    if not benchmarked:
        return phases
    end, before = max(benchmarked), 0.0
    for at, what in times:
        if at > end:
            break
        phase = phase_of(what)
        if phase is not None:
            phases[phase] = (phases[phase] or 0.0) + at - before
        before = at
    phases["other"] = end - sum(v for v in phases.values() if v is not None)
    return phases


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


class Round(NamedTuple):
    """One cluster kind in one round, in seconds from spawns."""

    fleet: float  # the job: its report
    reference: float  # the bar: the slowest bucket alone + the slowest rank's pulls
    on_plan: float  # the slowest rank on plan (inf when a rank never got there)

    @property
    def ratio(self) -> float:
        return self.fleet / self.reference

    @property
    def on_plan_ratio(self) -> float:
        return self.on_plan / self.reference


def main() -> None:
    parser = argparse.ArgumentParser()
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--example", default="mlp", help="A config of examples/, by name (default: mlp).")
    which.add_argument(
        "--model",
        type=Path,
        help="Any warmup config instead, e.g. bench/models/mixnet_l.yaml: a model whose compile dominates.",
    )
    parser.add_argument("--buckets", default="1,8,32", help="Passed to every run: a config's own are not read.")
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
    # absolute: every run below starts in ROOT, not where we were started
    model = str(args.model.resolve() if args.model else ROOT / "examples" / f"{args.example}.yaml")
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

    ratios: dict[str, list[Round]] = {}  # cluster -> its rounds
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"## round {number} of {args.rounds}\n")
        for name, row in measure(args, model, work / f"round-{number}", buckets).items():
            ratios.setdefault(name, []).append(row)
    if args.rounds > 1:
        print(f"## {args.rounds} rounds\n")
        print(
            "| cluster | slowest alone + pulls, each round | slowest rank on plan, each round | on plan ratio, "
            "each round | median on plan ratio | fleet, each round | ratio, each round | median job ratio |"
        )
        print("|---|---|---|---|---|---|---|---|")

        def each(values: list[float], digits: int = 1) -> str:
            return ", ".join(f"{x:.{digits}f}" for x in values)

        for name, rows in ratios.items():
            on_plan_ratios = [r.on_plan_ratio for r in rows]
            job_ratios = [r.ratio for r in rows]
            print(
                f"| {name} | {each([r.reference for r in rows])} s | {each([r.on_plan for r in rows])} s "
                f"| {each(on_plan_ratios, 2)} | **{statistics.median(on_plan_ratios):.2f}** (target <= "
                f"{ON_PLAN_TARGET} on plan) | {each([r.fleet for r in rows])} s | {each(job_ratios, 2)} "
                f"| **{statistics.median(job_ratios):.2f}** (target <= {JOB_TARGET} job) |"
            )


def measure(args: argparse.Namespace, model: str, work: Path, buckets: list[int]) -> dict[str, Round]:
    """One round: the fleet (each cluster kind), naive, every bucket alone; prints the round and
    returns it per cluster kind."""
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
            run = timed(
                [
                    sys.executable,
                    __file__,
                    "--model",
                    model,
                    "--alone",
                    str(bucket),
                    "--cache-dir",
                    str(work / f"alone-{bucket}-{len(single.get(bucket, {}))}"),
                ],
                extra,
            )
            if run.rc != 0:
                raise SystemExit(f"alone {bucket} ({setting}) failed:\n{run.err[-3000:]}")
            single.setdefault(bucket, {})[setting] = {"ready": run.ready, **json.loads(run.out)}
    best = {bucket: min(runs_.values(), key=lambda r: r["ready"]) for bucket, runs_ in single.items()}
    slowest = max(best, key=lambda b: best[b]["ready"])

    first = next(iter(runs.values()))["report"]
    print(f"{first['gpu'] or first['device']}, {first['model']}, buckets {args.buckets}, {ranks} ranks\n")
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
    split: dict[str, tuple[int, dict[str, float | None]]] = {}  # cluster -> (its slowest rank, where its time went)
    for name, run in runs.items():
        reference = best[slowest]["ready"] + run["pull"]
        zero, how = timeline_zero(run)
        moments = on_plan(run["report"], zero)
        # a rank that never got on plan fails the target: it counts as never
        slowest_rank = max(moments, key=lambda r: float("inf") if moments[r] is None else moments[r])
        latest = moments[slowest_rank]
        ratios[name] = Round(run["ready"], reference, float("inf") if latest is None else latest)
        events = next(row["events"] for row in run["report"]["executor"]["timeline"] if row["rank"] == slowest_rank)
        split[name] = (slowest_rank, where_it_went(events, zero))
        print(
            f"{name} cluster: the timeline's zero is {zero:.2f} s from the spawn ({how}); the report came "
            f"{run['ready'] - zero - max(row['answered_s'] for row in run['report']['executor']['timeline']):.2f} s "
            "after the driver's last answer"
        )
        print(
            f"{name} cluster: ranks on plan (benchmarked their last bucket) at "
            f"{', '.join(f'rank {r} {seconds(at)}' for r, at in sorted(moments.items()))} from the spawn; slowest / "
            f"(slowest bucket alone {best[slowest]['ready']:.1f} s + pulls {run['pull']:.2f} s) = "
            f"**{ratios[name].on_plan_ratio:.2f}** (target <= {ON_PLAN_TARGET} on plan)"
        )
        print(
            f"{name} cluster: fleet / naive {run['ready'] / naive_wall:.2f}; fleet / (slowest bucket alone "
            f"{best[slowest]['ready']:.1f} s + pulls {run['pull']:.2f} s) = **{ratios[name].ratio:.2f}** "
            f"(target <= {JOB_TARGET} job)"
        )
        # The same clock stopped when the last rank loaded its last bucket: what is left after it is
        # the ranks' benchmarks, the answers and the driver's teardown, work the bucket alone does not do
        timeline = run["report"]["executor"]["timeline"]
        loaded = max(
            at for row in timeline if row["wave"] == "warm" for what, at in row["events"] if what.startswith("loaded")
        )
        warm_at = zero + loaded
        print(
            f"{name} cluster: every rank loaded every bucket at {warm_at:.1f} s: {warm_at / reference:.2f} of the "
            f"same reference; the benchmarks, answers and teardown after it took {run['ready'] - warm_at:.1f} s"
        )
    # Where the rest goes: the slowest rank's time until on plan, from the spawn of the fleet's command
    print("\nwhere the slowest rank's time until on plan goes (s from the spawn):\n")
    print(f"| cluster, rank | {' | '.join(PHASES)} | on plan |")
    print(f"|---|{'---|' * len(PHASES)}---|")
    for name, (rank, phases) in split.items():
        print(
            f"| {name}, rank {rank} | {' | '.join(seconds(phases[p]) for p in PHASES)} "
            f"| {seconds(ratios[name].on_plan)} |"
        )
    for name, run in runs.items():
        # what a rank's load of a bucket is made of: the stages it timed, and each serving variant's build
        print(f"\n{name} cluster, each rank's stages per bucket (s):")
        for r in sorted(run["report"]["results"], key=lambda r: (r["phase"], r["rank"] or 0, r["bucket"])):
            stages = ", ".join(f"{stage} {spent:.2f}" for stage, spent in r["stage_seconds"].items())
            built = ", ".join(
                f"{variant} {v['build_seconds']:.2f}" if v.get("ok") else f"{variant} unavailable"
                for variant, v in (r.get("variants") or {}).items()
                if v.get("build_seconds") is not None or not v.get("ok")
            )
            who = f"rank {r['rank']}" if r["phase"] == "warm" else "compile"
            print(f"- {who} b{r['bucket']}: {stages}; variants built: {built or 'none'}")
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
