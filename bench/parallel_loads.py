"""Whether a replica's `aot` buckets load faster side by side: threads against one after another.

    python bench/parallel_loads.py CONFIG --cache-dir DIR [--runs 6] [--device cuda]

CONFIG must have been warmed into DIR with `aot` serving (`serve: {variants: [aot]}` or the
default on CUDA). Fresh processes, alternating: each builds the model, imports what a replica
imports for `aot`, then loads every bucket's saved function (aot.load: the file read, Dynamo's
guards rebuilt, the compiled code and its kernels loaded) either one after another or each in a
thread of its own, all started at once, and then calls each once. Printed per way: the load's
seconds (median and range over the runs that loaded every bucket) and the runs in which a load
failed, with the first line of the first error. A capture (CUDA) is not part of it: that needs
the GPU and runs one at a time in any case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys, threading, time
from pathlib import Path
import torch
from orchestrator.config import load_spec_with_overrides
from orchestrator.cache.local import LocalCache
from orchestrator.cache.namespace import namespace
from orchestrator.jobs import aot, torch_internals as ti
from orchestrator.jobs.torch_internals import point_caches_at
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.variants import read_plans

config, cache, way, device = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
spec = load_spec_with_overrides(config, device=device)
device = resolve_device(spec.device)
local = LocalCache(Path(cache), namespace(spec.label, ti.current_platform(device), spec.identity_hash()))
directory = local.path
plans = read_plans(directory)
point_caches_at(local)  # as a replica loads: Inductor's and Triton's caches are the namespace's own
ti.match_a_plain_process()
files = {b: directory / plan["artifacts"]["aot"]["path"] for b, plan in plans.items() if plan.get("artifacts", {}).get("aot")}
model = build_model(spec, device)
ti.import_compiler(to_compile=False)
loaded, errors = {}, []

def load(bucket):
    try:
        loaded[bucket] = aot.load(files[bucket], model)
    except Exception as exc:
        errors.append(f"bucket {bucket}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")

began = time.perf_counter()
if way == "threads":
    threads = [threading.Thread(target=load, args=(b,)) for b in sorted(files, reverse=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
else:
    for bucket in sorted(files, reverse=True):
        load(bucket)
seconds = time.perf_counter() - began
with torch.no_grad():
    for bucket, function in loaded.items():
        args, kwargs = make_inputs(spec, bucket, device)
        function(*args, **kwargs)
print(json.dumps({"way": way, "seconds": seconds, "buckets": len(files), "loaded": len(loaded), "errors": errors}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--runs", type=int, default=6, help="fresh processes per way")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"one after another": [], "threads": []}
    for i in range(args.runs):
        for way in list(results) if i % 2 == 0 else list(results)[::-1]:
            done = subprocess.run(
                [sys.executable, "-c", PROBE, args.config, args.cache_dir, way, args.device],
                capture_output=True, text=True, cwd=ROOT, timeout=900,
            )  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                results[way].append({"errors": [f"exit {done.returncode}: {done.stderr.strip()[-300:]}"]})
            else:
                results[way].append(json.loads(lines[-1]))
            print(f"{way}: {results[way][-1]}", file=sys.stderr, flush=True)
    for way, runs in results.items():
        whole = [run["seconds"] for run in runs if not run["errors"]]
        failed = [run for run in runs if run["errors"]]
        figure = (
            f"{statistics.median(whole):.2f} s [{min(whole):.2f}-{max(whole):.2f}]" if whole else "no run loaded all"
        )
        print(
            f"{way:18s} {figure}, {len(failed)} of {len(runs)} runs failed"
            + (f": {failed[0]['errors'][0]}" if failed else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
