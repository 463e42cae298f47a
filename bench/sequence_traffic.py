"""Requests of every length: what a grid of batch x seq buckets serves, against the alternatives.

    python bench/sequence_traffic.py OUT_DIR [--models encoder,decoder] [--requests 2000] [--budget SECONDS]
                                     [--methods grid,hand-replayed graph per exact shape,...]
                                     [--batches 1,8,32] [--seqs 32,64,128,256] [--dynamic]

Per model (a Hugging Face encoder called with its attention mask; a decoder padded on the right,
its logits read at the real positions; both built from configs with random weights, MiniLM-sized):
  1. `orchestrate warmup --no-ray` of a grid config (batch 1, 8, 32 x seq 32, 64, 128, 256 unless
     `--batches` and `--seqs` say otherwise; `--dynamic`: compiled once with symbolic sizes, a
     graph captured per point), and of a list config whose sequence is the longest (what a user
     of the list form does: every request padded to the longest length).
  2. A fresh process replays one traffic: `--requests` requests, lengths long-tailed (a log-normal
     of median 60, cut to 1..256) and batch sizes 1..32 (a log-uniform draw), through
       - eager at the exact shape;
       - `torch.compile(dynamic=True)` (mode default);
       - the list-form replica, every request padded to 256 by hand, cut back;
       - the grid replica (`runtime.load`), which pads to the point that costs least;
       - the same through `borrow()`: the answer left in the graph's buffers, as the floor's is;
       - a CUDA graph per exact shape, no padding at all (`torch.compile(mode="reduce-overhead",
         dynamic=True)`: cudagraph trees record one per shape seen, and pay their bookkeeping and
         the shape guards at every call);
       - the floor (CUDA only): `torch.compile(dynamic=True)`'s code captured by hand in a CUDA
         graph per exact shape, replayed with the request copied in and its outputs left in the
         graph's buffers. No runtime serving these shapes can answer faster.
     `--methods` chooses among them (eager, the reference of every check, always runs; the list
     form is warmed only where it is chosen).
     A first pass calls each method once per distinct request shape, at the shape's first request
     (compiles, recompiles, recordings and the libraries' first call at a shape happen there,
     untimed); the second is timed, the methods interleaved request by request: per request
     the wall time from the call to its outputs ready on the host's side (a synchronize), p50 and
     p99, and throughput as requests over the summed latencies; `host p50` is the time until the
     call returned, before the synchronize: the host's own work per request, the device's queued
     (a method whose host work is longer than its device work waits on neither); `device
     allocations` counts the caching allocator's calls into the driver during the timed pass (each
     a request that found no cached block). Every answer of every method is
     checked (untimed) at its exact shape with the correctness gate as warmup applies it: against
     the model run in float64 on the same request, its error held to a multiple of eager's own;
     `checked` counts those that passed.
  3. Padding waste: of the positions (rows x seq) computed, the fraction that was padding.

Output: OUT_DIR/sequence_traffic.json and a Markdown table on stdout; each process's stderr in
OUT_DIR/logs (the traffic probe's says how long each first pass took and how far the timed pass
got). On a device whose outputs come back only two folders deep and a few files at a time, give
OUT_DIR outside them and copy back the JSON and logs/traffic-*.log. On the H200 one model's run of
2,000 requests took 500-530 s with eager, dynamic, the list form, the grid and the reduce-overhead
graphs, and 340 s with eager, dynamic, the grid and the floor: give each model a call of its own.
A run that ends early (its budget, a crash) keeps in its row how far it got (`partial`). A cold
warmup of a 24-point grid took 252 s on an H100, and the probe's first passes, then over every
request rather than every distinct shape (2,000 against about 1,300), 226 s more: where
one call cannot hold both, call again on the machine kept warm with `--reuse-warmup`, which skips
a warmup whose report (of the same config) and cache OUT_DIR already holds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "encoder": ("bert", {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6,
                         "intermediate_size": 1536, "max_position_embeddings": 512}),
    "decoder": ("gpt2", {"vocab_size": 50257, "n_positions": 512, "n_embd": 384, "n_layer": 6, "n_head": 6}),
}  # fmt: skip
BATCHES, SEQS = [1, 8, 32], [32, 64, 128, 256]
METHODS = ["compile(dynamic=True)", "padded to the longest", "grid", "grid (borrow)", "graph per exact shape",
           "hand-replayed graph per exact shape"]  # fmt: skip


TINY = {"encoder": {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                    "intermediate_size": 64, "max_position_embeddings": 512},
        "decoder": {"vocab_size": 30522, "n_positions": 512, "n_embd": 32, "n_layer": 1, "n_head": 2}}  # fmt: skip


def config(
    name: str,
    grid: bool,
    out_dir: Path,
    device: str = "cuda",
    batches: list[int] = BATCHES,
    seqs: list[int] = SEQS,
    dynamic: bool = False,
) -> Path:
    """The model's config: the grid of `batches` x `seqs`, or the list form padded to the longest
    of `seqs`; `dynamic`: the grid compiled once with symbolic sizes (`compile.dynamic`)."""
    factory, kwargs = MODELS[name]
    if device != "cuda":
        kwargs = TINY[name]
    data = {
        "name": f"{name}-{'grid' if grid else 'longest'}",
        "model": {"factory": f"{ROOT / 'examples' / 'huggingface.py'}:{factory}", "kwargs": kwargs,
                  "dtype": "float16" if device == "cuda" else None},
        "inputs": [
            {"name": "input_ids", "shape": ["batch", "seq" if grid else max(seqs)], "dtype": "int64",
             "range": [1, 30000], "pad": 0},
            {"name": "attention_mask", "shape": ["batch", "seq" if grid else max(seqs)], "dtype": "int64",
             "range": [1, 2], "pad": 0},
        ],
        "buckets": {"batch": batches, "seq": seqs} if grid else batches,
        "compile": {"mode": "default", "dynamic": dynamic and grid},
        "serve": {"variants": ["eager", "compiled", "graphed"] if device == "cuda" else ["eager", "compiled"],
                  "outputs": ["logits"] if name == "decoder" else None},
        "call": {"kwargs": {"use_cache": False}} if name == "decoder" else {"kwargs": {}},
        "bench": {"iterations": 40, "warmup": 5},
        "device": device,
    }  # fmt: skip
    if data["serve"]["outputs"] is None:
        del data["serve"]["outputs"]
    path = out_dir / "configs" / f"{data['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# argv: grid config, longest config, cache dir, requests, device, methods (comma-separated).
# JSON lines on stdout, the last one whole.
PROBE = r"""
import json, math, statistics, sys, time
import torch
from orchestrator import runtime
from orchestrator.config import load_spec
from orchestrator.jobs.engine import Float64Twin
from orchestrator.jobs.gate import Gate, snapshot

grid_config, longest_config, cache, requests, device = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
chosen = sys.argv[6].split(",")
CUDA = device == "cuda"
sync = torch.cuda.synchronize if CUDA else (lambda: None)

def device_allocations():
    # the caching allocator's calls into the driver (cudaMalloc): one in the timed pass is a request
    # that found no cached block of its size, and costs the host far more than a launch
    return torch.cuda.memory_stats().get("num_device_alloc", 0) if CUDA else 0
began = time.perf_counter()
grid = runtime.load(grid_config, cache_dir=cache, ready="planned")
longest = runtime.load(longest_config, cache_dir=cache, ready="planned") if "padded to the longest" in chosen else None
print(f"replicas on plan in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
model = grid.model
LONGEST = max(load_spec(grid_config).grid["seq"])
gate = Gate.from_options(load_spec(grid_config).check)
# what the gate judges an answer against, as at warmup: the model in float64 at the request's exact
# size (a float16 answer held to eager's fixed tolerance fails on a few rounding steps in millions)
twin = Float64Twin(model)
def float64_of(request):
    return snapshot(plain(twin(**request)))

generator = torch.Generator().manual_seed(0)
lengths = torch.exp(torch.randn(requests, generator=generator) * 0.8 + math.log(60)).round().clamp(1, LONGEST).long()
batches = torch.exp(torch.rand(requests, generator=generator) * math.log(32)).floor().clamp(1, 32).long()
traffic = []
for n, s in zip(batches.tolist(), lengths.tolist()):
    ids = torch.randint(1, 30000, (n, s), generator=generator).to(device)
    traffic.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

def padded_to_longest(request):
    n, s = request["input_ids"].shape
    pad = lambda t: torch.nn.functional.pad(t, (0, LONGEST - s))
    out = longest(**{k: pad(v) for k, v in request.items()})
    # the outputs along the sequence cut back; the others (a pooled output) kept whole
    cut = lambda v: v[:, :s] if v.dim() > 1 and v.shape[1] == LONGEST else v
    return {k: cut(v) for k, v in out.items()} if isinstance(out, dict) else cut(out)

def plain(out):  # a model's output class and a replica's dict of the same outputs compare alike
    return dict(out) if isinstance(out, dict) else out

# Dynamo's recompile limit is per thread: the replicas' loaders raised theirs, not this one's, and
# the model's frame holds every point's entry already
from orchestrator.jobs import torch_internals as ti
ti.allow_recompiles(64)
dynamic = torch.compile(model, dynamic=True)
bound = torch.compile(model, dynamic=True, mode="reduce-overhead" if CUDA else "default")
def graph_per_shape(request):
    if CUDA:
        ti.cudagraph_trees_on_this_thread()  # the replicas' loader threads may have imported the trees first
        torch.compiler.cudagraph_mark_step_begin()
    out = bound(**request)
    return snapshot_tree(out)

# The floor: the same dynamic compiled code captured by hand in one CUDA graph per exact shape,
# replayed with the request copied in and the outputs left in the graph's buffers. No padding, no
# guards, no bookkeeping: what no runtime serving these shapes can beat.
# The graphs share one pool and none owns its outputs: each keeps views that do not hold their
# memory (as CUDA-graph trees keep theirs), so the next capture reuses it, and the pool stays the
# size of the largest graph, not the sum of a thousand (a decoder's logits are tens of MB a
# shape). An answer is read before the next replay, as every method's is here.
graphs, pool = {}, torch.cuda.graph_pool_handle() if CUDA else None
def unowned(tensor):
    storage = torch._C._construct_storage_from_data_pointer(
        tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes())
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())
def hand_graph(request):
    shape = tuple(request["input_ids"].shape)
    if shape not in graphs:
        static = {k: v.clone() for k, v in request.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                dynamic(**static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            captured = plain(dynamic(**static))
        out = ({k: unowned(v) if isinstance(v, torch.Tensor) else v for k, v in captured.items()}
               if isinstance(captured, dict) else unowned(captured))
        del captured  # its memory back to the pool, for the next capture
        graphs[shape] = (graph, static, out)
    graph, static, out = graphs[shape]
    for name, value in request.items():
        static[name].copy_(value)
    graph.replay()
    return out

from orchestrator.jobs.grid import snapshot_tree
methods = {
    "eager": lambda r: model(**r),
    "compile(dynamic=True)": lambda r: dynamic(**r),
    "padded to the longest": padded_to_longest,
    "grid": lambda r: grid(**r),
    "grid (borrow)": lambda r: grid.borrow(**r),  # its answer read before the next call: no copy out
    "graph per exact shape": graph_per_shape,
    "hand-replayed graph per exact shape": hand_graph,
}
methods = {name: fn for name, fn in methods.items() if name in chosen or name == "eager"}  # eager: the reference
seconds = {}
errors = {name: 0.0 for name in methods}
mismatches = {}
checked = {}  # answers that passed the gate at the exact shape, by method
judged = {}  # what the gate judged them against: float64, or eager where the model has no float64 run
with torch.no_grad():
    failed = {}
    shapes = {}  # each distinct shape's first request: what a first pass calls
    for request in traffic:
        shapes.setdefault(tuple(request["input_ids"].shape), request)
    print(f"{len(shapes)} distinct shapes in {len(traffic)} requests", file=sys.stderr, flush=True)
    for name, fn in list(methods.items()):  # first passes: compiles, recompiles, recordings
        began = time.perf_counter()
        try:
            # cudagraph trees warm a new shape at its first call and record it at its second
            for i, request in enumerate(list(shapes.values()) * (2 if name == "graph per exact shape" else 1)):
                if i % 500 == 499:
                    print(f"{name}: first pass at {i + 1} in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
                fn(request)
            sync()
        except Exception as exc:  # the other methods are still measured; the row says why not this one
            failed[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            del methods[name]
            continue
        seconds[name] = time.perf_counter() - began
        print(f"{name}: first pass {seconds[name]:.1f} s", file=sys.stderr, flush=True)
        # a line the parent keeps should the timed pass outlast the budget
        print(json.dumps({"first_pass_s": seconds, "failed": failed}), flush=True)
    latency = {name: [] for name in methods}
    host = {name: [] for name in methods}  # ms until the call returned: the host's work, the device's queued
    allocations = dict.fromkeys(methods, 0)
    timed_from = time.perf_counter()
    for i, request in enumerate(traffic):
        if i % 250 == 0:  # where the time goes, should the run outlast its budget
            print(f"timed and checked {i} of {len(traffic)} in {time.perf_counter() - timed_from:.1f} s",
                  file=sys.stderr, flush=True)
        order = list(methods) if i % 2 == 0 else list(methods)[::-1]
        answers = {}
        for name in order:
            sync()
            allocated = device_allocations()
            began = time.perf_counter()
            out = methods[name](request)
            returned = time.perf_counter()
            sync()
            latency[name].append((time.perf_counter() - began) * 1e3)
            allocations[name] += device_allocations() - allocated
            host[name].append((returned - began) * 1e3)
            answers[name] = snapshot(plain(out))  # every answer checked, untimed
        exact = float64_of(request)
        for name, answer in answers.items():
            try:
                verdict = gate.compare(answers["eager"], answer, call=f"{name} at {tuple(request['input_ids'].shape)}",
                                       float64=exact)
                judged[name] = verdict.reference
                errors[name] = max(errors[name], verdict.max_abs_error or 0.0)
                checked[name] = checked.get(name, 0) + 1
            except Exception as exc:
                mismatches.setdefault(name, str(exc)[:300])

computed = {"grid": 0, "padded to the longest": 0}  # padded positions, by method
real = 0
for request in traffic:
    n, s = request["input_ids"].shape
    real += n * s
    index = grid._choose(n, {"seq": s})
    part = grid.slices[index][0]
    fits = [b for b in part.buckets if b >= n]
    rows = fits[0] if fits else part.buckets[-1] * math.ceil(n / part.buckets[-1])
    computed["grid"] += rows * part.fixed["seq"]
    batches = longest.spec.buckets if longest is not None else [1]
    fits = [b for b in batches if b >= n]
    computed["padded to the longest"] += (fits[0] if fits else batches[-1] * math.ceil(n / batches[-1])) * LONGEST
computed["grid (borrow)"] = computed["grid"]  # the same points, its answers not copied

def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]

rows = {}
for name, values in latency.items():
    rows[name] = {"p50_ms": statistics.median(values), "p99_ms": quantile(values, 0.99),
                  "requests_per_s": 1e3 * len(values) / sum(values), "first_pass_s": seconds[name],
                  "host_p50_ms": statistics.median(host[name]), "device_allocations": allocations[name],
                  "max_abs_error": errors[name], "mismatch": mismatches.get(name),
                  "checked": checked.get(name, 0), "judged_against": judged.get(name)}
for name in computed:
    if name in methods:
        rows[name]["padding_waste"] = 1 - real / computed[name]
for name, why in failed.items():
    rows[name] = {"error": why}
print(json.dumps({"rows": rows, "requests": len(traffic), "median_seq": int(lengths.median()),
                  "info": {k: v.variant for k, v in grid.info().buckets.items()}}), flush=True)
import os
os._exit(0)
"""


def run(command: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    with log.open("w") as sink:
        return subprocess.run(command, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=ROOT, timeout=timeout)


def probe_result(stdout: str, ended: str) -> dict[str, Any]:
    """The probe's last JSON line: its result where it has its rows, else `ended` (how the probe
    ended) and, as `partial`, the first passes' seconds if it got that far."""
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith("{")), None)
    found = json.loads(line) if line else {}
    return found if "rows" in found else {"error": ended, **({"partial": found} if found else {})}


def traffic_arguments(doc: str, requests: int) -> argparse.ArgumentParser:
    """What every traffic benchmark takes: where its output goes, how many requests, the seconds
    it may run and the device (cpu: a check of the script with tiny models)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--budget", type=float, default=540)
    parser.add_argument("--device", default="cuda", help="cpu: a check of this script with tiny models")
    return parser


def main() -> int:
    parser = traffic_arguments(__doc__, 2000)
    parser.add_argument("--models", default="encoder,decoder")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated, of: " + ", ".join(METHODS) + " (eager, the reference, always runs)",
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="the grid's batch sizes")
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)), help="the grid's sequence lengths")
    parser.add_argument("--dynamic", action="store_true", help="the grid compiled once with symbolic sizes")
    parser.add_argument(
        "--reuse-warmup",
        action="store_true",
        help="skip a config's warmup where OUT_DIR holds its report (same config) and its cache: a second "
        "call on a machine kept warm, after a first that ran out of time past its warmup",
    )
    args = parser.parse_args()
    if str(ROOT) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(ROOT))
    from orchestrator.config import ConfigError, load_spec, parse_buckets

    shape: dict[str, Any] = {"dynamic": args.dynamic}
    for option, text in (("batches", args.batches), ("seqs", args.seqs)):
        try:
            shape[option] = parse_buckets(text)  # the sizes as --buckets takes them
        except ConfigError as exc:
            parser.error(f"--{option} {text!r}: {exc}")
    methods = args.methods.split(",")
    if unknown := [name for name in methods if name not in METHODS]:
        parser.error(f"--methods: unknown {', '.join(map(repr, unknown))}; choose among {', '.join(METHODS)}")
    if "hand-replayed graph per exact shape" in methods and "compile(dynamic=True)" not in methods:
        parser.error("--methods: the hand-replayed graphs capture compile(dynamic=True)'s code: choose it too")
    if args.device != "cuda" and "hand-replayed graph per exact shape" in methods:
        methods.remove("hand-replayed graph per exact shape")  # a CUDA graph, captured by hand
    out_dir = args.out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {}
    for name in args.models.split(","):
        left = args.budget - (time.monotonic() - started)
        if left < 60:
            results[name] = {"error": f"skipped: {left:.0f} s of the budget left"}
            continue
        cache = out_dir / "cache"
        warm = {}
        for grid in (True, False) if "padded to the longest" in methods else (True,):
            path = config(name, grid, out_dir, args.device, **shape)
            began = time.perf_counter()
            earlier = out_dir / f"warmup-{path.stem}.json"
            if args.reuse_warmup and earlier.is_file() and (out_dir / "cache").is_dir():
                report, spec = json.loads(earlier.read_text()), load_spec(path)
                points = sorted(part.point_label(b) for part in spec.slices() for b in part.buckets)
                # a grid's identity leaves its sizes out (each point is a bucket of a slice): both are compared
                if report.get("config_hash") == spec.identity_hash() and sorted(report.get("points") or []) == points:
                    warm[path.stem] = {"exit": 0, "seconds": 0.0, "reused": True,
                                       "compile_seconds": report["summary"]["compile_seconds_total"]}  # fmt: skip
                    print(f"{path.stem}: warmup reused ({earlier.name})", file=sys.stderr, flush=True)
                    continue
            try:
                done = run([sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(path),
                            "--cache-dir", str(cache), "--json"], out_dir / "logs" / f"warmup-{path.stem}.log", left)  # fmt: skip
            except subprocess.TimeoutExpired:  # the budget ran out: the model's row says so
                warm[path.stem] = {"exit": "timeout", "seconds": time.perf_counter() - began}
                break
            warm[path.stem] = {"exit": done.returncode, "seconds": time.perf_counter() - began}
            if done.returncode == 0:
                report = json.loads(done.stdout)
                (out_dir / f"warmup-{path.stem}.json").write_text(json.dumps(report, indent=1))
                warm[path.stem]["compile_seconds"] = report["summary"]["compile_seconds_total"]
            print(
                f"{path.stem}: warmup exit {done.returncode} in {warm[path.stem]['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        if any(w["exit"] != 0 for w in warm.values()):
            results[name] = {"warmup": warm, "error": "a warmup failed or ran out of the budget (logs/warmup-*.log)"}
            (out_dir / "sequence_traffic.json").write_text(json.dumps(results, indent=1))
            continue
        left = args.budget - (time.monotonic() - started)
        grid_path = config(name, True, out_dir, args.device, **shape)
        longest_path = config(name, False, out_dir, args.device, **shape)
        try:
            done = run([sys.executable, "-c", PROBE, str(grid_path), str(longest_path), str(cache), str(args.requests),
                        args.device, ",".join(methods)],
                       out_dir / "logs" / f"traffic-{name}.log", max(left, 30))  # fmt: skip
            ended = f"exit {done.returncode}"
            if done.returncode:  # its reason is the last line of its log
                said = (out_dir / "logs" / f"traffic-{name}.log").read_text().strip().splitlines()
                ended += f": {said[-1][:200]}" if said else ""
            results[name] = {"warmup": warm, **probe_result(done.stdout, ended)}
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            results[name] = {"warmup": warm, **probe_result(out, "timed out")}
        (out_dir / "sequence_traffic.json").write_text(json.dumps(results, indent=1))
    lines = ["| model | method | p50 ms | p99 ms | host p50 ms | device allocations | requests/s | padding waste | first pass s | max abs error | passed the gate |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, result in results.items():
        if "rows" not in result:
            lines.append(f"| {name} | {result.get('error')} | | | | | | | | | |")
            continue
        for method, row in result["rows"].items():
            if "error" in row:
                lines.append(f"| {name} | {method}: {row['error'][:120]} | | | | | | | | | |")
                continue
            waste = f"{row['padding_waste']:.1%}" if "padding_waste" in row else ""
            passed = f"{row.get('checked', 0)} of {result.get('requests')}, against {row.get('judged_against')}"
            if row.get("mismatch"):
                passed += f"; first failure: {row['mismatch'][:160]}"
            lines.append(f"| {name} | {method} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['host_p50_ms']:.3f} | "
                         f"{row.get('device_allocations', '-')} | {row['requests_per_s']:.0f} | "
                         f"{waste} | {row['first_pass_s']:.1f} | {row['max_abs_error']:.2g} | {passed} |")  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
