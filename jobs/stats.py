"""How far to trust a speedup: a bootstrap interval for a ratio of medians, and the rule that
calls a figure too noisy to print as if it were clean. Stdlib only and torch-free, so the driver,
the report and the tests use the same arithmetic.

The samples are paired: Clock.interleaved times every variant once per iteration, so sample i of
eager and sample i of a variant saw the same moment of the machine (clocks, other tenants). The
bootstrap resamples iteration indices, keeping each pair together, and recomputes
median(eager) / median(variant) each time: drift that hits both sides alike cancels, a burst
that hit one side only widens the interval.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Optional

RESAMPLES = 1000  # enough for stable 2.5/97.5 percentiles; ~50 ms for 100 paired samples
SEED = 0  # a fixed seed: the same samples always give the same interval, in reports and tests
CONFIDENCE = 0.95

# A speedup is noisy when its interval's half-width (the larger side) exceeds this fraction of the
# figure: "4.1x" whose 95% interval spans 3.0-5.2 says less than its two digits claim, and on a
# quiet machine intervals are a few percent wide, so 25% only catches runs disturbed by something.
NOISY_RELATIVE_HALF_WIDTH = 0.25
# Below this many paired samples a median moves with single samples (with two, one slow call
# halves the figure) and the bootstrap itself is unreliable, whatever interval it gives.
MIN_SAMPLES = 10


def ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Optional[list[float]]:
    """[low, high] of median(numerator) / median(denominator) by a paired bootstrap; None when
    there is nothing to pair or a median is not positive (no ratio to speak of)."""
    n = min(len(numerator), len(denominator))
    if n == 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = rng.choices(range(n), k=n)
        below = statistics.median([denominator[i] for i in picks])
        if below <= 0:
            return None
        ratios.append(statistics.median([numerator[i] for i in picks]) / below)
    ratios.sort()
    tail = (1 - confidence) / 2
    return [_percentile(ratios, tail), _percentile(ratios, 1 - tail)]


def is_noisy(point: Optional[float], interval: Optional[Sequence[float]], samples: Optional[int]) -> bool:
    """Whether `point` (a speedup) is too uncertain to print as a clean figure: too few samples
    (None: unknown, not counted against it) or an interval too wide for it. No interval (a
    report from before intervals) is nothing to judge by: not noisy."""
    if point is None:
        return False  # nothing is claimed
    if samples is not None and samples < MIN_SAMPLES:
        return True
    if interval is None:
        return False
    low, high = interval
    return max(point - low, high - point) > NOISY_RELATIVE_HALF_WIDTH * point


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks of an ordered list."""
    at = q * (len(ordered) - 1)
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)
