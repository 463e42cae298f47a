"""Buckets planned from a traffic against powers of two, both measured on that traffic.

    python bench/plan_traffic.py OUT_DIR [--traces long-tailed,bimodal,uniform,recorded] [--points 6]
                                 [--requests 1500] [--budget SECONDS] [--device cuda|cpu]
                                 [--calibration warmup-calibration.json] [--encoder minilm|base]
                                 [--objective mean|p50|p99] [--align DIM=N]

The model: bench/sequence_traffic.py's Hugging Face encoder (a MiniLM-sized BERT, float16, random
weights; `--encoder base`: BERT-base's sizes, whose latency grows more steeply with the positions
computed) called with its attention mask, bucketed over batch x seq.
  1. Calibration: `orchestrate warmup --no-ray` of a dense grid (batch 1, 4, 16, 32 x seq 32, 64,
     128, 256). Its report prices every point in milliseconds: what `orchestrate plan --report`
     interpolates between.
  2. Per trace, `--requests` requests from a fixed seed:
       - uniform: batch 1..32 and seq 1..256, each uniform;
       - long-tailed: seq log-normal of median 60 cut to 1..256, batch log-uniform over 1..32;
       - bimodal: 70% short requests (seq 8..48, batch 1..4), 30% long ones (seq 160..256,
         batch 16..32);
       - recorded: a replica serves a mixture of the three, and the trace is what the replica
         itself recorded (`info().request_sizes`), as a JSONL of sizes. The replica is the
         calibration grid's, or with `--calibration` a grid of four points warmed for it
         (batch 8, 32 x seq 128, 256).
     `orchestrate plan --traffic TRACE --max-points P --report calibration.json --json` gives the
     plan and powers of two with as many sizes per dimension, each with its predicted mean and median latency
     of a request (`--objective p50`: the plan is `orchestrate plan --objective p50`'s, free points
     warmed as a grid with `points.only`; `--align seq=8`: its lengths multiples of 8). Both are warmed (`orchestrate warmup --no-ray`), then a fresh process loads both
     replicas (`runtime.load(ready="planned")`) and replays the trace through each: one untimed
     pass, then a timed one, the two replicas interleaved request by request (alternating which
     goes first), each request timed from the call to its outputs on the host (a synchronize).
     Figures: p50, p99, mean and throughput (requests over the summed latencies), and the
     prediction's error, predicted mean / measured mean - 1. Every 20th answer of both replicas is
     checked at the request's exact size with the correctness gate as warmup applies it: against
     the model run in float64, its error held to a multiple of eager's own.
  3. Where a prediction's error comes from, point by point: the planner's price of the point, the
     point's own warmup figure (`padding_proof.padded_ms`: CUDA events, blocks of calls), one
     request of that point called back to back in the replay's process (blocks of 20, host clock
     and a synchronize, as the traffic is timed), and the traffic's own latencies there.

`--calibration` takes the calibration report of an earlier run on the same kind of machine instead of
warming the dense grid again.

A host meter (orchestrator.jobs.timing's) is read after every request, untimed: the figures are given
again over the requests read with the host at full speed, beside the prediction.

Output: OUT_DIR/plan_traffic.json, each timed request in OUT_DIR/requests-<trace>.json (per
replica: batch, seq, the point that served it, ms, whether it went first of the two, the host
meter's reading in µs), and a
Markdown table on stdout; a trace whose turn comes after
`--budget` seconds is skipped with that reason.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sequence_traffic import MODELS, TINY, run, traffic_arguments  # noqa: E402  (bench/ is not a package)

sys.path.insert(0, str(ROOT))
from orchestrator.planning.advice import measured_costs  # noqa: E402
from orchestrator.planning.buckets import Cost  # noqa: E402
from orchestrator.reports.records import SCHEMA_VERSION  # noqa: E402

CALIBRATION = {"batch": [1, 4, 16, 32], "seq": [32, 64, 128, 256]}
ENCODERS = {
    "minilm": MODELS["encoder"][1],
    "base": {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512},
}  # fmt: skip
TRACES = ("long-tailed", "bimodal", "uniform", "recorded")
RECORDER = {"batch": [8, 32], "seq": [128, 256]}  # with --calibration: the replica that records the mixture
SLOWED = 1.25  # a reading over this times the best is a slowed host, as orchestrator.jobs.timing.HOST_SLOWED says


def config(
    name: str,
    buckets: dict[str, list[int]],
    out_dir: Path,
    device: str,
    encoder: str = "minilm",
    points: Any = None,
) -> Path:
    factory, kwargs = MODELS["encoder"][0], ENCODERS[encoder]
    data = {
        "name": name,
        "model": {"factory": f"{ROOT / 'examples' / 'huggingface.py'}:{factory}",
                  "kwargs": kwargs if device == "cuda" else TINY["encoder"],
                  "dtype": "float16" if device == "cuda" else None},
        "inputs": [
            {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64", "range": [1, 30000], "pad": 0},
            {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64", "range": [1, 2], "pad": 0},
        ],
        "buckets": buckets,
        **({"points": points} if points else {}),
        "compile": {"mode": "default"},
        "serve": {"variants": ["eager", "compiled", "graphed"] if device == "cuda" else ["eager", "compiled"]},
        "bench": {"iterations": 40, "warmup": 5},
        "device": device,
    }  # fmt: skip
    path = out_dir / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def synthetic(kind: str, requests: int, seed: int = 0) -> list[tuple[int, int]]:
    """(batch, seq) per request."""
    rng = random.Random(seed)
    out = []
    for _ in range(requests):
        if kind == "uniform":
            out.append((rng.randint(1, 32), rng.randint(1, 256)))
        elif kind == "long-tailed":
            seq = min(256, max(1, round(math.exp(rng.gauss(math.log(60), 0.8)))))
            out.append((min(32, max(1, int(math.exp(rng.random() * math.log(32))))), seq))
        elif kind == "bimodal":
            if rng.random() < 0.7:
                out.append((rng.randint(1, 4), rng.randint(8, 48)))
            else:
                out.append((rng.randint(16, 32), rng.randint(160, 256)))
        else:
            raise ValueError(kind)
    return out


def write_trace(sizes: list[tuple[int, int]], path: Path) -> None:
    path.write_text("".join(json.dumps({"batch": n, "seq": s}) + "\n" for n, s in sizes))


def read_trace(path: Path) -> list[tuple[int, int]]:
    return [(row["batch"], row["seq"]) for row in map(json.loads, path.read_text().splitlines())]


def orchestrate(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "orchestrator", *args], log, timeout)


def warm(path: Path, cache: Path, out_dir: Path, timeout: float) -> dict[str, Any]:
    began = time.perf_counter()
    done = orchestrate(["warmup", "--no-ray", "--model", str(path), "--cache-dir", str(cache), "--json"],
                       out_dir / "logs" / f"warmup-{path.stem}.log", timeout)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"warmup of {path.stem} exited {done.returncode} (logs/warmup-{path.stem}.log)")
    report = json.loads(done.stdout)
    (out_dir / f"warmup-{path.stem}.json").write_text(json.dumps(report, indent=1))
    return {"seconds": time.perf_counter() - began, "compile_seconds": report["summary"]["compile_seconds_total"]}


# argv: device, cache, trace JSONL, requests-out JSONL (or "-"), then the configs to replay the
# trace through. One JSON line on stdout: per config its latencies' figures.
PROBE = r"""
import json, statistics, sys, time
import torch
from orchestrator import runtime
from orchestrator.config import load_spec
from orchestrator.jobs.engine import Float64Twin
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.timing import HostMeter

device, cache, trace, record_to, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
CUDA = device == "cuda"
sync = torch.cuda.synchronize if CUDA else (lambda: None)
replicas = {path: runtime.load(path, cache_dir=cache, ready="planned") for path in configs}
first = next(iter(replicas.values()))
gate = Gate.from_options(load_spec(configs[0]).check)
# what the gate judges an answer against, as at warmup: the model in float64 at the request's exact
# size (a float16 answer held to eager's fixed tolerance fails on a few rounding steps in millions)
twin = Float64Twin(first.model)
host_meter = HostMeter()  # the benchmark's own meter: the best of three runs of a fixed loop of Python
generator = torch.Generator().manual_seed(1)
requests = []
for line in open(trace):
    size = json.loads(line)
    ids = torch.randint(1, 30000, (size["batch"], size["seq"]), generator=generator).to(device)
    requests.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
latency = {path: [] for path in configs}
at_point = {path: {} for path in configs}  # the point that served each timed request -> its latencies
timed = {path: [] for path in configs}  # per timed request: batch, seq, its point, ms, served first of the two, host µs
first_at = {path: {} for path in configs}  # the point -> the first request it served
mismatches = {}
checked = {path: [0, 0] for path in configs}  # answers that passed the gate, answers checked
judged = None  # what the gate judged them against: float64, or eager where the model has no float64 run

def point_of(replica, request):
    return "x".join(str(size) for size in replica._route((), request).point.values())
with torch.no_grad():
    for request in requests:  # untimed: every replica's first call at each point, and the host's warm-up
        for replica in replicas.values():
            replica(**request)
    sync()
    for i, request in enumerate(requests):
        order = configs if i % 2 == 0 else configs[::-1]
        answers = {}
        for path in order:
            sync()
            began = time.perf_counter()
            out = replicas[path](**request)
            sync()
            ms = (time.perf_counter() - began) * 1e3
            latency[path].append(ms)
            point = point_of(replicas[path], request)
            at_point[path].setdefault(point, []).append(ms)
            timed[path].append([*request["input_ids"].shape, point, round(ms, 4), path == order[0]])
            first_at[path].setdefault(point, request)
            if i % 20 == 0:
                answers[path] = snapshot(dict(out))
        reading = round(host_meter() * 1e6, 1)  # the host's speed at this request, untimed
        for path in configs:
            timed[path][-1].append(reading)
        if answers:
            expected = snapshot(dict(first.model(**request)))
            exact = snapshot(dict(twin(**request)))
            for path, answer in answers.items():
                checked[path][1] += 1
                try:
                    verdict = gate.compare(expected, answer, call=f"{tuple(request['input_ids'].shape)}", float64=exact)
                    checked[path][0] += 1
                    judged = verdict.reference
                except Exception as exc:
                    mismatches.setdefault(path, str(exc)[:300])
    recorded = first.request_sizes()  # the traffic's, before the repeated calls below add theirs
    # each point again, one request of its own called back to back (blocks of 20, 5 rounds), timed
    # as above: what the traffic's interleaving adds to a point's latency, beside what warmup measured
    repeated = {path: {} for path in configs}
    for path, firsts in first_at.items():
        for point, request in firsts.items():
            samples = []
            for _ in range(5):
                for _ in range(3):
                    replicas[path](**request)
                for _ in range(20):
                    sync()
                    began = time.perf_counter()
                    replicas[path](**request)
                    sync()
                    samples.append((time.perf_counter() - began) * 1e3)
            repeated[path][point] = statistics.median(samples)
if record_to != "-":  # what a replica recorded of the traffic it served: sizes in the grid's dimensions
    with open(record_to, "w") as sink:  # each request was served twice, untimed and timed
        for (batch, seq), count in sorted(recorded.items()):
            sink.write("".join(json.dumps({"batch": batch, "seq": seq}) + "\n" for _ in range(count // 2)))

def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]

print(json.dumps({path: {"p50_ms": statistics.median(v), "p99_ms": quantile(v, 0.99), "mean_ms": statistics.fmean(v),
                         "requests_per_s": 1e3 * len(v) / sum(v), "mismatch": mismatches.get(path),
                         "checked": checked[path], "judged_against": judged,
                         "variants": sorted({r.variant for r in replicas[path].info().buckets.values()}),
                         "points": {point: {"requests": len(values), "traffic_p50_ms": statistics.median(values),
                                            "traffic_mean_ms": statistics.fmean(values),
                                            "repeated_ms": repeated[path][point]}
                                    for point, values in sorted(at_point[path].items(), key=lambda kv: [int(n) for n in kv[0].split("x")])},
                         "timed": timed[path]}
                  for path, v in latency.items()}), flush=True)
import os
os._exit(0)
"""


def replay(device: str, cache: Path, trace: Path, configs: list[Path], out_dir: Path, name: str, timeout: float,
           record_to: str = "-") -> dict[str, Any]:  # fmt: skip
    with (out_dir / "logs" / f"replay-{name}.log").open("w") as sink:
        done = subprocess.run([sys.executable, "-c", PROBE, device, str(cache), str(trace), record_to,
                               *map(str, configs)], stdout=subprocess.PIPE, stderr=sink, text=True, cwd=ROOT,
                              timeout=timeout)  # fmt: skip
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"replay {name} exited {done.returncode} (logs/replay-{name}.log)")
    return json.loads(line)


def at_full_speed(timed: list[list[Any]]) -> dict[str, Any]:
    """The replay's figures over the requests read with the host at full speed: a host meter read
    after each request within SLOWED times the replay's best reading. A shared host runs Python
    slower for stretches of seconds to minutes; the planner prices a host at full speed."""
    readings = [row[5] for row in timed if len(row) > 5]
    if not readings:
        return {}
    best = min(readings)
    kept = [row[3] for row in timed if len(row) > 5 and row[5] <= SLOWED * best]
    return {
        "host_best_us": best,
        "full_speed_requests": len(kept),
        "full_speed_p50_ms": statistics.median(kept) if kept else None,
        "full_speed_mean_ms": statistics.fmean(kept) if kept else None,
    }


def point_costs(report: Path) -> dict[tuple[int, ...], float]:
    """What `orchestrate plan --report` prices each (batch, seq) point of a warmup report at."""
    return measured_costs(json.loads(report.read_text()), ["batch", "seq"])[0]


def free_points(candidate: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A candidate's `points` entry where it is a free set of points (`{only: [...]}`), else None
    (a product grid's count of points)."""
    points = candidate.get("points")
    return points if isinstance(points, dict) else None


def plan(
    model: Path,
    trace: Path,
    points: int,
    calibration: Path,
    out_dir: Path,
    name: str,
    objective: str = "mean",
    align: Sequence[str] = (),
) -> dict[str, Any]:
    aligned = [arg for given in align for arg in ("--align", given)]
    done = orchestrate(["plan", "--model", str(model), "--traffic", str(trace), "--max-points", str(points),
                        "--report", str(calibration), "--objective", objective, *aligned, "--json"],
                       out_dir / "logs" / f"plan-{name}.log", 120)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"plan for {name} exited {done.returncode} (logs/plan-{name}.log)")
    return json.loads(done.stdout)


def main() -> int:
    parser = traffic_arguments(__doc__, 1500)
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--points", type=int, default=6, help="grid points of the plan (and of powers of two)")
    parser.add_argument("--calibration", type=Path, help="an earlier run's warmup-calibration.json, to reuse")
    parser.add_argument("--encoder", choices=sorted(ENCODERS), default="minilm", help="the encoder's sizes (on a GPU)")
    parser.add_argument("--objective", choices=["mean", "p50", "p99"], default="mean", help="what the plan minimises")
    parser.add_argument("--align", action="append", default=[], metavar="DIM=N", help="orchestrate plan's --align")
    args = parser.parse_args()
    out_dir = args.out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def left() -> float:
        return args.budget - (time.monotonic() - started)

    cache = out_dir / "cache"
    calibration_config = config("calibration", CALIBRATION, out_dir, args.device, args.encoder)
    calibration = out_dir / "warmup-calibration.json"
    results: dict[str, Any] = {}
    if args.calibration:
        kept = json.loads(args.calibration.read_text())
        # a calibration kept in the repository holds its points' figures alone: the fields every
        # report has, which `orchestrate plan --report` checks, are added back around them
        kept.setdefault("schema_version", SCHEMA_VERSION)
        kept.setdefault("summary", {})
        kept.setdefault("executor", "calibration")
        calibration.write_text(json.dumps(kept))
        results["calibration"] = {"reused": str(args.calibration)}
    else:
        results["calibration"] = warm(calibration_config, cache, out_dir, left())
        print(f"calibration: warmed in {results['calibration']['seconds']:.0f} s", file=sys.stderr, flush=True)
    for name in args.traces.split(","):
        if left() < 60:
            results[name] = {"error": f"skipped: {left():.0f} s of the budget left"}
            continue
        trace = out_dir / f"trace-{name}.jsonl"
        try:
            if name == "recorded":
                recorder = calibration_config
                if args.calibration:  # no calibration replica warmed here: a small grid serves the mixture
                    recorder = config("recorder", RECORDER, out_dir, args.device, args.encoder)
                    results["calibration"]["recorder"] = warm(recorder, cache, out_dir, left())
                mixture = [size for kind in TRACES[:3] for size in synthetic(kind, args.requests // 3, seed=7)]
                random.Random(7).shuffle(mixture)
                write_trace(mixture, out_dir / "trace-mixture.jsonl")
                replay(args.device, cache, out_dir / "trace-mixture.jsonl", [recorder], out_dir,
                       "recording", left(), record_to=str(trace))  # fmt: skip
            else:
                write_trace(synthetic(name, args.requests), trace)
            sizes = read_trace(trace)
            planned = plan(
                calibration_config, trace, args.points, calibration, out_dir, name, args.objective, args.align
            )
            by_name = {c["name"]: c for c in planned["candidates"]}
            by_name["plan"] = planned["candidates"][0]  # the plan for the objective comes first
            configs = {kind: config(f"{name}-{kind.replace(' ', '-')}", by_name[kind]["buckets"], out_dir, args.device,
                                    args.encoder, free_points(by_name[kind]))
                       for kind in ("plan", "powers of two")}  # fmt: skip
            warmed = {kind: warm(path, cache, out_dir, left()) for kind, path in configs.items()}
            measured = replay(args.device, cache, trace, list(configs.values()), out_dir, name, left())
            rows = {}
            price = Cost(point_costs(calibration))
            # each timed request, in order, for what a point's tail shares: OUT_DIR/requests-<trace>.json
            timed = {kind: measured[str(path)].pop("timed") for kind, path in configs.items()}
            (out_dir / f"requests-{name}.json").write_text(json.dumps(timed))
            for kind, path in configs.items():
                figures = measured[str(path)]
                own = point_costs(out_dir / f"warmup-{path.stem}.json")
                for point, row in figures["points"].items():
                    point_sizes = tuple(int(n) for n in point.split("x"))
                    row["planner_ms"], row["warmup_padded_ms"] = price(point_sizes), own.get(point_sizes)
                predicted = by_name[kind]["mean_cost"]
                rows[kind] = {
                    **figures,
                    "buckets": by_name[kind]["buckets"],
                    "only": (free_points(by_name[kind]) or {}).get("only"),
                    "predicted_mean_ms": predicted,
                    "predicted_p50_ms": by_name[kind]["p50_cost"],
                    "prediction_error": predicted / figures["mean_ms"] - 1 if predicted else None,
                    "padding_waste": by_name[kind]["padding_waste"],
                    "warmup": warmed[kind],
                    **at_full_speed(timed[kind]),
                }
            results[name] = {
                "objective": args.objective,
                "requests": len(sizes),
                "distinct_sizes": len(Counter(sizes)),
                "rows": rows,
                "p50_gain": 1 - rows["plan"]["p50_ms"] / rows["powers of two"]["p50_ms"],
            }
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results[name] = {"error": str(exc)}
        print(f"{name}: {json.dumps(results[name])[:300]}", file=sys.stderr, flush=True)
        (out_dir / "plan_traffic.json").write_text(json.dumps(results, indent=1))
    (out_dir / "plan_traffic.json").write_text(json.dumps(results, indent=1))
    lines = ["| trace | buckets | p50 ms (predicted) | p99 ms | mean ms | predicted ms | error | requests/s | padding waste |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, result in results.items():
        if name == "calibration":
            continue
        if "rows" not in result:
            lines.append(f"| {name} | {result.get('error')} | | | | | | | |")
            continue
        for kind, row in result["rows"].items():
            error = f"{row['prediction_error']:+.0%}" if row["prediction_error"] is not None else "-"
            shown = f"points {row['only']}" if row.get("only") else row["buckets"]
            lines.append(f"| {name} | {kind}: {shown} | {row['p50_ms']:.3f} ({row['predicted_p50_ms']:.3f}) | {row['p99_ms']:.3f} | "
                         f"{row['mean_ms']:.3f} | {row['predicted_mean_ms']:.3f} | {error} | "
                         f"{row['requests_per_s']:.0f} | {row['padding_waste']:.1%} |")  # fmt: skip
        lines.append(f"| {name} | plan's p50 gain over powers of two: {result['p50_gain']:.0%} | | | | | | | |")
    lines += [
        "",
        f"The same figures over the requests read with the host at full speed (a host meter read after "
        f"each request, within {SLOWED}x the replay's best reading), against the prediction:",
        "",
    ]
    for name, result in results.items():
        for kind, row in (result.get("rows") or {}).items():
            if row.get("full_speed_p50_ms") is None:
                continue
            p50, mean = row["full_speed_p50_ms"], row["full_speed_mean_ms"]
            lines.append(
                f"- {name}, {kind}: {row['full_speed_requests']} of {result['requests']} requests; "
                f"p50 {p50:.3f} ms (predicted {row['predicted_p50_ms']:.3f}, {row['predicted_p50_ms'] / p50 - 1:+.0%}), "
                f"mean {mean:.3f} ms (predicted {row['predicted_mean_ms']:.3f}, {row['predicted_mean_ms'] / mean - 1:+.0%})"
            )
    lines += ["", "Every 20th answer checked at the request's exact size:", ""]
    for name, result in results.items():
        for kind, row in (result.get("rows") or {}).items():
            passed, of = row["checked"]
            failure = f"; first failure: {row['mismatch']}" if row.get("mismatch") else ""
            lines.append(
                f"- {name}, {kind}: {passed} of {of} passed the gate, against {row['judged_against']}{failure}"
            )
    lines += ["", "Where each point's latency goes: the planner's price (the calibration interpolated), the "
              "point's own warmup (`padded_ms`, CUDA events), one request of it repeated in this process "
              "(host clock, synchronize), and the traffic's requests there (interleaved).", "",
              "| trace | buckets | point | requests | planner ms | warmup ms | repeated ms | traffic p50 ms | traffic mean ms |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, result in results.items():
        for kind, row in (result.get("rows") or {}).items():
            for point, at in row.get("points", {}).items():
                warmup = f"{at['warmup_padded_ms']:.3f}" if at.get("warmup_padded_ms") else "-"
                lines.append(f"| {name} | {kind} | {point} | {at['requests']} | {at['planner_ms']:.3f} | {warmup} | "
                             f"{at['repeated_ms']:.3f} | {at['traffic_p50_ms']:.3f} | {at['traffic_mean_ms']:.3f} |")  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
