"""Fleet warmup through Ray against the naive way, where every rank compiles every bucket itself.

    python bench/fleet_warmup.py --example mlp --buckets 1,8,32 [--ranks N] [--ray-address ADDR]

Both start cold (--fresh, empty cache directories). "fleet" is one `orchestrate warmup` on Ray
(local instance unless --ray-address): compile wave, then every rank warms from the store.
"naive" runs N `orchestrate warmup --no-ray` processes at once, each compiling all buckets.
Reports wall times and the target of the issue: fleet wall / (slowest bucket's cold compile +
the slowest pull).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def orchestrate(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "warmup", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--buckets", default="1,8,32")
    parser.add_argument("--ranks", type=int, default=None)
    parser.add_argument("--ray-address")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    model = str(ROOT / "examples" / f"{args.example}.yaml")
    common = ["--model", model, "--buckets", args.buckets, "--fresh", "--json"]

    start = time.perf_counter()
    fleet_cmd = common + ["--cache-dir", str(work / "fleet")]
    fleet_cmd += ["--ranks", str(args.ranks)] if args.ranks else []
    fleet_cmd += ["--ray-address", args.ray_address] if args.ray_address else []
    fleet = orchestrate(*fleet_cmd)
    out, err = fleet.communicate()
    fleet_wall = time.perf_counter() - start
    if fleet.returncode != 0:
        raise SystemExit(f"fleet run failed ({fleet.returncode}):\n{err[-3000:]}")
    report = json.loads(out)
    ranks = report["executor"]["ranks"]

    start = time.perf_counter()
    naive = [orchestrate(*common, "--no-ray", "--cache-dir", str(work / f"naive-{i}")) for i in range(ranks)]
    naive_reports = [json.loads(p.communicate()[0]) for p in naive]
    naive_wall = time.perf_counter() - start

    compiled = [r for r in report["results"] if r["phase"] == "compile"]
    slowest = max(r["compile_seconds"] for r in compiled)
    waves = report["executor"]["wave_seconds"]
    pulls = report["summary"]["fleet"]["pull_seconds"]
    slowest_pull = pulls["max"] if pulls else 0.0
    print(f"{report['gpu'] or report['device']}, {args.example}, buckets {args.buckets}, {ranks} ranks\n")
    print("| | wall | detail |")
    print("|---|---|---|")
    print(f"| fleet (Ray) | {fleet_wall:.1f} s | ray start {waves['start']:.1f} s, compile wave {waves['compile']:.1f} s, "
          f"warm wave {waves['warm']:.1f} s; slowest bucket cold compile {slowest:.1f} s, slowest pull "
          f"{slowest_pull:.2f} s |")
    naive_compile = [sum(r["compile_seconds"] or 0 for r in n["results"]) for n in naive_reports]
    print(f"| naive (each rank compiles all) | {naive_wall:.1f} s | per-rank sum of first calls "
          f"{', '.join(f'{c:.1f}' for c in naive_compile)} s |")
    print(f"\nfleet / naive: {fleet_wall / naive_wall:.2f}; "
          f"compile wave / (slowest cold compile + pull): {waves['compile'] / (slowest + slowest_pull):.2f}; "
          f"fleet wall / (slowest cold compile + pull): {fleet_wall / (slowest + slowest_pull):.2f}")


if __name__ == "__main__":
    main()
