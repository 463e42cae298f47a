"""What a rank's load costs after a publish, with and without a trace ahead.

    python bench/trace_ahead.py --example resnet18 --bucket 8 [--rounds 2]

One fresh process compiles the bucket cold (as a compile unit does, plain torch.compile); then,
alternating, fresh processes load it plainly (Dynamo trace + cache hit in one call) and after a
trace ahead (Session.trace, then the load). Each loader first primes the compiler, as a rank with a
CPU to spare does, so neither pays Inductor's one-off start in its load. With --copy, each loader
reads its own copy of the compiled directory at another path, as a rank reads what it pulled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(model: str, bucket: int, cache: str, mode: str) -> None:
    sys.path.insert(0, str(ROOT))
    from jobs import torch_internals as ti
    from jobs.engine import Session
    from orchestrator.config import load_spec

    spec = load_spec(model).replaced(buckets=[bucket])
    session = Session(spec, Path(cache), fresh=mode == "cold", trace_ahead=mode == "ahead")
    if mode != "cold":
        ti.prime_compiler(session.device)
    session.trace(bucket)  # only the eager reference unless trace_ahead
    result = session.warm(bucket, benchmark=False)
    stages = result.stage_seconds
    print(json.dumps({"mode": mode, "status": result.status, "cache_state": result.cache_state,
                      "load_s": stages["compile"], "trace_ahead_s": stages.get("trace ahead"),
                      "compile_seconds": result.compile_seconds}))


def run(model: str, bucket: int, cache: str, mode: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--model-path", model, "--bucket", str(bucket),
                           "--cache-dir", cache], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--bucket", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--copy", action="store_true", help="Load from a copy at another path, as after a pull.")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.model_path, args.bucket, args.cache_dir, args.child)
    model = str(ROOT / "examples" / f"{args.example}.yaml")
    work = Path(tempfile.mkdtemp(prefix="trace-ahead-"))
    cold = run(model, args.bucket, str(work / "compiled"), "cold")
    runs: dict[str, list[dict]] = {"plain": [], "ahead": []}
    for i in range(args.rounds):
        for mode in runs:
            cache = work / "compiled"
            if args.copy:
                cache = work / f"pulled-{mode}-{i}"
                shutil.copytree(work / "compiled", cache, ignore=shutil.ignore_patterns("locks", "*.lock"))
            runs[mode].append(run(model, args.bucket, str(cache), mode))
    where = "a copy at another path" if args.copy else "the compiler's directory"
    print(f"{args.example}, bucket {args.bucket}: cold first call {cold['compile_seconds']:.2f} s; loads from {where}")
    print("| load | after the publish (median) | each | trace ahead, before it | cache |")
    print("|---|---|---|---|---|")
    for mode, rows in runs.items():
        loads = [r["load_s"] for r in rows]
        traces = [r["trace_ahead_s"] for r in rows if r["trace_ahead_s"] is not None]
        print(f"| {mode} | {statistics.median(loads):.2f} s | {', '.join(f'{x:.2f}' for x in loads)} s | "
              f"{', '.join(f'{x:.2f}' for x in traces) + ' s' if traces else '-'} | "
              f"{', '.join(sorted({r['cache_state'] for r in rows}))} |")


if __name__ == "__main__":
    main()
