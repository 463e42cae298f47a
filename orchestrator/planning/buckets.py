"""Buckets chosen from traffic: the sizes that minimise the expected cost of a request.

A request of size n (per dimension) runs at the smallest bucket at least as large; its cost is the
cost of that bucket (point, in a grid): without measurements, its padded size (the product of its
sizes: the positions it computes); with a warmup report, the measured latency of the variant that
serves it, interpolated between measured points (Cost).

One dimension: the optimum is exact. Sizes sorted, a set of k buckets splits them into k runs of
consecutive sizes, each served by its largest (a bucket between two seen sizes only costs more),
so the best set is the best partition, found by dynamic programming over (last size, buckets
used): O(k m^2) for m distinct sizes.

A grid (batch x seq): the plan is a product of one set per dimension, as the config's grid form is.
With the sets of the other dimensions fixed, the best set for one dimension is again an exact
partition (each request's cost depends only on the run its size falls in), so the plan alternates
exact one-dimensional steps over the dimensions until none improves, from every split of the point
budget into per-dimension counts. Each step never raises the cost, so this ends at a coordinate-wise
optimum: no better plan differs from it in one dimension alone. It need not be the global optimum;
tests check it against brute force on small traces.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

Point = tuple[int, ...]
Traffic = Mapping[Point, int]  # request sizes (one per dimension) -> how many requests


class Cost:
    """What a call at a point costs: its padded size (product of its sizes), or, with measured
    latencies by point, those interpolated (linearly in each dimension, in log size) and scaled
    by the padded size beyond the measured range."""

    def __init__(self, measured: Optional[Mapping[Point, float]] = None) -> None:
        self.measured = dict(measured or {})
        self.unit = "ms" if self.measured else "positions"

    def __call__(self, point: Point) -> float:
        if not self.measured:
            return float(math.prod(point))
        if point in self.measured:
            return self.measured[point]
        return self._interpolated(point)

    def _interpolated(self, point: Point) -> float:
        """Inverse-distance weighting in log sizes over the measured points, each scaled by the
        ratio of padded sizes where the point lies outside them: a smooth, monotone estimate that
        is exact at every measured point."""
        weights, total = 0.0, 0.0
        for known, ms in self.measured.items():
            distance = math.sqrt(sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(point, known, strict=True)))
            scaled = ms * math.prod(point) / math.prod(known) if distance > 0 else ms
            weight = 1.0 / (distance**4 + 1e-12)
            weights += weight
            total += weight * scaled
        return total / weights


@dataclass(frozen=True)
class Figures:
    """What a set of buckets costs on a traffic: the mean cost of a request, the fraction of the
    positions computed that were padding, and the points to compile."""

    mean_cost: float
    padding_waste: float
    points: int


def bucket_for(sizes: Sequence[int], n: int) -> Optional[int]:
    at = bisect.bisect_left(sizes, n)
    return sizes[at] if at < len(sizes) else None


def figures(traffic: Traffic, grid: Sequence[Sequence[int]], cost: Cost) -> Figures:
    """The figures of the product grid `grid` (sorted sizes per dimension) on `traffic`; a
    request larger than the grid in the first dimension (the batch) runs in chunks of its largest,
    one beyond it in another dimension cannot run: ValueError."""
    total_cost = requests = 0.0
    real = padded = 0.0
    for sizes, count in traffic.items():
        point, calls = [], 1
        for d, (n, buckets) in enumerate(zip(sizes, grid, strict=True)):
            b = bucket_for(buckets, n)
            if b is None:
                if d:
                    raise ValueError(f"a request of {n} in dimension {d} is larger than every bucket {list(buckets)}")
                calls, b = math.ceil(n / buckets[-1]), buckets[-1]
            point.append(b)
        total_cost += count * calls * cost(tuple(point))
        requests += count
        real += count * math.prod(sizes)
        padded += count * calls * math.prod(point)
    return Figures(total_cost / requests, 1 - real / padded if padded else 0.0, math.prod(len(g) for g in grid))


def best_partition(sizes: Sequence[int], group_cost: Callable[[int, int], float], k: int) -> list[int]:
    """The at most `k` buckets (taken from `sizes`, sorted and distinct, the largest always among
    them) minimising the sum of group_cost(i, j) over the runs sizes[i..j] they make, each run
    served by sizes[j]. Exact: dynamic programming."""
    m = len(sizes)
    k = max(1, min(k, m))
    inf = math.inf
    # best[g][j]: the least cost of serving sizes[0..j] with g buckets, the last one sizes[j]
    best = [[inf] * m for _ in range(k + 1)]
    back = [[-1] * m for _ in range(k + 1)]
    for j in range(m):
        best[1][j] = group_cost(0, j)
    for g in range(2, k + 1):
        for j in range(m):
            for i in range(g - 2, j):  # the previous bucket is sizes[i]; this run is sizes[i+1..j]
                if best[g - 1][i] == inf:
                    continue
                value = best[g - 1][i] + group_cost(i + 1, j)
                if value < best[g][j]:
                    best[g][j], back[g][j] = value, i
    g = min(range(1, k + 1), key=lambda used: best[used][m - 1])
    chosen, j = [], m - 1
    while j >= 0 and g >= 1:
        chosen.append(sizes[j])
        j, g = back[g][j], g - 1
    return sorted(chosen)


def plan_one(traffic: Traffic, dim: int, grid: list[list[int]], cost: Cost, k: int) -> list[int]:
    """The exact best `k` sizes for dimension `dim`, the other dimensions' sets fixed."""
    sizes = sorted({request[dim] for request in traffic})
    index = {n: i for i, n in enumerate(sizes)}
    # served[j][i]: what the requests of size sizes[i] cost when sizes[j] serves them, summed
    # from i = 0 (prefix sums, so a run's cost is a difference)
    served = [[0.0] * (j + 1) for j in range(len(sizes))]
    for request, count in traffic.items():
        point = list(request)
        for d, size in enumerate(request):
            if d != dim:
                b = bucket_for(grid[d], size)
                point[d] = b if b is not None else grid[d][-1]
        for j in range(index[request[dim]], len(sizes)):
            point[dim] = sizes[j]
            served[j][index[request[dim]]] += count * cost(tuple(point))
    for row in served:
        for i in range(1, len(row)):
            row[i] += row[i - 1]

    def run_cost(i: int, j: int) -> float:
        return served[j][j] - (served[j][i - 1] if i else 0.0)

    return best_partition(sizes, run_cost, k)


def plan(traffic: Traffic, max_points: int, cost: Cost, dims: int) -> list[list[int]]:
    """The grid (sorted sizes per dimension, at most `max_points` points) of least mean cost on
    `traffic`, by alternating exact one-dimensional steps (module doc)."""
    if not traffic:
        raise ValueError("the traffic holds no request")
    if dims == 1:
        return [plan_one(traffic, 0, [[max(r[0] for r in traffic)]], cost, max_points)]
    best: Optional[tuple[float, list[list[int]]]] = None
    largest = [max(r[d] for r in traffic) for d in range(dims)]
    for counts in itertools.product(range(1, max_points + 1), repeat=dims):
        if math.prod(counts) > max_points:
            continue
        grid = [[largest[d]] for d in range(dims)]
        current = figures(traffic, grid, cost).mean_cost
        for _ in range(20):  # each pass never raises the cost; a few passes settle it
            for d in range(dims):
                grid[d] = plan_one(traffic, d, grid, cost, counts[d])
            value = figures(traffic, grid, cost).mean_cost
            if value >= current - 1e-12:
                current = value
                break
            current = value
        if best is None or current < best[0] - 1e-12:
            best = (current, [list(g) for g in grid])
    assert best is not None
    return best[1]


def powers_of_two(traffic: Traffic, shape: Sequence[int]) -> list[list[int]]:
    """The usual guess with as many sizes per dimension as `shape` says: the largest powers of two
    up to the one that holds the largest request."""
    out = []
    for d, count in enumerate(shape):
        top = 1 << max(0, math.ceil(math.log2(max(r[d] for r in traffic))))
        sizes = [top >> i for i in range(count) if top >> i >= 1]
        out.append(sorted(sizes))
    return out
