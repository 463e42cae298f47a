"""The serving runtime against plain PyTorch, on a GPU (numbers go to docs/performance.md).

    python bench/serving.py OUT_DIR [--starts N] [example ...]   # default: mlp resnet18 transformer

Per example (buckets from its config, 1,8,32 unless it says otherwise):
  1. `orchestrate warmup --no-ray --device cuda` into a fresh cache: the report's chosen variant
     and its latency per bucket.
  2. A fresh process loads the runtime from that cache and times, interleaved in one process with
     CUDA events (each call on an idle device): the runtime's call at request size = bucket, the
     bucket's chosen variant called alone as warmup timed it (what the report's figure is of),
     eager, and plain `torch.compile(mode="reduce-overhead")` (same cache); then request sizes
     between the buckets: the runtime's padded call against eager at that exact size.
  3. Replica start, fresh processes alternating: spawn to `runtime.load()` returned, against the
     eager floor (spawn, import, build, one eager call per bucket).
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

TIMING = r"""
import json, statistics, sys, torch
from orchestrator import runtime
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs.model import build_model, make_inputs
from orchestrator.jobs.timing import Clock, median, p90
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.padding import copy_out
from orchestrator.jobs.variants import replays_into_buffers, spread

config, cache = sys.argv[1], sys.argv[2]
served = runtime.load(config, cache_dir=cache, device="cuda", ready="planned")
spec = served.spec
device = torch.device("cuda")
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
        runner = served._runners[bucket]
        def variant_call():  # the chosen variant alone, as warmup timed it: what the report's figure is of
            outputs = runner(*args, **kwargs)
            return copy_out(outputs) if replays_into_buffers(served.variant(bucket), spec, device.type) else outputs
        variants = {"runtime": lambda: served(*args, **kwargs), "alone": variant_call,
                    "eager": lambda: eager(*args, **kwargs), "reduce-overhead": plain_call}
        samples = clock.interleaved(variants, 200, 20)
        out["buckets"][bucket] = {"variant": served.variant(bucket), **{k: row(v) for k, v in samples.items()}}
    sizes = sorted({(a + b) // 2 for a, b in zip([0, *spec.buckets], spec.buckets) if (a + b) // 2 not in spec.buckets and (a + b) // 2 > 0})
    for n in sizes:
        args, kwargs = make_inputs(spec, n, device)
        samples = clock.interleaved({"runtime": lambda: served(*args, **kwargs), "eager": lambda: eager(*args, **kwargs)}, 200, 20)
        out["between"][n] = {k: row(v) for k, v in samples.items()}
print(json.dumps(out))
"""

READY = r"""
import json, sys, time
from orchestrator import runtime
served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], device="cuda", ready="planned")
info = served.info()
print(json.dumps({"ready_from_spawn": info.ready_seconds_from_spawn, "ready": info.ready_seconds,
                  "variants": {b: i.variant for b, i in info.buckets.items()},
                  "misses": sum(i.cache_misses for i in info.buckets.values())}))
"""

# argv: config [device, default cuda]
FLOOR = r"""
import json, sys, time, torch
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs.model import build_model, make_inputs
from orchestrator.jobs.timing import process_age_seconds
device_name = sys.argv[2] if len(sys.argv) > 2 else "cuda"
spec = load_spec_with_overrides(sys.argv[1], device=device_name)
started, age = time.perf_counter(), process_age_seconds()
device = torch.device(device_name)
model = build_model(spec, device)
with torch.no_grad():
    for bucket in spec.buckets:
        args, kwargs = make_inputs(spec, bucket, device)
        model(*args, **kwargs)
if device.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"ready_from_spawn": age + time.perf_counter() - started}))
"""


def run_python(code: str, *args: str, timeout: int = 600, env: dict | None = None) -> dict:
    """Run `code` in a fresh process; its last line of stdout, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(example: str, out_dir: Path, start_runs: int = START_RUNS) -> dict:
    config = ROOT / "examples" / f"{example}.yaml"
    cache = Path(tempfile.mkdtemp(prefix=f"serving-{example}-"))
    warmup = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(config), "--device", "cuda",
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
        "timing": run_python(TIMING, str(config), str(cache)),
    }
    starts: dict[str, list[float]] = {"runtime": [], "floor": []}
    for _ in range(start_runs):
        starts["runtime"].append(run_python(READY, str(config), str(cache))["ready_from_spawn"])
        starts["floor"].append(run_python(FLOOR, str(config))["ready_from_spawn"])
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
    starts = START_RUNS
    if args[:1] == ["--starts"]:
        starts, args = int(args[1]), args[2:]
    examples = args or ["mlp", "resnet18", "transformer"]
    lines = []
    for example in examples:
        try:
            lines += summary(example, bench(example, out_dir, starts))
        except Exception as exc:  # one example's failure must not lose the others' numbers
            lines.append(f"## {example}: FAILED {exc}")
        print("\n".join(lines[-12:]), flush=True)
    (out_dir / "serving-summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
