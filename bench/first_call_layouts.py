"""What a process's first call of a compiled conv net pays when its artifacts come from the cache,
and how much of it an eager call in each memory layout pays ahead (diagnostics, GPU).

    python bench/first_call_layouts.py --model bench/models/mixnet_l.yaml --bucket 8 --cache DIR

Runs, in fresh processes on one Inductor cache: one compile that fills it, then alternating
processes that load it. Each loader makes the eager reference call (NCHW, as a rank does), then,
by its setting, nothing more, or an eager call with model and input in channels_last, and then
times the compiled model's first call (the load, Inductor's CUDA-graph warm-up run) and second.
Prints each process's seconds and the medians per setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import torch
from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model, make_inputs

config, bucket, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = load_spec(config)
device = torch.device("cuda")
model = build_model(spec, device)
args, kwargs = make_inputs(spec, bucket, device)
times = {}

def timed(name, fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = fn()
    torch.cuda.synchronize()
    times[name] = time.perf_counter() - start
    return out

timed("eager first", lambda: model(*args, **kwargs))
timed("eager second", lambda: model(*args, **kwargs))
if setting == "channels_last":  # what a rank does ahead (engine.Session.warm_layouts)
    from orchestrator.jobs import torch_internals as ti
    twin = ti.channels_last_twin(model)
    last, last_kwargs = ti.channels_last_inputs(tuple(args), kwargs)
    timed("channels_last first", lambda: twin(*last, **last_kwargs))
    timed("channels_last second", lambda: twin(*last, **last_kwargs))
    del twin
compiled = torch.compile(model, mode=spec.compile.mode)
timed("compiled first", lambda: compiled(*args, **kwargs))
timed("compiled second", lambda: compiled(*args, **kwargs))
timed("compiled third", lambda: compiled(*args, **kwargs))
print(json.dumps(times))
"""


def run(config: str, bucket: int, setting: str, cache: Path) -> dict[str, float]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # as a rank loads
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, config, str(bucket), setting],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--bucket", type=int, default=8)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    fill = run(args.model, args.bucket, "nothing", args.cache)
    print(f"fill (a compile): {json.dumps({k: round(v, 3) for k, v in fill.items()})}", flush=True)
    seen: dict[str, list[dict[str, float]]] = {"nothing": [], "channels_last": []}
    for i in range(args.rounds):
        for setting in list(seen) if i % 2 == 0 else list(seen)[::-1]:
            times = run(args.model, args.bucket, setting, args.cache)
            seen[setting].append(times)
            print(f"{setting}: {json.dumps({k: round(v, 3) for k, v in times.items()})}", flush=True)
    for setting, runs in seen.items():
        names = runs[0].keys()
        medians = {name: statistics.median(r[name] for r in runs) for name in names}
        spread = {name: (min(r[name] for r in runs), max(r[name] for r in runs)) for name in names}
        print(
            f"median {setting}: "
            + ", ".join(f"{n} {medians[n]:.3f} ({spread[n][0]:.3f}-{spread[n][1]:.3f})" for n in names)
        )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
