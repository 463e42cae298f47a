"""Timing that means what it says: synchronize around host timers, CUDA events on the GPU,
interleaved blocks of each variant's calls so drift (clocks, thermals, other tenants) hits every
variant alike, each timed in the steady state a replica serving it would be in, and only while
the host runs at its own full speed."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

# A replica runs one variant per bucket, call after call: each variant is timed in blocks of
# consecutive calls, the blocks of all variants interleaved round by round (drift hits all alike),
# and the first calls of every block untimed, since a call right after another variant's pays for
# the switch (caches, clocks, CUDA-graph trees' bookkeeping) where a replica never does.
BLOCK_CALLS = 20  # timed calls in a block, at most
MIN_ROUNDS = 5  # blocks per variant, at least, where the calls asked for allow it
LEAD_CALLS = 2  # untimed calls at the start of every block
# A GPU drops its clocks when idle (through a compile, a load, a wait) and raises them under load,
# and a core may do the same, while a small model's whole benchmark is a few ms of calls: timed on
# the way up, its first bucket would read every variant slow alike. On a GPU the untimed calls
# before a benchmark go on, each to its end, until every variant has had its count and together
# they have run WARMUP_SECONDS.
WARMUP_SECONDS = 0.1

# A shared host (a cloud VM beside other tenants) runs the same Python up to twice as slowly for
# seconds at a time, for most of a minute at worst. Host-bound calls (eager at small sizes) slow
# with it and graph replays do not, so a round timed then overstates every speedup, and a fresh
# process's re-timing cannot confirm it. The host meter is read before every block and after each
# round; a round whose slowest reading exceeds HOST_SLOWED times the best reading this process has
# seen (HOST: read at every stage of every bucket, so a benchmark that falls wholly within a slowed
# stretch is seen as one) is left out of every variant's samples (the pairs stay whole) and timed
# again while the rounds at full speed are fewer than asked, for up to RETAKE_SECONDS.
HOST_SLOWED = 1.25
RETAKE_SECONDS = 10.0
RETAKE_ROUNDS = 3  # times the rounds asked for, at most, within RETAKE_SECONDS
# Fewer rounds at full speed than this, or than half the rounds asked for, select nothing: the
# host was slowed for most of the benchmark, every round is kept and the figures are noisy.
MIN_STEADY_ROUNDS = 3


def block_plan(iterations: int) -> list[int]:
    """The timed calls of each round's block, adding up to `iterations`: blocks of up to
    BLOCK_CALLS calls, in at least MIN_ROUNDS rounds where there are that many calls."""
    block = max(1, min(BLOCK_CALLS, iterations // MIN_ROUNDS))
    full, rest = divmod(iterations, block)
    return [block] * full + ([rest] if rest else [])


def host_work() -> int:
    """A fixed piece of pure-Python work (tens of microseconds): the interpreter's loop, integer
    arithmetic and the caches they run from, as a host-bound model call uses them."""
    total = 0
    for i in range(1000):
        total += i * i
    return total


class HostMeter:
    """The host's speed: seconds that `host_work` takes, the best of a few runs (a reading is a
    fraction of a millisecond, so a single preemption does not make it look slowed), and the best
    reading so far, the host at its own full speed. `reading` replaces the work (tests)."""

    def __init__(self, reading: Optional[Callable[[], float]] = None, repeats: int = 3) -> None:
        self._reading, self.repeats = reading, repeats
        self.best = math.inf

    def __call__(self) -> float:
        if self._reading is not None:
            seconds = self._reading()
        else:
            seconds = math.inf
            for _ in range(self.repeats):
                start = time.perf_counter()
                host_work()
                seconds = min(seconds, time.perf_counter() - start)
        self.best = min(self.best, seconds)
        return seconds


# This process's meter: every Clock on a GPU reads it unless given another, and the engine reads it at
# every stage, so that its best reading spans the process's life, not one benchmark's seconds.
HOST = HostMeter()


# The cores of a shared host are not alike: two processes in the same state, timed turn about at
# the same moments, run the same host-bound calls up to 1.6x apart for as long as each stays on its
# core (a core whose sibling thread or cache another tenant keeps busy). A benchmark's thread runs
# on the core where the host meter reads best, for the length of the benchmark.
CORE_READINGS = 3  # meter readings per core, the best of them counted


@contextlib.contextmanager
def on_fastest_core(enabled: bool = True) -> Iterator[Optional[int]]:
    """Pin the calling thread to the allowed core where the host meter reads best, and give it
    back its cores at the end; yields the core (None where there is no choice: one core allowed,
    no affinity on this system, or not `enabled`). Meanwhile a benchmark that finds a round
    slowed moves to the core that is fastest then (move_to_fastest_core): which cores are slowed
    changes within tens of seconds."""
    global _choosing_among
    getter = getattr(os, "sched_getaffinity", None)
    allowed = getter(0) if enabled and getter is not None else set()
    if len(allowed) < 2:
        yield None
        return
    best = fastest_core(sorted(allowed))
    _choosing_among = sorted(allowed)
    try:
        os.sched_setaffinity(0, {best})
        yield best
    finally:
        _choosing_among = None
        os.sched_setaffinity(0, allowed)


def move_to_fastest_core() -> Optional[int]:
    """Within on_fastest_core: pin the thread to the core that is fastest now; the core, or None
    outside it."""
    if not _choosing_among:
        return None
    best = fastest_core(_choosing_among)
    os.sched_setaffinity(0, {best})
    return best


def fastest_core(cores: list[int], readings: int = CORE_READINGS, meter: Optional[Callable[[], float]] = None) -> int:
    """The core among `cores` where the meter's best reading is lowest, read round-robin so that
    a slowed moment does not fall on one core alone. Leaves the thread on the last core read."""
    best = {core: math.inf for core in cores}
    own = HostMeter()
    read = meter or own
    for _ in range(readings):
        for core in cores:
            os.sched_setaffinity(0, {core})
            best[core] = min(best[core], read())
    HOST.best = min(HOST.best, own.best)
    return min(best, key=lambda core: best[core])


_choosing_among: Optional[list[int]] = None  # the allowed cores, while on_fastest_core holds


@dataclass
class Timed:
    """Per-call latency samples in ms by variant, and what the host meter saw: `rounds` timed
    (retakes included), `slowed` of them found slowed. Where `steady`, the slowed rounds are left
    out of the samples; otherwise too few rounds ran at full speed and every round is kept."""

    samples: dict[str, list[float]]
    rounds: int = 0
    slowed: int = 0
    steady: bool = True
    host_ms: list[float] = field(default_factory=list)  # each round's slowest meter reading
    kept_host_ms: list[float] = field(default_factory=list)  # the same, of the rounds kept in `samples`


@dataclass
class _Round:
    samples: dict[str, list[float]]
    host_s: float  # the slowest host meter reading around its blocks


class Clock:
    def __init__(
        self,
        device: torch.device,
        timer: Callable[[], float] = time.perf_counter,
        host: Optional[HostMeter] = None,
    ) -> None:
        """timer: the host's clock in seconds, where the device has no events of its own (the CPU).
        host: the host meter whose best reading says what full speed is; by default this process's
        own on a GPU, and none on the CPU, where every variant runs on the host: a slowed host
        slows them all alike, which the interleaving already cancels in every ratio."""
        self.device = device
        self.timer = timer
        self.host = host if host is not None else (HOST if device.type == "cuda" else None)

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
    ) -> Timed:
        """Per-call latency in ms of each variant: `iterations` samples each, timed in blocks of
        consecutive calls (block_plan), each block after LEAD_CALLS untimed calls, the variants'
        blocks in turn with the order reversed every round. `warmup` untimed calls of each variant
        come first, on a GPU for at least WARMUP_SECONDS (warm_up). Sample i of every variant is
        the same round's same position: the pairs the bootstrap keeps together
        (orchestrator.jobs.stats). Rounds the host meter finds slowed are timed again and left out
        (HOST_SLOWED).

        Each call starts on an idle device (synchronize first), so a sample is the latency one
        request sees, launch overhead included: that is what CUDA graphs remove. `on_step` runs
        once per iteration, a round's worth at the end of each round."""
        names = list(variants)
        self.warm_up(variants, warmup, WARMUP_SECONDS if self.device.type == "cuda" else 0.0)
        for _ in range(warmup):
            on_step()
        self.sync()
        plan = block_plan(iterations)
        rounds: list[_Round] = []
        for calls in plan:
            rounds.append(self._round(variants, names, calls, reverse=len(rounds) % 2 == 1))
            for _ in range(calls):
                on_step()
        # retakes, of the plan's first block size, while fewer rounds ran at full speed than the
        # plan has (the best reading may move with them), within RETAKE_SECONDS and RETAKE_ROUNDS
        deadline = time.monotonic() + RETAKE_SECONDS
        for _ in range(RETAKE_ROUNDS * len(plan)):
            slowed = self._slowed(rounds)
            if len(rounds) - len(slowed) >= len(plan) or time.monotonic() > deadline:
                break
            if id(rounds[-1]) in slowed:
                move_to_fastest_core()
            rounds.append(self._round(variants, names, plan[0], reverse=len(rounds) % 2 == 1))
        slowed = self._slowed(rounds)
        steady_rounds = [r for r in rounds if id(r) not in slowed]
        steady = len(steady_rounds) >= min(len(plan), max(MIN_STEADY_ROUNDS, (len(plan) + 1) // 2))
        kept = steady_rounds if steady else rounds
        return Timed(
            samples={name: [ms for r in kept for ms in r.samples[name]] for name in names},
            rounds=len(rounds),
            slowed=len(slowed),
            steady=steady,
            host_ms=[r.host_s * 1e3 for r in rounds],
            kept_host_ms=[r.host_s * 1e3 for r in kept],
        )

    def warm_up(self, variants: dict[str, Callable[[], Any]], calls: int, seconds: float) -> None:
        """Untimed calls of every variant in turn, each to its end on the device: at least `calls`
        of each, and on until `seconds` have passed on the clock's timer (WARMUP_SECONDS)."""
        started, done = self.timer(), 0
        while done < calls or (variants and self.timer() - started < seconds):
            for fn in variants.values():
                fn()
                self.sync()
            done += 1

    def _round(self, variants: dict[str, Callable[[], Any]], names: list[str], calls: int, reverse: bool) -> _Round:
        """One block of `calls` timed calls per variant, the host meter read before each block and
        after the last: the round's host reading is the slowest of them."""
        samples: dict[str, list[float]] = {}
        host_s = 0.0
        for name in names[::-1] if reverse else names:
            host_s = max(host_s, self._read_host())
            fn = variants[name]
            for _ in range(LEAD_CALLS):
                fn()
            samples[name] = [self._time_one(fn) for _ in range(calls)]
        return _Round(samples, max(host_s, self._read_host()))

    def _read_host(self) -> float:
        return self.host() if self.host is not None else 0.0

    def _slowed(self, rounds: list[_Round]) -> set[int]:
        """The ids of the rounds timed while the host ran slowed: their slowest reading over
        HOST_SLOWED times the best the meter has read."""
        if self.host is None:
            return set()
        return {id(r) for r in rounds if r.host_s > HOST_SLOWED * self.host.best}

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
            # Both events go on a stream looked up before the first: `Event.record()` without one
            # looks the current stream up itself, several microseconds of Python (the device's
            # index, CUDA's availability, a new Stream object) that would lie between the events
            # and be charged to every host-bound call.
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(calls):
                fn()
            end.record(stream)
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
