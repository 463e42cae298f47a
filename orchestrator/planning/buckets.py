"""Buckets chosen from traffic: the sizes that minimise the expected cost of a request.

A request of size n (per dimension) runs at the smallest bucket at least as large; its cost is the
cost of that bucket (point, in a grid): without measurements, its padded size (the product of its
sizes: the positions it computes); with a warmup report, the measured latency of the variant that
serves it, interpolated between measured points (Cost).

One dimension: the optimum is exact. Sizes sorted, a set of k buckets splits them into k runs of
consecutive sizes, each served by its largest (a bucket between two seen sizes only costs more),
so the best set is the best partition, found by dynamic programming over (last size, buckets
used): O(k m^2) for m distinct sizes (plan_one).

A grid (batch x seq): the plan is a product of one set per dimension, as the config's grid form is.
With the sets of the other dimensions fixed, the best set for one dimension is again an exact
partition (each request's cost depends only on the run its size falls in), so the plan alternates
exact one-dimensional steps over the dimensions until none improves, from every split of the point
budget into per-dimension counts that leaves none to spare. Each step never raises the cost, so
this ends at a coordinate-wise optimum: no better plan differs from it in one dimension alone. It
need not be the global optimum; tests check it against brute force on small traces.

Free points (a grid's `points.only`): any set of points, not a product. Each request runs at the
cheapest point at least as large in every dimension. The point of the largest sizes seen is
always one of them: it holds any request within the sizes seen, not only the trace's (without it,
a batch of 32 at a length seen only with one row would run as 32 calls). Choosing the others is a
k-median problem with covering constraints, NP-hard in general, so plan_points is a heuristic:
greedy additions of the point that lowers the mean cost most, then swaps of one point for another
until none helps (a local optimum: no plan that differs in one point is better), the best of
several such searches from different second points. Candidates are the products of the sizes
seen per dimension (a point between two seen sizes only costs more), at most CANDIDATE_SIZES per
dimension (quantiles of the traffic, the largest kept), so the search stays a few seconds. Nothing
guarantees it beats the product plan; tests check it against brute force on small traces.

A quantile (plan_quantile): free points of the least median or 99th-percentile cost, which a plan
for the mean can leave high (a median request served at the edge of a point). Unlike the mean, the
least quantile is found exactly, over the candidate sizes, for one or two dimensions: see there.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from orchestrator.jobs.routing import cheapest

Point = tuple[int, ...]
Traffic = Mapping[Point, int]  # request sizes (one per dimension) -> how many requests


class Cost:
    """What a call at a point costs: its padded size (product of its sizes), or, with measured
    latencies by point, those interpolated between the measured points (`_interpolated`).
    Costs are remembered by point: a plan asks for the same few points many times.

    `spread`: how a request's measured latency falls around its point's price (each measured
    point's samples less their median, pooled). A point's price is one number, but the requests it
    serves spread around it, so where a quantile falls on the edge of a point's step (that point
    holds just over the quantile's share of the requests), the measured quantile lies in the tail
    of that point's latencies, not at its price. The figures' quantiles and mean are of the
    latencies so spread (_figures); the search for a plan prices each point at its one number."""

    def __init__(self, measured: Optional[Mapping[Point, float]] = None, spread: Sequence[float] = ()) -> None:
        self.measured = dict(measured or {})
        self.spread = np.asarray(spread, dtype=float)
        self.unit = "ms" if self.measured else "positions"
        dims = len(next(iter(self.measured))) if self.measured else 0
        self._sizes = [sorted({point[d] for point in self.measured}) for d in range(dims)]
        self._known: dict[Point, float] = {}

    def __call__(self, point: Point) -> float:
        value = self._known.get(point)
        if value is None:
            if not self.measured:
                value = float(math.prod(point))
            else:
                value = self.measured[point] if point in self.measured else self._interpolated(point)
            self._known[point] = value
        return value

    def _interpolated(self, point: Point) -> float:
        """Multilinear interpolation in the sizes between the measured sizes around the point (a
        GPU's latency is close to affine in each size: a floor, then a slope), over the corners
        that were measured; above the largest measured size of a dimension, the largest one
        scaled by the ratio of sizes (the work grows with the positions computed); below the
        smallest, the smallest one (the floor). Exact at every measured point, and monotone where
        the measurements are."""
        corners: list[tuple[list[int], float]] = [([], 1.0)]
        scale = 1.0
        for n, sizes in zip(point, self._sizes, strict=True):
            at = bisect.bisect_left(sizes, n)
            if at == len(sizes):
                scale *= n / sizes[-1]
                ends = [(sizes[-1], 1.0)]
            elif sizes[at] == n or at == 0:
                ends = [(sizes[at], 1.0)]
            else:
                low, high = sizes[at - 1], sizes[at]
                t = (n - low) / (high - low)
                ends = [(low, 1.0 - t), (high, t)]
            corners = [([*sizes_so_far, size], weight * w) for sizes_so_far, weight in corners for size, w in ends]
        total = weight_sum = 0.0
        for sizes_at, weight in corners:
            ms = self.measured.get(tuple(sizes_at))
            if ms is not None and weight > 0:
                total += weight * ms
                weight_sum += weight
        if weight_sum > 0:
            return scale * total / weight_sum
        # no corner measured (a grid with points left out): the nearest point at least as large
        # in every dimension, else the nearest, scaled by the ratio of padded sizes
        larger = [known for known in self.measured if all(k >= n for k, n in zip(known, point, strict=True))]
        known = min(larger or self.measured, key=lambda k: _log_distance(k, point))
        ms = self.measured[known]
        return ms if larger else ms * math.prod(point) / math.prod(known)


def _log_distance(a: Point, b: Point) -> float:
    return math.sqrt(sum((math.log(x) - math.log(y)) ** 2 for x, y in zip(a, b, strict=True)))


@dataclass(frozen=True)
class Figures:
    """What a set of buckets costs on a traffic: the mean cost of a request (what a plan
    minimises), the costs that half and 99 in 100 of the requests stay within (the median and the
    tail, which a plan for the mean may leave worse), the fraction of the positions computed that
    were padding, and the points to compile. With a measured spread (Cost), the mean and the
    quantiles are of the latencies the requests see around their points' prices."""

    mean_cost: float
    p50_cost: float
    p99_cost: float
    padding_waste: float
    points: int


def _figures(served: Sequence[tuple[float, float, int, int]], points: int, spread: np.ndarray) -> Figures:
    """Figures from what each kind of request costs: (its cost, how many there are, the positions
    it holds, the positions computed for it), each cost spread as `spread` says (Cost): the cost
    plus every deviation, its requests shared evenly among them (a request served in chunks takes
    one deviation for all its calls)."""
    real = sum(count * holds for _, count, holds, _ in served)
    padded = sum(count * computed for _, count, _, computed in served)
    by_cost: dict[float, float] = {}
    for cost, count, _, _ in served:
        by_cost[cost] = by_cost.get(cost, 0.0) + count
    costs, counts = np.array(list(by_cost)), np.array(list(by_cost.values()))
    mean = _mean(served)
    if len(spread):
        costs = (costs[:, None] + spread[None, :]).ravel()
        counts = np.repeat(counts / len(spread), len(spread))
        mean += float(spread.mean())
    p50, p99 = _quantiles(costs, counts, (0.5, 0.99))
    return Figures(mean, p50, p99, 1 - real / padded if padded else 0.0, points)


def _mean(served: Sequence[tuple[float, float, int, int]]) -> float:
    return sum(count * cost for cost, count, _, _ in served) / sum(count for _, count, _, _ in served)


def _quantiles(costs: np.ndarray, counts: np.ndarray, qs: Sequence[float]) -> list[float]:
    """For each q, the least cost that at least a fraction q of the requests stay within: `costs`
    and `counts` hold each cost of a request and how many requests cost that."""
    order = np.argsort(costs, kind="stable")
    upto = np.cumsum(counts[order])
    last = len(costs) - 1
    return [float(costs[order[min(int(np.searchsorted(upto, q * upto[-1] - 1e-9)), last)]]) for q in qs]


def aligned(traffic: Traffic, multiples: Sequence[int]) -> Traffic:
    """`traffic` with each request's size in every dimension rounded up to that dimension's
    multiple. A size that is a multiple holds a request exactly when it holds the request so
    rounded, so a plan of this traffic is the best plan of `traffic` whose sizes are multiples
    (the search's candidates are the sizes seen)."""
    if all(m == 1 for m in multiples):
        return traffic
    out: dict[Point, int] = {}
    for request, count in traffic.items():
        key = tuple(-(-n // m) * m for n, m in zip(request, multiples, strict=True))
        out[key] = out.get(key, 0) + count
    return out


def bucket_for(sizes: Sequence[int], n: int) -> Optional[int]:
    at = bisect.bisect_left(sizes, n)
    return sizes[at] if at < len(sizes) else None


def figures(traffic: Traffic, grid: Sequence[Sequence[int]], cost: Cost) -> Figures:
    """The figures of the product grid `grid` (sorted sizes per dimension) on `traffic`; a
    request larger than the grid in the first dimension (the batch) runs in chunks of its largest,
    one beyond it in another dimension cannot run: ValueError."""
    return _figures(_served(traffic, grid, cost), math.prod(len(g) for g in grid), cost.spread)


def _served(traffic: Traffic, grid: Sequence[Sequence[int]], cost: Cost) -> list[tuple[float, float, int, int]]:
    """What each request size of `traffic` costs on the product grid `grid`, as _figures takes it."""
    served: list[tuple[float, float, int, int]] = []
    for sizes, count in traffic.items():
        point, calls = [], 1
        for d, (n, buckets) in enumerate(zip(sizes, grid, strict=True)):
            b = bucket_for(buckets, n)
            if b is None:
                if d:
                    raise ValueError(f"a request of {n} in dimension {d} is larger than every bucket {list(buckets)}")
                calls, b = math.ceil(n / buckets[-1]), buckets[-1]
            point.append(b)
        served.append((calls * cost(tuple(point)), count, math.prod(sizes), calls * math.prod(point)))
    return served


def plan_one(traffic: Traffic, dim: int, grid: list[list[int]], cost: Cost, k: int) -> list[int]:
    """The exact best at most `k` sizes for dimension `dim` (the largest seen size among them),
    the other dimensions' sets fixed: dynamic programming over the sorted distinct sizes.

    A request served at size s of this dimension costs what the point of s and the other
    dimensions' buckets costs, whatever its own size below s. So with P_g[i] the requests of group
    g (those the other dimensions serve at one point) of size at most sizes[i], and u_g[j] what one
    of them costs at sizes[j], the run sizes[i+1..j] served by sizes[j] costs
    sum_g u_g[j] * (P_g[j] - P_g[i]), and

        best[1][j] = V_j[j],  best[b][j] = V_j[j] + min over i < j of (best[b-1][i] - V_j[i]),
        V_j[i] = sum_g u_g[j] * P_g[i],

    where best[b][j] is the least cost of the requests up to sizes[j] with b buckets, the last one
    sizes[j]. O(k m^2 g) for m distinct sizes and g groups, the inner loops in C (map)."""
    sizes = sorted({request[dim] for request in traffic})
    m = len(sizes)
    k = max(1, min(k, m))
    index = {n: i for i, n in enumerate(sizes)}
    by_group: dict[Point, list[float]] = {}  # the other dimensions' point (this one 0) -> requests by size
    for request, count in traffic.items():
        key = tuple(0 if d == dim else _serving(grid[d], n) for d, n in enumerate(request))
        by_group.setdefault(key, [0.0] * m)[index[request[dim]]] += count
    groups = list(by_group)
    upto = [list(itertools.accumulate(by_group[key])) for key in groups]  # P_g
    inf = math.inf
    best = [[inf] * m for _ in range(k + 1)]
    back = [[-1] * m for _ in range(k + 1)]
    for j, n in enumerate(sizes):
        unit = [cost(key[:dim] + (n,) + key[dim + 1 :]) for key in groups]  # u_g[j]
        v = [0.0] * (j + 1)  # V_j[0..j]
        for u, p in zip(unit, upto, strict=True):
            v = list(map(operator.add, v, map(operator.mul, p[: j + 1], itertools.repeat(u))))
        best[1][j] = v[j]
        for b in range(2, min(k, j + 1) + 1):
            gaps = list(map(operator.sub, best[b - 1][:j], v[:j]))
            low = min(gaps)
            if low < inf:
                best[b][j], back[b][j] = v[j] + low, gaps.index(low)
    used = min(range(1, k + 1), key=lambda b: best[b][m - 1])
    chosen, j = [], m - 1
    while j >= 0 and used >= 1:
        chosen.append(sizes[j])
        j, used = back[used][j], used - 1
    return sorted(chosen)


def _serving(sizes: Sequence[int], n: int) -> int:
    """The bucket of `sizes` that serves a request of size n (the largest, chunked, above it)."""
    b = bucket_for(sizes, n)
    return b if b is not None else sizes[-1]


def plan(traffic: Traffic, max_points: int, cost: Cost, dims: int) -> list[list[int]]:
    """The grid (sorted sizes per dimension, at most `max_points` points) of least mean cost on
    `traffic`, by alternating exact one-dimensional steps (module doc) from every split of the
    points over the dimensions that leaves none to spare (a further size never costs more)."""
    if not traffic:
        raise ValueError("the traffic holds no request")
    if dims == 1:
        return [plan_one(traffic, 0, [[max(r[0] for r in traffic)]], cost, max_points)]
    best: Optional[tuple[float, list[list[int]]]] = None
    largest = [max(r[d] for r in traffic) for d in range(dims)]
    distinct = [len({r[d] for r in traffic}) for d in range(dims)]
    for counts in _splits(max_points, distinct):
        grid = [[largest[d]] for d in range(dims)]
        current = _mean(_served(traffic, grid, cost))
        for _ in range(20):  # each pass never raises the cost; a few passes settle it
            for d in range(dims):
                grid[d] = plan_one(traffic, d, grid, cost, counts[d])
            value = _mean(_served(traffic, grid, cost))
            if value >= current - 1e-12:
                current = value
                break
            current = value
        if best is None or current < best[0] - 1e-12:
            best = (current, [list(g) for g in grid])
    assert best is not None
    return best[1]


def _splits(max_points: int, distinct: Sequence[int]) -> list[tuple[int, ...]]:
    """The counts of sizes per dimension (at most the distinct sizes seen there) whose product is
    at most `max_points` and that no dimension can raise without passing it."""
    caps = [min(max_points, n) for n in distinct]
    fitting = [c for c in itertools.product(*(range(1, cap + 1) for cap in caps)) if math.prod(c) <= max_points]
    return [
        c
        for c in fitting
        if all(c[d] == caps[d] or math.prod(c) // c[d] * (c[d] + 1) > max_points for d in range(len(c)))
    ]


def powers_of_two(traffic: Traffic, shape: Sequence[int]) -> list[list[int]]:
    """The usual guess with as many sizes per dimension as `shape` says: the largest powers of two
    up to the one that holds the largest request."""
    out = []
    for d, count in enumerate(shape):
        top = 1 << max(0, math.ceil(math.log2(max(r[d] for r in traffic))))
        sizes = [top >> i for i in range(count) if top >> i >= 1]
        out.append(sorted(sizes))
    return out


CANDIDATE_SIZES = 48  # per dimension, for plan_points


def point_figures(traffic: Traffic, points: Sequence[Point], cost: Cost) -> Figures:
    """The figures of a free set of points, each request served as a grid replica routes it
    (routed_costs)."""
    return _figures(routed_costs(traffic, points, cost), len(points), cost.spread)


def routed_costs(traffic: Traffic, points: Sequence[Point], cost: Cost) -> list[tuple[float, int, int, int]]:
    """Per request size of `traffic`: (its cost, how many requests, the positions it holds, the
    positions computed for it), served as a grid replica routes it (routing.cheapest): the points
    that share their sizes beyond the batch form a slice; a request runs whole at the cheapest
    point that holds it, and only one of more rows than any point holding its other sizes runs in
    chunks, at the largest batch of the slice where those calls cost least. ValueError where no
    point holds a request's sizes beyond the batch."""
    slices: dict[Point, list[int]] = {}
    for point in sorted(points):
        slices.setdefault(point[1:], []).append(point[0])
    served = []
    for sizes, count in traffic.items():
        holding = [rest for rest in slices if all(b >= n for b, n in zip(rest, sizes[1:], strict=True))]
        if not holding:
            raise ValueError(f"no point holds a request of {list(sizes)}")
        at, batch, calls = cheapest(sizes[0], [slices[rest] for rest in holding], lambda i, b: cost((b, *holding[i])))
        point = (batch, *holding[at])
        served.append((calls * cost(point), count, math.prod(sizes), calls * math.prod(point)))
    return served


def plan_points(traffic: Traffic, max_points: int, cost: Cost) -> list[Point]:
    """At most `max_points` points, any sizes, of low mean cost on `traffic` (module doc): the
    best of RESTARTS searches, each from the largest point and one of the points whose addition
    alone lowers the cost most."""
    found = _Candidates(traffic, cost)
    k = min(max_points, len(found.points))
    largest = found.largest
    gains = (np.maximum(found.price[largest][None, :] - found.price, 0.0) * found.counts).sum(axis=1)
    seeds = [[largest]] + [[largest, int(c)] for c in np.argsort(-gains)[:RESTARTS] if gains[c] > 0 and k > 1]
    searched = [_search(found.price, found.counts, seed, k) for seed in seeds]
    _, chosen = min(searched, key=lambda result: result[0])
    return sorted(found.points[c] for c in chosen)


RESTARTS = 8


def plan_quantile(
    traffic: Traffic, max_points: int, cost: Cost, q: float, slack: float = 0.0, margin: float = 0.0
) -> list[Point]:
    """At most `max_points` points of one or two dimensions whose q-quantile of a request's cost
    (q = 0.5: the median) is within `slack` (a fraction) of the least that any such set of
    candidate points reaches, and of the least mean cost among those this search finds.

    `margin` (0 to 1): the plan holds its level for that share of the requests beyond the quantile
    as well, i.e. it plans the quantile q + margin * (1 - q) (a median with margin 0.2: 60% of the
    requests at or under the level). A point's price is one number, but the requests it serves
    spread around it: a plan whose level holds just q of the requests puts the measured quantile
    in the tail of its cheap points' latencies, while one that holds a margin more keeps it among
    their typical latencies.

    A request costs at most c wherever some point of cost at most c holds it, so the least
    quantile is the least c at which max_points - 1 points of cost at most c (beside the largest
    point) hold a fraction q of the requests. At a given c the useful points form a staircase, one
    per batch size: the longest length affordable there. Taken in order of batch size, each point
    adds exactly the requests of larger batch than the one before, up to its own batch and length
    (a point that another of larger batch and length holds adds nothing), so the most requests
    that t points hold is a dynamic program over the staircase (_Candidates.most_held, exact), and
    the least c for t points is found by bisection over the candidates' costs. The least quantile
    may take every point, leaving none for the others' requests; a little above it, fewer points
    reach it. So for each t, where its least c is within the slack, the t points that reach it
    are kept to that bound, the others chosen for the mean and any swapped for a cheaper mean
    while the bound holds (_search); the cheapest of those plans is the plan."""
    if not traffic:
        raise ValueError("the traffic holds no request")
    dims = len(next(iter(traffic)))
    if dims not in (1, 2):
        raise ValueError(f"a plan for a quantile takes one or two bucketed dimensions, not {dims}")
    price: Callable[[Point], float] = cost
    if dims == 1:  # the same search over points of length 1
        traffic = {(*request, 1): count for request, count in traffic.items()}
        price = lambda point: cost(point[:1])  # noqa: E731
    found = _Candidates(traffic, price)
    k = min(max_points, len(found.points))
    need = (q + margin * (1 - q)) * float(found.counts.sum()) - 1e-9
    levels = np.unique(found.unit)
    top = int(np.searchsorted(levels, found.unit[found.largest]))  # the largest point alone holds all

    def least_level(t: int) -> int:
        low, high = 0, top
        while low < high:  # the least level at which t points hold a fraction q
            middle = (low + high) // 2
            if found.most_held(levels[middle], t)[0] >= need:
                high = middle
            else:
                low = middle + 1
        return low

    bound: Optional[float] = None  # the least quantile, with its slack: that of k - 1 points
    plans = []
    for t in range(k - 1, 0, -1):
        level = levels[least_level(t)]
        if bound is None:
            bound = level * (1 + slack)
        elif level > bound:
            break
        _, needed = found.most_held(level, t, need)
        seed = [found.largest, *(c for c in needed if c != found.largest)]
        plans.append(_search(found.price, found.counts, seed, k, within=(float(level), need)))
    if not plans:  # one point: the largest
        plans.append((0.0, [found.largest]))
    _, chosen = min(plans, key=lambda result: result[0])
    points = sorted(found.points[c] for c in chosen)
    return [point[:1] for point in points] if dims == 1 else points


def _search(
    price: np.ndarray,
    counts: np.ndarray,
    seed: list[int],
    k: int,
    within: Optional[tuple[float, float]] = None,
) -> tuple[float, list[int]]:
    """From `seed` (the largest point first, kept): greedy additions up to k points, then swaps
    of one point for the best other until none lowers the cost. `within` (a cost, a number of
    requests): a swap must leave at least that many requests costing no more than that, as the
    seed does (a quantile's bound). The cost and the points."""
    chosen = list(seed)
    best = price[chosen].min(axis=0)
    while len(chosen) < k:
        gains = (np.maximum(best[None, :] - price, 0.0) * counts).sum(axis=1)
        pick = int(gains.argmax())
        if gains[pick] <= 0.0:
            break
        chosen.append(pick)
        best = np.minimum(best, price[pick])
    current = float((best * counts).sum())
    for _ in range(20):  # each swap lowers the cost; a few passes settle it
        improved = False
        for i in range(1, len(chosen)):  # the largest point stays
            others = price[[c for j, c in enumerate(chosen) if j != i]].min(axis=0)
            served = np.minimum(others[None, :], price)
            totals = (served * counts).sum(axis=1)
            if within is not None:
                level, need = within
                totals[((served <= level) * counts).sum(axis=1) < need] = np.inf
            pick = int(totals.argmin())
            if totals[pick] < current * (1 - 1e-9) and pick not in chosen:
                chosen[i], current, improved = pick, float(totals[pick]), True
        if not improved:
            break
    return current, chosen


class _Candidates:
    """The points a free plan chooses among (the products of each dimension's candidate sizes),
    the traffic's requests rounded up to candidate sizes (a candidate holds a request exactly
    when it holds it so rounded: far fewer to count on a wide trace), what each candidate costs,
    and what each request costs at each candidate (inf where it does not fit)."""

    def __init__(self, traffic: Traffic, cost: Callable[[Point], float]) -> None:
        self.axes = [_candidate_sizes(traffic, d) for d in range(len(next(iter(traffic))))]
        rounded: dict[Point, int] = {}
        for request, count in traffic.items():
            key = tuple(axis[bisect.bisect_left(axis, n)] for axis, n in zip(self.axes, request, strict=True))
            rounded[key] = rounded.get(key, 0) + count
        self.counts = np.array(list(rounded.values()), dtype=float)
        self.requests = np.array(list(rounded), dtype=float)  # (requests, dims)
        self.points = list(itertools.product(*self.axes))
        at = np.array(self.points, dtype=float)
        holds = (at[:, None, :] >= self.requests[None, :, :]).all(axis=2)  # (candidates, requests)
        self.unit = np.array([cost(c) for c in self.points])
        self.price = np.where(holds, self.unit[:, None], np.inf)
        self.largest = self.points.index(tuple(axis[-1] for axis in self.axes))

    def most_held(self, level: float, t: int, enough: float = math.inf) -> tuple[float, list[int]]:
        """Two dimensions: the most requests that at most t candidates of cost at most `level`
        hold together, and the candidates of a set that holds them (of one that holds `enough`,
        with as few points as can, where one does): the staircase's dynamic program."""
        rows, lengths = self.axes
        held = self._held
        affordable = self.unit.reshape(len(rows), len(lengths)) <= level
        # per batch size, its step: the longest affordable length's index + 1 (0: none)
        step = np.where(affordable.any(axis=1), len(lengths) - affordable[:, ::-1].argmax(axis=1), 0)
        if t < 1 or not step.any():
            return 0.0, []
        alone = np.where(step > 0, held[np.arange(1, len(rows) + 1), step], -np.inf)
        best = np.full((t + 1, len(rows)), -np.inf)  # best[u, i]: u steps, the last at batch rows[i]
        back = np.full((t + 1, len(rows)), -1)
        best[1] = alone
        for used in range(2, t + 1):
            for last in range(1, len(rows)):
                if not step[last]:
                    continue
                # after a step at rows[a], this one adds the requests above rows[a] up to its own
                gained = best[used - 1, :last] + alone[last] - held[np.arange(1, last + 1), step[last]]
                a = int(gained.argmax())
                best[used, last], back[used, last] = gained[a], a
        most = float(best.max())
        goal = min(enough, most)
        used = next(u for u in range(1, t + 1) if best[u].max() >= goal)
        i, chosen = int(best[used].argmax()), []
        while i >= 0 and used >= 1:
            chosen.append(i * len(lengths) + int(step[i]) - 1)  # points run over lengths within rows
            i, used = int(back[used, i]), used - 1
        return most, chosen

    @functools.cached_property
    def _held(self) -> np.ndarray:
        """Two dimensions: [i, j] the requests of at most rows[i-1] rows and lengths[j-1]
        positions, whatever the level: made once for every most_held."""
        rows, lengths = self.axes
        held = np.zeros((len(rows) + 1, len(lengths) + 1))
        np.add.at(
            held,
            (np.searchsorted(rows, self.requests[:, 0]) + 1, np.searchsorted(lengths, self.requests[:, 1]) + 1),
            self.counts,
        )
        return held.cumsum(axis=0).cumsum(axis=1)


def _candidate_sizes(traffic: Traffic, dim: int) -> list[int]:
    """The sizes seen in dimension `dim`, at most CANDIDATE_SIZES of them: where more were seen,
    those at evenly spaced quantiles of the requests, the largest always among them."""
    seen: dict[int, int] = {}
    for request, count in traffic.items():
        seen[request[dim]] = seen.get(request[dim], 0) + count
    ordered = sorted(seen)
    if len(ordered) <= CANDIDATE_SIZES:
        return ordered
    upto = list(itertools.accumulate(seen[n] for n in ordered))
    picks = {ordered[-1]}
    for q in range(1, CANDIDATE_SIZES):
        picks.add(ordered[bisect.bisect_left(upto, upto[-1] * q / CANDIDATE_SIZES)])
    return sorted(picks)
