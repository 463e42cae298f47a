"""The request sizes a model gets, from a file or from its replicas' metrics in Prometheus.

A file holds one request a line, its size in every bucketed dimension by name: JSONL
(`{"batch": 3, "seq": 71}`) or CSV with a header (`batch,seq`). Prometheus holds each replica's
histogram of request sizes per dimension (`orchestrate_replica_request_size`, label `dim`); a
window of it gives each dimension's distribution, and a grid's joint one is taken as their
product (the histograms keep no joint counts), each size at its bin's upper edge.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.errors import EXIT_STORE, UserError
from orchestrator.planning.buckets import Point

REQUEST_SIZE = "orchestrate_replica_request_size"


class TrafficError(UserError):
    """Traffic that cannot be read: one line naming the place and what to fix (exit 2)."""


class TrafficUnreachable(UserError):
    """A Prometheus that does not answer (exit 3)."""

    exit_code = EXIT_STORE


def read_traffic(source: str, dims: list[str], model: str, window: str = "1d") -> Counter[Point]:
    """Request sizes -> counts, sizes in `dims` order."""
    if source.startswith(("http://", "https://")):
        return _from_prometheus(source, dims, model, window)
    path = Path(source)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrafficError(
            f"--traffic {source}: cannot read it ({type(exc).__name__}); pass a JSONL or CSV file"
        ) from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TrafficError(f"--traffic {source}: empty; it needs one request a line, e.g. {_example(dims)}")
    if path.suffix.lower() == ".csv" or not lines[0].lstrip().startswith("{"):
        rows: list[tuple[int, Any]] = [(i + 2, row) for i, row in enumerate(csv.DictReader(lines))]
    else:
        rows = []
        for i, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except ValueError:
                raise TrafficError(f"--traffic {source}: line {i} is not JSON; write e.g. {_example(dims)}") from None
            rows.append((i, row))
    counts: Counter[Point] = Counter()
    for number, row in rows:
        if not isinstance(row, dict):
            raise TrafficError(f"--traffic {source}: line {number} is not an object; write e.g. {_example(dims)}")
        counts[tuple(_size(source, number, row, dim) for dim in dims)] += 1
    return counts


def _size(source: str, line: int, row: dict[str, Any], dim: str) -> int:
    if dim not in row or row[dim] in (None, ""):
        raise TrafficError(f"--traffic {source}: line {line} has no {dim!r}; every request needs its {dim}")
    value = row[dim]
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or str(value).strip() not in (str(number), f"{number}.0") or number <= 0:
        raise TrafficError(f"--traffic {source}: line {line}: {dim} {value!r} is not a positive whole number")
    return number


def _example(dims: list[str]) -> str:
    return json.dumps(dict(zip(dims, (3, 71), strict=False)))


def _from_prometheus(url: str, dims: list[str], model: str, window: str) -> Counter[Point]:
    import requests

    series = f'{REQUEST_SIZE}_bucket{{model="{model}"}}'
    # what the window added; where that is nothing (replicas that took all their requests before
    # their first scrape), every count since they started
    queries = [
        f"sum by (dim, le) (increase({series}[{window}]))",
        f"sum by (dim, le) (last_over_time({series}[{window}]))",
    ]
    cumulative: dict[str, list[tuple[float, float]]] = {}
    for query in queries:
        try:
            answer = requests.get(f"{url.rstrip('/')}/api/v1/query", params={"query": query}, timeout=30)
            body = answer.json()
        except (requests.RequestException, ValueError) as exc:
            raise TrafficUnreachable(
                f"--traffic {url}: Prometheus did not answer ({type(exc).__name__}); check the URL"
            ) from None
        if body.get("status") != "success":
            raise TrafficError(f"--traffic {url}: Prometheus refused the query: {body.get('error', '?')}")
        cumulative = {}
        for found in body["data"]["result"]:
            labels = found["metric"]
            cumulative.setdefault(labels.get("dim", ""), []).append((float(labels["le"]), float(found["value"][1])))
        if any(count > 0 for edges in cumulative.values() for _, count in edges):
            break
    marginals = []
    for dim in dims:
        edges = sorted(cumulative.get(dim, []))
        mass: dict[int, float] = {}
        below = 0.0
        for edge, count in edges:
            if math.isinf(edge):
                if count - below > 0.5:
                    raise TrafficError(
                        f"--traffic {url}: {count - below:.0f} requests are larger in {dim} than the histogram's "
                        "largest bin; the replica's histogram needs a larger top bin"
                    )
                continue
            if count - below > 0:
                mass[int(edge)] = count - below
            below = count
        if not mass:
            raise TrafficError(
                f"--traffic {url}: no {REQUEST_SIZE} of model {model!r} in dimension {dim!r} over the last {window}; "
                "is a replica of it scraped there?"
            )
        marginals.append(mass)
    total = sum(marginals[0].values())
    counts: Counter[Point] = Counter()
    for point in _product(marginals):
        share = total
        for d, size in enumerate(point):
            share *= marginals[d][size] / sum(marginals[d].values())
        counts[point] = max(1, round(share))
    return counts


def _product(marginals: list[dict[int, float]]) -> list[Point]:
    points: list[Point] = [()]
    for mass in marginals:
        points = [(*p, size) for p in points for size in mass]
    return points
