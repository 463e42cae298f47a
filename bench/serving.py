"""The serving runtime against plain PyTorch, on a GPU (numbers go to docs/performance.md).

    python bench/serving.py OUT_DIR [--device cuda|cpu] [--starts N] [--host-calls N] [example ...]
                                    # default: cuda, mlp resnet18 transformer

Per example (buckets from its config, 1,8,32 unless it says otherwise):
  1. `orchestrate warmup --no-ray --device DEVICE` into a fresh cache: the report's chosen variant
     and its latency per bucket.
  2. A fresh process loads the runtime from that cache and times, interleaved in one process with
     CUDA events (each call on an idle device; perf_counter on the CPU): the runtime's call at
     request size = bucket, the bucket's chosen variant called alone as warmup timed it (what the
     report's figure is of), eager, and plain `torch.compile(mode="reduce-overhead")` (same cache);
     then request sizes between the buckets: the runtime's padded call against eager at that
     exact size.
  3. The runtime's own cost per call, host side: the runtime's call at request size = bucket
     against the chosen variant alone, in blocks of back-to-back calls timed with perf_counter_ns
     until the last call returns (the device synchronized after each block, untimed), interleaved
     (bench/runtime_overhead.py). An event-timed call on an idle device carries the launch
     latency's noise, larger than this cost; what the host spends per call is the cost itself.
  4. Replica start, fresh processes alternating: spawn to `runtime.load()` returned, against the
     eager floor (spawn, import torch and the model's module, build, one eager call per bucket;
     no config read, none of this project's modules but its clock).
Everything is written to OUT_DIR/serving-<example>.json; a summary table goes to stdout.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_RUNS = 3  # fresh processes of each kind, alternating (--starts N to change, 0 to skip)
HOST_CALLS = 5000  # back-to-back calls of each kind per bucket for the host-side overhead (--host-calls N)
HOST_BLOCK = 50  # calls per timed block

# argv: config cache device host_calls host_block; run with the repository as the working directory
TIMING = r"""
import json, statistics, sys, torch
from bench.runtime_overhead import host_overhead
from orchestrator import runtime
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs.model import build_model, make_inputs
from orchestrator.jobs.timing import Clock, median, p90
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.variants import spread

config, cache, device_name = sys.argv[1:4]
host_calls, host_block = int(sys.argv[4]), int(sys.argv[5])
served = runtime.load(config, cache_dir=cache, device=device_name, ready="planned")
spec = served.spec
device = torch.device(device_name)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
eager = build_model(spec, device)
ti.match_a_plain_process()
plain = torch.compile(eager, mode="reduce-overhead", dynamic=False)
clock = Clock(device)
out = {"info": served.info().to_dict(), "buckets": {}, "between": {}}
def row(samples):
    return {"ms": median(samples), "p90_ms": p90(samples), "spread_ms": spread(samples)}
with torch.no_grad():
    for bucket in spec.buckets:
        args, kwargs = make_inputs(spec, bucket, device)
        def plain_call():
            ti.mark_step()
            return plain(*args, **kwargs)
        route = served._routes[bucket]
        runner, copy = route.runner, route.copy  # as the runtime calls it
        def variant_call():  # the chosen variant alone, as warmup timed it: what the report's figure is of
            outputs = runner(*args, **kwargs)
            return copy(outputs) if copy is not None else outputs
        runtime_call = lambda: served(*args, **kwargs)
        variants = {"runtime": runtime_call, "alone": variant_call,
                    "eager": lambda: eager(*args, **kwargs), "reduce-overhead": plain_call}
        plain_call()  # compiles here, untimed, so that the timing starts once Inductor's compile workers have
        ti.wait_for_compile_workers()
        samples = clock.interleaved(variants, 200, 20).samples
        out["buckets"][bucket] = {"variant": served.variant(bucket), **{k: row(v) for k, v in samples.items()}}
        out["buckets"][bucket]["host"] = host_overhead(runtime_call, variant_call, host_calls, host_block, sync)
    sizes = sorted({(a + b) // 2 for a, b in zip([0, *spec.buckets], spec.buckets) if (a + b) // 2 not in spec.buckets and (a + b) // 2 > 0})
    for n in sizes:
        args, kwargs = make_inputs(spec, n, device)
        samples = clock.interleaved({"runtime": lambda: served(*args, **kwargs), "eager": lambda: eager(*args, **kwargs)}, 200, 20).samples
        out["between"][n] = {k: row(v) for k, v in samples.items()}
print(json.dumps(out))
"""

# argv: config cache [device, default cuda]
READY = r"""
import json, sys, time
from orchestrator import runtime
device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], device=device, ready="planned")
info = served.info()
print(json.dumps({"ready_from_spawn": info.ready_seconds_from_spawn, "ready": info.ready_seconds,
                  "variants": {b: i.variant for b, i in info.buckets.items()},
                  "misses": sum(i.cache_misses for i in info.buckets.values())}))
"""

# argv: the floor's recipe (floor_recipe). A plain PyTorch server: it imports torch and the
# model's own module, builds the model and calls it once per bucket. Of this project it imports
# only the clock that counts from spawn (the standard library and torch): the config's modules
# (pydantic, YAML, the store's and the signatures') are a replica's own cost, not the floor's.
FLOOR = r"""
import importlib, importlib.util, json, sys, time, torch
from orchestrator.jobs.timing import process_age_seconds
recipe = json.loads(sys.argv[1])
started, age = time.perf_counter(), process_age_seconds()
marks = {"torch imported": age}
path, target, attribute = recipe["file"], recipe["module"], recipe["attribute"]
if path:
    found = importlib.util.spec_from_file_location(target, path)
    module = sys.modules[target] = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
else:
    module = importlib.import_module(target)
marks["model's module imported"] = age + time.perf_counter() - started
factory = module
for part in attribute.split("."):
    factory = getattr(factory, part)
torch.manual_seed(recipe["seed"])
model = factory(**recipe["kwargs"])
if recipe["dtype"]:
    model = model.to(getattr(torch, recipe["dtype"]))
device = torch.device(recipe["device"])
model = model.to(device).eval()
marks["model built"] = age + time.perf_counter() - started
def tensor(t):
    if t["dtype"] == "bool":
        return torch.randint(0, 2, t["shape"]).bool().to(device)
    if t["range"] is not None:
        return torch.randint(*t["range"], t["shape"], dtype=getattr(torch, t["dtype"])).to(device)
    return torch.randn(t["shape"]).to(getattr(torch, t["dtype"])).to(device)
with torch.no_grad():
    for inputs in recipe["calls"]:
        made = [(t["name"], tensor(t)) for t in inputs]
        model(*[v for k, v in made if not k], **{k: v for k, v in made if k}, **recipe["call_kwargs"])
if device.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"ready_from_spawn": age + time.perf_counter() - started, "milestones_from_spawn": marks,
                  "project_modules": sorted(m for m in sys.modules if m.split(".")[0] == "orchestrator")}))
"""


def floor_recipe(config: Path, device: str) -> str:
    """What the eager floor builds and calls, resolved here from the config (as
    jobs/model.build_model and make_inputs do), so that the floor's process reads no config: the
    factory, its keyword arguments, seed and dtype, the call's constant keyword arguments, and each
    bucket's inputs (a grid's points, slice by slice). The outputs a config serves are not picked
    out: that indexes what the call returned and costs nothing."""
    from orchestrator.config import load_spec_with_overrides
    from orchestrator.jobs.model import factory_source

    spec = load_spec_with_overrides(config, device=device)
    ref = spec.model
    calls = [
        [
            {"name": item.name, "shape": item.concrete_shape(part.bucket_symbol, bucket, part.fixed),
             "dtype": item.dtype, "range": item.range}
            for item in part.inputs
        ]
        for part in spec.slices()
        for bucket in part.buckets
    ]  # fmt: skip
    file, module = factory_source(ref, spec.base_dir)
    return json.dumps({
        "file": file and str(file), "module": module,
        "attribute": ref.attribute, "kwargs": ref.kwargs, "seed": spec.seed, "dtype": ref.dtype,
        "device": device, "call_kwargs": spec.call.kwargs, "calls": calls,
    })  # fmt: skip


def run_python(code: str, *args: str, timeout: int = 600, env: dict | None = None) -> dict:
    """Run `code` in a fresh process; its last line of stdout, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{done.stderr[-3000:]}\nexit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(
    example: str, out_dir: Path, start_runs: int = START_RUNS, device: str = "cuda", host_calls: int = HOST_CALLS
) -> dict:
    config = ROOT / "examples" / f"{example}.yaml"
    cache = Path(tempfile.mkdtemp(prefix=f"serving-{example}-"))
    warmup = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(config), "--device", device,
         "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    (out_dir / f"warmup-{example}.log").write_text(warmup.stderr)
    if warmup.returncode not in (0, 1):
        raise RuntimeError(f"warmup {example}: exit {warmup.returncode}: {warmup.stderr[-2000:]}")
    report = json.loads(warmup.stdout)
    result = {
        "report": {
            r["bucket"]: {"status": r["status"], "variant": r["variant"], "variants": r["variants"]}
            for r in report["results"]
        },
        "timing": run_python(TIMING, str(config), str(cache), device, str(host_calls), str(HOST_BLOCK)),
    }
    starts: dict[str, list[float]] = {"runtime": [], "floor": []}
    recipe = floor_recipe(config, device)
    for _ in range(start_runs):
        starts["runtime"].append(run_python(READY, str(config), str(cache), device)["ready_from_spawn"])
        starts["floor"].append(run_python(FLOOR, recipe)["ready_from_spawn"])
    result["start"] = starts
    (out_dir / f"serving-{example}.json").write_text(json.dumps(result, indent=2))
    return result


def summary(example: str, result: dict) -> list[str]:
    lines = [f"## {example}"]
    for bucket, row in result["timing"]["buckets"].items():
        reported = result["report"].get(int(bucket)) or result["report"].get(bucket) or {}
        chosen = reported.get("variant")
        report_ms = (reported.get("variants") or {}).get(chosen, {}).get("ms")
        lines.append(
            f"bucket {bucket}: runtime {row['runtime']['ms']:.3f}±{row['runtime']['spread_ms']:.3f} ms ({row['variant']}), "
            f"{row['variant']} alone {row['alone']['ms']:.3f}±{row['alone']['spread_ms']:.3f}, "
            f"eager {row['eager']['ms']:.3f}±{row['eager']['spread_ms']:.3f}, "
            f"reduce-overhead {row['reduce-overhead']['ms']:.3f}±{row['reduce-overhead']['spread_ms']:.3f}; "
            f"report said {chosen} {report_ms if report_ms is None else round(report_ms, 3)} ms"
        )
        host = row["host"]
        single_us = (row["runtime"]["ms"] - row["alone"]["ms"]) * 1e3  # from the medians of step 2
        lines.append(
            f"  runtime overhead per call, host: {host['overhead_us']:+.2f}±{host['overhead_spread_us']:.2f} µs "
            f"(runtime {host['runtime_us']:.2f}±{host['runtime_spread_us']:.2f}, {row['variant']} alone "
            f"{host['direct_us']:.2f}±{host['direct_spread_us']:.2f} µs/call back to back, {host['calls']} calls each); "
            f"one call at a time: {single_us:+.1f} µs"
        )
    for n, row in result["timing"]["between"].items():
        lines.append(f"size {n}: runtime (padded) {row['runtime']['ms']:.3f} ms, eager {row['eager']['ms']:.3f} ms")
    runtime, floor = result["start"]["runtime"], result["start"]["floor"]
    if not runtime:
        return lines
    lines.append(
        f"start from spawn: runtime {statistics.median(runtime):.2f} s {sorted(runtime)}, "
        f"eager floor {statistics.median(floor):.2f} s {sorted(floor)}, "
        f"ratio {statistics.median(runtime) / statistics.median(floor):.2f}"
    )
    return lines


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    options = {"--starts": str(START_RUNS), "--device": "cuda", "--host-calls": str(HOST_CALLS)}
    while args[:1] and args[0] in options:
        options[args[0]], args = args[1], args[2:]
    examples = args or ["mlp", "resnet18", "transformer"]
    lines = []
    for example in examples:
        try:
            result = bench(
                example, out_dir, int(options["--starts"]), options["--device"], int(options["--host-calls"])
            )
            lines += summary(example, result)
        except Exception as exc:  # one example's failure must not lose the others' numbers
            lines.append(f"## {example}: FAILED {exc}")
        print("\n".join(lines[-12:]), flush=True)
    (out_dir / "serving-summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
