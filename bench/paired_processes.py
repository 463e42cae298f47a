"""Is a slow eager figure the host's or the process's? Two processes time the same model's eager
call in turns, block for block, so that both see the host at the same moments.

    python bench/paired_processes.py OUT_DIR [--only NAME[,NAME]] [--pairs N] [--budget SECONDS]

Per model (bench/zoo.py's configs and settings, warmed once by a cold `warmup --no-ray`):
  - `plain` builds the model and does nothing else, all along;
  - `probe` goes through the states of bench/fidelity.py's probe, one after another: `built` (the
    model built as `plain` builds it), `loaded` (a replica after `runtime.load(ready="planned")`,
    its module timed), `variants` (the `compiled` and `graphed` variants compiled in the process
    and captured, as the probe rebuilds them), `workers shut` (Inductor's compile workers shut
    down), `dynamo reset` (`torch._dynamo.reset()`).
In each state the two take turns, the first of a pair alternating, N pairs per bucket: each turn
is a host meter reading (the best of three runs of a fixed pure-Python loop) then 40 consecutive
eager calls after 3 untimed, a CUDA event pair around each after a synchronize; a turn's figure
is its median. A pair's ratio is probe over plain; the state's is the median of its pairs'.
A ratio near 1 with both slow together is the host; a ratio away from 1 is the process.

Output: OUT_DIR/paired.json and a Markdown table on stdout.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import zoo  # noqa: E402

STATES = ("built", "loaded", "variants", "workers shut", "dynamo reset")

# argv: role, config, cache. Reads commands on stdin; answers one "@@ <json>" line on stdout each.
CHILD = r"""
import json, os, statistics, sys, time
role, config, cache = sys.argv[1:4]
import torch
from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.timing import HostMeter

spec = load_spec(config)
device = resolve_device(spec.device)
model = build_model(spec, device)
inputs = {b: make_inputs(spec, b, device) for b in spec.buckets}

meter = HostMeter()

def meter_us():
    return meter() * 1e6

def turn(bucket):
    args, kwargs = inputs[bucket]
    meter = meter_us()
    taken = []
    with torch.no_grad():
        for _ in range(3):
            model(*args, **kwargs)
        for _ in range(40):
            if device.type != "cuda":
                began = time.perf_counter()
                model(*args, **kwargs)
                taken.append((time.perf_counter() - began) * 1e3)
                continue
            torch.cuda.synchronize()
            stream = torch.cuda.current_stream()  # looked up outside the sample (jobs/timing.py)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            model(*args, **kwargs)
            end.record(stream)
            end.synchronize()
            taken.append(start.elapsed_time(end))
    return {"ms": statistics.median(taken), "meter_us": meter, "after_meter_us": meter_us()}

keep = []  # what the probe's states hold alive: the replica, its compiled functions, captured graphs

def advance(state):
    global model
    if state == "loaded":
        from orchestrator import runtime
        served = runtime.load(config, cache_dir=cache, device=device.type, ready="planned")
        keep.append(served)
        model = served.model
    elif state == "variants":
        from orchestrator.jobs import torch_internals as ti
        from orchestrator.jobs.graphs import GraphedCall
        spec_ = keep[0].spec
        with torch.no_grad():
            for variant in ("compiled", "graphed") if device.type == "cuda" else ("compiled",):
                ti.match_a_plain_process()
                fn = torch.compile(model, **ti.variant_compile_kwargs(spec_.compile, variant))
                for b, (args, kwargs) in inputs.items():
                    if variant == "compiled":
                        fn(*args, **kwargs)
                    else:
                        keep.append(GraphedCall(fn, args, kwargs))
                keep.append(fn)
        ti.wait_for_compile_workers()  # the state is the variants built, not their compiler's pool starting
    elif state == "workers shut":
        from torch._inductor import async_compile
        async_compile.shutdown_compile_workers()
        time.sleep(1)
    elif state == "dynamo reset":
        import importlib
        importlib.import_module("torch._dynamo").reset()
    threads = len(os.listdir("/proc/self/task"))
    return {"state": state, "threads": threads}

def answer(value):
    sys.stdout.write("@@ " + json.dumps(value) + "\n")
    sys.stdout.flush()

answer({"ready": role})
for line in sys.stdin:
    command, _, argument = line.strip().partition(" ")
    try:
        if command == "time":
            answer(turn(int(argument)))
        elif command == "state":
            answer(advance(argument))
        elif command == "exit":
            break
    except Exception as exc:
        answer({"error": f"{type(exc).__name__}: {exc}"[:500]})
        break
os._exit(0)
"""


class Child:
    def __init__(self, role: str, config: Path, cache: Path, log: Path) -> None:
        self.role = role
        self.sink = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, role, str(config), str(cache)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.sink, text=True, cwd=ROOT, env={**os.environ, **zoo.ENV},
            start_new_session=True,
        )  # fmt: skip
        zoo.LIVE.add(self.process)

    def read(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("@@ "):
                value = json.loads(line[3:])
                if "error" in value:
                    raise RuntimeError(f"{self.role}: {value['error']}")
                return value
        raise RuntimeError(f"{self.role} exited {self.process.wait()} (see its log)")

    def ask(self, command: str) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.ask("exit")
        except (RuntimeError, BrokenPipeError, OSError):
            pass
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait()
        zoo.LIVE.discard(self.process)
        self.sink.close()


def paired(model: zoo.Model, config: Path, cache: Path, out_dir: Path, buckets: list[int], pairs: int) -> dict:
    probe = Child("probe", config, cache, out_dir / "logs" / f"{model.name}-probe.log")
    plain = Child("plain", config, cache, out_dir / "logs" / f"{model.name}-plain.log")
    row: dict = {"model": model.name, "states": {}}
    try:
        probe.read(), plain.read()
        for state in STATES:
            facts = probe.ask(f"state {state}") if state != "built" else {"state": state}
            cells = {}
            for bucket in buckets:
                turns = []
                for i in range(pairs):
                    first, second = (probe, plain) if i % 2 == 0 else (plain, probe)
                    a, b = first.ask(f"time {bucket}"), second.ask(f"time {bucket}")
                    turns.append({first.role: a, second.role: b})
                ratios = [t["probe"]["ms"] / t["plain"]["ms"] for t in turns]
                cells[bucket] = {
                    "probe_ms": statistics.median(t["probe"]["ms"] for t in turns),
                    "plain_ms": statistics.median(t["plain"]["ms"] for t in turns),
                    "ratio": statistics.median(ratios),
                    "ratio_range": [min(ratios), max(ratios)],
                    "probe_meter_us": statistics.median(t["probe"]["meter_us"] for t in turns),
                    "plain_meter_us": statistics.median(t["plain"]["meter_us"] for t in turns),
                    "turns": turns,
                }
                print(f"{model.name} {state} b{bucket}: probe {cells[bucket]['probe_ms']:.3f} plain "
                      f"{cells[bucket]['plain_ms']:.3f} ratio {cells[bucket]['ratio']:.3f}", file=sys.stderr, flush=True)  # fmt: skip
            row["states"][state] = {"facts": facts, "buckets": cells}
    except RuntimeError as exc:
        row["error"] = str(exc)
    finally:
        probe.close(), plain.close()
    return row


def render(rows: list[dict]) -> str:
    lines = [
        "| model | state | bucket | probe ms | plain ms | probe / plain (range) | meter µs, probe · plain |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        if "error" in row and not row.get("states"):
            lines.append(f"| {row['model']} | | | | | {row['error']} | |")
        for state, data in row.get("states", {}).items():
            for bucket, c in data["buckets"].items():
                low, high = c["ratio_range"]
                lines.append(
                    f"| {row['model']} | {state} | {bucket} | {c['probe_ms']:.3f} | {c['plain_ms']:.3f} | "
                    f"{c['ratio']:.3f} ({low:.2f}-{high:.2f}) | {c['probe_meter_us']:.0f} · {c['plain_meter_us']:.0f} |"
                )
        if row.get("error") and row.get("states"):
            lines.append(f"| {row['model']} | | | | | stopped: {row['error']} | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", default="distilbert_fp16,bench/models/two_input_linear.yaml")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--budget", type=float)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    out_dir = zoo.output_folder(args.out_dir)
    zoo_args = argparse.Namespace(buckets=None, device=args.device, set=[])
    budget = zoo.Budget(args.budget)
    rows: list[dict] = []
    for model in zoo.select([t for t in args.only.split(",") if t]):
        if not budget.fits():
            rows.append({"model": model.name, "error": f"skipped: {budget.left():.0f} s of the budget left"})
            continue
        started = time.perf_counter()
        config, data = zoo.effective_config(model, zoo_args, out_dir)
        cache = out_dir / "cache" / model.name
        cache.mkdir(parents=True, exist_ok=True)
        warmed = zoo.warm(model, config, cache, out_dir, args.device, budget.timeout(zoo.WARMUP_TIMEOUT))
        if "error" in warmed:
            rows.append({"model": model.name, "error": warmed["error"]})
        else:
            rows.append(paired(model, config, cache, out_dir, list(data["buckets"]), args.pairs))
        budget.longest = max(budget.longest, time.perf_counter() - started)
        (out_dir / "paired.json").write_text(json.dumps(rows, indent=1))
    table = render(rows)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
