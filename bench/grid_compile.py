"""A grid compiled point by point against one dynamic compile: compile seconds against served latency.

    python bench/grid_compile.py OUT_DIR [--models encoder,decoder] [--device cuda|cpu] [--budget SECONDS]
                                 [--tolerance 0.03]

Per model (bench/sequence_traffic.py's: a MiniLM-sized Hugging Face encoder with its mask and a decoder,
batch 1, 8, 32 x seq 32, 64, 128, 256; tiny ones with --device cpu), two cold `orchestrate warmup
--no-ray` runs of the same grid, each into a cache of its own:
  - `compile.dynamic: false` (the default): every point compiled for its own shapes;
  - `compile.dynamic: true`: one Dynamo graph with symbolic sizes, which every later point reuses
    where no size of it is 1 and was not before (Dynamo specialises a size of 1): a few compiles for
    the whole grid.
Either way each point is checked, benchmarked and served on its own (`graphed` captures one CUDA
graph per point on the GPU), so the question is only what a symbolic-size kernel costs per call
against one compiled for its shapes. Per arm, a fresh process loads the grid as a replica does
(`runtime.load(ready="planned")`) and reports the seconds from its start to every point on plan.
Then one process loads both replicas and times them side by side at every point's exact shape: 5
rounds, each arm's block of 20 calls (after 3 untimed) in turns, the order alternating, a
synchronize after every call; an arm's figure is the median of its block medians, and the ratio
dynamic / per point is taken round by round (its median and range).

Output: OUT_DIR/grid_compile.json and Markdown tables on stdout: per point, each arm's compile
seconds (warmup's), the variant each replica serves and its ms side by side, and the ratio; per
model, the compile, warmup and replica seconds of each arm, the geometric mean of the ratios, and
the choice: `dynamic` where the geometric mean is within --tolerance of 1 and no point is slower
by more than twice that, else `per point`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from sequence_traffic import config, run  # noqa: E402  (a sibling script)

ARMS = {"per point": False, "dynamic": True}

# argv: config, cache dir. One JSON line: seconds from the process's start to every point on plan.
REPLICA = r"""
import time
started = time.perf_counter()
import json, sys
from orchestrator import runtime
served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], ready="planned")
on_plan = time.perf_counter() - started
variants = {str(k): v.variant for k, v in served.info().buckets.items()}
print(json.dumps({"on_plan_s": on_plan, "variants": variants}), flush=True)
import os
os._exit(0)
"""

# argv: JSON of {arm: [config, cache dir]}, device, JSON of [[batch, seq], ...]. One JSON line: per point
# and arm the median ms, and the ratio dynamic / per point by round.
SIDE_BY_SIDE = r"""
import json, statistics, sys, time
import torch
from orchestrator import runtime
arms, device, points = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
served = {arm: runtime.load(config, cache_dir=cache, ready="planned") for arm, (config, cache) in arms.items()}
names = list(served)
generator = torch.Generator().manual_seed(0)
out = {}
for batch, seq in points:
    ids = torch.randint(1, 100, (batch, seq), generator=generator).to(device)
    request = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    blocks = {arm: [] for arm in names}
    with torch.no_grad():
        for round_ in range(5):
            for arm in (names if round_ % 2 == 0 else names[::-1]):
                call = served[arm]
                for _ in range(3):
                    call(**request)
                sync()
                times = []
                for _ in range(20):
                    began = time.perf_counter()
                    call(**request)
                    sync()
                    times.append(1e3 * (time.perf_counter() - began))
                blocks[arm].append(statistics.median(times))
    ratios = [d / s for s, d in zip(blocks[names[0]], blocks[names[1]])]
    out[f"{batch}x{seq}"] = {"ms": {arm: statistics.median(b) for arm, b in blocks.items()},
                             "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
print(json.dumps(out), flush=True)
import os
os._exit(0)
"""


def arm_config(name: str, dynamic: bool, out_dir: Path, device: str) -> Path:
    """sequence_traffic's grid config of the model, with `compile.dynamic` set and a name of its own."""
    data = yaml.safe_load(config(name, True, out_dir, device).read_text())
    data["name"] = f"{name}-{'dynamic' if dynamic else 'static'}"
    data["compile"]["dynamic"] = dynamic
    path = out_dir / "configs" / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def points_of(report: dict) -> dict[str, dict]:
    """Each point of a warmup report by its label (`8x64`): compile seconds, served variant and ms."""
    points = {}
    for result in report["results"]:
        point = result.get("point") or {"batch": result["bucket"]}
        label = "x".join(str(point[k]) for k in ("batch", "seq") if k in point)
        variants = result.get("variants", {})
        served = result.get("variant") or "eager"
        points[label] = {
            "status": result["status"],
            "compile_s": result.get("compile_seconds"),
            "served": served,
            "served_ms": variants.get(served, {}).get("ms"),
            "eager_ms": variants.get("eager", {}).get("ms"),
        }
    return points


def choose(ratios: list[float], tolerance: float) -> tuple[float, str]:
    """The geometric mean of dynamic's served ms over the per-point compile's, and the choice."""
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    dynamic = mean <= 1 + tolerance and max(ratios) <= 1 + 2 * tolerance
    return mean, "dynamic" if dynamic else "per point"


def bench_model(name: str, args, out_dir: Path, started: float) -> dict:
    result: dict = {"arms": {}}
    configs = {}
    for arm, dynamic in ARMS.items():
        left = args.budget - (time.monotonic() - started)
        if left < 30:
            result["error"] = f"{arm}: skipped, {left:.0f} s of the budget left"
            return result
        path = arm_config(name, dynamic, out_dir, args.device)
        cache = out_dir / "cache" / path.stem
        configs[arm] = [str(path), str(cache)]
        began = time.perf_counter()
        try:
            done = run([sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--fresh", "--model", str(path),
                        "--cache-dir", str(cache), "--json"], out_dir / "logs" / f"warmup-{path.stem}.log", left)  # fmt: skip
        except subprocess.TimeoutExpired:
            result["error"] = f"{arm}: the warmup ran out of the budget"
            return result
        seconds = time.perf_counter() - began
        if done.returncode != 0:
            result["error"] = f"{arm}: warmup exit {done.returncode} (logs/warmup-{path.stem}.log)"
            return result
        report = json.loads(done.stdout)
        (out_dir / f"warmup-{path.stem}.json").write_text(json.dumps(report, indent=1))
        arm_result = {
            "warmup_s": seconds,
            "compile_s": report["summary"]["compile_seconds_total"],
            "points": points_of(report),
        }
        result["arms"][arm] = arm_result
        arm_result["replica"] = probe(REPLICA, [str(path), str(cache)], out_dir / "logs" / f"replica-{path.stem}.log",
                                      args, started)  # fmt: skip
        print(
            f"{path.stem}: warmup {seconds:.0f} s, compile {arm_result['compile_s']:.1f} s", file=sys.stderr, flush=True
        )
    points = [[int(x) for x in label.split("x")] for label in result["arms"]["per point"]["points"]]
    timed = probe(SIDE_BY_SIDE, [json.dumps(configs), args.device, json.dumps(points)],
                  out_dir / "logs" / f"side-by-side-{name}.log", args, started)  # fmt: skip
    if "error" in timed:
        result["error"] = f"side by side: {timed['error']}"
        return result
    result["timed"] = timed
    ratios = [figures["ratio"] for figures in timed.values()]
    result["geomean"], result["choice"] = choose(ratios, args.tolerance)
    return result


def probe(code: str, argv: list[str], log: Path, args, started: float) -> dict:
    """A fresh process running `code`: its last JSON line, or why there is none."""
    left = args.budget - (time.monotonic() - started)
    try:
        done = run([sys.executable, "-c", code, *argv], log, max(left, 30))
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    return json.loads(line) if line else {"error": f"exit {done.returncode} ({log.name})"}


def render(results: dict) -> str:
    lines = [
        "| model | point | per point: compile s | served | ms | dynamic: compile s | served | ms | "
        "dynamic / per point [range] |",
        "|---|---|---:|---|---:|---:|---|---:|---:|",
    ]
    totals = ["| model | arm | compile s | warmup s | replica on plan s |", "|---|---|---:|---:|---:|"]
    verdicts = []
    for name, result in results.items():
        if "error" in result:
            verdicts.append(f"- {name}: {result['error']}")
        arms, timed = result.get("arms", {}), result.get("timed", {})
        if len(arms) == len(ARMS) and timed:
            static, dynamic = (arms[arm]["points"] for arm in ARMS)
            for label, figures in timed.items():
                s, d = static.get(label, {}), dynamic.get(label, {})
                low, high = figures["ratio_range"]
                lines.append(
                    f"| {name} | {label} | {_num(s.get('compile_s'), 1)} | {s.get('served', '')} | "
                    f"{figures['ms']['per point']:.3f} | {_num(d.get('compile_s'), 1)} | {d.get('served', '')} | "
                    f"{figures['ms']['dynamic']:.3f} | {figures['ratio']:.3f} [{low:.3f}-{high:.3f}] |"
                )
        for arm, figures in arms.items():
            replica = figures.get("replica", {})
            on_plan = _num(replica.get("on_plan_s"), 1) if "on_plan_s" in replica else replica.get("error", "")
            totals.append(f"| {name} | {arm} | {figures['compile_s']:.1f} | {figures['warmup_s']:.1f} | {on_plan} |")
        if "choice" in result:
            ratios = [figures["ratio"] for figures in timed.values()]
            verdicts.append(
                f"- {name}: dynamic's served ms over the per-point compile's, geometric mean {result['geomean']:.3f} "
                f"(points {min(ratios):.3f}-{max(ratios):.3f}): **{result['choice']}**"
            )
    return "\n".join(lines + [""] + totals + [""] + verdicts)


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--models", default="encoder,decoder")
    parser.add_argument("--budget", type=float, default=540, help="seconds; a model that would start later is skipped")
    parser.add_argument("--device", default="cuda", help="cpu: a check of this script with tiny models")
    parser.add_argument("--tolerance", type=float, default=0.03, help="served latency dynamic may add (0.03: 3%%)")
    args = parser.parse_args()
    out_dir = args.out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {}
    for name in args.models.split(","):
        results[name] = bench_model(name, args, out_dir, started)
        (out_dir / "grid_compile.json").write_text(json.dumps(results, indent=1))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
