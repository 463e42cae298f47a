"""`orchestrate plan`: the buckets a traffic calls for, beside the config's and the usual guess.

rows = compare(spec, traffic, max_points, report)   # plan, current, powers of two (, free points)
render(rows, console) / as_json(rows) / write_buckets(config_path, rows[0])
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.table import Table

from orchestrator.cache.files import replacing
from orchestrator.config import ConfigError, load_spec
from orchestrator.errors import UserError
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.planning.buckets import (
    Cost,
    Figures,
    Point,
    aligned,
    figures,
    plan,
    plan_points,
    plan_quantile,
    point_figures,
    powers_of_two,
)


@dataclass
class Candidate:
    """A set of buckets and what it costs on the traffic (None where it cannot serve it, and why)."""

    name: str
    grid: list[list[int]]  # sorted sizes per dimension, the bucket dimension first
    figures: Optional[Figures]
    compile_seconds: Optional[float]
    why_not: Optional[str] = None
    # a free set of points (a grid's `points.only`), where `grid` is only the sizes they use
    points: Optional[list[Point]] = None


def measured_costs(report: Mapping[str, Any], dims: list[str]) -> tuple[dict[Point, float], Optional[float]]:
    """A warmup report's latency per point (the median across ranks), and the median compile
    (or load) seconds of a point. A grid's point is priced at what a request it pads costs
    (`padding_proof.padded_ms`: padded, run, cut and copied as a replica serves it), else at its
    served variant's latency at the point's own size."""
    by_point: dict[Point, list[float]] = {}
    compiles = []
    for point, record in _measured_points(report, dims):
        ms = (record.get("padding_proof") or {}).get("padded_ms") or record.get("served_ms")
        if ms:
            by_point.setdefault(point, []).append(float(ms))
        if record.get("compile_seconds") is not None:
            compiles.append(float(record["compile_seconds"]))
    return (
        {point: statistics.median(values) for point, values in by_point.items()},
        statistics.median(compiles) if compiles else None,
    )


def measured_spread(report: Mapping[str, Any], dims: list[str]) -> list[float]:
    """How a warmup report's served latencies fall around their medians: each point's samples of
    its served variant less their median, pooled over the points (and ranks). On a GPU they
    deviate by about as many microseconds at a large point as at a small one (the host's and the
    launch's jitter), so one pool serves every point. Empty where the report kept no samples."""
    deviations: list[float] = []
    for _, record in _measured_points(report, dims):
        samples = ((record.get("variants") or {}).get(record.get("variant")) or {}).get("samples_ms") or []
        if samples:
            middle = statistics.median(samples)
            deviations.extend(float(ms) - middle for ms in samples)
    return deviations


def _measured_points(report: Mapping[str, Any], dims: list[str]) -> Iterator[tuple[Point, Mapping[str, Any]]]:
    """The report's records that measured a point of these dimensions, with the point."""
    for record in report.get("results") or []:
        if record.get("status") != "ok" or record.get("phase") == "compile" and record.get("rank") is None:
            continue
        point = record.get("point") or {dims[0]: record.get("bucket")}
        if all(dim in point for dim in dims):
            yield tuple(int(point[dim]) for dim in dims), record


QUANTILES = {"p50": 0.5, "p99": 0.99}
# A quantile a little above the least reachable often leaves points for the other requests: the
# plan for a quantile takes the cheapest mean within this fraction of the least quantile.
QUANTILE_SLACK = 0.05
# The share of the requests beyond the quantile that a quantile's plan also holds at its level
# (buckets.plan_quantile): the requests a point serves spread around its price, and a plan that
# holds just the quantile's share puts the measured quantile in the tail of its cheapest points.
QUANTILE_MARGIN = 0.2


def compare(
    spec: WarmupSpec,
    traffic: Mapping[Point, int],
    max_points: int,
    report: Optional[Mapping[str, Any]] = None,
    max_compile_seconds: Optional[float] = None,
    objective: str = "mean",
    slack: float = QUANTILE_SLACK,
    margin: float = QUANTILE_MARGIN,
    align: Optional[Mapping[str, int]] = None,
) -> list[Candidate]:
    """The plan, the config's buckets and powers of two, each with its figures (and for a grid,
    free points for the mean). With `max_compile_seconds`, the plan holds at most the points whose
    compiles fit in it, each point costing the report's median compile seconds (a warmup compiles
    points alike: their graphs differ in sizes only).

    `objective` "p50" or "p99": the plan is the free points (a list's buckets) whose quantile of a
    request's cost, held with `margin`, is within `slack` of the least reachable, of least mean
    among those (buckets.plan_quantile); the plan for the mean follows the powers of two, so what
    the quantile costs the mean shows beside it.

    `align` (dimension -> n): the plans' sizes in that dimension are multiples of n (the kernels
    of half-precision matrix products and attention run fastest on such sizes; a size between
    two measured ones is priced as if it did). Every figure is of the traffic as it came."""
    dims = spec.grid_dims
    align = align or {}
    unknown = sorted(set(align) - set(dims))
    if unknown:
        raise UserError(f"--align {unknown[0]}: {spec.label} buckets {', '.join(dims)}; align one of those")
    planned = aligned(traffic, [align.get(name, 1) for name in dims])
    measured, compile_seconds = measured_costs(report or {}, dims)
    if max_compile_seconds is not None:
        if compile_seconds is None:
            raise UserError(
                "--max-compile-seconds needs what a point costs to compile: pass --report with a warmup "
                "report of this model"
            )
        fit = math.floor(max_compile_seconds / compile_seconds)
        if fit < 1:
            raise UserError(
                f"--max-compile-seconds {max_compile_seconds:g}: one point alone compiles in {compile_seconds:.1f} s "
                "by the report; raise the budget"
            )
        max_points = min(max_points, fit)
    if objective != "mean" and len(dims) > 2:
        raise UserError(
            f"--objective {objective} plans one or two bucketed dimensions; {spec.label} has {len(dims)} "
            f"({', '.join(dims)}): plan for the mean"
        )
    cost = Cost(measured, measured_spread(report or {}, dims))
    chosen = plan(planned, max_points, cost, len(dims))
    current = [list(spec.buckets), *(list(sizes) for sizes in (spec.grid or {}).values())]
    guess = powers_of_two(traffic, [len(sizes) for sizes in chosen])
    out = []
    if objective != "mean":
        quantile = plan_quantile(planned, max_points, cost, QUANTILES[objective], slack, margin)
        out.append(_free(f"plan ({objective})", quantile, traffic, cost, compile_seconds))
    others = [("config", current), ("powers of two", guess)]
    named = [*others, ("plan (mean)", chosen)] if objective != "mean" else [("plan", chosen), *others]
    for name, grid in named:
        points = 1
        for sizes in grid:
            points *= len(sizes)
        seconds = compile_seconds * points if compile_seconds is not None else None
        try:
            out.append(Candidate(name, grid, figures(traffic, grid, cost), seconds))
        except ValueError as exc:
            out.append(Candidate(name, grid, None, seconds, why_not=str(exc)))
    if len(dims) > 1:  # any points, not a product: served as the grid of their sizes with `points.only`
        name = "free points (mean)" if objective != "mean" else "free points"
        out.append(_free(name, plan_points(planned, max_points, cost), traffic, cost, compile_seconds))
    return out


def _free(
    name: str, points: list[Point], traffic: Mapping[Point, int], cost: Cost, compile_seconds: Optional[float]
) -> Candidate:
    """A free set of points as a candidate: served as the grid of the sizes they use with
    `points.only`, or for one dimension as its buckets, which a list's points are."""
    used = [sorted({point[d] for point in points}) for d in range(len(points[0]))]
    seconds = compile_seconds * len(points) if compile_seconds is not None else None
    only = points if len(used) > 1 else None
    return Candidate(name, used, point_figures(traffic, points, cost), seconds, points=only)


def buckets_value(spec: WarmupSpec, grid: list[list[int]]) -> Any:
    """The plan in the config's own form: a list, or a grid's mapping of dimensions."""
    if not spec.grid:
        return grid[0]
    return dict(zip(spec.grid_dims, grid, strict=True))


def render(spec: WarmupSpec, candidates: list[Candidate], cost_unit: str, console: Console) -> None:
    table = Table(title=f"buckets for {spec.label}'s traffic")
    columns = (
        "",
        "buckets",
        "points",
        f"mean cost ({cost_unit})",
        f"p50 cost ({cost_unit})",
        f"p99 cost ({cost_unit})",
        "padding waste",
        "compile s",
    )
    for column in columns:
        table.add_column(column, justify="right" if column not in ("", "buckets") else "left")
    for c in candidates:
        shown = " x ".join(
            f"{dim} {','.join(map(str, sizes))}" for dim, sizes in zip(spec.grid_dims, c.grid, strict=True)
        )
        if c.points is not None:
            shown = "points " + ", ".join("x".join(map(str, point)) for point in c.points)
        if c.figures is None:
            table.add_row(c.name, shown, "-", f"cannot serve: {c.why_not}", "-", "-", "-", "-")
            continue
        seconds = f"{c.compile_seconds:.0f}" if c.compile_seconds is not None else "-"
        table.add_row(
            c.name,
            shown,
            str(c.figures.points),
            f"{c.figures.mean_cost:.4g}",
            f"{c.figures.p50_cost:.4g}",
            f"{c.figures.p99_cost:.4g}",
            f"{c.figures.padding_waste:.1%}",
            seconds,
        )
    console.print(table)


def as_json(spec: WarmupSpec, candidates: list[Candidate], cost_unit: str) -> dict[str, Any]:
    return {
        "model": spec.label,
        "cost_unit": cost_unit,
        "candidates": [
            {
                "name": c.name,
                "buckets": buckets_value(spec, c.grid),
                "points": c.figures.points if c.figures else None,
                "mean_cost": c.figures.mean_cost if c.figures else None,
                "p50_cost": c.figures.p50_cost if c.figures else None,
                "p99_cost": c.figures.p99_cost if c.figures else None,
                "padding_waste": c.figures.padding_waste if c.figures else None,
                "compile_seconds": c.compile_seconds,
                "cannot_serve": c.why_not,
                **({"points": {"only": [list(p) for p in c.points]}} if c.points is not None else {}),
            }
            for c in candidates
        ],
        "buckets": buckets_value(spec, candidates[0].grid),
        **({"points": {"only": [list(p) for p in candidates[0].points]}} if candidates[0].points is not None else {}),
    }


_TOP_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s*:")


def write_buckets(path: Path, spec: WarmupSpec, grid: list[list[int]], points: Optional[list[Point]] = None) -> None:
    """Replace the config file's `buckets` entry with the plan (and, for a free-point plan, its
    `points` entry with `{only: [...]}`), leaving every other line (comments, order, quoting) as it
    was; the result is checked as a config before it replaces the file."""
    lines = Path(path).read_text().splitlines(keepends=True)
    value = buckets_value(spec, grid)
    if isinstance(value, dict):
        block = ["buckets:\n", *(f"  {dim}: [{', '.join(map(str, sizes))}]\n" for dim, sizes in value.items())]
    else:
        block = [f"buckets: [{', '.join(map(str, value))}]\n"]
    lines = _replace_entry(lines, "buckets", block)
    if points is not None:
        shown = ", ".join(f"[{', '.join(map(str, point))}]" for point in points)
        lines = _replace_entry(lines, "points", [f"points: {{only: [{shown}]}}\n"])
    target = Path(path)
    with replacing(target, mode=target.stat().st_mode & 0o777) as scratch:
        scratch.write_text("".join(lines))
        try:
            load_spec(scratch)
        except ConfigError as exc:
            raise ConfigError(
                f"--write: the config with the plan's buckets would not load ({exc}); edit it by hand"
            ) from None


def _replace_entry(lines: list[str], key: str, block: list[str]) -> list[str]:
    """`lines` with the top-level entry `key` (its line and the indented ones under it) replaced
    by `block`, or `block` added at the end where there is none."""
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{key}\s*:", line)), None)
    if start is None:
        return [*lines, *(["\n"] if lines and not lines[-1].endswith("\n") else []), *block]
    end = start + 1
    while end < len(lines) and not _TOP_KEY.match(lines[end]) and not lines[end].startswith("#"):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines before the next key stay
        end -= 1
    return [*lines[:start], *block, *lines[end:]]
