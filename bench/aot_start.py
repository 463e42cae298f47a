"""Replica start with and without the `aot` variant, and the two ahead-of-time mechanisms side by
side, on a GPU (numbers go to docs/performance.md).

    python bench/aot_start.py OUT_DIR [--starts N] [--mechanisms aoti,aoti-packaged,precompile] [--device cuda]
                              [example or CFG.yaml ...]  # default: mlp resnet18 transformer, 3 starts

Per example (buckets 1, 8, 32 from its config):
  1. `orchestrate warmup --no-ray --device cuda` into a fresh cache with the default variants, `aot`
     among them: every variant's latency per bucket, measured interleaved in one run, and aot's
     build seconds.
  2. A copy of that cache whose serving plans choose, by the same rule on the same measurements,
     among every variant but `aot`: the runtime without it.
  3. Fresh processes, alternating, N of each: the eager floor (spawn, import, build, one eager
     call per bucket), the runtime without aot, the runtime with it; spawn to ready, and the
     Dynamo frames each compiled.
  4. The --mechanisms asked for (none by default), at bucket 8: AOTInductor (torch.export +
     aoti_compile_and_package, loaded by its C++ loader as torch's own wrapper calls it, without
     the wrapper's imports; `aoti` hands the module's weights over at load, `aoti-packaged` keeps
     them in the package) and Dynamo's precompile as the `aot` variant
     ships it (orchestrator.jobs.aot): produce seconds, artifact bytes, load seconds in a fresh
     process on an empty Inductor cache, files that load wrote into that cache, latency captured
     in the tool's CUDA graph, and whether each accepted the model at all (the error, where not;
     each step runs in its own process, so a crash is a finding, not the end of the run).
Written as it goes to OUT_DIR/aot-<example>.json; a summary to stdout and OUT_DIR/aot-summary.txt.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving import FLOOR, floor_recipe, run_python  # noqa: E402  (bench/serving.py: the eager floor, a fresh process)

from orchestrator.jobs.records import VariantMeasure  # noqa: E402
from orchestrator.jobs.variants import PLAN_DIR, choose, read_plans  # noqa: E402

READY = r"""
import json, sys
from orchestrator import runtime
served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], device=sys.argv[3], ready="planned")
info = served.info()
print(json.dumps({"ready_from_spawn": info.ready_seconds_from_spawn, "ready": info.ready_seconds,
                  "frames": info.dynamo_frames_compiled,
                  "variants": {b: i.variant for b, i in info.buckets.items()},
                  "reasons": {b: i.reason for b, i in info.buckets.items() if i.reason},
                  "load_seconds": {b: i.load_seconds for b, i in info.buckets.items()},
                  "misses": sum(i.cache_misses for i in info.buckets.values())}))
"""

# argv: config, bucket, artifact path, mechanism
PRODUCE = r"""
import json, os, shutil, sys, time, torch
from pathlib import Path
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs import aot
from orchestrator.jobs.model import build_model, make_inputs
spec = load_spec_with_overrides(sys.argv[1], device="cuda")
bucket, path, mechanism = int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
device = torch.device("cuda", 0)
model = build_model(spec, device)
args, kwargs = make_inputs(spec, bucket, device)
started = time.perf_counter()
if mechanism.startswith("aoti"):
    # "aoti": the weights left out of the package, handed over at load as a replica's own module's;
    # "aoti-packaged": the weights inside it, as AOTInductor packages them by default
    configs = {} if mechanism == "aoti-packaged" else {"aot_inductor.package_constants_in_so": False}
    with torch.no_grad():
        exported = torch.export.export(model, tuple(args), kwargs)
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path), inductor_configs=configs)
else:
    options = spec.compile
    work = path.parent / "namespace"
    work.mkdir(exist_ok=True)
    rel = aot.build(model, args, kwargs, work, bucket, aot.compile_kwargs(options.mode, options.options, options.backend, "cuda"))
    shutil.move(work / rel, path)
print(json.dumps({"seconds": time.perf_counter() - started, "bytes": os.path.getsize(path)}))
"""

# argv: config, bucket, artifact path, mechanism; run with an empty TORCHINDUCTOR_CACHE_DIR
LOAD = r"""
import json, os, sys, time, torch
from orchestrator.config import load_spec_with_overrides
from orchestrator.jobs.model import build_model, make_inputs
from orchestrator.jobs import aot
from orchestrator.jobs.graphs import GraphedCall
from orchestrator.jobs.timing import Clock, median
from orchestrator.jobs.variants import spread
from orchestrator.jobs import torch_internals as ti
spec = load_spec_with_overrides(sys.argv[1], device="cuda")
bucket, path, mechanism = int(sys.argv[2]), sys.argv[3], sys.argv[4]
device = torch.device("cuda", 0)
model = build_model(spec, device)
args, kwargs = make_inputs(spec, bucket, device)
frames = ti.CounterWindow()
modules_before = set(sys.modules)
started = time.perf_counter()
if mechanism.startswith("aoti"):
    # AOTInductor's own C++ loader, called as torch's Python wrapper calls it (AOTICompiledModel),
    # without the wrapper, whose import brings Dynamo's and Inductor's Python in
    import torch.utils._pytree as pytree
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, 0)  # run single-threaded (CUDA graphs), cuda:0
    if mechanism == "aoti":
        weights = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        # constants map, use_inactive, check_full_update, user_managed, allow_h2d_copy
        loader.load_constants({n: weights[n] for n in loader.get_constant_fqns()}, False, True, True, False)
    in_spec, out_spec = (pytree.treespec_loads(spec) for spec in loader.get_call_spec())
    kwargs_spec = in_spec.child(1) if hasattr(in_spec, "child") else in_spec.children_specs[1]
    def function(*call_args, **call_kwargs):
        ordered = {name: call_kwargs[name] for name in kwargs_spec.context}  # as exported, whatever the call's order
        flat = [x for x in pytree.tree_flatten((call_args, ordered))[0] if isinstance(x, torch.Tensor)]
        return pytree.tree_unflatten(loader.boxed_run(flat), out_spec)
else:
    function = aot.load(path, model)
with torch.no_grad():
    function(*args, **kwargs)
torch.cuda.synchronize()
load_seconds = time.perf_counter() - started
modules_after_load = set(sys.modules)
with torch.no_grad():
    graphed = GraphedCall(function, args, kwargs)
    error = (graphed(*args, **kwargs) - model(*args, **kwargs)).abs().max().item()
    samples = Clock(device).interleaved({"graphed": lambda: graphed(*args, **kwargs), "eager": lambda: model(*args, **kwargs)}, 200, 20).samples
written = sum(len(files) for _, _, files in os.walk(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
print(json.dumps({"load_seconds": load_seconds, "frames": frames.stats().frames_compiled, "max_abs_error": error,
                  "modules_imported_by_load": len(modules_after_load - modules_before),
                  "dynamo_imported": "torch._dynamo.variables" in sys.modules,
                  "inductor_compiler_imported": "torch._inductor.compile_fx" in sys.modules,
                  "ms": median(samples["graphed"]), "spread_ms": spread(samples["graphed"]),
                  "eager_ms": median(samples["eager"]), "inductor_files_written": written}))
"""


def without_aot(cache: Path) -> Path:
    """A copy of the cache whose newest plans choose, on the recorded measurements, among every
    variant but aot."""
    copy = Path(str(cache) + "-without-aot")
    shutil.copytree(cache, copy, symlinks=True)
    for directory in (p for p in copy.iterdir() if (p / PLAN_DIR).is_dir()):
        for bucket, plan in read_plans(directory).items():
            measured = {
                name: VariantMeasure(**m) for name, m in plan["variants"].items() if name != "aot" and m.get("ok")
            }
            plan = {
                **plan,
                "variant": choose(measured).variant,
                "artifacts": {},
                "measured_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
            }
            (directory / PLAN_DIR / f"plan-b{bucket}-without-aot.json").write_text(json.dumps(plan))
    return copy


def mechanisms(config: Path, names: list[str], out: dict, save) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="aot-mechanisms-"))
    for mechanism in names:
        row: dict = {}
        out["mechanisms"][mechanism] = row
        # AOTInductor on torch 2.11 takes only a package name ending in .pt2.
        path = scratch / f"{mechanism}.pt2"
        try:
            row["produce"] = run_python(PRODUCE, str(config), "8", str(path), mechanism)
            empty = Path(tempfile.mkdtemp(prefix="empty-inductor-"))
            row["load"] = run_python(
                LOAD, str(config), "8", str(path), mechanism, env={"TORCHINDUCTOR_CACHE_DIR": str(empty)}
            )
        except Exception as exc:  # a mechanism that refuses the model: its error is the finding
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            row["error"] = " | ".join(lines[-3:])[:600]
        save()


def bench(example: str, out_dir: Path, start_runs: int, names: list[str], device: str) -> dict:
    config = Path(example).resolve() if example.endswith(".yaml") else ROOT / "examples" / f"{example}.yaml"
    example = config.stem
    cache = Path(tempfile.mkdtemp(prefix=f"aot-{example}-"))
    result: dict = {"example": example, "mechanisms": {}}

    def save() -> None:
        (out_dir / f"aot-{example}.json").write_text(json.dumps(result, indent=2))

    warmup = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(config), "--device", device,
         "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    (out_dir / f"aot-warmup-{example}.log").write_text(warmup.stderr)
    if warmup.returncode not in (0, 1):
        raise RuntimeError(f"warmup {example}: exit {warmup.returncode}: {warmup.stderr[-2000:]}")
    report = json.loads(warmup.stdout)
    result["report"] = {
        r["bucket"]: {"status": r["status"], "variant": r["variant"], "variants": r["variants"]}
        for r in report["results"]
    }
    result["warmup_seconds"] = report.get("summary", {}).get("wall_seconds")
    save()
    plain = without_aot(cache)
    starts: dict[str, list[dict]] = {"floor": [], "without_aot": [], "with_aot": []}
    result["start"] = starts
    recipe = floor_recipe(config, device)
    for _ in range(start_runs):
        starts["floor"].append(run_python(FLOOR, recipe))
        starts["without_aot"].append(run_python(READY, str(config), str(plain), device))
        starts["with_aot"].append(run_python(READY, str(config), str(cache), device))
        save()
    if names:
        mechanisms(config, names, result, save)
    return result


def summary(result: dict) -> list[str]:
    lines = [f"## {result['example']}"]
    for bucket, row in result["report"].items():
        variants = row["variants"]
        best_other = min(
            ((n, v) for n, v in variants.items() if n != "aot" and v.get("ok") and v.get("ms")),
            key=lambda item: item[1]["ms"],
        )
        built = variants.get("aot", {})
        aot_text = (
            f"aot {built['ms']:.3f}±{built['spread_ms']:.3f} ms (built in {built['build_seconds']:.1f} s)"
            if built.get("ok")
            else f"aot unavailable: {built.get('reason')}"
        )
        lines.append(
            f"bucket {bucket}: serves {row['variant']}; {aot_text}; best without aot {best_other[0]} "
            f"{best_other[1]['ms']:.3f}±{best_other[1]['spread_ms']:.3f} ms; eager {variants['eager']['ms']:.3f} ms"
        )
    starts = result.get("start", {})
    if starts.get("floor"):
        floor = statistics.median(s["ready_from_spawn"] for s in starts["floor"])
        for kind in ("without_aot", "with_aot"):
            runs = starts[kind]
            ready = statistics.median(s["ready_from_spawn"] for s in runs)
            lines.append(
                f"start {kind}: {ready:.2f} s ({sorted(round(s['ready_from_spawn'], 2) for s in runs)}), "
                f"{ready / floor:.2f}x the eager floor {floor:.2f} s; frames compiled {[s['frames'] for s in runs]}; "
                f"variants {runs[0]['variants']}"
            )
    for mechanism, row in result.get("mechanisms", {}).items():
        if "error" in row:
            lines.append(f"{mechanism}: refused: {row['error']}")
        elif "load" in row:
            produce, load = row["produce"], row["load"]
            lines.append(
                f"{mechanism}: produce {produce['seconds']:.1f} s, {produce['bytes'] / 1e6:.1f} MB; load "
                f"{load['load_seconds']:.2f} s, {load['frames']} frames, {load['inductor_files_written']} files "
                f"written to the Inductor cache; graphed {load['ms']:.3f}±{load['spread_ms']:.3f} ms "
                f"(eager {load['eager_ms']:.3f}); max |err| {load['max_abs_error']:.1e}; modules the load imported: "
                f"{load.get('modules_imported_by_load')}; Dynamo's tracer imported by the end: {load.get('dynamo_imported')}, "
                f"Inductor's compiler: {load.get('inductor_compiler_imported')}"
            )
    return lines


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    starts, names, device = 3, [], "cuda"
    while args[:1] and args[0].startswith("--"):
        if args[0] == "--starts":
            starts, args = int(args[1]), args[2:]
        elif args[0] == "--mechanisms":
            names, args = args[1].split(","), args[2:]
        elif args[0] == "--device":
            device, args = args[1], args[2:]
        else:
            raise SystemExit(f"unknown option {args[0]}")
    lines: list[str] = []
    for example in args or ["mlp", "resnet18", "transformer"]:
        try:
            lines += summary(bench(example, out_dir, starts, names, device))
        except Exception as exc:  # one example's failure must not lose the others' numbers
            lines.append(f"## {example}: FAILED {exc}")
        print("\n".join(lines), flush=True)
        (out_dir / "aot-summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
