"""What a rank's loads cost after the publishes, with and without a trace ahead.

    python bench/trace_ahead.py --example resnet18 --buckets 1,8,32 [--rounds 2] [--copy] [--pool]
        [--prime-first] [--profile FILE]

Fresh processes compile each bucket cold (as compile units do, plain torch.compile); then,
alternating, fresh processes load them all the way a rank does (RankWorker.prepare, then a load
per bucket): "plain" runs the eager references and primes the compiler, then loads (Dynamo trace +
cache hit in one call); "ahead" runs the references, traces every bucket (Session.trace), primes,
then loads. With --copy, each loader reads its own copy of the compiled directory at another path,
as a rank reads what it pulled. Loaders compile in-process (TORCHINDUCTOR_COMPILE_THREADS=1), as a
rank does; --pool gives them Inductor's default pool of compile workers instead. --prime-first
primes before the traces instead of after them. --profile writes where an "ahead" loader's loads
spent their time (cProfile, by cumulative time) to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_ARTIFACTS = shutil.ignore_patterns("locks", "*.lock")  # left out of a merge or a copy, as a pull leaves them


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from orchestrator.config import load_spec
    from orchestrator.jobs import torch_internals as ti
    from orchestrator.jobs.engine import Session

    buckets = [int(b) for b in args.buckets.split(",")]
    mode = args.child
    spec = load_spec(args.model_path).replaced(buckets=buckets)
    session = Session(spec, Path(args.cache_dir), fresh=mode == "cold", trace_ahead=mode == "ahead")
    if mode == "cold":
        result = session.warm(buckets[0], benchmark=False)
        print(json.dumps({"compile_seconds": result.compile_seconds, "status": result.status}))
        return
    if args.prime_first:
        ti.prime_compiler(session.device)
    for bucket in buckets:
        session.reference(bucket)
    for bucket in buckets:
        session.trace(bucket)  # nothing unless trace_ahead
    if not args.prime_first:
        ti.prime_compiler(session.device)
    profiler = None
    if args.profile and mode == "ahead":
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    results = [session.warm(bucket, benchmark=False) for bucket in buckets]
    if profiler:
        import io
        import pstats

        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
        Path(args.profile).write_text(text.getvalue())
    print(
        json.dumps(
            {
                "mode": mode,
                "status": sorted({r.status for r in results}),
                "cache_state": sorted({str(r.cache_state) for r in results}),
                "load_s": {r.bucket: r.stage_seconds.get("compile") for r in results},
                "trace_ahead_s": {r.bucket: r.stage_seconds.get("trace ahead") for r in results},
            }
        )
    )


def run(args: argparse.Namespace, model: str, cache: Path, mode: str, buckets: str, pool: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--model-path",
        model,
        "--buckets",
        buckets,
        "--cache-dir",
        str(cache),
    ]
    cmd += ["--prime-first"] if args.prime_first else []
    cmd += ["--profile", str(args.profile)] if args.profile else []
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env if pool else {**env, "TORCHINDUCTOR_COMPILE_THREADS": "1"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--buckets", default="8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--copy", action="store_true", help="Load from a copy at another path, as after a pull.")
    parser.add_argument("--pool", action="store_true", help="Loaders use Inductor's default compile workers.")
    parser.add_argument("--prime-first", action="store_true", help="Prime the compiler before the traces.")
    parser.add_argument("--profile", type=Path, help="Write a profile of an 'ahead' loader's loads here.")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    model = str(ROOT / "examples" / f"{args.example}.yaml")
    work = Path(tempfile.mkdtemp(prefix="trace-ahead-"))
    buckets = args.buckets.split(",")
    # each bucket compiled by a process of its own in a directory of its own, merged as pulls merge them
    cold = {b: run(args, model, work / f"compiled-{b}", "cold", b)["compile_seconds"] for b in buckets}
    for b in buckets:
        shutil.copytree(work / f"compiled-{b}", work / "compiled", dirs_exist_ok=True, ignore=NOT_ARTIFACTS)
    runs: dict[str, list[dict]] = {"plain": [], "ahead": []}
    for i in range(args.rounds):
        for mode in runs:
            cache = work / "compiled"
            if args.copy:
                cache = work / f"pulled-{mode}-{i}"
                shutil.copytree(work / "compiled", cache, ignore=NOT_ARTIFACTS)
            runs[mode].append(run(args, model, cache, mode, args.buckets, pool=args.pool))
    where = "a copy at another path" if args.copy else "the compiler's directory"
    threads = "Inductor's default compile workers" if args.pool else "compiling in-process, as a rank"
    order = "primed before the traces" if args.prime_first else "primed after the traces, as a rank"
    print(
        f"{args.example}: cold first calls {', '.join(f'b{b} {s:.2f}' for b, s in cold.items())} s; loads from "
        f"{where}, {threads}, {order}"
    )
    print("| load | bucket | after the publish (median) | each | trace ahead, before it | cache |")
    print("|---|---|---|---|---|---|")
    for mode, rows in runs.items():
        for bucket in buckets:
            loads = [r["load_s"][bucket] for r in rows]
            traces = [r["trace_ahead_s"][bucket] for r in rows if r["trace_ahead_s"][bucket] is not None]
            print(
                f"| {mode} | {bucket} | {statistics.median(loads):.2f} s | {', '.join(f'{x:.2f}' for x in loads)} s | "
                f"{', '.join(f'{x:.2f}' for x in traces) + ' s' if traces else '-'} | "
                f"{', '.join(sorted({s for r in rows for s in r['cache_state']}))} |"
            )


if __name__ == "__main__":
    main()
