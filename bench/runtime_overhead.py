"""What the serving runtime's call adds over calling the served variant directly, host side.

    python bench/runtime_overhead.py [--calls 20000] [--block 200] [--width 8] [--json]

A replica of a single Linear (buckets 1 and 8) is loaded on the CPU with `runtime.load`; each
bucket is timed at its own size (the exact-bucket path) two ways, in blocks of back-to-back calls
interleaved with the order alternating: the runtime's call, and its runner called directly
(plus its copy where the variant replays into buffers, as the runtime returns it). `eager` is
the model as served; `replays` swaps in a stand-in runner flagged as replaying into buffers,
so the copy-out path is timed too. The overhead is the runtime's block mean minus the direct
one's in the same round: its median and spread (half the interquartile range), in µs per call.
`padded` rows time a request one row short of the bucket through the runtime against the
bucket's own size through the runtime: what checking, padding and cutting back add.

`host_overhead` is also what bench/serving.py uses for its host-side figures on the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from orchestrator.jobs.variants import spread  # noqa: E402  (half the interquartile range)

MODEL = """
import torch

def linear(width):
    return torch.nn.Linear(width, width)
"""


def host_blocks(
    calls: dict[str, Callable[[], Any]],
    rounds: int,
    block: int,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, list[float]]:
    """µs per call of each callable, one sample per round: the mean over `block` back-to-back
    calls, the host's own time until the last one returned (`sync` runs after, untimed, so
    device work never queues across blocks). The order alternates every round."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            fn = calls[name]
            started = clock()
            for _ in range(block):
                fn()
            elapsed = clock() - started
            sync()
            samples[name].append(elapsed / block / 1000)
    return samples


def host_overhead(
    runtime_call: Callable[[], Any],
    direct_call: Callable[[], Any],
    calls: int = 20000,
    block: int = 200,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    """The runtime's host-side µs per call over the direct call's: medians of per-block means
    and of the per-round difference, with their spreads. Warms both up first."""
    rounds = max(calls // block, 4)
    kinds = {"runtime": runtime_call, "direct": direct_call}
    host_blocks(kinds, max(rounds // 10, 2), block, sync, clock)
    samples = host_blocks(kinds, rounds, block, sync, clock)
    diffs = [a - b for a, b in zip(samples["runtime"], samples["direct"], strict=True)]
    return {
        "runtime_us": statistics.median(samples["runtime"]),
        "runtime_spread_us": spread(samples["runtime"]),
        "direct_us": statistics.median(samples["direct"]),
        "direct_spread_us": spread(samples["direct"]),
        "overhead_us": statistics.median(diffs),
        "overhead_spread_us": spread(diffs),
        "calls": rounds * block,
    }


class _Replays:
    """A stand-in for a variant that replays into static buffers: the Linear's call written into
    one output tensor, which the runtime must copy out."""

    def __init__(self, linear: Any, out: Any) -> None:
        self.linear, self.out = linear, out

    def __call__(self, x: Any) -> Any:
        import torch

        return torch.addmm(self.linear.bias, x, self.linear.weight.t(), out=self.out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls of each kind per bucket")
    parser.add_argument("--block", type=int, default=200, help="back-to-back calls per sample")
    parser.add_argument("--width", type=int, default=8, help="the Linear's width")
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="wall: perf_counter; thread: this thread's CPU time, blind to other processes on a busy host",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args()

    import torch

    from orchestrator import runtime
    from orchestrator.jobs.model import make_inputs
    from orchestrator.jobs.replica import BucketInfo

    torch.set_num_threads(1)
    clock = time.thread_time_ns if args.clock == "thread" else time.perf_counter_ns
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="runtime-overhead-") as tmp:
        (Path(tmp) / "models.py").write_text(MODEL)
        config = Path(tmp) / "cfg.yaml"
        config.write_text(
            f"model: {{factory: models.py:linear, kwargs: {{width: {args.width}}}}}\n"
            f"inputs: [{{shape: [batch, {args.width}]}}]\nbuckets: [1, 8]\ndevice: cpu\n"
        )
        served = runtime.load(config, cache_dir=Path(tmp) / "cache", device="cpu", ready="planned")
        device = torch.device("cpu")
        with torch.no_grad():
            for kind in ("eager", "replays"):
                for bucket in served.buckets:
                    (x,), _ = make_inputs(served.spec, bucket, device)
                    if kind == "replays":  # the runtime copies out of the buffers, as a direct caller must
                        served._switch(
                            BucketInfo(bucket, "graphed", "graphed", None), _Replays(served.model, served.model(x)), 0
                        )
                    runner = served._routes[bucket].runner
                    copy = served._routes[bucket].copy

                    def direct(runner: Any = runner, copy: Any = copy, x: Any = x) -> Any:
                        outputs = runner(x)
                        return copy(outputs) if copy is not None else outputs

                    def through_runtime(x: Any = x) -> Any:
                        return served(x)

                    results[f"{kind} b{bucket}"] = host_overhead(
                        through_runtime, direct, args.calls, args.block, clock=clock
                    )
                    if bucket > 1:  # a request of fewer rows: checked, padded, cut back and copied
                        results[f"{kind} b{bucket} padded"] = host_overhead(
                            lambda x=x[: bucket - 1]: served(x), through_runtime, args.calls, args.block, clock=clock
                        )
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'':18} {'runtime µs':>14} {'direct µs':>14} {'overhead µs':>16}   (median ± half IQR, per call)")
    for name, r in results.items():
        print(
            f"{name:18} {r['runtime_us']:8.2f} ±{r['runtime_spread_us']:4.2f} {r['direct_us']:8.2f} "
            f"±{r['direct_spread_us']:4.2f} {r['overhead_us']:10.2f} ±{r['overhead_spread_us']:4.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
