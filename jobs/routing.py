"""Which point of a grid serves a request's rows: plain arithmetic, no torch, shared by a grid
replica (jobs/grid_replica.py) and `orchestrate plan`, so that the plan prices each request as a
replica serves it."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence


def cheapest(rows: int, slices: Sequence[Sequence[int]], price: Callable[[int, int], float]) -> tuple[int, int, int]:
    """(which slice, its bucket, calls) for a request of `rows` rows among `slices`, each the batch
    sizes (ascending) of one point of the other dimensions, all of which hold the request there;
    `price(slice, bucket)` is one call's cost. The request runs whole, once, at the slice's
    smallest bucket that holds its rows, in the slice where that costs least. Only where no
    bucket holds its rows is it split along the batch: at each slice's largest bucket, once per
    chunk of that many rows, in the slice where those calls cost least. Ties go to the first."""
    options = []  # (split, cost, slice, bucket, calls): whole before split, then the cost, then the order
    for index, buckets in enumerate(slices):
        at = bisect.bisect_left(buckets, rows)
        bucket, calls = (buckets[at], 1) if at < len(buckets) else (buckets[-1], math.ceil(rows / buckets[-1]))
        options.append((calls > 1, calls * price(index, bucket), index, bucket, calls))
    if not options:
        raise ValueError("no slice to serve the request")
    _, _, index, bucket, calls = min(options)
    return index, bucket, calls
