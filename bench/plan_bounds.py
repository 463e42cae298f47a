"""How far any grid of k points can go at the median, by the planner's own model of a calibration.

    python bench/plan_bounds.py CALIBRATION_REPORT [--traces long-tailed,bimodal,uniform]
                                [--points 4,6,8,9,12] [--requests 1500] [--search-points 6]

`orchestrate plan` minimises the mean cost of a request. A target set on the median (p50) can
disagree with it: this prices, with the calibration's warmup report (`measured_costs`, interpolated
as `orchestrate plan --report` does) and bench/plan_traffic.py's synthetic traces (same seed):
  1. per trace and point count, the plan and powers of two with as many sizes per dimension (the
     candidates `orchestrate plan` prints, and bench/plan_traffic.py warms): their p50 and mean costs and the plan's gain in each;
     and the plan for the median (`orchestrate plan --objective p50`: free points, its default
     slack and margin) with its gains over powers of two;
  2. per trace, the product grid of `--search-points` points with the least p50 cost, found by
     trying every set of batch sizes and every set of sequence lengths for each split of the
     points into per-dimension counts (lengths in steps of 8 where a dimension has more than 3
     sizes, to keep the search to seconds): a bound on what any such grid reaches at the median.
Costs in the report's milliseconds; the largest size seen in each dimension is always a size.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from plan_traffic import synthetic  # noqa: E402  (bench/ is not a package)

from orchestrator.planning.advice import QUANTILE_MARGIN, QUANTILE_SLACK, measured_costs  # noqa: E402
from orchestrator.planning.buckets import Cost, figures, plan, plan_quantile, point_figures, powers_of_two  # noqa: E402


class Priced:
    """A trace's distinct sizes and counts, and every (rows, length) up to the largest priced once:
    `buckets.figures`' p50 and mean in array operations, for a search over a million grids."""

    def __init__(self, traffic: Counter[tuple[int, int]], cost: Cost) -> None:
        keys = list(traffic)
        self.rows = np.array([n for n, _ in keys])
        self.lengths = np.array([s for _, s in keys])
        self.counts = np.array([traffic[k] for k in keys], dtype=float)
        self.largest = (int(self.rows.max()), int(self.lengths.max()))
        rows, lengths = self.largest
        self.table = np.array([[cost((n, s)) for s in range(1, lengths + 1)] for n in range(1, rows + 1)])

    def figures(self, batch: Sequence[int], seq: Sequence[int]) -> tuple[float, float]:
        """(p50 cost, mean cost) of the grid batch × seq: each request at the smallest point that holds it."""
        served = self.table[
            np.asarray(batch)[np.searchsorted(batch, self.rows)] - 1,
            np.asarray(seq)[np.searchsorted(seq, self.lengths)] - 1,
        ]
        order = np.argsort(served, kind="stable")
        upto = np.cumsum(self.counts[order])
        p50 = float(served[order][np.searchsorted(upto, 0.5 * upto[-1] - 1e-9)])
        return p50, float((served * self.counts).sum() / self.counts.sum())

    def least_p50(self, points: int) -> tuple[float, float, list[list[int]]]:
        best: tuple[float, float, list[list[int]]] = (math.inf, math.inf, [])
        top_rows, top_length = self.largest
        for rows_count in (d for d in range(1, points + 1) if points % d == 0):
            lengths_count = points // rows_count
            lengths = range(1, top_length) if lengths_count <= 3 else range(8, top_length, 8)
            for batch in itertools.combinations(range(1, top_rows), rows_count - 1):
                for seq in itertools.combinations(lengths, lengths_count - 1):
                    grid = [[*batch, top_rows], [*seq, top_length]]
                    p50, mean = self.figures(*grid)
                    if (p50, mean) < best[:2]:
                        best = (p50, mean, grid)
        return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("calibration", type=Path)
    parser.add_argument("--traces", default="long-tailed,bimodal,uniform")
    parser.add_argument("--points", default="4,6,8,9,12")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--search-points", type=int, default=6)
    args = parser.parse_args()
    cost = Cost(measured_costs(json.loads(args.calibration.read_text()), ["batch", "seq"])[0])
    print("| trace | points | plan | p50 ms | mean ms | powers of two | p50 ms | mean ms | plan's gain: p50, mean "
          "| plan for the median: p50 ms, mean ms | its gain: p50, mean |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---:|---:|---|---|---|")
    shown = [int(n) for n in args.points.split(",")]
    bounds = []
    for trace in args.traces.split(","):
        traffic = Counter(synthetic(trace, args.requests))
        guesses = {}  # powers of two's figures, by the point count
        for points in sorted({*shown, args.search_points}):
            planned = plan(traffic, points, cost, 2)
            two = powers_of_two(traffic, [len(sizes) for sizes in planned])
            mine, guesses[points] = figures(traffic, planned, cost), figures(traffic, two, cost)
            if points in shown:
                guess = guesses[points]
                median = point_figures(
                    traffic, plan_quantile(traffic, points, cost, 0.5, QUANTILE_SLACK, QUANTILE_MARGIN), cost
                )
                print(
                    f"| {trace} | {points} | {planned} | {mine.p50_cost:.3f} | {mine.mean_cost:.3f} | {two} "
                    f"| {guess.p50_cost:.3f} | {guess.mean_cost:.3f} "
                    f"| {1 - mine.p50_cost / guess.p50_cost:+.0%}, {1 - mine.mean_cost / guess.mean_cost:+.0%} "
                    f"| {median.p50_cost:.3f}, {median.mean_cost:.3f} "
                    f"| {1 - median.p50_cost / guess.p50_cost:+.0%}, {1 - median.mean_cost / guess.mean_cost:+.0%} |",
                    flush=True,
                )
        guess = guesses[args.search_points]
        bounds.append((trace, guess.p50_cost, guess.mean_cost, *Priced(traffic, cost).least_p50(args.search_points)))
    print(f"\nThe least p50 of any product grid of {args.search_points} points, against powers of two:\n")
    print("| trace | grid | p50 ms | mean ms | p50 gain over powers of two | mean gain |")
    print("|---|---|---:|---:|---:|---:|")
    for trace, two_p50, two_mean, p50, mean, grid in bounds:
        print(f"| {trace} | {grid} | {p50:.3f} | {mean:.3f} | {1 - p50 / two_p50:+.0%} | {1 - mean / two_mean:+.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
