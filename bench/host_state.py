"""What a process's own state does to the latency of host-bound calls: the same eager call of the
same model timed in a compiling warmup process at each step of its life, and in fresh processes.

    python bench/host_state.py OUT_DIR [--only NAME[,NAME]] [--budget SECONDS]

Per model (bench/zoo.py's configs and settings), three processes, each timing eager at every
bucket (blocks of 40 calls, 5 rounds, CUDA events after a synchronize, medians; as bench/fidelity.py):
  - warmup: the engine's Session as `warmup --no-ray` drives it, timed after the model is built
    (`built`), after every bucket compiled (`compiled`), after Inductor's compile workers are shut
    down (`workers shut`), after the objects alive are frozen out of the collector (`gc frozen`),
    with the collector off (`gc off`); then the engine's own benchmark, whose eager figure the
    report would carry (`report`); then a model built after all that (`a model built now`), and
    the first model again after `torch._dynamo.reset()` and an emptied CUDA cache (`Dynamo reset`);
  - plain: a fresh process that builds the model and calls it, nothing else;
  - replica: a fresh process after `runtime.load(ready="planned")`, as bench/fidelity.py's probe.
During each timing the process's threads and child processes are sampled for CPU, and its
collector's objects, monitoring tools, torch-function modes and Dynamo frame callback recorded. Each `plain`
process runs four times, and twice more pinned to one core: how far fresh processes of the same
model disagree with each other.

Output: OUT_DIR/host_state.json and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import zoo  # noqa: E402

CHILD = r"""
import gc, json, os, statistics, sys, time
from pathlib import Path
role, config, cache = sys.argv[1:4]
if "@" in role:  # pinned to one core before anything starts
    role, core = role.split("@")
    os.sched_setaffinity(0, {int(core)})
import torch
from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model, make_inputs, resolve_device

TICK = os.sysconf("SC_CLK_TCK")

def ticks(stat_path):
    try:
        text = open(stat_path).read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[1])  # utime+stime, ppid

def snapshot():
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        t = ticks(f"/proc/self/task/{tid}/stat")
        if t:
            try:
                name = open(f"/proc/self/task/{tid}/comm").read().strip()
            except OSError:
                name = "?"
            threads[tid] = (name, t[0])
    procs, parents = {}, {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            t = ticks(f"/proc/{pid}/stat")
            if t:
                procs[pid], parents[pid] = t[0], str(t[1])
    mine, frontier = set(), {str(os.getpid())}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return threads, {p: procs[p] for p in mine}

def busy(before, after, seconds):
    t0, c0 = before
    t1, c1 = after
    threads = sorted(((t1[tid][0], (t1[tid][1] - t0[tid][1]) / TICK / seconds) for tid in t1 if tid in t0), key=lambda x: -x[1])
    children = sum(c1[p] - c0.get(p, c1[p]) for p in c1) / TICK / seconds
    return {"threads": [[n, round(f, 3)] for n, f in threads if f >= 0.02], "thread_count": len(t1),
            "children": len(c1), "children_cpu": round(children, 3)}

CUDA = torch.cuda.is_available()

def timed(fn, block=40, rounds=5, untimed=3):
    for _ in range(untimed):
        fn()
    if not CUDA:
        host = []
        for _ in range(rounds * block):
            h = time.perf_counter()
            fn()
            host.append((time.perf_counter() - h) * 1e3)
        host.sort()
        return {"ms": statistics.median(host), "p10": host[len(host) // 10], "p90": host[(9 * len(host)) // 10], "host_ms": statistics.median(host)}
    ev, host = [], []
    for _ in range(rounds):
        for _ in range(block):
            torch.cuda.synchronize()
            stream = torch.cuda.current_stream()  # looked up outside the sample (jobs/timing.py)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h = time.perf_counter()
            s.record(stream)
            fn()
            e.record(stream)
            e.synchronize()
            host.append((time.perf_counter() - h) * 1e3)
            ev.append(s.elapsed_time(e))
    ev.sort()
    return {"ms": statistics.median(ev), "p10": ev[len(ev) // 10], "p90": ev[(9 * len(ev)) // 10], "host_ms": statistics.median(host)}

spec = load_spec(config)
out = {"role": role, "states": {}, "facts": {}}

def measure(state, fns):
    before = snapshot()
    started = time.perf_counter()
    with torch.no_grad():
        row = {b: timed(fn) for b, fn in fns.items()}
    seconds = time.perf_counter() - started
    row["cpu"] = busy(before, snapshot(), seconds)
    row["gc"] = {"objects": len(gc.get_objects()), "counts": gc.get_count(), "collections": [s["collections"] for s in gc.get_stats()]}
    # what could slow a host-bound call beside the collector: monitoring tools (Python 3.12 on),
    # torch-function modes left on, a Dynamo frame callback left set
    monitoring = getattr(sys, "monitoring", None)
    row["process"] = {"monitoring": [monitoring.get_tool(i) for i in range(6) if monitoring.get_tool(i)] if monitoring else None,
                      "torch_function_modes": torch._C._len_torch_function_stack(),
                      "dynamo_callback": repr(torch._C._dynamo.eval_frame.get_eval_frame_callback())[:80]}
    out["states"][state] = row
    print(f"{role}: {state}: " + ", ".join(f"b{b} {row[b]['ms']:.3f}" for b in fns), file=sys.stderr, flush=True)

def eager_calls(model, device):
    fns = {}
    for b in spec.buckets:
        args, kwargs = make_inputs(spec, b, device)
        fns[b] = (lambda a=args, k=kwargs: model(*a, **k))
    return fns

out["facts"] = {"affinity": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(), "switch_interval": sys.getswitchinterval()}
if role == "plain":
    device = resolve_device(spec.device)
    model = build_model(spec, device)
    measure("plain", eager_calls(model, device))
elif role == "replica":
    from orchestrator import runtime
    served = runtime.load(config, cache_dir=cache, ready="planned")
    measure("replica", eager_calls(served.model, served.device))
    fns = {}
    for b in spec.buckets:
        args, kwargs = make_inputs(spec, b, served.device)
        fns[b] = (lambda a=args, k=kwargs: served(*a, **k))
    measure("replica: runtime", fns)
else:
    from orchestrator.config import cache_root, embedded_store, load_spec_with_overrides
    from orchestrator.jobs.engine import Session
    spec = load_spec_with_overrides(config, cache_dir=cache)
    root = cache_root(spec)
    session = Session(spec, root, fresh=True, remote=embedded_store(root, False), build_ahead=spec.buckets)
    measure("built", eager_calls(session.model, session.device))
    for b in spec.buckets:
        session.warm(b, benchmark=False)
    session.close()
    measure("compiled", eager_calls(session.model, session.device))
    from torch._inductor import async_compile
    async_compile.shutdown_compile_workers()
    time.sleep(1)
    measure("workers shut", eager_calls(session.model, session.device))
    gc.collect()
    gc.freeze()
    measure("gc frozen", eager_calls(session.model, session.device))
    gc.disable()
    measure("gc off", eager_calls(session.model, session.device))
    gc.enable()
    gc.unfreeze()
    report = {}
    for b in spec.buckets:
        r = session.benchmark(b)
        report[b] = {"eager_ms": r.eager_ms, "served": r.variant, "served_ms": r.served_ms,
                     "variants": {n: v.ms for n, v in r.variants.items()}}
    out["report"] = report
    session.publish()
    measure("a model built now", eager_calls(build_model(spec, session.device), session.device))
    torch._dynamo.reset()
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    measure("Dynamo reset", eager_calls(session.model, session.device))
print(json.dumps(out, default=str), flush=True)
os._exit(0)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", default="distilbert_fp16,gpt2_cache_bf16,two_input_linear")
    parser.add_argument("--budget", type=float, default=480)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    out_dir = zoo.output_folder(args.out_dir)
    zoo_args = argparse.Namespace(buckets=None, device=args.device, set=[])
    started = time.monotonic()
    results = []
    for model in zoo.select([t for t in args.only.split(",") if t]):
        config, _ = zoo.effective_config(model, zoo_args, out_dir)
        cache = out_dir / "cache" / model.name
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        row = {"model": model.name}
        for role in ("warmup", "replica", "plain", "plain", "plain", "plain", "plain@1", "plain@0"):
            label = role if role not in row else f"{role} {sum(r.split(' ')[0] == role for r in row)}"
            left = args.budget - (time.monotonic() - started)
            if left < 20:
                row[label] = {"error": "budget spent"}
                continue
            log = out_dir / "logs" / f"{model.name}-{label.replace(' ', '').replace('@', '-')}.log"
            done = zoo.run(
                [sys.executable, "-c", CHILD, role, str(config), str(cache)], log, min(300, left), capture=True
            )
            line = next((x for x in reversed(done["stdout"].splitlines()) if x.startswith("{")), None)
            row[label] = json.loads(line) if line else {"error": f"exit {done['exit']}: {zoo.last_line(log)}"}
        results.append(row)
        (out_dir / "host_state.json").write_text(json.dumps(results, indent=1, default=str))
    for row in results:
        print(f"## {row['model']}")
        for role in [k for k in row if k != "model"]:
            data = row.get(role) or {}
            if "error" in data:
                print(f"- {role}: {data['error']}")
                continue
            for state, values in data.get("states", {}).items():
                cells = ", ".join(
                    f"b{k} {v['ms']:.3f} [{v['p10']:.3f}-{v['p90']:.3f}] host {v['host_ms']:.3f}"
                    for k, v in values.items()
                    if isinstance(v, dict) and "ms" in v
                )
                print(f"- {role} / {state}: {cells}; cpu {values['cpu']}")
            if "report" in data:
                print(f"- report: {data['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
