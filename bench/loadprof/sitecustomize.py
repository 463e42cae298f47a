"""Where each bucket's first call spends its time, in every process of a fleet (diagnostics).

    PYTHONPATH=bench/loadprof:$PYTHONPATH LOADPROF=/tmp/lp ray start --head ...   # workers inherit it
    LOADPROF=/tmp/lp orchestrate warmup ... --ray-address ...                       # then read /tmp/lp/loads.txt

Python imports `sitecustomize` at start-up from the path, so every Ray worker started with it
wraps `orchestrator.jobs.engine._BucketWork.compile` once `orchestrator.jobs.engine` is imported, and appends to
$LOADPROF/loads.txt a header (pid, bucket, cache state, wall, stages), the torch `dynamo_timed`
phases that grew during the call (CachingAutotuner.benchmark_all_configs among them: a load
that re-tunes its kernels shows there) and, in processes compiling in-process
(TORCHINDUCTOR_COMPILE_THREADS=1: the ranks), a cProfile by cumulative and own time.
With NOKILL=1 in the driver's environment, ray.kill does nothing: compile units live until the
job ends, to tell whether their teardown slows a rank's loads.
"""

import builtins
import os
import sys

_import = builtins.__import__


def _hook(name, globals=None, locals=None, fromlist=(), level=0):
    module = _import(name, globals, locals, fromlist, level)
    engine = sys.modules.get("orchestrator.jobs.engine")
    # patch once the module has finished executing (an import inside it lands here too)
    if os.environ.get("LOADPROF") and hasattr(engine, "_BucketWork") and not getattr(engine, "_profiled", False):
        engine._profiled = True
        _profile(engine._BucketWork)
    ray = sys.modules.get("ray")
    if os.environ.get("NOKILL") and hasattr(ray, "kill") and not getattr(ray, "_kill_disabled", False):
        ray._kill_disabled = True
        ray.kill = lambda *args, **kwargs: None
    return module


def _profile(work_class) -> None:
    compile_ = work_class.compile

    def compile(self):
        import cProfile
        import io
        import pstats
        import time

        import torch._dynamo.utils as utils

        before = {name: (len(times), sum(times)) for name, times in utils.compilation_time_metrics.items()}
        profiler = cProfile.Profile() if os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") == "1" else None
        started, at = time.perf_counter(), time.time()
        if profiler:
            profiler.enable()
        try:
            return compile_(self)
        finally:
            if profiler:
                profiler.disable()
            grew = []
            for name, times in utils.compilation_time_metrics.items():
                count, total = before.get(name, (0, 0.0))
                if len(times) > count:
                    grew.append((sum(times) - total, len(times) - count, name))
            result = self.result
            lines = [
                f"### pid {os.getpid()} bucket {result.bucket} state {result.cache_state} "
                f"wall {time.perf_counter() - started:.3f} at {at:.3f} "
                f"stages { {k: round(v, 3) for k, v in result.stage_seconds.items()} }"
            ]
            lines += [
                f"  {seconds:8.3f} s x{count:<3} {name}" for seconds, count, name in sorted(grew, reverse=True)[:22]
            ]
            if profiler:
                for order, rows in (("cumulative", 35), ("tottime", 20)):
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
                    lines.append(text.getvalue())
            with open(os.path.join(os.environ["LOADPROF"], "loads.txt"), "a") as out:
                out.write("\n".join(lines) + "\n")

    work_class.compile = compile


if os.environ.get("LOADPROF") or os.environ.get("NOKILL"):
    builtins.__import__ = _hook
