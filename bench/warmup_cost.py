"""What a cold warmup costs against compiling the model plainly, and where the difference goes.

    python bench/warmup_cost.py OUT --models examples/mlp.yaml,examples/resnet18.yaml [--rounds 2]
        [--buckets 1,8,32] [--budget 540]

For each model, in rounds whose order alternates (plain first, then warmup first), each run a
fresh process with fresh cache directories, timed from its spawn to its exit:

- plain: `torch.compile(model, mode=<the config's>)` (the config's whole compile: dynamic,
  fullgraph, options) in one process, every bucket called as often as warmup calls it to compile
  and record its CUDA graphs, as a user would warm a server by hand;
- warmup: `orchestrate warmup --no-ray --fresh`: the same compiles, plus each serving variant's
  build, the eager references, the checks, the benchmarks and the publish to the store beside the
  cache.

The target is warmup <= 1.25 x plain. The table gives the medians of the rounds with their
range, and the warmup's own split, summed over buckets from its report: the config's compile
(first calls), CUDA graph recording, the serving variants' builds (graphed, eager-graphed: the
"graph variants" stage; aot), benchmarks and checks, and what is left (process start, imports,
model, publish). Writes OUT/warmup_cost.json and OUT/warmup_cost.md; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.25
sys.path.insert(0, str(ROOT))
from orchestrator.jobs.torch_internals import GRAPH_RECORD_CALLS  # noqa: E402

CALLS = 1 + GRAPH_RECORD_CALLS  # warmup's: the compiling call, then those that record the CUDA graphs

# The plain process: the user's own warm-up of a compiled server, nothing of orchestrate's but the
# config reader and the model factory (the same model, built the same way).
PLAIN = """
import json, sys, time
started = time.perf_counter()
import torch
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs import torch_internals as ti
imported = time.perf_counter()
spec = load_spec_with_overrides(sys.argv[1], buckets=sys.argv[2])
calls = int(sys.argv[3])
device = resolve_device(spec.device)
model = build_model(spec, device)
options = spec.compile
compiled = torch.compile(model, **ti.compile_kwargs(options.mode, options.dynamic, options.fullgraph, options.backend, options.options))
built = time.perf_counter()
buckets = {}
with torch.no_grad():
    for bucket in spec.buckets:
        args, kwargs = make_inputs(spec, bucket, device)
        start = time.perf_counter()
        for _ in range(calls):
            ti.mark_step()
            compiled(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        buckets[bucket] = time.perf_counter() - start
print(json.dumps({"imports": imported - started, "model": built - imported, "buckets": buckets}))
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fresh_env(scratch: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
    env["TRITON_CACHE_DIR"] = str(scratch / "triton")
    env.pop("ORCHESTRATE_CACHE_DIR", None)
    return env


def plain(config: Path, buckets: str, logs: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="plain-") as scratch:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", PLAIN, str(config), buckets, str(CALLS)],
            cwd=ROOT,
            env=fresh_env(Path(scratch)),
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
    (logs / f"{config.stem}-plain-{int(time.time())}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{config}: the plain compile failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return {"wall": wall, **json.loads(proc.stdout.strip().splitlines()[-1])}


def warmup(config: Path, buckets: str, logs: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="warmup-") as scratch:
        report = Path(scratch) / "report.json"
        cmd = [sys.executable, "-m", "orchestrator", "warmup", "--model", str(config), "--buckets", buckets]
        cmd += ["--no-ray", "--fresh", "--cache-dir", str(Path(scratch) / "cache"), "--report", str(report)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=fresh_env(Path(scratch)), capture_output=True, text=True)
        wall = time.perf_counter() - start
        (logs / f"{config.stem}-warmup-{int(time.time())}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode not in (0, 1) or not report.exists():
            raise SystemExit(f"{config}: warmup failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        data = json.loads(report.read_text())
    return {"wall": wall, "split": split(data), "report": data}


def split(report: dict) -> dict[str, float]:
    """The warmup's seconds by kind of work, summed over buckets; `variants` by variant."""
    stages: dict[str, float] = {}
    variants: dict[str, float] = {}
    for result in report["results"]:
        for stage, seconds in (result.get("stage_seconds") or {}).items():
            stages[stage] = stages.get(stage, 0.0) + seconds
        for name, measure in (result.get("variants") or {}).items():
            if measure.get("build_seconds") is not None:
                variants[name] = variants.get(name, 0.0) + measure["build_seconds"]
    return {
        # a rank's work ahead of the publish is part of its buckets' first calls (engine.Session)
        "compile": stages.get("compile", 0.0) + stages.get("trace ahead", 0.0) + stages.get("layouts ahead", 0.0),
        "record graphs": stages.get("record graphs", 0.0),
        "graph variants": stages.get("graph variants", 0.0),
        "aot": stages.get("aot compile", 0.0),
        "benchmark": stages.get("benchmark", 0.0) + stages.get("check", 0.0) + stages.get("eager reference", 0.0),
        **{f"build {name}": seconds for name, seconds in sorted(variants.items())},
    }


def spread(values: list[float]) -> str:
    middle = statistics.median(values)
    if len(values) < 2:
        return f"{middle:.1f}"
    return f"{middle:.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default="examples/mlp.yaml,examples/resnet18.yaml")
    parser.add_argument("--buckets", default=None, help="default: each config's own")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--budget", type=float, default=540.0, help="start no round after this many seconds")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    began = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        config = (ROOT / name).resolve()
        buckets = args.buckets or ",".join(str(b) for b in _config_buckets(config))
        runs: dict[str, list[dict]] = {"plain": [], "warmup": []}
        for round_ in range(args.rounds):
            if time.perf_counter() - began > args.budget and runs["plain"]:
                say(f"{config.stem}: budget spent, {round_} rounds")
                break
            order = ("plain", "warmup") if round_ % 2 == 0 else ("warmup", "plain")
            for kind in order:
                say(f"{config.stem} buckets {buckets}: round {round_ + 1}, {kind} ...")
                run = (plain if kind == "plain" else warmup)(config, buckets, logs)
                runs[kind].append(run)
                say(f"{config.stem}: {kind} {run['wall']:.1f} s")
        rows.append({"model": config.stem, "buckets": buckets, **runs})
    table = render(rows)
    print(table)
    (args.out / "warmup_cost.md").write_text(table + "\n")
    for row in rows:
        for run in row["warmup"]:
            run.pop("report", None)
    (args.out / "warmup_cost.json").write_text(json.dumps(rows, indent=2))
    return 0


def _config_buckets(config: Path) -> list[int]:
    from orchestrator.config import load_spec

    return list(load_spec(config).buckets)


def render(rows: list[dict]) -> str:
    lines = [
        f"| model | buckets | plain s | warmup s | warmup / plain (target <= {TARGET}) | compile | "
        "record graphs | graph variants | aot | checks, benchmarks | variants built (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        if not row["plain"] or not row["warmup"]:
            continue
        plain_walls = [r["wall"] for r in row["plain"]]
        warm_walls = [r["wall"] for r in row["warmup"]]
        # a round the budget cut short has one run of the two: ratios pair whole rounds only
        ratios = [w / p for w, p in zip(warm_walls, plain_walls, strict=False)]
        parts = {key: [r["split"].get(key, 0.0) for r in row["warmup"]] for key in row["warmup"][0]["split"]}
        built = ", ".join(f"{k[6:]} {statistics.median(v):.1f}" for k, v in parts.items() if k.startswith("build "))
        cells = [spread(parts[key]) for key in ("compile", "record graphs", "graph variants", "aot", "benchmark")]
        lines.append(
            f"| {row['model']} | {row['buckets']} | {spread(plain_walls)} | {spread(warm_walls)} | "
            f"{statistics.median(ratios):.2f}{'' if len(ratios) < 2 else f' ({min(ratios):.2f}-{max(ratios):.2f})'} | "
            + " | ".join(cells)
            + f" | {built or '-'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
