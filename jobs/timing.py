"""Timing that means what it says: synchronize around host timers, CUDA events on the GPU,
interleaved repetitions so drift (clocks, thermals, other tenants) hits both variants alike."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

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

    def interleaved(self, variants: dict[str, Callable[[], Any]], iterations: int, warmup: int,
                    on_step: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
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
            for name in (names if i % 2 == 0 else names[::-1]):
                samples[name].append(self._time_one(variants[name]))
            on_step()
        return samples

    def _time_one(self, fn: Callable[[], Any]) -> float:
        self.sync()
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        start_s = time.perf_counter()
        fn()
        return (time.perf_counter() - start_s) * 1e3


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
