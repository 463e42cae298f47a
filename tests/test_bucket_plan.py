"""`orchestrate plan`: buckets chosen from a traffic, checked against brute force, and the command's
inputs, output and config rewrite."""

from __future__ import annotations

import itertools
import json
import math
import random
import socket
from pathlib import Path

import pytest
from conftest import ROOT, orchestrate

from orchestrator.planning.buckets import (
    Cost,
    aligned,
    figures,
    plan,
    plan_one,
    plan_points,
    plan_quantile,
    point_figures,
    powers_of_two,
)


def brute_force(traffic, max_points: int, dims: int) -> float:
    """The least mean cost of every product grid of at most `max_points` points whose sizes are
    seen sizes (a bucket between two seen sizes only costs more), each dimension's largest kept."""
    per_dim = [sorted({r[d] for r in traffic}) for d in range(dims)]
    best = float("inf")
    choices = []
    for d in range(dims):
        sizes = per_dim[d]
        choices.append(
            [
                [*subset, sizes[-1]]
                for k in range(len(sizes))
                for subset in itertools.combinations(sizes[:-1], k)
                if k + 1 <= max_points
            ]
        )
    for grid in itertools.product(*choices):
        if math.prod(len(g) for g in grid) <= max_points:
            best = min(best, figures(traffic, [list(g) for g in grid], Cost()).mean_cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_one_dimension_finds_the_optimum(seed):
    rng = random.Random(seed)
    traffic = {(rng.randint(1, 40),): rng.randint(1, 20) for _ in range(12)}
    for k in (1, 2, 3, 4):
        [chosen] = plan(traffic, k, Cost(), 1)
        assert len(chosen) <= k and chosen[-1] == max(r[0] for r in traffic)
        assert figures(traffic, [chosen], Cost()).mean_cost == pytest.approx(brute_force(traffic, k, 1))


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_of_aligned_sizes_is_the_best_plan_of_multiples(seed):
    """Planned over the traffic rounded up to multiples of 8, the plan is the best set of
    multiples of 8 for the traffic as it came (brute force over every such set)."""
    rng = random.Random(200 + seed)
    traffic = {(rng.randint(1, 60),): rng.randint(1, 20) for _ in range(12)}
    multiples = sorted({-(-r[0] // 8) * 8 for r in traffic})
    for k in (1, 2, 3):
        [chosen] = plan(aligned(traffic, [8]), k, Cost(), 1)
        assert all(n % 8 == 0 for n in chosen)
        best = min(
            figures(traffic, [[*subset, multiples[-1]]], Cost()).mean_cost
            for size in range(k)
            for subset in itertools.combinations(multiples[:-1], size)
        )
        assert figures(traffic, [chosen], Cost()).mean_cost == pytest.approx(best)
    assert aligned({(3, 7): 2, (4, 8): 1, (5, 9): 4}, [1, 8]) == {(3, 8): 2, (4, 8): 1, (5, 16): 4}


@pytest.mark.parametrize("seed", range(4))
def test_a_grid_plan_is_the_optimum_on_small_traces(seed):
    rng = random.Random(100 + seed)
    traffic = {(rng.choice([1, 2, 3, 8]), rng.choice([5, 9, 17, 30, 64])): rng.randint(1, 9) for _ in range(10)}
    chosen = plan(traffic, 4, Cost(), 2)
    assert len(chosen[0]) * len(chosen[1]) <= 4
    assert figures(traffic, chosen, Cost()).mean_cost == pytest.approx(brute_force(traffic, 4, 2))


def brute_force_points(traffic, max_points: int, cost: Cost) -> float:
    """The least mean cost of every set of at most `max_points` points of seen sizes with the
    point of the largest sizes among them."""
    dims = len(next(iter(traffic)))
    candidates = list(itertools.product(*(sorted({r[d] for r in traffic}) for d in range(dims))))
    largest = tuple(max(r[d] for r in traffic) for d in range(dims))
    others = [c for c in candidates if c != largest]
    return min(
        point_figures(traffic, [largest, *subset], cost).mean_cost
        for k in range(max_points)
        for subset in itertools.combinations(others, k)
    )


@pytest.mark.parametrize("seed", range(6))
def test_free_points_reach_the_optimum_on_small_traces_and_never_lose_to_the_product_plan(seed):
    rng = random.Random(200 + seed)
    traffic = {(rng.choice([1, 2, 3, 8]), rng.choice([5, 9, 17, 30, 64])): rng.randint(1, 9) for _ in range(10)}
    for k in (2, 4):
        points = plan_points(traffic, k, Cost())
        assert len(points) <= k and tuple(max(r[d] for r in traffic) for d in range(2)) in points
        mean = point_figures(traffic, points, Cost()).mean_cost
        assert mean == pytest.approx(brute_force_points(traffic, k, Cost()))
        assert mean <= figures(traffic, plan(traffic, k, Cost(), 2), Cost()).mean_cost + 1e-9


def test_free_points_serve_two_crowds_a_product_grid_cannot():
    # short requests of many rows, long ones of one row: two points; a product grid of two points
    # pads one crowd to the other's size in one dimension
    traffic = {(32, 16): 100, (1, 256): 100}
    assert plan_points(traffic, 2, Cost()) == [(1, 256), (32, 256)]  # the largest point, always there
    points = plan_points(traffic, 3, Cost())
    assert points == [(1, 256), (32, 16), (32, 256)]
    assert point_figures(traffic, points, Cost()).padding_waste == 0.0
    assert figures(traffic, plan(traffic, 3, Cost(), 2), Cost()).padding_waste > 0.4


def test_free_points_keep_to_the_candidate_sizes_on_a_wide_trace():
    from orchestrator.planning import buckets

    rng = random.Random(7)
    traffic: dict = {}
    for _ in range(3000):
        key = (rng.randint(1, 32), min(256, int(rng.lognormvariate(4.1, 0.8)) + 1))
        traffic[key] = traffic.get(key, 0) + 1
    points = plan_points(traffic, 6, Cost())
    seqs = {p[1] for p in points}
    assert len(points) <= 6 and (32, max(r[1] for r in traffic)) in points
    assert seqs <= set(buckets._candidate_sizes(traffic, 1)) and len(buckets._candidate_sizes(traffic, 1)) <= 48
    assert (
        point_figures(traffic, points, Cost()).mean_cost
        <= figures(traffic, plan(traffic, 6, Cost(), 2), Cost()).mean_cost
    )


def brute_force_quantile(traffic, max_points: int, q: float) -> float:
    """The least q-quantile of a request's cost over every set of at most `max_points` points of
    seen sizes with the point of the largest sizes among them."""
    dims = len(next(iter(traffic)))
    candidates = list(itertools.product(*(sorted({r[d] for r in traffic}) for d in range(dims))))
    largest = tuple(max(r[d] for r in traffic) for d in range(dims))
    others = [c for c in candidates if c != largest]
    figure = "p50_cost" if q == 0.5 else "p99_cost"
    return min(
        getattr(point_figures(traffic, [largest, *subset], Cost()), figure)
        for k in range(max_points)
        for subset in itertools.combinations(others, k)
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_plan_for_a_quantile_reaches_the_least_quantile_on_small_traces(seed):
    rng = random.Random(300 + seed)
    dims = 1 if seed < 2 else 2
    traffic = {
        tuple(rng.choice(sizes) for sizes in ([1, 2, 3, 5, 8], [5, 9, 17, 30, 64])[:dims]): rng.randint(1, 9)
        for _ in range(10)
    }
    for k in (2, 3, 4):
        for q, figure in ((0.5, "p50_cost"), (0.99, "p99_cost")):
            points = plan_quantile(traffic, k, Cost(), q)
            assert len(points) <= k and tuple(max(r[d] for r in traffic) for d in range(dims)) in points
            assert getattr(point_figures(traffic, points, Cost()), figure) == brute_force_quantile(traffic, k, q)


def test_a_plan_for_the_median_holds_the_cheap_half_that_a_plan_for_the_mean_leaves_out():
    # 40 tiny requests, 15 long ones of one row, 45 at the largest point: the mean gains most from
    # a point for the tiny ones alone (the median then falls at the largest point); the median
    # needs a point that holds the tiny and the long ones together
    traffic = {(2, 2): 40, (1, 64): 15, (4, 64): 45}
    assert plan_points(traffic, 2, Cost()) == [(2, 2), (4, 64)]
    assert point_figures(traffic, [(2, 2), (4, 64)], Cost()).p50_cost == 256
    chosen = plan_quantile(traffic, 2, Cost(), 0.5)
    assert chosen == [(2, 64), (4, 64)] and point_figures(traffic, chosen, Cost()).p50_cost == 128
    # with a point more, each crowd at its own size: the median at the long ones' 64
    chosen = plan_quantile(traffic, 3, Cost(), 0.5)
    assert chosen == [(1, 64), (2, 2), (4, 64)] and point_figures(traffic, chosen, Cost()).p50_cost == 64


def test_a_slack_on_the_quantile_buys_a_lower_mean():
    # the least median (10) takes both spare points, one for each crowd of a quarter; a median
    # allowed up to 11 times that is the mean's plan: one point for both crowds and the 20 between
    traffic = {(1, 10): 25, (10, 1): 25, (10, 10): 20, (20, 20): 30}
    strict = plan_quantile(traffic, 3, Cost(), 0.5)
    tight = point_figures(traffic, strict, Cost())
    assert strict == [(1, 10), (10, 1), (20, 20)] and (tight.p50_cost, tight.mean_cost) == (10, 205)
    assert tight.p50_cost == brute_force_quantile(traffic, 3, 0.5)
    loose = plan_quantile(traffic, 3, Cost(), 0.5, slack=10.0)
    easy = point_figures(traffic, loose, Cost())
    assert loose == plan_points(traffic, 3, Cost()) and (easy.p50_cost, easy.mean_cost) == (100, 167.5)
    assert plan_quantile({(7, 33): 500}, 6, Cost(), 0.5) == [(7, 33)]


def test_a_margin_holds_the_quantile_for_more_requests_than_the_quantile_itself():
    # half the requests at 1 x 10: a plan for the median alone gives them a point of their own, its
    # level held by exactly half (the measured median then falls in those requests' slowest); with
    # a margin of 0.2 the cheap point also holds the 10 requests at 2 x 10: 60% at its level
    traffic = {(1, 10): 50, (2, 10): 10, (10, 10): 40}
    edge = plan_quantile(traffic, 2, Cost(), 0.5)
    assert edge == [(1, 10), (10, 10)] and point_figures(traffic, edge, Cost()).p50_cost == 10
    held = plan_quantile(traffic, 2, Cost(), 0.5, margin=0.2)
    assert held == [(2, 10), (10, 10)] and point_figures(traffic, held, Cost()).p50_cost == 20


@pytest.mark.parametrize("seed", range(4))
def test_a_margin_plans_the_quantile_beyond_it(seed):
    rng = random.Random(700 + seed)
    traffic = {(rng.choice([1, 2, 3, 5, 8]), rng.choice([5, 9, 17, 30, 64])): rng.randint(1, 9) for _ in range(12)}
    for q, margin in ((0.5, 0.2), (0.5, 0.5), (0.99, 0.2)):
        assert plan_quantile(traffic, 3, Cost(), q, margin=margin) == plan_quantile(
            traffic, 3, Cost(), q + margin * (1 - q)
        )


def test_a_trace_of_one_size_gives_one_point():
    assert plan({(7, 33): 500}, 6, Cost(), 2) == [[7], [33]]
    assert plan({(5,): 3}, 4, Cost(), 1) == [[5]]
    assert plan_points({(7, 33): 500}, 6, Cost()) == [(7, 33)]


def test_measured_costs_are_used_where_the_report_has_them():
    # bucket 8 is as fast as bucket 4 on this device: a plan by measurement serves 3..8 from 8
    measured = Cost({(1,): 1.0, (4,): 2.0, (8,): 2.0})
    traffic = {(1,): 10, (3,): 10, (8,): 10}
    assert plan(traffic, 2, measured, 1) == [[1, 8]]
    assert powers_of_two(traffic, [2]) == [[4, 8]]


def test_measured_costs_are_interpolated_as_affine_in_each_size():
    # a latency with a floor and a slope in each size, and their product: exact between measured points
    def latency(batch: int, seq: int) -> float:
        return 0.2 + 0.01 * batch + 0.002 * seq + 0.0001 * batch * seq

    measured = {(b, s): latency(b, s) for b in (1, 4, 16, 32) for s in (32, 64, 128, 256)}
    cost = Cost(measured)
    for point in [(1, 32), (3, 106), (13, 200), (31, 255), (16, 100)]:
        assert cost(point) == pytest.approx(latency(*point))
    assert cost((1, 8)) == pytest.approx(latency(1, 32))  # below the smallest size: the floor
    assert cost((64, 256)) == pytest.approx(2 * latency(32, 256))  # above the largest: by the positions
    # monotone in each size, as the measurements are
    for b in range(1, 40):
        assert cost((b, 50)) <= cost((b + 1, 50)) and cost((b, 50)) <= cost((b, 51))


def test_a_grid_with_points_left_out_interpolates_over_the_measured_corners():
    # (32, 256) left out (points.max_product): the corners that were measured, reweighted
    cost = Cost({(1, 32): 1.0, (1, 256): 2.0, (32, 32): 3.0})
    weights = {(1, 32): (12 / 31) * (56 / 224), (1, 256): (12 / 31) * (168 / 224), (32, 32): (19 / 31) * (56 / 224)}
    expected = sum(w * cost.measured[p] for p, w in weights.items()) / sum(weights.values())
    assert cost((20, 200)) == pytest.approx(expected)
    # no measured corner: the nearest measured point at least as large, else the nearest scaled by positions
    assert Cost({(1, 16): 1.0, (16, 2): 2.0, (32, 32): 9.0})((16, 16)) == 9.0
    assert Cost({(1, 16): 1.0, (16, 2): 2.0})((16, 16)) == pytest.approx(2.0 * 256 / 32)


def reference_partition(traffic, dim: int, grid, cost: Cost, k: int) -> float:
    """The least cost over every set of at most k sizes (the largest kept) for `dim`, the other
    dimensions fixed, by the plainest dynamic programming: the least mean cost it reaches."""
    sizes = sorted({r[dim] for r in traffic})

    def run(i: int, j: int) -> float:
        total = 0.0
        for request, count in traffic.items():
            if sizes[i] <= request[dim] <= sizes[j]:
                point = [sizes[j] if d == dim else min(b for b in grid[d] if b >= n) for d, n in enumerate(request)]
                total += count * cost(tuple(point))
        return total

    m = len(sizes)
    best = {(1, j): run(0, j) for j in range(m)}
    for g in range(2, k + 1):
        for j in range(m):
            best[g, j] = min([best[g - 1, i] + run(i + 1, j) for i in range(j)], default=math.inf)
    return min(best[g, m - 1] for g in range(1, k + 1)) / sum(traffic.values())


@pytest.mark.parametrize("seed", range(3))
def test_each_dimensions_step_is_the_exact_partition_with_measured_costs(seed):
    rng = random.Random(200 + seed)
    measured = {(b, s): 0.2 + 0.01 * b + 0.001 * s * b**0.5 for b in (1, 4, 16, 32) for s in (32, 128, 256)}
    cost = Cost(measured)
    traffic = {(rng.randint(1, 32), rng.randint(1, 256)): rng.randint(1, 5) for _ in range(150)}
    grid = [[8, 32], [100, 256]]
    for dim in (0, 1):
        for k in (1, 2, 3):
            chosen = plan_one(traffic, dim, grid, cost, k)
            planned = [chosen if d == dim else grid[d] for d in range(2)]
            assert len(chosen) <= k and chosen[-1] == max(r[dim] for r in traffic)
            assert figures(traffic, planned, cost).mean_cost == pytest.approx(
                reference_partition(traffic, dim, grid, cost, k)
            )


# -- the command --------------------------------------------------------------------------------

CONFIG = """\
# the served model
name: mlp
model:
  factory: {factory}
# the buckets a fleet warms
buckets:
  - 1
  - 8
  - 32
inputs:
  - shape: [batch, 16]
"""


def test_the_p50_and_p99_costs_are_what_half_and_99_in_100_requests_stay_within():
    traffic = {(1,): 98, (4,): 1, (8,): 1}  # cost: positions, 1, 4 and 8 at buckets of their sizes
    assert figures(traffic, [[1, 4, 8]], Cost()).p99_cost == 4
    assert figures(traffic, [[1, 4, 8]], Cost()).p50_cost == 1
    assert figures({(1,): 50, (3,): 50}, [[2, 4]], Cost()).p50_cost == 2  # the 50th request of 100
    assert figures({(1,): 49, (3,): 51}, [[2, 4]], Cost()).p50_cost == 4
    assert figures(traffic, [[1, 8]], Cost()).p99_cost == 8  # the 4 pads to 8
    assert figures({(1,): 99, (8,): 1}, [[1, 8]], Cost()).p99_cost == 1
    assert figures({(40,): 1}, [[8, 16]], Cost()).p99_cost == 3 * 16  # in chunks of the largest
    free = point_figures({(1, 1): 98, (2, 3): 1, (4, 4): 1}, [(1, 1), (2, 4), (4, 4)], Cost())
    assert (free.p99_cost, free.mean_cost) == (8, (98 + 8 + 16) / 100)


def test_a_quantile_on_the_edge_of_a_points_step_lies_in_that_points_spread():
    # 51 of 100 requests at a point priced 1.0: by the prices alone their median is 1.0, but the
    # requests there spread around it, and the 50th of all 100 is the 5th fastest of those 51
    spread = [-0.2, -0.1, 0.0, 0.1, 0.2]
    traffic = {(1,): 51, (2,): 49}
    plain = figures(traffic, [[1, 2]], Cost({(1,): 1.0, (2,): 2.0}))
    spread_out = figures(traffic, [[1, 2]], Cost({(1,): 1.0, (2,): 2.0}, spread))
    assert (plain.p50_cost, plain.p99_cost) == (1.0, 2.0)
    assert (spread_out.p50_cost, spread_out.p99_cost) == (pytest.approx(1.2), pytest.approx(2.2))
    assert spread_out.mean_cost == pytest.approx(plain.mean_cost) == pytest.approx(1.49)
    # the deviations' own mean moves the mean; the points chosen are priced at their one number
    skewed = Cost({(1,): 1.0, (2,): 2.0}, [0.0, 0.0, 0.3])
    assert figures(traffic, [[1, 2]], skewed).mean_cost == pytest.approx(1.59)
    assert figures({(1,): 3}, [[1]], skewed).p50_cost == pytest.approx(1.0)
    assert plan(traffic, 1, skewed, 1) == plan(traffic, 1, Cost({(1,): 1.0, (2,): 2.0}), 1) == [[2]]


def test_a_reports_spread_is_each_points_served_samples_about_their_median(tmp_path):
    from orchestrator.config import load_spec
    from orchestrator.planning.advice import compare, measured_spread

    def record(bucket: int, ms: float, samples: list[float] | None, **extra) -> dict:
        variants = {"graphed": {"samples_ms": samples}} if samples is not None else {}
        return {"status": "ok", "phase": "warm", "rank": 0, "bucket": bucket, "served_ms": ms,
                "variant": "graphed", "variants": variants, **extra}  # fmt: skip

    report = {
        "results": [
            record(1, 1.0, [0.9, 1.0, 1.1, 1.3]),
            record(8, 2.0, [1.9, 2.0, 2.1]),
            record(32, 5.0, None),  # no samples kept: priced, not spread
            record(8, 9.0, [1.0, 9.0], status="error"),
        ]
    }
    assert measured_spread(report, ["batch"]) == pytest.approx([-0.15, -0.05, 0.05, 0.25, -0.1, 0.0, 0.1])
    assert measured_spread({"results": [record(1, 1.0, None)]}, ["batch"]) == []
    spec = load_spec(config(tmp_path))
    traffic = {(1,): 60, (8,): 40}
    [config_row] = [row for row in compare(spec, traffic, 2, report) if row.name == "config"]
    assert config_row.figures is not None
    # 60 requests at 1.0 and 40 at 2.0, each shared over the 7 deviations: the 50th of the 100
    # falls on the 6th deviation at 1.0 (+0.1), the 99th on the last at 2.0 (+0.25)
    assert config_row.figures.p50_cost == pytest.approx(1.1)
    assert config_row.figures.p99_cost == pytest.approx(2.25)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.yaml"
    path.write_text(CONFIG.format(factory=ROOT / "examples" / "models.py:mlp"))
    return path


def test_plan_prints_the_plan_beside_the_config_and_powers_of_two_and_writes_it(tmp_path):
    traffic = tmp_path / "sizes.jsonl"
    traffic.write_text("".join(json.dumps({"batch": n}) + "\n" for n in [3] * 50 + [5] * 30 + [20] * 5))
    path = config(tmp_path)
    done = orchestrate("plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "2", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["buckets"] == [5, 20] and answer["cost_unit"] == "positions"
    by_name = {c["name"]: c for c in answer["candidates"]}
    assert by_name["config"]["buckets"] == [1, 8, 32] and by_name["powers of two"]["buckets"] == [16, 32]
    assert by_name["plan"]["mean_cost"] < by_name["powers of two"]["mean_cost"]
    assert by_name["plan"]["p99_cost"] == 20  # the 5 requests of 20 are the top 6%
    assert by_name["plan"]["p50_cost"] == 5 and by_name["powers of two"]["p50_cost"] == 16
    table = orchestrate("plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "2", "--write")
    assert table.returncode == 0, table.stderr
    assert (
        "powers of two" in table.stdout
        and "padding waste" in table.stdout
        and "p50 cost" in table.stdout
        and "p99 cost" in table.stdout
    )
    written = path.read_text()
    assert written == CONFIG.format(factory=ROOT / "examples" / "models.py:mlp").replace(
        "buckets:\n  - 1\n  - 8\n  - 32\n", "buckets: [5, 20]\n"
    )  # comments, order and every other line as they were


def grid_config(tmp_path: Path, buckets: str, dims: str = "batch, seq", name: str = "grid") -> Path:
    """A grid config of the MLP example over `dims`, its `buckets` line as given (a comment may
    lead it)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nmodel: {{factory: {ROOT / 'examples' / 'models.py:mlp'}}}\n"
        f"inputs: [{{shape: [{dims}]}}]\n{buckets}\n"
    )
    return path


def test_a_grid_is_planned_in_its_own_form(tmp_path):
    path = grid_config(tmp_path, "buckets: {batch: [1, 8], seq: [32, 128]}")
    traffic = tmp_path / "sizes.csv"
    traffic.write_text("batch,seq\n" + "".join(f"{n},{s}\n" for n, s in [(1, 30)] * 40 + [(4, 100)] * 10))
    done = orchestrate("plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "4", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["buckets"] == {"batch": [1, 4], "seq": [30, 100]}
    # the free points: each crowd at its own size, and nothing more
    free = answer["candidates"][-1]
    assert free["name"] == "free points" and free["points"] == {"only": [[1, 30], [4, 100]]}
    assert free["buckets"] == {"batch": [1, 4], "seq": [30, 100]} and free["padding_waste"] == 0.0
    shown = orchestrate("plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "4")
    assert "points 1x30, 4x100" in shown.stdout, shown.stdout

    # --write --free-points: the points' sizes as buckets and the points as points.only, the rest kept
    path.write_text(
        path.read_text().replace("buckets:", "# the sizes we serve\nbuckets:") + "points: {max_product: 4096}\n"
    )
    traffic.write_text("batch,seq\n" + "".join(f"{n},{s}\n" for n, s in [(8, 30)] * 40 + [(1, 100)] * 40))
    done = orchestrate(
        "plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "3", "--write", "--free-points"
    )
    assert done.returncode == 0, done.stderr
    assert "wrote the plan's buckets and points into" in done.stderr
    text = path.read_text()
    assert "# the sizes we serve\nbuckets:\n  batch: [1, 8]\n  seq: [30, 100]\n" in text
    assert text.endswith("points: {only: [[1, 100], [8, 30], [8, 100]]}\n") and "max_product" not in text
    refused = orchestrate("plan", "--model", str(config(tmp_path)), "--traffic", str(traffic), "--free-points")
    assert refused.returncode == 2 and "--free-points writes a grid's free-point plan" in refused.stderr


def test_a_plan_for_the_median_is_printed_first_with_the_plan_for_the_mean_beside_it(tmp_path):
    path = grid_config(tmp_path, "# the grid we guessed\nbuckets: {batch: [1, 4], seq: [2, 64]}")
    traffic = tmp_path / "sizes.csv"
    traffic.write_text(
        "batch,seq\n" + "".join(f"{n},{s}\n" for n, s in [(2, 2)] * 40 + [(1, 64)] * 15 + [(4, 64)] * 45)
    )
    args = ["plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "2"]
    done = orchestrate(*args, "--objective", "p50", "--margin", "0", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    names = [c["name"] for c in answer["candidates"]]
    assert names == ["plan (p50)", "config", "powers of two", "plan (mean)", "free points (mean)"]
    median, mean = answer["candidates"][0], answer["candidates"][-1]
    assert median["points"] == {"only": [[2, 64], [4, 64]]} and median["p50_cost"] == 128
    assert mean["p50_cost"] == 256 and mean["mean_cost"] < median["mean_cost"]
    assert answer["buckets"] == {"batch": [2, 4], "seq": [64]} and answer["points"] == median["points"]
    # by default the median's level holds a margin more than half: 60%, which 2 x 64 (55%) does
    # not, so the plan for the median is the mean's
    held = json.loads(orchestrate(*args, "--objective", "p50", "--json").stdout)["candidates"][0]
    assert held["points"] == {"only": [[2, 2], [4, 64]]} and held["p50_cost"] == 256
    written = orchestrate(*args, "--objective", "p50", "--margin", "0", "--write")
    assert written.returncode == 0, written.stderr
    text = path.read_text()
    assert "# the grid we guessed\nbuckets:\n  batch: [2, 4]\n  seq: [64]\n" in text
    assert text.endswith("points: {only: [[2, 64], [4, 64]]}\n")

    cube = grid_config(tmp_path, "buckets: {batch: [1, 4], seq: [2, 64], width: [8]}", "batch, seq, width", "cube")
    traffic.write_text("batch,seq,width\n1,2,8\n")
    for option in ("--slack", "--margin"):
        alone = orchestrate(*args, option, "0.1")
        assert alone.returncode == 2 and f"{option} shapes a quantile's plan" in alone.stderr
    whole = orchestrate(*args, "--objective", "p50", "--margin", "1")
    assert whole.returncode == 2 and "--margin" in whole.stderr
    refused = orchestrate("plan", "--model", str(cube), "--traffic", str(traffic), "--objective", "p99")
    assert refused.returncode == 2
    assert "--objective p99 plans one or two bucketed dimensions" in refused.stderr.strip().splitlines()[-1]


def test_a_plan_aligned_to_multiples_keeps_every_planned_size_a_multiple(tmp_path):
    path = grid_config(tmp_path, "buckets: {batch: [1, 8], seq: [32, 128]}")
    traffic = tmp_path / "sizes.csv"
    traffic.write_text("batch,seq\n" + "".join(f"{n},{s}\n" for n, s in [(1, 29)] * 40 + [(3, 99)] * 10))
    args = ["plan", "--model", str(path), "--traffic", str(traffic), "--max-points", "4"]
    done = orchestrate(*args, "--align", "seq=8", "--objective", "p50", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    median = answer["candidates"][0]
    assert median["points"] == {"only": [[1, 32], [3, 104]]}
    # every figure is of the requests as they came: 29 and 99 of the 32 and 104 positions are real
    assert median["padding_waste"] == pytest.approx(1 - (40 * 29 + 30 * 99) / (40 * 32 + 30 * 104))
    assert all(s % 8 == 0 for c in answer["candidates"][2:] for s in c["buckets"]["seq"])
    for given, message in [
        ("seq=0", "'seq=0': give DIM=N, N a whole number of at least 1"),
        ("seq", "'seq': give DIM=N"),
        ("width=8", "--align width: grid buckets batch, seq; align one of those"),
    ]:
        refused = orchestrate(*args, "--align", given)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    "lines, message",
    [
        ("", "empty; it needs one request a line"),
        ('{"rows": 3}\n', "line 1 has no 'batch'; every request needs its batch"),
        ('{"batch": 0}\n', "line 1: batch 0 is not a positive whole number"),
        ('{"batch": -2}\n', "line 1: batch -2 is not a positive whole number"),
        ('{"batch": 2.5}\n', "line 1: batch 2.5 is not a positive whole number"),
        ('{"batch": 2}\n{oops\n', "line 2 is not JSON"),
    ],
)
def test_bad_traffic_is_one_line_exit_2(tmp_path, lines, message):
    traffic = tmp_path / "sizes.jsonl"
    traffic.write_text(lines)
    done = orchestrate("plan", "--model", str(config(tmp_path)), "--traffic", str(traffic))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert message in line


def test_a_prometheus_that_does_not_answer_is_exit_3(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens there
    done = orchestrate("plan", "--model", str(config(tmp_path)), "--traffic", f"http://127.0.0.1:{port}")
    assert done.returncode == 3
    assert done.stderr.strip().endswith("Prometheus did not answer (ConnectionError); check the URL")


def test_a_grid_point_is_priced_at_what_a_request_it_pads_costs():
    from orchestrator.planning.advice import measured_costs

    def record(batch: int, seq: int, served: float, padded: float | None) -> dict:
        proof = {"padded_ms": padded} if padded is not None else None
        return {"status": "ok", "phase": "warm", "rank": 0, "bucket": batch, "point": {"batch": batch, "seq": seq},
                "served_ms": served, "padding_proof": proof}  # fmt: skip

    report = {"results": [record(1, 8, 0.2, None), record(4, 8, 0.3, 0.45), record(4, 16, 0.4, 0.55)]}
    costs, _ = measured_costs(report, ["batch", "seq"])
    assert costs == {(1, 8): 0.2, (4, 8): 0.45, (4, 16): 0.55}


def test_a_compile_budget_caps_the_points_at_what_the_reports_compiles_fit(tmp_path):
    from orchestrator.config import load_spec
    from orchestrator.errors import UserError
    from orchestrator.planning.advice import compare

    spec = load_spec(config(tmp_path))
    report = {
        "results": [
            {"status": "ok", "phase": "warm", "rank": 0, "bucket": b, "served_ms": ms, "compile_seconds": 10.0}
            for b, ms in [(1, 1.0), (8, 2.0), (32, 5.0)]
        ]
    }
    traffic = {(1,): 10, (3,): 10, (8,): 10, (20,): 10}
    assert len(compare(spec, traffic, 4, report)[0].grid[0]) == 4
    planned = compare(spec, traffic, 4, report, max_compile_seconds=25)[0]  # 2 compiles of 10 s fit
    assert len(planned.grid[0]) == 2 and planned.compile_seconds == 20.0
    with pytest.raises(UserError, match="one point alone compiles in 10.0 s by the report; raise the budget"):
        compare(spec, traffic, 4, report, max_compile_seconds=5)
    sizes = tmp_path / "sizes.jsonl"
    sizes.write_text('{"batch": 3}\n')
    done = orchestrate("plan", "--model", str(config(tmp_path)), "--traffic", str(sizes), "--max-compile-seconds", "60")
    assert done.returncode == 2
    assert "--max-compile-seconds needs what a point costs to compile: pass --report" in done.stderr
