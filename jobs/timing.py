"""Timing that means what it says: synchronize around host timers, CUDA events on the GPU,
interleaved repetitions so drift (clocks, thermals, other tenants) hits both variants alike."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Optional

import torch


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

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
        """Per-call latency in ms of each variant, alternating ABAB.. then BABA.. order each round.

        Each call starts on an idle device (synchronize first), so a sample is the latency one
        request sees, launch overhead included: that is what CUDA graphs remove.
        """
        names = list(variants)
        for _ in range(warmup):
            for name in names:
                variants[name]()
            on_step()
        self.sync()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(iterations):
            for name in names if i % 2 == 0 else names[::-1]:
                samples[name].append(self._time_one(variants[name]))
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
        variant, order alternating. The host queues work ahead of the device here, so this is
        throughput under load: launch overhead hides behind device work wherever it can."""
        names = list(variants)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(rounds):
            for name in names if i % 2 == 0 else names[::-1]:
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
        start_s = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start_s) * 1e3


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
