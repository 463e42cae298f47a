"""Which portable unit warms a new node faster: Mega-Cache blob or cache-directory snapshot?

    python bench/portable_unit.py --examples mlp,transformer,resnet18 --buckets 1,8,32 [--repeats 2]

"Node A" compiles every bucket in a fresh process, saves `torch.compiler.save_cache_artifacts()`
to a file and publishes its cache directory to a `file://` store. Then, alternating, fresh
processes with an empty cache directory ("node B") either load the Mega-Cache blob or pull the
snapshot, then compile (expected: hits only) and record CUDA graphs for every bucket. Each child
reports its time to ready counted from process spawn, so imports and CUDA init are included.
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
sys.path.insert(0, str(ROOT))


def child(mode: str, config: str, buckets: list[int], work: Path) -> dict:
    """Runs in its own process. Points the caches at an empty directory before torch compiles."""
    cache_dir = work / f"node-{mode}-{os.getpid()}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    import torch

    from orchestrator.cache import sync
    from orchestrator.cache.store import open_store
    from orchestrator.config import load_spec
    from orchestrator.jobs import torch_internals as ti
    from orchestrator.jobs.model import build_model, make_inputs, resolve_device
    from orchestrator.jobs.timing import Clock, process_age_seconds

    spec = load_spec(config).replaced(buckets=buckets)
    device = resolve_device("auto")
    clock = Clock(device)
    store, namespace = open_store(f"file://{work / 'store'}"), "bench"
    out: dict = {"mode": mode}
    start = time.perf_counter()
    if mode == "mega":
        loaded = torch.compiler.load_cache_artifacts((work / "mega.bin").read_bytes())
        out["unit_seconds"] = time.perf_counter() - start
        out["mega_artifacts"] = sum(len(v) for v in loaded.artifacts.values()) if loaded else 0
    elif mode == "snapshot":
        pulled = sync.pull(store, namespace, cache_dir, None, allow_unsigned=True)
        out["unit_seconds"] = time.perf_counter() - start
        out["files"] = pulled.files
    model = build_model(spec, device)
    ti.allow_recompiles(len(buckets))
    options = spec.compile
    compiled = torch.compile(
        model, **ti.compile_kwargs(options.mode, options.dynamic, options.fullgraph, options.backend, options.options)
    )
    window = ti.CounterWindow()
    first_calls = 0.0
    with torch.no_grad():
        for bucket in buckets:
            args, kwargs = make_inputs(spec, bucket, device)
            seconds, _ = clock.wall(lambda: (ti.mark_step(), compiled(*args, **kwargs)))
            first_calls += seconds
            for _ in range(2):  # record the CUDA graphs: ready to serve
                clock.wall(lambda: (ti.mark_step(), compiled(*args, **kwargs)))
    stats = window.stats()
    out.update(
        first_calls_seconds=first_calls,
        ready_seconds=time.perf_counter() - start,
        spawn_to_ready_seconds=(process_age_seconds() or 0.0),
        hits=stats.cache_hits,
        misses=stats.cache_misses,
    )
    if mode == "save":
        blob = torch.compiler.save_cache_artifacts()
        (work / "mega.bin").write_bytes(blob[0] if blob else b"")
        out["mega_bytes"] = len(blob[0]) if blob else 0
        out["publish"] = vars(sync.publish(store, cache_dir, namespace, None, allow_unsigned=True, buckets=buckets))
    return out


def spawn(mode: str, config: str, buckets: str, work: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--config", config, "--buckets", buckets, "--work", str(work)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", default="mlp,transformer,resnet18")
    parser.add_argument("--buckets", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child")
    parser.add_argument("--config")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    buckets = [int(b) for b in args.buckets.split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.config, buckets, args.work)))
        return
    print(
        "| model | node A cold: first calls | Mega-Cache blob | load | first calls | spawn->ready | "
        "snapshot | pull | first calls | spawn->ready | hits/misses mega, snapshot |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for example in args.examples.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"portable-{example}-"))
        (work / "store").mkdir()
        config = str(ROOT / "examples" / f"{example}.yaml")
        saved = spawn("save", config, args.buckets, work)
        runs: dict[str, list[dict]] = {"mega": [], "snapshot": []}
        for i in range(args.repeats):
            for mode in ("mega", "snapshot") if i % 2 == 0 else ("snapshot", "mega"):
                runs[mode].append(spawn(mode, config, args.buckets, work))

        def med(mode: str, key: str) -> float:
            return statistics.median(r[key] for r in runs[mode])

        m, s = runs["mega"][0], runs["snapshot"][0]
        print(
            f"| {example} | {saved['first_calls_seconds']:.1f} s | {saved['mega_bytes'] / 1e6:.1f} MB | "
            f"{med('mega', 'unit_seconds'):.2f} s | {med('mega', 'first_calls_seconds'):.2f} s | "
            f"{med('mega', 'spawn_to_ready_seconds'):.1f} s | {saved['publish']['bytes'] / 1e6:.1f} MB, "
            f"{saved['publish']['files']} files | {med('snapshot', 'unit_seconds'):.2f} s | "
            f"{med('snapshot', 'first_calls_seconds'):.2f} s | {med('snapshot', 'spawn_to_ready_seconds'):.1f} s | "
            f"{m['hits']}/{m['misses']}, {s['hits']}/{s['misses']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
