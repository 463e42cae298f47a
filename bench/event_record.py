"""What a CUDA event pair charges a host-bound call: the same eager call timed with its end event
recorded on a stream looked up before the sample (`end.record(stream)`, as orchestrator.jobs.timing
times now) and on none (`end.record()`, which looks the current stream up between the events),
blocks of each interleaved on one core, in one process; and `torch.cuda.current_stream()` alone by
the host clock.

    python bench/event_record.py [CONFIG ...] [--rounds N] [--block N]   (default: two_input_linear)

Per config and bucket: the median ms of each way, their difference in µs, and the lookup's own µs.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from orchestrator.config import load_spec  # noqa: E402
from orchestrator.jobs.model import build_model, make_inputs  # noqa: E402
from orchestrator.jobs.timing import on_fastest_core  # noqa: E402


def sample(fn, stream) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    fn()
    end.record(stream)  # stream None: looked up here, inside the sample
    end.synchronize()
    return start.elapsed_time(end)


def lookup_us(calls: int = 2000) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        torch.cuda.current_stream()
    return (time.perf_counter() - began) * 1e6 / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", default=[str(ROOT / "bench/models/two_input_linear.yaml")])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("event_record: needs a GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    print(
        "| model | bucket | stream looked up before ms | looked up between the events ms | difference µs | lookup alone µs |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for config in args.configs:
        spec = load_spec(config)
        model = build_model(spec, device)
        for bucket in spec.buckets:
            inputs, kwargs = make_inputs(spec, bucket, device)
            with torch.no_grad(), on_fastest_core():
                call = lambda: model(*inputs, **kwargs)  # noqa: E731
                for _ in range(20):
                    call()
                ways: dict[str, list[float]] = {"before": [], "between": []}
                for r in range(args.rounds):
                    for name in ("before", "between") if r % 2 == 0 else ("between", "before"):
                        stream = torch.cuda.current_stream() if name == "before" else None
                        for _ in range(3):  # the block's lead, untimed
                            call()
                        ways[name] += [sample(call, stream) for _ in range(args.block)]
                lookup = statistics.median(lookup_us() for _ in range(5))
            before, between = (statistics.median(ways[name]) for name in ("before", "between"))
            print(
                f"| {spec.name} | {bucket} | {before:.4f} | {between:.4f} | {(between - before) * 1e3:+.1f} | {lookup:.1f} |"
            )
    print(f"(one core of {len(os.sched_getaffinity(0))}, {args.rounds} rounds of {args.block} calls a way)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
