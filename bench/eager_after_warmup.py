"""Is a host-bound eager call slower in a process that has run a warmup, and what undoes it?

    python bench/eager_after_warmup.py CFG.yaml BUCKET CACHE_DIR OUT.json [warmup options ...]

In one process, on one core throughout: a model built from CFG.yaml is timed at BUCKET (eager,
no grad; CUDA events around each call after a synchronize, or the host clock on the CPU; 5
untimed calls, then the median of 7 blocks of 40) twice, then `orchestrate warmup --no-ray
--model CFG.yaml --cache-dir CACHE_DIR --json [warmup options]` runs in this same process, and
the timing is taken again: right after, after 10 s idle, with Inductor's compile workers shut
down, with the collector's objects frozen (gc.freeze), with the collector off, and after
torch._dynamo.reset() and an emptied CUDA cache. Each reading times a model built for it (fresh)
and the one built first, and records the process's state: a pure-Python call's speed (fib(20)),
its threads, children and collector's objects, monitoring tools, torch-function modes and
Dynamo's frame callback. Readings are printed to stderr and written to OUT.json as they come.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from host_speed import event_ms  # noqa: E402  (bench/ is not a package)

from orchestrator.config import load_spec  # noqa: E402
from orchestrator.jobs.model import build_model, make_inputs  # noqa: E402

BLOCKS, BLOCK, UNTIMED = 7, 40, 5


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def python_call_us() -> float:
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        fib(20)
        best = min(best, time.perf_counter() - began)
    return best * 1e6


def median_call_us(fn: Callable[[], Any], cuda: bool) -> float:
    with torch.no_grad():
        for _ in range(UNTIMED):
            fn()
        taken = []
        for _ in range(BLOCKS * BLOCK):
            if cuda:
                taken.append(event_ms(fn) * 1e3)
            else:
                began = time.perf_counter()
                fn()
                taken.append((time.perf_counter() - began) * 1e6)
    return round(statistics.median(taken), 2)


def children() -> int:
    me, count = str(os.getpid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1] == me:
                count += 1
        except (OSError, IndexError):
            pass
    return count


def state() -> dict[str, Any]:
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12 on
    return {
        "fib20_us": round(python_call_us(), 1),
        "threads": [t.name for t in threading.enumerate()],
        "children": children(),
        "gc_objects": len(gc.get_objects()),
        "gc_enabled": gc.isenabled(),
        "monitoring": [monitoring.get_tool(i) for i in range(6) if monitoring.get_tool(i)] if monitoring else None,
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "dynamo_callback": repr(torch._C._dynamo.eval_frame.get_eval_frame_callback())[:80],
    }


def main() -> None:
    if len(sys.argv) < 5 or not sys.argv[2].isdigit():
        sys.exit("usage: python bench/eager_after_warmup.py CFG.yaml BUCKET CACHE_DIR OUT.json [warmup options ...]")
    config, bucket, cache, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    spec = load_spec(config)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)  # one core: a pool of threads on it would time the scheduler
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    first = build_model(spec, device)
    readings: list[dict[str, Any]] = []

    def reading(tag: str) -> None:
        fresh = build_model(spec, device)
        args, kwargs = make_inputs(spec, bucket, device)
        row: dict[str, Any] = {"tag": tag, "fresh_us": median_call_us(lambda: fresh(*args, **kwargs), cuda)}
        row["first_us"] = median_call_us(lambda: first(*args, **kwargs), cuda)
        row["fresh_again_us"] = median_call_us(lambda: fresh(*args, **kwargs), cuda)
        row.update(state())
        readings.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        out.write_text(json.dumps(readings, indent=1))

    reading("before warmup")
    reading("before warmup, again")
    from orchestrator.cli import cli

    began = time.perf_counter()
    try:
        cli(
            ["warmup", "--no-ray", "--model", config, "--cache-dir", cache, "--json", *sys.argv[5:]],
            standalone_mode=False,
        )
    except SystemExit:
        pass
    print(f"warmup: {time.perf_counter() - began:.1f} s", file=sys.stderr)
    os.sched_setaffinity(0, {core})  # the warmup benchmarks on a core of its choosing
    reading("after warmup")
    time.sleep(10)
    reading("after 10 s idle")
    from torch._inductor import async_compile

    async_compile.shutdown_compile_workers()
    reading("compile workers shut")
    gc.collect()
    gc.freeze()
    reading("collector's objects frozen")
    gc.disable()
    reading("collector off")
    gc.enable()
    gc.unfreeze()
    torch._dynamo.reset()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    reading("Dynamo reset, CUDA cache emptied")


if __name__ == "__main__":
    main()
