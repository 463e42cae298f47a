"""What a saved `aot` function's guards cost a replica's load: the guard filter the variant ships
(the call's tensors and the global state) against the one it replaced (every guard another
process could satisfy: the model's submodules, attributes, parameters and buffers too), side by
side in one run (numbers go to docs/performance.md).

    python bench/aot_guards.py OUT_DIR [--loads N] [--device cuda|cpu] CFG.yaml [CFG.yaml ...]

Per config, buckets from the config:
  1. One process compiles every bucket ahead of time with each filter (the second compile of a
     bucket hits Inductor's cache, so both files hold the same kernels) and saves the functions
     beside each other: guards kept, bytes.
  2. Fresh processes, N of each filter, taking turns: import torch, build the model, one eager
     call per bucket (the reference), then load every bucket's function, largest first, as a
     replica's loader does, and call each once: load seconds per bucket, and the largest
     difference from eager.
Medians [range] to stdout and OUT_DIR/aot-guards.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILTERS = ("shipped", "with the model's")

# argv: config, out dir, device; prints one JSON line per filter
BUILD = r"""
import json, sys
from pathlib import Path
import torch
from orchestrator.config import load_spec
from orchestrator.jobs import aot
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.model import build_model, make_inputs, resolve_device

def with_the_models(entries):
    # the filter before: every guard another process can satisfy, the model's own among them
    from torch._dynamo.guards import CheckFunctionManager
    unportable = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ()))
    return [not (e.is_global or e.guard_type in unportable or unportable.intersection(e.derived_guard_types)
                 or ti._reached_through_an_import(e.orig_guard.originating_source)) for e in entries]

spec = load_spec(sys.argv[1])
out = Path(sys.argv[2])
device = resolve_device(sys.argv[3])
model = build_model(spec, device)
options = spec.compile
for name, rule in (("shipped", ti.portable_guards), ("with the model's", with_the_models)):
    kept = []
    def counting(entries, rule=rule):
        keep = rule(entries)
        kept.append(sum(keep))
        return keep
    kwargs = aot.compile_kwargs(options.mode, options.options, options.backend, device.type)
    kwargs["options"] = {**kwargs["options"], "guard_filter_fn": counting}
    directory = out / name.replace(" ", "-").replace("'", "")
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for bucket in spec.buckets:
        args, call_kwargs = make_inputs(spec, bucket, device)
        rel = aot.build(model, args, call_kwargs, directory, bucket, kwargs)
        files[bucket] = str(directory / rel)
    print(json.dumps({"filter": name, "files": files, "guards_kept": kept[-1] if kept else None,
                      "bytes": {b: Path(p).stat().st_size for b, p in files.items()}}), flush=True)
"""

# argv: config, device, files as JSON; prints one JSON line
LOAD = r"""
import json, sys, time
import torch
from orchestrator.config import load_spec
from orchestrator.jobs import aot
from orchestrator.jobs.model import build_model, make_inputs, resolve_device

spec = load_spec(sys.argv[1])
device = resolve_device(sys.argv[2])
files = {int(b): p for b, p in json.loads(sys.argv[3]).items()}
torch.set_grad_enabled(False)
model = build_model(spec, device)
inputs = {b: make_inputs(spec, b, device) for b in files}
reference = {b: model(*a, **k) for b, (a, k) in inputs.items()}
loads, error = {}, 0.0
for bucket in sorted(files, reverse=True):
    started = time.perf_counter()
    function = aot.load(files[bucket], model)
    if device.type == "cuda":
        torch.cuda.synchronize()
    loads[bucket] = time.perf_counter() - started
    args, kwargs = inputs[bucket]
    got, want = function(*args, **kwargs), reference[bucket]
    got = got if isinstance(got, torch.Tensor) else got[0]
    want = want if isinstance(want, torch.Tensor) else want[0]
    error = max(error, (got.float() - want.float()).abs().max().item())
print(json.dumps({"loads": loads, "max_abs_error": error}))
"""


def python(code: str, *args: str, timeout: float) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


def bench(config: Path, out: Path, device: str, loads: int) -> dict:
    built = {row["filter"]: row for row in python(BUILD, str(config), str(out / config.stem), device, timeout=900)}
    runs: dict[str, list[dict]] = {name: [] for name in FILTERS}
    for _ in range(loads):
        for name in FILTERS:
            runs[name].append(python(LOAD, str(config), device, json.dumps(built[name]["files"]), timeout=300)[0])
    result = {"config": str(config), "filters": {}}
    print(f"## {config.stem}")
    for name in FILTERS:
        per_bucket = {b: [run["loads"][b] for run in runs[name]] for b in runs[name][0]["loads"]}
        first = max(per_bucket, key=int)
        result["filters"][name] = {**built[name], "runs": runs[name]}
        others = ", ".join(f"bucket {b} {spread(v)}" for b, v in per_bucket.items() if b != first)
        print(
            f"  {name:>17}: {built[name]['guards_kept']} guards, {max(built[name]['bytes'].values()):,} bytes;"
            f" first load (bucket {first}) {spread(per_bucket[first])}; {others};"
            f" max |err| {max(run['max_abs_error'] for run in runs[name]):.1e}"
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("configs", type=Path, nargs="+")
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = [bench(config, args.out, args.device, args.loads) for config in args.configs]
    (args.out / "aot-guards.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
