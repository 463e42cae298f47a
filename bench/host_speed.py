"""Does the host's speed swing, and does the host meter see it? A model's eager call, bound by
the host at small sizes, timed in blocks of 10 for SECONDS, each block beside a reading of the host
meter (orchestrator.jobs.timing.HostMeter's work) and a device-bound matmul; then the copy of a
GPT-2-shaped output tree (logits and 12 layers' keys and values, bf16) by each method.

    python bench/host_speed.py CONFIG SECONDS OUT_NAME      (JSON rows to $OUT or /tmp/OUT_NAME)

Prints the blocks' spread, the share of them slowed (over 1.3x the fastest), the meter's readings
in slowed and fast blocks and their correlation, steal time, and how long slowed periods last.
"""

import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from orchestrator.config import load_spec  # noqa: E402
from orchestrator.jobs.copies import copy_out  # noqa: E402
from orchestrator.jobs.model import build_model, make_inputs, resolve_device  # noqa: E402
from orchestrator.jobs.timing import host_work  # noqa: E402


def meter_us() -> float:
    """Three runs of the host meter's work, in µs."""
    began = time.perf_counter()
    for _ in range(3):
        host_work()
    return (time.perf_counter() - began) * 1e6


def event_ms(fn) -> float:
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()  # looked up outside the sample (jobs/timing.py)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def cpu_state() -> tuple[int, int, int]:
    """Steal ticks and all ticks of the host so far, and the core this process runs on."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    with open("/proc/self/stat") as f:
        core = int(f.read().rsplit(")", 1)[1].split()[36])
    return int(cpu[8]), sum(int(x) for x in cpu[1:9]), core


def swings(config: str, seconds: float) -> list[dict]:
    spec = load_spec(config)
    device = resolve_device("cuda")
    model = build_model(spec, device)
    args, kwargs = make_inputs(spec, 1, device)
    x = torch.randn(4096, 4096, device=device)
    rows = []
    with torch.no_grad():
        for _ in range(3):
            model(*args, **kwargs)
        end = time.time() + seconds
        while time.time() < end:
            before = cpu_state()
            meter = statistics.median(meter_us() for _ in range(5))
            eager = statistics.median(event_ms(lambda: model(*args, **kwargs)) for _ in range(10))
            matmul = statistics.median(event_ms(lambda: x @ x) for _ in range(5))
            after = cpu_state()
            steal = (after[0] - before[0]) / max(1, after[1] - before[1])
            rows.append(
                {
                    "t": time.time(),
                    "meter_us": meter,
                    "eager_ms": eager,
                    "mm_ms": matmul,
                    "steal": steal,
                    "core": after[2],
                }
            )
    return rows


def summarize(rows: list[dict]) -> None:
    meter, eager = [r["meter_us"] for r in rows], [r["eager_ms"] for r in rows]
    fast = min(eager)
    slowed = [r for r in rows if r["eager_ms"] > 1.3 * fast]
    quick = [r for r in rows if r not in slowed]
    print(
        f"blocks {len(rows)}; eager ms min {fast:.3f} median {statistics.median(eager):.3f} max {max(eager):.3f}; "
        f"slowed share {len(slowed) / len(rows):.2f}"
    )
    mean_m, mean_e = statistics.mean(meter), statistics.mean(eager)
    cov = sum((a - mean_m) * (b - mean_e) for a, b in zip(meter, eager, strict=True)) / len(rows)
    print(
        f"meter µs min {min(meter):.1f} median {statistics.median(meter):.1f} max {max(meter):.1f}; "
        f"correlation with eager {cov / (statistics.pstdev(meter) * statistics.pstdev(eager)):.2f}"
    )
    if slowed and quick:
        print(
            f"meter µs median in slowed blocks {statistics.median(r['meter_us'] for r in slowed):.1f}, "
            f"in the others {statistics.median(r['meter_us'] for r in quick):.1f}"
        )
        print(
            f"steal in slowed blocks {statistics.mean(r['steal'] for r in slowed):.5f}, "
            f"in the others {statistics.mean(r['steal'] for r in quick):.5f}"
        )
    matmul = [r["mm_ms"] for r in rows]
    print(f"matmul ms min {min(matmul):.3f} median {statistics.median(matmul):.3f} max {max(matmul):.3f}")
    print("cores", Counter(r["core"] for r in rows).most_common(4))
    periods, current = [], None
    for r in rows:
        slow = r in slowed
        if current and current[0] == slow:
            current[2] = r["t"]
        else:
            if current:
                periods.append(current)
            current = [slow, r["t"], r["t"]]
    periods.append(current)
    print("slowed periods, s:", [round(b - a, 2) for slow, a, b in periods if slow][:40])
    print("fast periods, s:", [round(b - a, 2) for slow, a, b in periods if not slow][:40])


def copy_methods(device: torch.device) -> None:
    """GPT-2's outputs at buckets 1 and 8 (bf16 logits over 50257 tokens of 128 positions, and
    12 layers' keys and values) copied by each method, µs by CUDA events."""

    def us(fn) -> float:
        for _ in range(5):
            fn()
        return round(statistics.median(event_ms(fn) for _ in range(60)) * 1e3, 1)

    for batch in (1, 8):
        leaves = [torch.randn(batch, 128, 50257, device=device).to(torch.bfloat16)]
        leaves += [torch.randn(batch, 12, 128, 64, device=device).to(torch.bfloat16) for _ in range(24)]
        views = [t.view(-1) for t in leaves]
        sizes = [t.numel() for t in leaves]
        whole = torch.empty(sum(sizes), dtype=torch.bfloat16, device=device)

        def foreach():
            flat = torch.empty(sum(sizes), dtype=torch.bfloat16, device=device)
            torch._foreach_copy_(list(torch.split(flat, sizes)), views)

        found = {
            "cat of all": us(lambda: torch.cat(views)),
            "empty + foreach_copy_": us(foreach),
            "clone each": us(lambda: [t.clone() for t in leaves]),
            "copy_out (jobs/copies.py)": us(lambda: copy_out(tuple(leaves))),
            "one clone of the bytes": us(lambda: whole.clone()),
        }
        print(f"copy b{batch}: {sum(sizes) * 2 / 1e6:.1f} MB in {len(leaves)} tensors, µs: {found}")


def main() -> int:
    config, seconds, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    rows = swings(config, seconds)
    Path(os.environ.get("OUT", "/tmp"), name).write_text(json.dumps(rows))
    summarize(rows)
    if "--no-copies" not in sys.argv:
        copy_methods(torch.device("cuda"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
