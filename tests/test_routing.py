"""How a grid replica picks the point for a request's rows (jobs/routing.py), which `orchestrate
plan` prices by as well."""

import pytest

from orchestrator.jobs.routing import cheapest
from orchestrator.planning.buckets import Cost, point_figures


def positions(seq):
    """One call's cost: the positions it computes, its batch times its slice's length."""
    return lambda at, bucket: float(bucket * seq[at])


def test_a_request_runs_whole_at_the_cheapest_point_that_holds_its_rows():
    # seq 10 slice: batch 2 and 8; seq 20 slice: batch 4. Three rows: 8 x 10 (80) against 4 x 20 (80),
    # a tie, which goes to the first slice; one row: 2 x 10 (20)
    slices, seq = [[2, 8], [4]], [10, 20]
    assert cheapest(3, slices, positions(seq)) == (0, 8, 1)
    assert cheapest(1, slices, positions(seq)) == (0, 2, 1)
    # two calls at 2 x 10 would cost 40, less than 8 x 10 whole: a point that holds the rows wins
    assert cheapest(3, [[2], [8]], lambda at, bucket: float(bucket * 10)) == (1, 8, 1)


def test_only_rows_that_no_point_holds_are_split_at_the_slice_where_the_chunks_cost_least():
    slices, seq = [[2, 4], [3]], [10, 5]
    # 9 rows: 3 calls of 4 x 10 (120) against 3 calls of 3 x 5 (45)
    assert cheapest(9, slices, positions(seq)) == (1, 3, 3)
    with pytest.raises(ValueError):
        cheapest(1, [], positions([]))


def test_the_plan_prices_a_request_as_the_replica_routes_it():
    # points 2 x 10 and 8 x 20: a request of 4 x 10 runs whole at 8 x 20 (160 positions), never as two
    # calls at 2 x 10 (40), though those would price lower
    figures = point_figures({(4, 10): 1}, [(2, 10), (8, 20)], Cost())
    assert figures.mean_cost == 160 and figures.padding_waste == pytest.approx(1 - 40 / 160)
    # 9 rows, which no point holds: chunks at the slice where they cost least, 5 calls of 2 x 10
    # (100) against 2 calls of 8 x 20 (320)
    assert point_figures({(9, 10): 1}, [(2, 10), (8, 20)], Cost()).mean_cost == 100
