"""Timing that means what it says: synchronize around host timers, CUDA events on the GPU,
interleaved blocks of each variant's calls so drift (clocks, thermals, other tenants) hits every
variant alike, and each is timed in the steady state a replica serving it would be in."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

# A replica runs one variant per bucket, call after call: each variant is timed in blocks of
# consecutive calls, the blocks of all variants interleaved round by round (drift hits all alike),
# and the first calls of every block untimed, since a call right after another variant's pays for
# the switch (caches, clocks, CUDA-graph trees' bookkeeping) where a replica never does.
BLOCK_CALLS = 20  # timed calls in a block, at most
MIN_ROUNDS = 5  # blocks per variant, at least, where the calls asked for allow it
LEAD_CALLS = 2  # untimed calls at the start of every block


def block_plan(iterations: int) -> list[int]:
    """The timed calls of each round's block, adding up to `iterations`: blocks of up to
    BLOCK_CALLS calls, in at least MIN_ROUNDS rounds where there are that many calls."""
    block = max(1, min(BLOCK_CALLS, iterations // MIN_ROUNDS))
    full, rest = divmod(iterations, block)
    return [block] * full + ([rest] if rest else [])


class Clock:
    def __init__(self, device: torch.device, timer: Callable[[], float] = time.perf_counter) -> None:
        """timer: the host's clock in seconds, where the device has no events of its own (the CPU)."""
        self.device = device
        self.timer = timer

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wall(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Seconds from call to finished device work, and the result."""
        self.sync()
        start = time.perf_counter()
        result = fn()
        self.sync()
        return time.perf_counter() - start, result

    def interleaved(
        self,
        variants: dict[str, Callable[[], Any]],
        iterations: int,
        warmup: int,
        on_step: Callable[[], None] = lambda: None,
    ) -> dict[str, list[float]]:
        """Per-call latency in ms of each variant: `iterations` samples each, timed in blocks of
        consecutive calls (block_plan), each block after LEAD_CALLS untimed calls, the variants'
        blocks in turn with the order reversed every round. `warmup` untimed calls of each variant
        come first. Sample i of every variant is the same round's same position: the pairs the
        bootstrap keeps together (orchestrator.jobs.stats).

        Each call starts on an idle device (synchronize first), so a sample is the latency one
        request sees, launch overhead included: that is what CUDA graphs remove. `on_step` runs
        once per iteration, a round's worth at the end of each round."""
        names = list(variants)
        for name in names:
            for _ in range(warmup):
                variants[name]()
        for _ in range(warmup):
            on_step()
        self.sync()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i, calls in enumerate(block_plan(iterations)):
            for name in names if i % 2 == 0 else names[::-1]:
                fn = variants[name]
                for _ in range(LEAD_CALLS):
                    fn()
                samples[name].extend(self._time_one(fn) for _ in range(calls))
            for _ in range(calls):
                on_step()
        return samples

    def back_to_back(
        self,
        variants: dict[str, Callable[[], Any]],
        rounds: int,
        calls: int,
        on_step: Callable[[], None] = lambda: None,
    ) -> dict[str, list[float]]:
        """Mean ms per call over `calls` calls issued without waiting, one sample per round and
        variant, order alternating, each after an untimed call (as a latency block's lead). The
        host queues work ahead of the device here, so this is throughput under load: launch
        overhead hides behind device work wherever it can."""
        names = list(variants)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                variants[name]()
                samples[name].append(self._time_one(variants[name], calls) / calls)
            on_step()
        return samples

    def _time_one(self, fn: Callable[[], Any], calls: int = 1) -> float:
        self.sync()
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        start_s = self.timer()
        for _ in range(calls):
            fn()
        return (self.timer() - start_s) * 1e3


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def process_age_seconds() -> Optional[float]:
    """Seconds since this process was spawned (Linux), so 'ready' can count interpreter start,
    imports and CUDA init as a replica does; None where /proc is unavailable."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # field 22 is the start time in clock ticks after boot; the command name may hold spaces
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
