"""Cold vs warm warmup of the example models, each run in a fresh process as a new replica would.

    python bench/warmup_examples.py --out reports/ [--examples mlp,transformer,resnet18] [--buckets 1,8,32]

For each example: `orchestrate warmup --fresh` (cold: empty cache namespace), then the same
command again (warm: same cache directory, new process). Prints a markdown table of the
reports' numbers plus spawn-to-exit wall time, and keeps every JSON report under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(
    example: str, buckets: str, cache_dir: Path, out: Path, label: str, fresh: bool, remote: str | None = None
) -> dict:
    report = out / f"{example}-{label}.json"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "warmup",
        "--model",
        str(ROOT / "examples" / f"{example}.yaml"),
        "--buckets",
        buckets,
        "--cache-dir",
        str(cache_dir),
        "--report",
        str(report),
    ]
    if fresh:
        cmd.append("--fresh")
    if remote:
        cmd += ["--remote", remote]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (out / f"{example}-{label}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{example} {label}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    data["process_wall_seconds"] = wall
    # time between the report landing and the process exiting (interpreter and worker-pool teardown)
    data["exit_lag_seconds"] = time.time() - report.stat().st_mtime - (time.perf_counter() - start - wall)
    print(proc.stdout, file=sys.stderr)
    return data


def fmt(values, spec):
    return " / ".join("-" if v is None else format(v, spec) for v in values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", default="mlp,transformer,resnet18")
    parser.add_argument("--buckets", default="1,8,32")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--via-store",
        action="store_true",
        help="cold node A publishes to a file:// store; node B (empty) pulls it and warms",
    )
    args = parser.parse_args()
    if args.via_store:
        return via_store(args)
    args.out.mkdir(parents=True, exist_ok=True)
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="orchestrate-bench-"))
    rows = []
    for example in args.examples.split(","):
        cold = run(example, args.buckets, cache_dir, args.out, "cold", fresh=True)
        warm = run(example, args.buckets, cache_dir, args.out, "warm", fresh=False)
        rows.append((example, cold, warm))
    gpu = rows[0][1]["gpu"] or rows[0][1]["device"]
    print(
        f"\n{gpu}, torch {rows[0][1]['torch_version']}, buckets {args.buckets}, mode {rows[0][1]['compile']['mode']}\n"
    )
    print(
        "| model | cold: sum of first calls | warm: sum of first calls | graphs recorded (warm) | "
        "ready cold / warm | process wall cold / warm | warm cache hits/misses | eager ms | compiled ms | speedup |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for example, _cold, warm in rows:
        cs, ws = cold["summary"], warm["summary"]
        results = warm["results"]
        print(
            f"| {example} | {cs['compile_seconds_total']:.1f} s | {ws['compile_seconds_total']:.1f} s | "
            f"{ws['graph_record_seconds_total']:.2f} s | {cs['ready_seconds']:.1f} / {ws['ready_seconds']:.1f} s | "
            f"{cold['process_wall_seconds']:.1f} / {warm['process_wall_seconds']:.1f} s | "
            f"{ws['cache_hits']}/{ws['cache_misses']} ({ws['cache_state']}) | "
            f"{fmt([r['eager_ms'] for r in results], '.3f')} | {fmt([r['compiled_ms'] for r in results], '.3f')} | "
            f"{fmt([r['speedup'] for r in results], '.2f')} |"
        )
    print(
        "\n| model | warm: process spawn to ready | exit lag after report | b2b speedup (warm) | eager / compiled b2b ms |"
    )
    print("|---|---|---|---|---|")
    for example, _cold, warm in rows:
        ws, results = warm["summary"], warm["results"]
        print(
            f"| {example} | {ws['process_seconds_to_ready']:.1f} s | {warm['exit_lag_seconds']:.1f} s | "
            f"{fmt([r['throughput_speedup'] for r in results], '.2f')} | "
            f"{fmt([r['eager_throughput_ms'] for r in results], '.3f')} / "
            f"{fmt([r['compiled_throughput_ms'] for r in results], '.3f')} |"
        )
    print("\nspeedups in the cold run (same process that compiled):")
    for example, cold, _ in rows:
        print(
            f"- {example}: {fmt([r['speedup'] for r in cold['results']], '.2f')}; "
            f"failed: {[r['bucket'] for r in cold['results'] if r['status'] != 'ok']}"
        )


def via_store(args: argparse.Namespace) -> None:
    """New-node warm start through the store against cold compile, each a fresh process."""
    os.environ.setdefault("ORCHESTRATE_CACHE_SIGNING_KEY", "bench-signing-key-" + "0" * 16)
    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="orchestrate-fleet-"))
    (base / "store").mkdir()
    remote = f"file://{base / 'store'}"
    print(
        "| model | node A cold: first calls / ready / spawn->ready | publish | node B: pull | first calls | "
        "ready (incl. pull) | spawn->ready | B hits/misses | B speedups |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for example in args.examples.split(","):
        a = run(example, args.buckets, base / "node-a", args.out, "node-a", fresh=True, remote=remote)
        b = run(example, args.buckets, base / "node-b", args.out, "node-b", fresh=False, remote=remote)
        sa, sb, pub, pull = a["summary"], b["summary"], a["remote"]["publish"], b["remote"]["pull"]
        print(
            f"| {example} | {sa['compile_seconds_total']:.1f} / {sa['ready_seconds']:.1f} / "
            f"{sa['process_seconds_to_ready']:.1f} s | {pub['files']} files, {pub['bytes'] / 1e6:.1f} MB, "
            f"{pub['seconds']:.2f} s | {pull['seconds']:.2f} s | {sb['compile_seconds_total']:.1f} s | "
            f"{sb['ready_seconds']:.1f} s | {sb['process_seconds_to_ready']:.1f} s | "
            f"{sb['cache_hits']}/{sb['cache_misses']} | {fmt([r['speedup'] for r in b['results']], '.2f')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
