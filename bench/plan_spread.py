"""A plan for the median when each request's latency spreads around its point's price.

    python bench/plan_spread.py CALIBRATION_REPORT [--points 6] [--margins 0,0.1,0.2]
                                [--requests 1500] [--draws 15]

The planner prices a point at one number; the requests a point serves do not all take that long.
Where a plan's cheapest points hold just half the requests, the traffic's median is the slowest
of their requests, not their typical one. This prices bench/plan_traffic.py's synthetic traces
(same seed) with the calibration's warmup report (as `orchestrate plan --report` does), then
draws each request's latency as its point's price times a factor: from 1 to BODY for most
requests, and from 1.1 to HIGH for a share SHARE of them (a tail). Per spread model, the median
of `--draws` draws of the whole trace's median, for powers of two (as many sizes per dimension as
the plan for the mean, as `orchestrate plan` prints them) and for the median plan at each
`--margin` (`orchestrate plan --objective p50 --margin M`, its default slack), printed as the
plan's gain over powers of two at the median.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from plan_traffic import synthetic  # noqa: E402  (bench/ is not a package)

from orchestrator.planning.advice import QUANTILE_SLACK, measured_costs  # noqa: E402
from orchestrator.planning.buckets import Cost, Point, plan, plan_quantile, powers_of_two, routed_costs  # noqa: E402

TRACES = ("long-tailed", "bimodal", "uniform")
SPREADS = [  # (SHARE, HIGH, BODY)
    (0.0, 1.1, 1.0),  # none: every request at its price
    *itertools.product([0.1, 0.2, 0.3], [1.3, 1.6], [1.05]),
]


def median_latency(
    traffic: Counter[Point], points: list[Point], cost: Cost, spread: tuple[float, float, float], draws: int
) -> float:
    share, high, body = spread
    served = [(price, n) for price, n, _, _ in routed_costs(traffic, points, cost)]  # routed as a replica routes
    rng = random.Random(1)
    medians = []
    for _ in range(draws if share else 1):
        latencies = [
            price * (rng.uniform(1.1, high) if rng.random() < share else rng.uniform(1.0, body))
            for price, n in served
            for _ in range(n)
        ]
        medians.append(statistics.median(latencies))
    return statistics.median(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("calibration", type=Path)
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--margins", default="0,0.1,0.2")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--draws", type=int, default=15)
    args = parser.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    measured, _ = measured_costs(json.loads(args.calibration.read_text()), ["batch", "seq"])
    cost = Cost(measured)
    print(
        "| trace | share, high, body | powers of two: p50 ms | " + " | ".join(f"margin {m:g}" for m in margins) + " |"
    )
    print("|---|---|---:|" + "---:|" * len(margins))
    for trace in TRACES:
        traffic = Counter(synthetic(trace, args.requests))
        # powers of two with as many sizes per dimension as the plan for the mean: the candidate
        # `orchestrate plan` prints beside it
        guess = powers_of_two(traffic, [len(sizes) for sizes in plan(traffic, args.points, cost, 2)])
        guessed = [tuple(p) for p in itertools.product(*guess)]
        plans = {m: plan_quantile(traffic, args.points, cost, 0.5, QUANTILE_SLACK, m) for m in margins}
        for spread in SPREADS:
            base = median_latency(traffic, guessed, cost, spread, args.draws)
            cells = []
            for m in margins:
                ms = median_latency(traffic, plans[m], cost, spread, args.draws)
                cells.append(f"{ms:.3f} ({1 - ms / base:+.0%})")
            print(f"| {trace} | {spread[0]:g}, {spread[1]:g}, {spread[2]:g} | {base:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
