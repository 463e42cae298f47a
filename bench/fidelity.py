"""Do the warmup report's figures hold up? Each model is warmed as the zoo warms it, then a fresh
process re-times it by a method of its own and prints every report figure against that timing.

    python bench/fidelity.py OUT_DIR [--only NAME[,NAME]] [--budget SECONDS] [--probes N] [zoo.py's options]

Per model (bench/zoo.py's configs, settings and cold `warmup --no-ray`), a fresh process loads the
replica with `runtime.load(ready="planned")`, then per bucket builds the functions to time:
  - eager: the replica's own module;
  - every variant the report measured that this process can rebuild from the warm cache:
    `compiled` (outputs copied where they replay into buffers, as warmup times it), `graphed` and
    `eager-graphed` (captured whole), `aot` where the replica serves it;
  - runtime: the replica's call; borrowed: `borrow()`, the graph's buffers themselves;
  - hand replay: the served variant's own CUDA graph, inputs copied in and `replay()`, nothing
    copied out: the floor a runtime can reach;
  - the hand replay with the copy out alone beside it: the runtime's own copy of the graph's
    outputs, a clone per output tensor, and one `torch._foreach_copy_` per dtype into one new
    contiguous tensor; and how the outputs lie (tensors, MB, how many are contiguous, how the
    copy groups them), which says what the copy launches.
Each is timed in blocks of 40 consecutive calls, rounds interleaved with the order reversed each
round, a CUDA event pair around each call after a synchronize, after 3 untimed calls, until 5
rounds ran with the host at full speed (a host meter of its own, read before every block: see
SLOWED), on the core where that meter reads best, chosen again after a slowed round; the figure
is the median of those rounds' calls, and of all rounds' beside. This timer is written here on
purpose, apart from orchestrator.jobs.timing: it is the check on that one.

With `--probes N`, N probes time each model, each a fresh process, one after another: every
independent figure is the median of theirs, their rounds are pooled for the like reading, a figure
is checked only where every probe had 3 rounds at full speed, and a column gives the spread of
eager and of the runtime over the probes ((largest - smallest) / median): how far a figure moves
from one process to the next, which no single process on either side can tell.

With `--compare-fresh`, a second cold `warmup --no-ray` (a cache of its own) times its buckets in
a fresh process that loads them from the warm cache (`bench.process: fresh`), and its report is
compared with the same independent timing: rows named "(timed in a fresh process)".

Output: OUT_DIR/fidelity.json and OUT_DIR/fidelity.md (also printed): per model and bucket, each
report figure over its independent timing (eager, every variant, served, speedup), and the
runtime's and borrow's cost over the hand replay, in µs and %. A figure outside the tolerance
(±10% below 0.1 ms, else ±5%) is marked ✗ where the probe had 3 rounds at full speed, and ? where
it had not (its figure is then a slowed host's, no check); a line below the table counts both.
fidelity.json keeps each probe round's slowest host reading beside its medians, and the table
gives the host's speed each side's figures were timed at (the report's `host_reading_us` and
`host_best_us`, the probe's own meter over its kept rounds). Host-bound figures compare only at
like readings, so the last column gives the report's eager figure over the probe's rounds whose
reading, taken where the report takes its own, lies within 5% of the report's.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
import zoo  # noqa: E402  (bench/zoo.py: configs, settings and the warmup process)

BLOCK, ROUNDS, UNTIMED = 40, 5, 3
# The host meter (a check of its own on orchestrator.jobs.timing's): a round whose slowest reading
# is over SLOWED times the best reading of the process (two seconds of readings first, then every
# block's) ran on a slowed host and is timed again, on the core that reads fastest then (which cores
# are slowed changes within seconds), up to MAX_ROUNDS rounds in all; the figures are
# the medians of the rounds at full speed, and of all rounds beside.
SLOWED, MAX_ROUNDS = 1.25, 16

# argv: config, cache dir, report. One JSON line on stdout.
PROBE = r"""
import json, os, statistics, sys, time
import torch
from orchestrator import runtime
from orchestrator.jobs import copies, trees, torch_internals as ti
from orchestrator.jobs.model import make_inputs
from orchestrator.jobs.graphs import GraphedCall
from orchestrator.jobs.variants import replays_into_buffers

BLOCK, ROUNDS, UNTIMED, MAX_ROUNDS = (int(v) for v in sys.argv[4:8])
SLOWED = float(sys.argv[8])
config, cache, report = sys.argv[1:4]
records = {r["bucket"]: r for r in json.load(open(report))["results"] if r.get("status") == "ok"}
served = runtime.load(config, cache_dir=cache, device="cuda", ready="planned")
spec, model, device = served.spec, served.model, served.device
stream = torch.cuda.current_stream()

BEST = [float("inf")]  # the best reading in this process: the host at full speed

def host_us():
    # the host's speed now: the best of three runs of a fixed loop of pure Python
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        total = 0
        for i in range(1000):
            total += i * i
        best = min(best, time.perf_counter() - began)
    BEST[0] = min(BEST[0], best * 1e6)
    return best * 1e6

for _ in range(200):  # two seconds of readings before anything is timed
    host_us()
    time.sleep(0.01)

ALLOWED = sorted(os.sched_getaffinity(0))  # before any pinning

def fastest_core():
    # the cores of a shared host are not alike (bench/paired_processes.py): time on the one where
    # this meter reads best, read round-robin over the allowed cores
    allowed = ALLOWED
    best = {core: float("inf") for core in allowed}
    for _ in range(5):
        for core in allowed:
            os.sched_setaffinity(0, {core})
            best[core] = min(best[core], host_us())
    chosen = min(best, key=best.get)
    os.sched_setaffinity(0, {chosen})
    return chosen, {core: round(us, 1) for core, us in best.items()}

def timed(fns):
    ti.wait_for_compile_workers()  # the pool Inductor starts at this process's own compiles, as warmup waits for it
    core, by_core = fastest_core()
    try:
        return timed_on_core(fns) + ({"core": core, "meter_by_core_us": by_core},)  # the core first chosen
    finally:
        os.sched_setaffinity(0, set(ALLOWED))

def timed_on_core(fns):
    for fn in fns.values():
        for _ in range(UNTIMED):
            fn()
    names = list(fns)
    # per round: its samples by name, the host reading before each block and after the round, and
    # the slowest of those readings, which says whether the round ran at full speed
    rounds = []
    at_full_speed = lambda r: r["slowest"] <= SLOWED * BEST[0]
    while True:
        samples, before = {}, {}
        for name in names if len(rounds) % 2 == 0 else names[::-1]:
            before[name] = host_us()
            fn, taken = fns[name], []
            for _ in range(BLOCK):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                fn()
                end.record(stream)
                end.synchronize()
                taken.append(start.elapsed_time(end))
            samples[name] = taken
        after = host_us()
        rounds.append({"samples": samples, "before": before, "after": after, "slowest": max([*before.values(), after])})
        full_speed = [r for r in rounds if at_full_speed(r)]
        if len(full_speed) >= ROUNDS or len(rounds) >= MAX_ROUNDS:
            break
        if not at_full_speed(rounds[-1]):  # the core slowed meanwhile: on to the fastest one now
            fastest_core()
    kept = full_speed if len(full_speed) >= 3 else rounds
    median = lambda chosen, name: statistics.median([ms for r in chosen for ms in r["samples"][name]])
    # each round's readings beside its medians: how far a slowed host moved each figure
    by_round = [{"host_us": round(r["slowest"], 1),
                 "ms": {name: round(statistics.median(r["samples"][name]), 5) for name in names},
                 "before": {name: round(us, 1) for name, us in r["before"].items()}, "after": round(r["after"], 1)}
                for r in rounds]
    return ({name: median(kept, name) for name in names}, {name: median(rounds, name) for name in names},
            {"rounds": len(rounds), "slowed": len(rounds) - len(full_speed), "full_speed": len(full_speed) >= 3,
             "reading_us": round(statistics.median(r["slowest"] for r in kept), 1), "best_us": round(BEST[0], 1),
             "by_round": by_round})

def hand_replay(graphed, args, kwargs):
    # the captured graph itself: its static inputs filled one copy each, replayed, nothing copied out
    statics = [a for a in graphed.args if isinstance(a, torch.Tensor)] + [v for v in graphed.kwargs.values() if isinstance(v, torch.Tensor)]
    values = [a for a in args if isinstance(a, torch.Tensor)] + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    graph = graphed.graph
    def run():
        for s, v in zip(statics, values):
            s.copy_(v, non_blocking=True)
        graph.replay()
    return run

def copy_parts(graphed, copy, run):
    # the copy out alone, beside the hand replay: the tool's copy of the graph's own outputs, a
    # clone per output tensor (the plainest copy), and one new tensor per dtype filled by
    # torch._foreach_copy_ (PyTorch's multi-tensor kernels); and how the tool's copy plans them
    tensors = [leaf for _, leaf in trees.leaves(graphed.outputs) if isinstance(leaf, torch.Tensor)]
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    def foreach():
        for group in by_dtype.values():
            flat = torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device)
            torch._foreach_copy_(list(torch._C._nn.unflatten_dense_tensors(flat, group)), group)
    fns = {"replay + copy": lambda: (run(), copy(graphed.outputs)),
           "replay + clones": lambda: (run(), [t.clone() for t in tensors]),
           "replay + foreach": lambda: (run(), foreach())}
    plan = getattr(copy, "_plan", None)
    layout = {"tensors": len(tensors), "contiguous": sum(t.is_contiguous() for t in tensors),
              "mb": round(sum(t.numel() * t.element_size() for t in tensors) / 1e6, 2),
              "grouped": [len(g) for g in plan._groups] if plan is not None else None,
              "alone": len(plan._alone) if plan is not None else None,
              "not_contiguous": [[list(t.shape), list(t.stride())] for t in tensors if not t.is_contiguous()][:3]}
    return fns, layout

out = {"buckets": {}}
compiled_fns = {}
def compiled_fn(variant):
    if variant not in compiled_fns:
        ti.match_a_plain_process()
        compiled_fns[variant] = torch.compile(model, **ti.variant_compile_kwargs(spec.compile, variant))
    return compiled_fns[variant]

with torch.no_grad():
    for bucket, record in sorted(records.items()):
        args, kwargs = make_inputs(spec, bucket, device)
        route = served._routes[bucket]
        fns = {"eager": lambda: model(*args, **kwargs)}
        skipped = {}
        for name, measure in (record.get("variants") or {}).items():
            if name == "eager" or not measure.get("ok") or measure.get("ms") is None:
                continue
            try:
                if name == "compiled":
                    fn = compiled_fn("compiled")
                    fn(*args, **kwargs)
                    copy = copies.copier(None, replays_into_buffers("compiled", spec, "cuda"))
                    fns[name] = (lambda fn=fn, copy=copy: copy(fn(*args, **kwargs))) if copy else (lambda fn=fn: fn(*args, **kwargs))
                elif name in ("graphed", "eager-graphed"):
                    fn = model if name == "eager-graphed" else compiled_fn("graphed")
                    call = GraphedCall(fn, args, kwargs)
                    copy = copies.copier(call, True)
                    fns[name] = lambda call=call, copy=copy: copy(call(*args, **kwargs))
                elif name == "aot" and route.variant == "aot":
                    copy = route.copy
                    fns[name] = (lambda r=route.runner, copy=copy: copy(r(*args, **kwargs))) if copy else (lambda r=route.runner: r(*args, **kwargs))
                else:
                    skipped[name] = "not rebuilt here (only where it serves)"
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"[:300]
        fns["runtime"] = lambda: served(*args, **kwargs)
        fns["borrowed"] = lambda: served.borrow(*args, **kwargs)
        layout = None
        if isinstance(route.runner, GraphedCall):
            fns["hand replay"] = hand_replay(route.runner, args, kwargs)
            if route.copy is not None:
                parts, layout = copy_parts(route.runner, route.copy, fns["hand replay"])
                fns.update(parts)
        ms, ms_all, host, cores = timed(fns)
        out["buckets"][bucket] = {"served": route.variant, "ms": ms, "ms_all": ms_all, "host": host, "skipped": skipped,
                                  "outputs": layout, **cores}
print(json.dumps(out), flush=True)
os._exit(0)
"""


def probe(model: zoo.Model, config: Path, cache: Path, report: Path, out_dir: Path, timeout: float, n: int = 0) -> dict:
    log = out_dir / "logs" / (f"probe-{model.name}.log" if n == 0 else f"probe-{model.name}-{n + 1}.log")
    argv = [sys.executable, "-c", PROBE, str(config), str(cache), str(report)]
    argv += [str(v) for v in (BLOCK, ROUNDS, UNTIMED, MAX_ROUNDS, SLOWED)]
    done = zoo.run(argv, log, timeout, capture=True)
    line = next((x for x in reversed(done["stdout"].splitlines()) if x.startswith("{")), None)
    if line is None:
        return {"error": f"probe exit {done['exit']}: {zoo.last_line(log)}"}
    return json.loads(line)


def combined(timings: list[dict]) -> dict:
    """Several probes' timings as one: per bucket each figure the median over the probes (each a
    fresh process), their rounds pooled for the like reading, and each figure's spread over the
    probes beside: how far the independent timing itself moves from one process to the next."""
    if len(timings) == 1 or any("error" in t for t in timings):
        return next((t for t in timings if "error" in t), timings[0])
    out: dict[str, Any] = {"buckets": {}}
    for bucket, first in timings[0]["buckets"].items():
        each = [t["buckets"][bucket] for t in timings]
        names = [name for name in first["ms"] if all(name in b["ms"] for b in each)]
        hosts = [b["host"] for b in each]
        out["buckets"][bucket] = {
            **first,
            "ms": {name: statistics.median(b["ms"][name] for b in each) for name in names},
            "ms_all": {name: statistics.median(b["ms_all"][name] for b in each) for name in names},
            "host": {
                **hosts[0],
                "rounds": sum(h["rounds"] for h in hosts),
                "slowed": sum(h["slowed"] for h in hosts),
                "full_speed": all(h.get("full_speed", True) for h in hosts),
                "reading_us": statistics.median(h["reading_us"] for h in hosts),
                "best_us": min(h["best_us"] for h in hosts),
                "by_round": [r for h in hosts for r in h.get("by_round") or []],
            },
            "probes": [b["ms"] for b in each],
        }
    return out


def probe_spread(timing: dict, name: str) -> Optional[float]:
    """(largest - smallest) / median of one figure over the probes; None with one probe."""
    figures = [ms[name] for ms in timing.get("probes") or [] if name in ms]
    return (max(figures) - min(figures)) / statistics.median(figures) if len(figures) > 1 else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def compare(record: dict, timing: dict) -> dict:
    """Every report figure over its independent timing, and the runtime's cost over the floor."""
    ms = timing["ms"]
    row: dict[str, Any] = {
        "bucket": record["bucket"],
        "served": record.get("variant"),
        "runtime_serves": timing["served"],
    }
    row["eager"] = ratio(record.get("eager_ms"), ms.get("eager"))
    row["eager_all_rounds"] = ratio(record.get("eager_ms"), timing["ms_all"].get("eager"))
    row["host"] = {
        "report": [record.get("host_slowed_rounds"), record.get("bench_rounds")],
        "independent": [timing["host"]["slowed"], timing["host"]["rounds"]],
        # fewer than 3 rounds at full speed: the probe's figures are a slowed host's, no check of the report's
        "independent_full_speed": timing["host"].get("full_speed", True),
        "independent_best_us": timing["host"].get("best_us"),
        # the host's speed each side's figures were timed at: its meter's median reading over the
        # rounds kept (µs; the report's meter and the probe's run the same loop), and its best
        "report_us": [record.get("host_reading_us"), record.get("host_best_us")],
        "independent_us": [timing["host"].get("reading_us"), timing["host"].get("best_us")],
        "independent_by_round": timing["host"].get("by_round"),
        "core": timing.get("core"),
        "meter_by_core_us": timing.get("meter_by_core_us"),
    }
    row["eager_like_reading"], row["like_rounds"] = at_like_reading(record, timing["host"])
    row["probe_spread"] = {name: probe_spread(timing, name) for name in ("eager", "runtime")}
    row["probes"] = len(timing.get("probes") or [None])
    row["variants"] = {
        name: ratio((record["variants"].get(name) or {}).get("ms"), ms[name])
        for name in ms
        if name in (record.get("variants") or {}) and name != "eager"
    }
    row["served_vs_runtime"] = ratio(record.get("served_ms"), ms.get("runtime"))
    row["speedup"] = ratio(record.get("served_speedup"), ratio(ms.get("eager"), ms.get("runtime")))
    row["ms"] = ms
    row["outputs"] = timing.get("outputs")
    floor = ms.get("hand replay")
    if floor:
        for name in ("runtime", "borrowed", "replay + copy", "replay + clones", "replay + foreach"):
            if name not in ms:
                continue
            row[f"{name}_over_floor_us"] = (ms[name] - floor) * 1e3
            row[f"{name}_over_floor"] = ms[name] / floor - 1
    return row


def verdict(value: Optional[float], eager_ms: float, checked: bool) -> str:
    """'' within the tolerance (±10% below 0.1 ms, else ±5%), '✗' outside it, '?' outside it where
    the probe found no 3 rounds at full speed (its figure is a slowed host's: no check), '-' none."""
    if value is None:
        return "-"
    limit = 0.10 if eager_ms < 0.1 else 0.05
    return "" if abs(value - 1) <= limit else ("✗" if checked else "?")


LIKE = 0.05  # a probe round whose host reading is within this of the report's is at a like speed


def at_like_reading(record: dict, host: dict) -> tuple[Optional[float], int]:
    """The report's eager figure over the probe's, from the probe rounds whose slowest host reading
    at the report's places lies within LIKE of the report's (`host_reading_us`): the two timed at
    a like host speed, whatever each side counted as full speed. None where fewer than 3 rounds
    qualify."""
    reading = record.get("host_reading_us")
    rounds = host.get("by_round") or []
    if not reading or not record.get("eager_ms"):
        return None, 0
    like = [r["ms"]["eager"] for r in rounds if abs(at_reports_places(r, record) / reading - 1) <= LIKE]
    if len(like) < 3:
        return None, len(like)
    return record["eager_ms"] / statistics.median(like), len(like)


def at_reports_places(round_: dict, record: dict) -> float:
    """A probe round's slowest reading among those taken where the report's rounds take theirs:
    before the blocks of eager and of each variant the report timed, and after the round. The
    probe times more functions a round, and the slowest of more readings runs higher."""
    before = round_.get("before")
    if not before:
        return round_["host_us"]
    timed_there = {"eager", *(record.get("variants") or {})}
    return max([us for name, us in before.items() if name in timed_there] + [round_["after"]])


def within(value: Optional[float], eager_ms: float, checked: bool = True) -> str:
    if value is None:
        return "-"
    mark = verdict(value, eager_ms, checked)
    return f"{value:.3f}" + (f" {mark}" if mark else "")


def tally(rows: list[dict]) -> str:
    """How many of the report's eager, served and speedup figures the probe confirmed, contradicted
    at full speed, or could not check."""
    marks = []
    for row in rows:
        if "error" in row:
            continue
        checked = row["host"].get("independent_full_speed", True)
        eager_ms = row["ms"]["eager"]
        marks += [
            verdict(row["eager"], eager_ms, checked),
            verdict(row["served_vs_runtime"], row["ms"]["runtime"], checked),
            verdict(row["speedup"], eager_ms, checked),
        ]
    confirmed, contradicted, unchecked = marks.count(""), marks.count("✗"), marks.count("?")
    return (
        f"\nEager, served and speedup figures: {confirmed} confirmed, {contradicted} outside the tolerance "
        f"with the probe at full speed (✗), {unchecked} outside it with the probe's host slowed (?: no check).\n"
    )


def render(rows: list[dict]) -> str:
    head = (
        "| model | bucket | served | eager ms (indep.) | report/indep.: eager (all rounds) | variants | served/runtime "
        "| speedup | runtime − hand replay | borrowed − hand replay | copy alone: tool's · clones · foreach | "
        "host slowed: report · indep. | host µs (kept · best): report · indep. | eager at a like reading | "
        "probes' spread: eager · runtime |\n"
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    )
    lines = [head]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | | | | {row['error'][:200]} | | | | | | | | | | |")
            continue
        eager_ms = row["ms"]["eager"]
        checked = row["host"].get("independent_full_speed", True)
        variants = ", ".join(f"{k} {within(v, row['ms'].get(k, 1), checked)}" for k, v in row["variants"].items())

        def over(name: str) -> str:
            if f"{name}_over_floor_us" not in row:
                return "-"
            return f"{row[f'{name}_over_floor_us']:+.1f} µs ({row[f'{name}_over_floor'] * 100:+.1f}%)"

        def slowed(side: str) -> str:
            done, rounds = row["host"][side]
            return "-" if rounds is None else f"{done}/{rounds}"

        def speed(side: str) -> str:
            kept, best = row["host"].get(f"{side}_us") or (None, None)
            return "-" if kept is None or best is None else f"{kept:.1f} · {best:.1f}"

        def like() -> str:
            value, rounds = row.get("eager_like_reading"), row.get("like_rounds", 0)
            return f"{value:.3f} ({rounds} rounds)" if value is not None else f"- ({rounds} rounds)"

        def copy_alone() -> str:
            if "replay + copy_over_floor_us" not in row:
                return "-"
            found = row["outputs"]
            tool, clones = row["replay + copy_over_floor_us"], row["replay + clones_over_floor_us"]
            bare = row["replay + foreach_over_floor_us"]
            plan = f"{found['tensors']} tensors, {found['mb']} MB, {found['contiguous']} contiguous"
            if found.get("grouped") is not None:
                plan += f", grouped {found['grouped']}, alone {found['alone']}"
            return f"{tool:+.1f} · {clones:+.1f} · {bare:+.1f} µs ({plan})"

        def spread() -> str:
            found = row.get("probe_spread") or {}
            if found.get("eager") is None:
                return "-"
            shown = " · ".join("-" if found.get(k) is None else f"{found[k]:.1%}" for k in ("eager", "runtime"))
            return f"{shown} ({row['probes']} probes)"

        all_rounds = row.get("eager_all_rounds")
        lines.append(
            f"| {row['model']} | {row['bucket']} | {row['runtime_serves']} | {eager_ms:.3f} | "
            f"{within(row['eager'], eager_ms, checked)} ({'-' if all_rounds is None else f'{all_rounds:.3f}'}) | "
            f"{variants} | {within(row['served_vs_runtime'], row['ms']['runtime'], checked)} | "
            f"{within(row['speedup'], eager_ms, checked)} | "
            f"{over('runtime')} | {over('borrowed')} | {copy_alone()} | {slowed('report')} · {slowed('independent')} | "
            f"{speed('report')} · {speed('independent')} | {like()} | {spread()} |"
        )
    return "\n".join(lines) + "\n" + tally(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", type=lambda s: [t for t in s.split(",") if t], default=[])
    parser.add_argument("--budget", type=float)
    parser.add_argument("--buckets", type=zoo.parse_buckets)
    parser.add_argument("--set", action="append", type=zoo.parse_set, default=[], metavar="KEY=VALUE")
    parser.add_argument("--cache-root", type=Path)
    parser.add_argument(
        "--probes",
        type=int,
        default=1,
        help="independent timings per model, each a fresh process: its figures are their medians, "
        "and the table gives each figure's spread over them",
    )
    parser.add_argument(
        "--compare-fresh",
        action="store_true",
        help="also a cold warmup into a cache of its own that times the buckets in a fresh process "
        "(bench.process: fresh), its report against the same independent timing",
    )
    args = parser.parse_args()
    args.device, args.reuse_cache = "cuda", False
    out_dir = zoo.output_folder(args.out_dir)
    cache_root = (args.cache_root or out_dir / "cache").resolve()
    budget = zoo.Budget(args.budget)
    rows: list[dict] = []
    # in the order named, so that a budget that runs out skips the last named
    named = [Path(token).stem if token.endswith((".yaml", ".yml")) else token for token in args.only]
    models = sorted(zoo.select(args.only), key=lambda m: named.index(m.name) if m.name in named else len(named))
    for model in models:
        started = time.perf_counter()
        if not budget.fits():
            rows.append({"model": model.name, "error": f"skipped: {budget.left():.0f} s of the budget left"})
            continue
        config, settings = zoo.effective_config(model, args, out_dir)
        cache = cache_root / model.name
        cache.mkdir(parents=True, exist_ok=True)
        warmed = zoo.warm(model, config, cache, out_dir, "cuda", budget.timeout(zoo.WARMUP_TIMEOUT))
        reports = {model.name: warmed}
        if args.compare_fresh and "error" not in warmed:
            fresh = config.with_name(f"{model.name}-fresh.yaml")
            timed_apart = copy.deepcopy(settings)
            zoo.assign(timed_apart, ["bench", "process"], "fresh")
            fresh.write_text(yaml.safe_dump(timed_apart, sort_keys=False))
            timeout = budget.timeout(zoo.WARMUP_TIMEOUT)
            reports[f"{model.name} (timed in a fresh process)"] = zoo.warm(
                model, fresh, cache_root / f"{model.name}-fresh", out_dir, "cuda", timeout, label=f"{model.name}-fresh"
            )
        if "error" in warmed:
            rows.append({"model": model.name, "error": warmed["error"]})
        else:
            report = out_dir / warmed["report"]
            timing = combined(
                [
                    probe(model, config, cache, report, out_dir, budget.timeout(zoo.REPLICA_TIMEOUT), n)
                    for n in range(max(1, args.probes))
                ]
            )
            for label, run in reports.items():
                if "error" in run or "error" in timing:
                    rows.append({"model": label, "error": run.get("error") or timing["error"]})
                    continue
                records = {r["bucket"]: r for r in json.loads((out_dir / run["report"]).read_text())["results"]}
                for bucket, measured in timing["buckets"].items():
                    rows.append({"model": label, **compare(records[int(bucket)], measured)})
        budget.longest = max(budget.longest, time.perf_counter() - started)
        (out_dir / "fidelity.json").write_text(json.dumps(rows, indent=1))
        print(f"fidelity: {model.name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    table = render(rows)
    (out_dir / "fidelity.md").write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
