"""How far to trust a speedup: a bootstrap interval for a ratio of medians, and the rule that
calls a figure too noisy to print as if it were clean. Stdlib only and torch-free, so the driver,
the report, the serving choice (orchestrator.jobs.variants) and the tests use the same arithmetic.

The samples are paired: Clock.interleaved times every variant in the same blocks, so sample i of
eager and sample i of a variant are the same round's same call, moments apart (clocks, other tenants). The
bootstrap resamples iteration indices, keeping each pair together, and recomputes
median(eager) / median(variant) each time: drift that hits both sides alike cancels, a burst
that hit one side only widens the interval.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
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
    paired = PairedBootstrap(
        {"numerator": numerator, "denominator": denominator}, resamples=resamples, seed=seed, confidence=confidence
    )
    return paired.interval("numerator", "denominator")


class PairedBootstrap:
    """Ratio intervals between any two of several sample lists timed in one interleaved run.

    A pair is the first n samples of both lists, n the shorter length: a variant timed in fewer
    rounds than another shares its iterations with the first ones of the other. The indices
    resampled for a length n are drawn once and each list's medians over them computed once, so
    every pair's interval is exactly ratio_interval's for that pair (the same seed, the same
    picks) at a fraction of its cost: most of it is drawing the picks."""

    def __init__(
        self,
        samples: Mapping[str, Sequence[float]],
        *,
        resamples: int = RESAMPLES,
        seed: int = SEED,
        confidence: float = CONFIDENCE,
    ) -> None:
        self.samples = samples
        self.resamples, self.seed, self.confidence = resamples, seed, confidence
        self._picks: dict[int, list[list[int]]] = {}
        self._medians: dict[tuple[str, int], list[float]] = {}

    def pairs(self, a: str, b: str) -> int:
        return min(len(self.samples[a]), len(self.samples[b]))

    def ratio(self, numerator: str, denominator: str) -> Optional[float]:
        """median(numerator) / median(denominator) over their pairs; None as for the interval."""
        n = self.pairs(numerator, denominator)
        if n == 0:
            return None
        below = statistics.median(self.samples[denominator][:n])
        return statistics.median(self.samples[numerator][:n]) / below if below > 0 else None

    def interval(self, numerator: str, denominator: str) -> Optional[list[float]]:
        """[low, high] of the ratio by the paired bootstrap; None when there is nothing to pair
        or a resampled median of the denominator is not positive."""
        n = self.pairs(numerator, denominator)
        if n == 0:
            return None
        below = self._resampled(denominator, n)
        if min(below) <= 0:
            return None
        ratios = sorted(above / under for above, under in zip(self._resampled(numerator, n), below, strict=True))
        tail = (1 - self.confidence) / 2
        return [_percentile(ratios, tail), _percentile(ratios, 1 - tail)]

    def _resampled(self, name: str, n: int) -> list[float]:
        if (name, n) not in self._medians:
            if n not in self._picks:
                rng = random.Random(self.seed)
                self._picks[n] = [rng.choices(range(n), k=n) for _ in range(self.resamples)]
            values = self.samples[name]
            self._medians[name, n] = [statistics.median([values[i] for i in picks]) for picks in self._picks[n]]
        return self._medians[name, n]


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


def paired_scale(anchor: float, samples: Sequence[float], beside: Sequence[float]) -> float:
    """`anchor`, a figure of the variant timed as `beside`, scaled by the median ratio of `samples`
    to `beside` taken pair by pair: another call's figure on the anchor's footing. A host slowed
    for some rounds slows both calls of a pair alike, so the ratio holds where a median of
    `samples` alone would carry the slowdown."""
    ratios = [a / b for a, b in zip(samples, beside, strict=True) if b > 0]
    return anchor * statistics.median(ratios)


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks of an ordered list."""
    at = q * (len(ordered) - 1)
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)
