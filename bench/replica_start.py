"""How fast a fresh serving process starts, against the eager floor, on a GPU (numbers go to
docs/performance.md). Run by hand; bench/replica_start.sh runs it on a GPU machine without network access.

    python bench/replica_start.py OUT_DIR [--starts N] [--no-warm] [--cache-root DIR] [--device cuda|cpu]
                                  [--budget SECONDS] [--profile-loads] [--compare-early-imports]
                                  [--compare-late-triton-hash] [--compare KIND]
                                  [--switch-interval SECONDS]
                                  [CFG.yaml or name ...]
    # names: examples/<name>.yaml or bench/models/<name>.yaml;
    # default: one model of each family: mixnet_l (a conv net), t5_small (an encoder-decoder),
    # clip_b32 (text and image), gpt2_cache_bf16 (a decoder with its cache), vit_s16, bert_base
    # (an encoder); 3 starts of each kind

Per model, in one run, with the cache <cache root>/<name> (default cache root: OUT_DIR/cache):
  1. `orchestrate warmup --no-ray --device cuda --json` into it (unless --no-warm: already warm):
     the report in OUT_DIR/warmup-<name>.json, its wall seconds, each bucket's served variant.
  2. Fresh processes, N of each, one of each kind per start, the order reversed every other
     start (floor, replica; replica, floor; ...):
     - floor: bench/serving.py's eager floor, a plain PyTorch server: spawn, import torch and the
       model's module, build, each bucket once eagerly, synchronize (`ready_from_spawn`, with
       its milestones on the way: torch imported, the model's module imported, built); it reads
       no config (the parent resolves it), so this project's imports count on the replica's side;
     - replica: `runtime.load(cfg, cache_dir=..., ready="answering")`: spawn to answering (every
       bucket answers, eager until its planned variant is swapped in), then `wait_loaded()`:
       spawn to on plan (every bucket on its planned variant, or refused with a reason). Each
       bucket is answered through the runtime at its own inputs once answering and once on
       plan, and checked against the eager module with the warmup's gate (tolerance by dtype):
       max |err| per bucket. The child prints one JSON line and exits at once; the time from
       that line to the process reaped is `exit_seconds` (target: within 1 s).
     A process that fails or runs past its timeout is recorded with its stderr's tail; the
     others go on. OUT_DIR/logs/ keeps every process's stderr.
  3. Per model: floor, answering and on plan, median [min-max], their ratios to the floor
     (targets: answering <= 1.05x, on plan <= 1.25x) both as the ratio of the medians and as
     the median [min-max] of each start's own ratio (its replica over its floor), exit seconds
     (target <= 1 s); where the median replica's time went: its milestones with deltas, the
     median floor's beside them, per bucket variant, planned, load and capture seconds, reason.
Written as it goes to OUT_DIR/replica-<name>.json; the summary to stdout and
OUT_DIR/replica-summary.txt; a Markdown row per model to OUT_DIR/replica-table.md (a model's row
replaced when it is measured again into the same OUT_DIR).
--profile-loads: after the timed starts, one replica more whose loader's thread is sampled
(bench/stack_sampler.py: imports, loads, captures, checks, waits: where a bucket's load goes), per
window between two milestones, written to OUT_DIR/loads-<name>.txt (every sample beside it as
collapsed stacks, loads-<name>.txt.collapsed); its times are not among the figures.
--compare-early-imports: each start runs a second replica beside the first, the two taking turns
going first, whose loader imports the compiler (Inductor's compile_fx, what a saved function's first
load imports) right after its pull, beside the model's build, where a replica otherwise waits
until it answers: on a GPU part of the build (the weights' initialisation and copy, cuDNN's and
cuBLAS's first calls) runs outside the interpreter lock. The summary gives both kinds' answering,
on plan and slowest bucket load; the figures above it are the usual replica's.
--compare KIND (repeatable): the same, with a replica of each kind named beside the usual one:
early (as --compare-early-imports), late_hash (--compare-late-triton-hash: the loader leaves
Triton's build hash, which it computes beside the build, to the first load, as Inductor otherwise
does), late_isa (on the CPU, the loader leaves Inductor's probe of the CPU's vector instructions,
which it runs beside the compiler's imports, to the first load), with_compiler (saved functions
load importing Inductor's compiler, as torch's loader and their generated code do, where a replica
otherwise loads them with stand-ins for the names they read from it), with_copy (each load keeps
the deep copy of its function's state that torch makes for a later save, where a replica skips it),
compiling_source (each generated module Inductor loads is compiled from its source, where a
replica reads the bytecode warmup saved beside it), hashing_torch (Inductor hashes torch's sources
at the first kernel it loads, where a replica takes the key warmup saved in the namespace),
collecting_imports (the runtime's imports run under Python's full collections, as any process's,
and nothing is frozen after them, where a replica holds those collections off and freezes what the
imports made: jobs/collector.py's imports_frozen).
--switch-interval SECONDS: the replicas run with this interpreter switch interval (Python's is 5
ms): a thread that takes the interpreter lock back after a torch op waits up to that long for the
thread beside it (the loader's pull, or its imports) to let go.
--budget SECONDS: start nothing that would not end within that many seconds of this run's start
(each step is expected to take as long as the longest of its kind so far): the run ends with its
files written inside the limit of the call it runs in; what it skipped it says.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving import FLOOR, floor_recipe, run_python  # noqa: E402  (bench/serving.py: the eager floor, a fresh process)

MODELS = ["mixnet_l", "t5_small", "clip_b32", "gpt2_cache_bf16", "vit_s16", "bert_base"]
PROCESS_TIMEOUT = 600  # seconds a floor or replica process may take
WARMUP_TIMEOUT = 900
EXIT_WAIT = 60  # after its JSON line, a replica that has not exited by then is killed
TARGETS = {"answering": 1.05, "on_plan": 1.25, "exit": 1.0}
ENV = {"PYTHONUNBUFFERED": "1"}  # both kinds of process start the same way
# the replicas a --compare option runs beside the usual one: label, what their environment adds
COMPARED = {
    "early": ("imports beside the build", {"REPLICA_START_EARLY_IMPORTS": "1"}),
    "late_hash": ("Triton's build hashed at the first load", {"REPLICA_START_LATE_TRITON_HASH": "1"}),
    "late_isa": ("the CPU probed at the first load", {"REPLICA_START_LATE_ISA_PROBE": "1"}),
    "with_compiler": ("loads importing the compiler", {"REPLICA_START_WITH_COMPILER": "1"}),
    "with_copy": ("loads keeping a copy to save", {"REPLICA_START_WITH_COPY": "1"}),
    "compiling_source": ("generated modules compiled from source", {"REPLICA_START_COMPILING_SOURCE": "1"}),
    "hashing_torch": ("torch's sources hashed at the first load", {"REPLICA_START_HASHING_TORCH": "1"}),
    "collecting_imports": ("imports under full collections, nothing frozen", {"REPLICA_START_COLLECTING_IMPORTS": "1"}),
}

# argv: config, cache dir, device. Nothing is imported before runtime.load that it would not import
# itself: the time to answering is the replica's own.
REPLICA = r"""
import json, os, sys, time
if os.environ.get("REPLICA_START_SWITCH_INTERVAL"):  # --switch-interval
    sys.setswitchinterval(float(os.environ["REPLICA_START_SWITCH_INTERVAL"]))
profile_to = os.environ.get("REPLICA_START_PROFILE")
if profile_to:  # the loader's thread sampled: where its wall time goes, waits included
    sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
    from stack_sampler import ThreadSampler
from orchestrator.jobs import collector
if os.environ.get("REPLICA_START_COLLECTING_IMPORTS"):  # the runtime's imports collected as any process's
    import contextlib
    collector.imports_frozen = contextlib.nullcontext
# what a kind compared imports before the runtime (torch, with torch_internals), held and frozen as
# the runtime's own imports are: a kind differs from the usual replica only where it says
with collector.imports_frozen():
    if os.environ.get("REPLICA_START_EARLY_IMPORTS"):  # the loader imports the compiler after its pull, beside the build
        from orchestrator.jobs import replica as _replica, torch_internals as _ti
        _pull = _replica._Loader._pull
        def _pull_then_import(self):
            _pull(self)
            self._pull_done.set()  # the plans are known: the caller's answering must not wait for these imports
            if any(plan.get("variant") in _replica.COMPILED_VARIANTS for plan in self._plans.values()):
                _ti.import_compiler(to_compile=True)
                self.events.add("compiler imported early")
        _replica._Loader._pull = _pull_then_import
    if os.environ.get("REPLICA_START_LATE_TRITON_HASH"):  # Triton's build hashed at the first load, by Inductor
        from orchestrator.jobs import torch_internals as _ti
        _ti.hash_triton_build = lambda: False
    if os.environ.get("REPLICA_START_LATE_ISA_PROBE"):  # the CPU probed at the first load, by Inductor
        from orchestrator.jobs import torch_internals as _ti
        _ti.cpu_vector_isa_probe = lambda: (lambda: None)
    if os.environ.get("REPLICA_START_WITH_COMPILER"):  # saved functions load importing Inductor's compiler
        import contextlib
        from orchestrator.jobs import torch_internals as _ti
        _ti.compiler_left_out = contextlib.nullcontext
    if os.environ.get("REPLICA_START_WITH_COPY"):  # each load deep-copies its function's state, as torch's does
        import contextlib
        from orchestrator.jobs import torch_internals as _ti
        _ti.loaded_without_a_copy_to_save = contextlib.nullcontext
    if os.environ.get("REPLICA_START_COMPILING_SOURCE"):  # generated modules compiled from source, as torch does
        from orchestrator.jobs import torch_internals as _ti
        _ti.read_generated_bytecode = lambda: None
    if os.environ.get("REPLICA_START_HASHING_TORCH"):  # Inductor hashes torch's sources itself, at the first load
        from orchestrator.jobs import torch_internals as _ti
        _ti.take_torch_key = lambda directory: False
from orchestrator import runtime
if profile_to:  # from the load's start, as its milestones are timed
    loader_samples = ThreadSampler("orchestrate-replica-loader").start()
served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], device=sys.argv[3], ready="answering")
answering = served.info()
import torch
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.model import make_inputs
spec, device = served.spec, served.device
grid = bool(spec.grid)  # info() names a grid's buckets by point (`8x64`), a list's by size
inputs = {(part.point_label(bucket) if grid else bucket): make_inputs(part, bucket, device)
          for part in spec.slices() for bucket in part.buckets}

def answer():  # each bucket at its own inputs through the runtime, and the variant serving it just before
    out = {}
    for bucket, (args, kwargs) in inputs.items():
        variant = served.info().buckets[bucket].variant
        out[bucket] = (variant, snapshot(served(*args, **kwargs)))
    return out

early = answer()
served.wait_loaded()
on_plan = served.info()
late = answer()
gate = Gate.from_options(spec.check)
with torch.no_grad():  # the eager module only now: while buckets load, the runtime may be capturing a graph
    references = {bucket: snapshot(served.model(*args, **kwargs)) for bucket, (args, kwargs) in inputs.items()}

def check(bucket, answered):
    variant, got = answered
    want = references[bucket]
    error, worst = None, 0.0
    try:
        gate.compare(want, got, call=f"bucket {bucket} served by {variant}")
    except Exception as exc:
        error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    for a, b in zip(want, got):
        a, b = a.value, b.value
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.numel():
            dtype = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
            worst = max(worst, (a.to(dtype) - b.to(dtype)).abs().max().item())
    return {"variant": variant, "ok": error is None, "max_abs_error": worst, "error": error}

buckets = {}
for bucket, i in on_plan.buckets.items():
    buckets[bucket] = {
        "variant": i.variant, "planned": i.planned, "on_plan": i.on_plan, "on_plan_seconds": i.on_plan_seconds,
        "reason": i.reason, "load_seconds": i.load_seconds, "capture_seconds": i.capture_seconds,
        "cache_hits": i.cache_hits, "cache_misses": i.cache_misses,
        "answering_variant": answering.buckets[bucket].variant,
        "check_answering": check(bucket, early[bucket]), "check_on_plan": check(bucket, late[bucket]),
    }
row = {"answering_from_spawn": answering.answering_seconds_from_spawn,
       "on_plan_from_spawn": on_plan.on_plan_seconds_from_spawn,
       "buckets": buckets, "events": [list(event) for event in on_plan.events], "info": on_plan.to_dict()}
early = late = references = inputs = None
if profile_to:  # a window per milestone: from the one before it to it
    loader_samples.stop()
    marks = [("start", 0.0)] + [(what, at) for what, at in row["events"]]
    windows = [(f"{a} -> {b}", t0, t1) for (a, t0), (b, t1) in zip(marks, marks[1:])]
    with open(profile_to, "w") as out:
        out.write("events: " + json.dumps(row["events"]) + "\n" + loader_samples.report(windows))
    from pathlib import Path
    loader_samples.write_collapsed(Path(profile_to + ".collapsed"))
row["exit_requested_at"] = time.time()
print(json.dumps(row, default=str), flush=True)
sys.exit(0)
"""


class Budget:
    """Seconds left of --budget since this run started (infinite without one), and how long each
    kind of step has taken so far, so a step that would not fit is not started."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.started, self.seconds = time.monotonic(), seconds
        self.taken: dict[str, list[float]] = {}

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (time.monotonic() - self.started)

    def took(self, kind: str, seconds: float) -> None:
        self.taken.setdefault(kind, []).append(seconds)

    def fits(self, *kinds: str, first: float = 0.0) -> bool:
        """Whether one step of each kind fits, each as long as its longest so far (`first` before
        the first of its kind)."""
        return self.left() > sum(max(self.taken.get(kind, []), default=first) for kind in kinds)

    def timeout(self, limit: float) -> float:
        return max(1.0, min(limit, self.left()))


def resolve(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name).resolve()
        if not path.is_file():
            raise SystemExit(f"replica_start: no config {path}")
        return path
    for folder in (ROOT / "examples", ROOT / "bench" / "models"):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    raise SystemExit(f"replica_start: no examples/{name}.yaml or bench/models/{name}.yaml")


def tail(text: str, chars: int = 3000) -> str:
    return text[-chars:]


def warm(config: Path, name: str, cache: Path, out_dir: Path, device: str, budget: Budget) -> dict:
    """The warmup into `cache`: its wall seconds, per bucket its status and served variant."""
    report_path, log = out_dir / f"warmup-{name}.json", out_dir / "logs" / f"warmup-{name}.log"
    command = [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(config),
               "--device", device, "--cache-dir", str(cache), "--json"]  # fmt: skip
    started = time.perf_counter()
    with report_path.open("w") as stdout, log.open("w") as stderr:
        try:
            done = subprocess.run(
                command, stdout=stdout, stderr=stderr, timeout=budget.timeout(WARMUP_TIMEOUT), cwd=ROOT,
                env={**os.environ, **ENV},
            )  # fmt: skip
            code: Optional[int] = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    wall = time.perf_counter() - started
    budget.took("warmup", wall)
    row: dict[str, Any] = {"wall_seconds": wall, "exit": code, "log": str(log.relative_to(out_dir))}
    if code not in (0, 1):  # 1: a bucket failed, the others are in the report
        why = "timed out" if code is None else f"exit {code}"
        row["error"] = f"warmup {why} after {wall:.0f} s: {tail(log.read_text(), 1500)}"
        return row
    report = json.loads(report_path.read_text())
    row["report_wall_seconds"] = report.get("summary", {}).get("wall_seconds")
    row["buckets"] = {
        r["bucket"]: {
            "status": r["status"],
            "variant": r.get("variant"),
            "cache_state": r.get("cache_state"),
            "compile_seconds": r.get("compile_seconds"),
            "ms": {v: m.get("ms") for v, m in (r.get("variants") or {}).items() if m.get("ok")},
            "unavailable": {v: m.get("reason") for v, m in (r.get("variants") or {}).items() if not m.get("ok")},
            "error": r.get("error"),
        }
        for r in report["results"]
    }
    return row


def floor_start(recipe: str, budget: Budget) -> dict:
    """One eager floor's start, from its recipe (floor_recipe)."""
    started = time.perf_counter()
    try:
        row = run_python(FLOOR, recipe, timeout=int(budget.timeout(PROCESS_TIMEOUT)), env=ENV)
        row["ok"] = True
    except subprocess.TimeoutExpired as exc:
        row = {"ok": False, "error": f"timed out after {exc.timeout} s"}
    except Exception as exc:  # run_python raises the stderr's tail; one start's failure is a finding
        text = str(exc).strip()
        row = {"ok": False, "error": (text.splitlines() or [type(exc).__name__])[-1][:300], "stderr_tail": tail(text)}
    row["wall_seconds"] = time.perf_counter() - started
    budget.took("floor", row["wall_seconds"])
    return row


def replica_start(
    config: Path,
    cache: Path,
    device: str,
    log: Path,
    budget: Budget,
    profile_to: Optional[Path] = None,
    kind: str = "replica",
) -> dict:
    """A fresh process on the runtime; its JSON line, and how long it took to exit after it.
    `profile_to`: its loader's thread sampled, the report written there.
    `kind`: a replica as it is, or one of COMPARED's (what its loader does otherwise)."""
    timeout = budget.timeout(PROCESS_TIMEOUT)
    started = time.perf_counter()
    row: dict[str, Any] = {"ok": False, "log": log.name}
    with log.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", REPLICA, str(config), str(cache), device],
            stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1, cwd=ROOT,
            env={
                **os.environ,
                **ENV,
                **({"REPLICA_START_PROFILE": str(profile_to)} if profile_to else {}),
                **(COMPARED[kind][1] if kind in COMPARED else {}),
            },
        )  # fmt: skip
        lines: queue.Queue[Optional[tuple[float, str]]] = queue.Queue()

        def read() -> None:  # each line with when it arrived; None at the end of stdout
            assert child.stdout is not None
            for line in child.stdout:
                lines.put((time.perf_counter(), line))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        other: list[str] = []  # what else the child printed on stdout
        try:
            while True:
                item = lines.get(timeout=max(0.0, started + timeout - time.perf_counter()))
                if item is None:  # stdout closed without the line: it failed
                    child.wait(timeout=max(1.0, started + timeout - time.perf_counter()))
                    row["error"] = f"exit {child.returncode} before its JSON line"
                    break
                arrived, line = item
                result = _json_line(line)
                if result is None or "exit_requested_at" not in result:
                    other.append(line)
                    continue
                try:
                    child.wait(timeout=EXIT_WAIT)
                    reaped, reaped_at = time.perf_counter(), time.time()
                    row.update(ok=True, exit_seconds=reaped - arrived, exit_code=child.returncode)
                    row["exit_from_request"] = reaped_at - result["exit_requested_at"]
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    row["error"] = f"did not exit within {EXIT_WAIT} s of its JSON line; killed"
                    row["exit_seconds"] = None
                row.update(result)
                break
        except (queue.Empty, subprocess.TimeoutExpired):
            child.kill()
            child.wait()
            row["error"] = f"timed out after {timeout:.0f} s"
    row["wall_seconds"] = time.perf_counter() - started
    budget.took("replica", row["wall_seconds"])
    if other:
        row["stdout_other"] = tail("".join(other), 1500)
    if not row["ok"] or row.get("error"):
        row["stderr_tail"] = tail(log.read_text())
    return row


def _json_line(line: str) -> Optional[dict]:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def bench(
    config: Path,
    out_dir: Path,
    cache_root: Path,
    starts: int,
    warm_first: bool,
    device: str,
    budget: Budget,
    profile_loads: bool = False,
    compared: tuple[str, ...] = (),
) -> dict:
    name = config.stem
    cache = cache_root / name
    cache.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"model": name, "config": str(config), "device": device, "cache": str(cache)}
    result.update(starts={"floor": [], "replica": [], **{kind: [] for kind in compared}}, order=[], skipped=[])

    def save() -> None:
        (out_dir / f"replica-{name}.json").write_text(json.dumps(result, indent=2, default=str))

    if warm_first:
        if not budget.fits("warmup", first=60):
            result["skipped"].append("warmup and every start: the budget is spent")
            save()
            return result
        print(f"{name}: warmup ...", file=sys.stderr, flush=True)
        result["warmup"] = warm(config, name, cache, out_dir, device, budget)
        save()
        if "error" in result["warmup"]:
            return result
    kinds = ["replica", *compared]
    recipe = floor_recipe(config, device)  # the config read once, in this process: the floor reads none
    for i in range(starts):
        if not budget.fits("floor", *(["replica"] * len(kinds))):
            result["skipped"].append(f"starts {i + 1}..{starts}: the budget would run out")
            break
        # the floor and the replicas take turns going first, so that a machine that drifts over a
        # start (its clocks, its page cache) favours neither side of a start's own ratio
        sequence = ["floor", *kinds]
        if i % 2:
            sequence.reverse()
        print(f"{name}: start {i + 1}/{starts}: {', '.join(sequence)} ...", file=sys.stderr, flush=True)
        for kind in sequence:
            if kind == "floor":
                run = floor_start(recipe, budget)
            else:
                log = out_dir / "logs" / f"{kind}-{name}-{i + 1}.log"
                run = replica_start(config, cache, device, log, budget, kind=kind)
            result["starts"][kind].append(run)
            result["order"].append(kind)
            save()
    if profile_loads and budget.fits("replica"):
        # one more replica, its loader sampled, outside the figures (the sampler takes the interpreter lock)
        profiled = out_dir / f"loads-{name}.txt"
        log = out_dir / "logs" / f"replica-{name}-profiled.log"
        result["profiled"] = replica_start(config, cache, device, log, budget, profile_to=profiled)
        result["profiled"]["profile"] = profiled.name
        save()
    return result


def spread(values: list[float]) -> str:
    """`median s [min-max]`."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]"


def median_run(runs: list[dict], key: str) -> Optional[dict]:
    """The run at the median of `key` (the lower one of an even count)."""
    ranked = sorted((r for r in runs if r.get(key) is not None), key=lambda r: r[key])
    return ranked[(len(ranked) - 1) // 2] if ranked else None


def served_label(result: dict) -> str:
    """The variants serving each bucket once on plan (from the median replica, else the warmup's
    report), e.g. `aot` or `1:aot 8:graphed 32:eager (planned aot)`."""
    run = median_run(ok_replicas(result), "on_plan_from_spawn")
    if run:
        rows = dict(run["buckets"])
        parts = {
            b: r["variant"] + ("" if r.get("planned") in (None, r["variant"]) else f" (planned {r['planned']})")
            for b, r in rows.items()
        }
    else:
        report = (result.get("warmup") or {}).get("buckets") or {}
        parts = {b: str(r.get("variant")) for b, r in report.items()}
    if not parts:
        return "?"
    if len(set(parts.values())) == 1:
        return next(iter(parts.values()))
    return " ".join(f"{b}:{v}" for b, v in sorted(parts.items(), key=lambda item: size_order(item[0])))


def size_order(bucket: object) -> list[int]:
    """A bucket (`8`) or a grid's point (`8x64`, as JSON keys both) in order of its sizes."""
    return [int(size) for size in str(bucket).split("x")]


def ok_replicas(result: dict) -> list[dict]:
    return [r for r in result["starts"]["replica"] if r.get("ok")]


def figures(result: dict) -> dict[str, list[float]]:
    floors = [r["ready_from_spawn"] for r in result["starts"]["floor"] if r.get("ok")]
    return {"floor": floors, **replica_figures(ok_replicas(result))}


def replica_figures(replicas: list[dict]) -> dict[str, list[float]]:
    """Seconds to answering and to on plan from spawn, and to exit, of each replica that has them."""
    return {
        "answering": [r["answering_from_spawn"] for r in replicas if r.get("answering_from_spawn") is not None],
        "on_plan": [r["on_plan_from_spawn"] for r in replicas if r.get("on_plan_from_spawn") is not None],
        "exit": [r["exit_seconds"] for r in replicas if r.get("exit_seconds") is not None],
    }


def ratio(values: list[float], floor: list[float]) -> Optional[float]:
    return statistics.median(values) / statistics.median(floor) if values and floor else None


def paired_ratios(result: dict, key: str) -> list[float]:
    """Each start's own ratio: its replica's `key` over its floor, the two run one right after the
    other. On a machine whose starts drift, these show what the ratio of medians averages away."""
    # strict=False: a run cut short may end with a start's first process alone
    pairs = zip(result["starts"]["floor"], result["starts"]["replica"], strict=False)
    return [
        replica[key] / floor["ready_from_spawn"]
        for floor, replica in pairs
        if floor.get("ok") and replica.get("ok") and replica.get(key) is not None
    ]


def ratio_spread(values: list[float]) -> str:
    """`median [min-max]` of ratios, `-` for none."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def verdict(value: Optional[float], target: float) -> str:
    return "" if value is None else ("met" if value <= target else "MISSED")


def summary(result: dict) -> list[str]:
    name = result["model"]
    warmup = result.get("warmup")
    head = f"## {name} ({len(result['starts']['replica'])} starts; serves {served_label(result)}"
    if warmup:
        head += f"; warmup {warmup['wall_seconds']:.1f} s"
    lines = [head + ")"]
    if warmup and "error" in warmup:
        return lines + [f"warmup FAILED: {warmup['error']}"]
    if warmup:
        for bucket, row in warmup["buckets"].items():
            served = row["variant"]
            ms = row["ms"].get(served)
            lines.append(
                f"  warmup bucket {bucket}: {row['status']}, serves {served}"
                + (f" {ms:.3f} ms" if ms is not None else "")
                + f", eager {row['ms'].get('eager', float('nan')):.3f} ms; cache {row['cache_state']}"
                + "".join(f"; {v} unavailable: {(why or '')[:120]}" for v, why in row["unavailable"].items())
                + (f"; error {row['error'][:200]}" if row.get("error") else "")
            )
    if not result["order"]:  # no process started
        return lines + [f"  skipped {what}" for what in result["skipped"]]
    f = figures(result)
    a, p = ratio(f["answering"], f["floor"]), ratio(f["on_plan"], f["floor"])
    exit_median = statistics.median(f["exit"]) if f["exit"] else None
    lines += [
        f"  eager floor  {spread(f['floor'])}",
        f"  answering    {spread(f['answering'])}"
        + (f"  {a:.2f}x floor (target <= {TARGETS['answering']}x: {verdict(a, TARGETS['answering'])})" if a else ""),
        f"  on plan      {spread(f['on_plan'])}"
        + (f"  {p:.2f}x floor (target <= {TARGETS['on_plan']}x: {verdict(p, TARGETS['on_plan'])})" if p else ""),
        f"  per start, each replica over its start's floor: answering "
        f"{ratio_spread(paired_ratios(result, 'answering_from_spawn'))}, on plan "
        f"{ratio_spread(paired_ratios(result, 'on_plan_from_spawn'))}",
        f"  exit         {spread(f['exit'])}"
        + (
            f"  (target <= {TARGETS['exit']:.0f} s: {verdict(exit_median, TARGETS['exit'])})"
            if exit_median is not None
            else ""
        ),
    ]
    lines += compared_kinds(result, f["floor"])
    lines += where_the_time_went(result)
    lines += correctness(result)
    for kind in result["starts"]:
        for i, run in enumerate(result["starts"][kind], 1):
            if not run.get("ok") or run.get("error"):
                lines.append(f"  {kind} #{i} FAILED: {run.get('error')}")
                detail = [line for line in (run.get("stderr_tail") or "").strip().splitlines() if line != run["error"]]
                lines += [f"    {line}" for line in detail[-6:]]
    lines += [f"  skipped {what}" for what in result["skipped"]]
    return lines


def compared_kinds(result: dict, floor: list[float]) -> list[str]:
    """With a --compare option: the usual replicas against those of each kind compared, and each
    kind's slowest bucket load (the first, with the imports)."""
    kinds = [(COMPARED[kind][0], result["starts"][kind]) for kind in result["starts"] if kind in COMPARED]
    if not kinds:
        return []
    lines = []
    for label, runs in [("the usual replica", ok_replicas(result)), *kinds]:
        runs = [r for r in runs if r.get("ok")]
        f = replica_figures(runs)
        slowest = [max((row.get("load_seconds") or 0.0 for row in r["buckets"].values()), default=0.0) for r in runs]
        a, p = ratio(f["answering"], floor), ratio(f["on_plan"], floor)
        lines.append(
            f"  {label}: answering {spread(f['answering'])} ({'-' if a is None else f'{a:.2f}x'}), on plan "
            f"{spread(f['on_plan'])} ({'-' if p is None else f'{p:.2f}x'}), slowest bucket load {spread(slowest)}"
        )
    return lines


def where_the_time_went(result: dict) -> list[str]:
    run = median_run(ok_replicas(result), "on_plan_from_spawn") or median_run(
        ok_replicas(result), "answering_from_spawn"
    )
    if run is None:
        return []
    index = result["starts"]["replica"].index(run) + 1
    events = [(str(e[0]), float(e[1])) for e in run.get("events") or []]
    answered = dict(events).get("answering")
    # load's start, from spawn: interpreter, imports, until runtime.load began (a grid's events
    # name their slices, so its info says it)
    offset = (run.get("info") or {}).get("load_started_from_spawn")
    if offset is None and answered is not None and run.get("answering_from_spawn"):
        offset = run["answering_from_spawn"] - answered
    lines = [f"  where the time went (replica #{index}, the median on plan):"]
    if offset is not None:
        lines.append(f"    {offset:7.2f} s  spawn -> runtime.load called (interpreter, imports)")
    before = 0.0
    for milestone, at in events:
        since = f"{offset + at:7.2f} s from spawn" if offset is not None else f"{at:7.2f} s from load"
        lines.append(f"    +{at - before:6.2f} s  {milestone}  ({since})")
        before = at
    floor = median_run([r for r in result["starts"]["floor"] if r.get("ok")], "ready_from_spawn")
    if floor and floor.get("milestones_from_spawn"):
        marks = [*floor["milestones_from_spawn"].items(), ("ready", floor["ready_from_spawn"])]
        lines.append(
            f"    beside it, the median floor (start {result['starts']['floor'].index(floor) + 1}), from spawn: "
            + ", ".join(f"{milestone} {at:.2f} s" for milestone, at in marks)
        )
    for bucket, row in sorted(run["buckets"].items(), key=lambda item: size_order(item[0])):
        settled = row.get("on_plan_seconds")
        lines.append(
            f"    bucket {bucket}: {row['variant']} (planned {row['planned']}; answered first by "
            f"{row.get('answering_variant')}), load {row['load_seconds']:.2f} s, capture {row['capture_seconds']:.2f} s, "
            f"settled {'-' if settled is None else f'{settled:.2f} s'} from load, "
            f"cache {row.get('cache_hits')} hits/{row.get('cache_misses')} misses"
            + (f"; reason: {row['reason']}" if row.get("reason") else "")
        )
    return lines


def correctness(result: dict) -> list[str]:
    """The largest error per stage over every replica, and every check that failed."""
    lines, worst = [], {"check_answering": 0.0, "check_on_plan": 0.0}
    for i, run in enumerate(ok_replicas(result), 1):
        for bucket, row in run["buckets"].items():
            for stage in worst:
                check = row.get(stage) or {}
                worst[stage] = max(worst[stage], check.get("max_abs_error") or 0.0)
                if not check.get("ok", True):
                    lines.append(
                        f"  MISMATCH replica #{i} bucket {bucket} {stage[6:]} ({check.get('variant')}): {check.get('error')}"
                    )
    if ok_replicas(result):
        lines.insert(
            0,
            f"  correct against eager: max |err| answering {worst['check_answering']:.1e}, on plan "
            f"{worst['check_on_plan']:.1e}" + ("" if lines else "; every check within the gate's tolerance"),
        )
    return lines


def table_row(result: dict) -> str:
    f = figures(result)
    a, p = ratio(f["answering"], f["floor"]), ratio(f["on_plan"], f["floor"])

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} s" if values else "-"

    return (
        f"| {result['model']} ({served_label(result)}) | {len(f['floor'])} | {med(f['floor'])} | "
        f"{med(f['answering'])} | {med(f['on_plan'])} | {'-' if a is None else f'{a:.2f}x'} | "
        f"{'-' if p is None else f'{p:.2f}x'} | {ratio_spread(paired_ratios(result, 'answering_from_spawn'))} | "
        f"{ratio_spread(paired_ratios(result, 'on_plan_from_spawn'))} | {med(f['exit'])} |"
    )


TABLE_HEAD = [
    "| model (variant served) | starts | eager floor | answering | on plan | answering/floor | on plan/floor "
    "| per start: answering/floor | per start: on plan/floor | exit |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def write_table(path: Path, result: dict) -> None:
    """The table with this model's row added, or put in place of its earlier one."""
    rows = path.read_text().splitlines()[len(TABLE_HEAD) :] if path.exists() else []
    rows = [r for r in rows if r.startswith("| ") and r[2:].split()[0:1] != [result["model"]]]
    path.write_text("\n".join([*TABLE_HEAD, *rows, table_row(result)]) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("models", nargs="*", metavar="CFG_OR_NAME")
    parser.add_argument("--starts", type=int, default=3, help="fresh processes of each kind (default 3)")
    parser.add_argument("--no-warm", action="store_true", help="the cache is warm already: no warmup")
    parser.add_argument("--cache-root", type=Path, help="cache dir per model below it (default OUT_DIR/cache)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget", type=float, help="seconds: start nothing that would end later")
    parser.add_argument(
        "--profile-loads", action="store_true", help="then one replica more, its loader's thread sampled"
    )
    parser.add_argument(
        "--compare",
        action="append",
        choices=list(COMPARED),
        default=[],
        help="per start one replica more of this kind, the kinds taking turns going first: "
        + "; ".join(f"{kind}: {label}" for kind, (label, _) in COMPARED.items()),
    )
    parser.add_argument(  # the names earlier runs were made with
        "--compare-early-imports", action="append_const", dest="compare", const="early", help="--compare early"
    )
    parser.add_argument(
        "--compare-late-triton-hash",
        action="append_const",
        dest="compare",
        const="late_hash",
        help="--compare late_hash",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="seconds: the replicas' interpreter switch interval (sys.setswitchinterval; Python's is 0.005), "
        "how long a thread that wants the interpreter lock back waits for another to drop it",
    )
    args = parser.parse_intermixed_args()
    if args.switch_interval:
        ENV["REPLICA_START_SWITCH_INTERVAL"] = str(args.switch_interval)
    configs = [resolve(name) for name in args.models or MODELS]
    out_dir = args.out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    cache_root = (args.cache_root or out_dir / "cache").resolve()
    budget = Budget(args.budget)
    lines: list[str] = []
    for config in configs:
        try:
            result = bench(
                config,
                out_dir,
                cache_root,
                args.starts,
                not args.no_warm,
                args.device,
                budget,
                args.profile_loads,
                tuple(dict.fromkeys(args.compare)),
            )
            block = summary(result)
            if result["order"]:
                write_table(out_dir / "replica-table.md", result)
        except Exception as exc:  # one model's failure must not lose the others' numbers
            block = [f"## {config.stem}: FAILED {type(exc).__name__}: {exc}"]
        print("\n".join(block), flush=True)
        lines += block
        (out_dir / "replica-summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
