"""Generate grafana-dashboard.json from one definition, so queries and metric names cannot drift.

    python k8s/monitoring/dashboard.py            # rewrites grafana-dashboard.json beside this file

Variables: `datasource` (a Prometheus datasource, picked in Grafana; no __inputs to fill on
import), and `model`, `bucket`, `gpu` from label_values of what warmups pushed. Three rows:
Warmup (did the last run succeed, what it cost and bought), Cache (how warm, how big, how long
the store took), Serving replicas (how they started and what they serve). Plain dicts: the JSON
model is small, and the generator needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

UID = "orchestrate-warmup"
SELECTOR = 'model=~"$model",bucket=~"$bucket",gpu=~"$gpu"'
RUN = 'model=~"$model",gpu=~"$gpu"'
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
DAY = 24 * 3600
WINDOW = "[5m]"  # rate window of the replicas' counters: several scrapes at any usual interval


def steps(*pairs: tuple[Optional[float], str]) -> dict[str, Any]:
    """Absolute thresholds: (from value, color); the first starts at -infinity (None)."""
    return {"mode": "absolute", "steps": [{"value": value, "color": color} for value, color in pairs]}


NEUTRAL = steps((None, "blue"))  # a size or a duration that is neither good nor bad in itself
OK_BELOW_ONE = steps((None, "green"), (1, "red"))  # a count of failures or of cold buckets


def panel(
    title: str,
    description: str,
    kind: str,
    unit: str,
    targets: list[tuple[str, str]],
    thresholds: dict[str, Any] = NEUTRAL,
    *,
    table: bool = False,
    custom: Optional[dict[str, Any]] = None,
    mappings: Optional[list[dict[str, Any]]] = None,
    options: Optional[dict[str, Any]] = None,
    transformations: Optional[list[dict[str, Any]]] = None,
    decimals: Optional[int] = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "thresholds": thresholds, "mappings": mappings or []}
    if kind in ("stat", "table"):
        defaults["color"] = {"mode": "thresholds"}
    if custom:
        defaults["custom"] = custom
    if decimals is not None:
        defaults["decimals"] = decimals
    out = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
        "targets": [
            {
                "refId": chr(ord("A") + j),
                "expr": expr,
                "legendFormat": legend,
                "datasource": DATASOURCE,
                **({"format": "table", "instant": True, "range": False} if table else {}),
            }
            for j, (expr, legend) in enumerate(targets)
        ],
    }
    if transformations:
        out["transformations"] = transformations
    return out


def hide_columns(*names: str) -> list[dict[str, Any]]:
    return [{"id": "organize", "options": {"excludeByName": dict.fromkeys(names, True)}}]


STAT = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background"}

WARMUP = [
    panel(
        "Last warmup per GPU class",
        "Whether every bucket of the last warmup of each model on each GPU class was ok. gpu=unknown is a "
        "run that failed before it learned its class (setup or store error); the next run that gets that "
        "far removes it.",
        "stat",
        "none",
        [(f"orchestrate_last_run_success{{{RUN}}}", "{{model}} {{gpu}}")],
        steps((None, "red"), (1, "green")),
        mappings=[{"type": "value", "options": {"0": {"text": "failed"}, "1": {"text": "ok"}}}],
        options=STAT,
    ),
    panel(
        "Since the last successful warmup",
        "Time since a warmup of this model last succeeded on this GPU class. Red beyond a day: a torch, "
        "driver or GPU change since then has no warm cache (alert OrchestrateNoRecentSuccess).",
        "stat",
        "s",
        [(f"time() - orchestrate_last_success_timestamp_seconds{{{RUN}}}", "{{model}} {{gpu}}")],
        steps((None, "green"), (DAY, "red")),
        options=STAT,
    ),
    panel(
        "Failed buckets in the last run",
        "Bucket records (rank x bucket) of the last warmup that failed: they are never published, so "
        "replicas compile them at start. The run's JSON report names the stage and error of each.",
        "stat",
        "none",
        [(f"orchestrate_bucket_failures{{{RUN}}}", "{{model}} {{gpu}}")],
        OK_BELOW_ONE,
        options=STAT,
        decimals=0,
    ),
    panel(
        "Compile time per bucket, cold vs warm",
        "First compiled call of each bucket in the last run (median across ranks): Dynamo trace plus "
        "Inductor compile when the cache was cold, trace plus cache load when it was warm.",
        "timeseries",
        "s",
        [(f"orchestrate_compile_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}} {{cache}} {{gpu}}")],
    ),
    panel(
        "Speedup over eager per bucket",
        "Median eager latency / median compiled latency in the last run. Below 1 (red line) the compile "
        "does not pay for this bucket; replicas then serve the faster variant, eager included.",
        "timeseries",
        "suffix:×",
        [(f"orchestrate_speedup_ratio{{{SELECTOR}}}", "{{model}} b{{bucket}} {{gpu}}")],
        steps((None, "red"), (1, "green")),
        custom={"thresholdsStyle": {"mode": "line"}},
        decimals=2,
    ),
    panel(
        "Latency per call, eager vs compiled",
        "Median latency of one call at the bucket's size in the last run, for eager and compiled.",
        "timeseries",
        "s",
        [(f"orchestrate_latency_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}} {{variant}} {{gpu}}")],
    ),
    panel(
        "Graph breaks and recompiles",
        "Dynamo graph breaks of a bucket's first call, and recompiles after it, in the last run (the "
        "highest across ranks). Each break is a Python fallback between compiled graphs.",
        "timeseries",
        "none",
        [
            (f"orchestrate_graph_breaks{{{SELECTOR}}}", "breaks {{model}} b{{bucket}} {{gpu}}"),
            (f"orchestrate_recompiles{{{SELECTOR}}}", "recompiles {{model}} b{{bucket}} {{gpu}}"),
        ],
        decimals=0,
    ),
    panel(
        "Job duration",
        "Wall time of the last warmup: cluster start, pull, compile, benchmark, publish.",
        "timeseries",
        "s",
        [(f"orchestrate_job_duration_seconds{{{RUN}}}", "{{model}} {{gpu}}")],
    ),
    panel(
        "CUDA-graph recording per bucket",
        "CUDA-graph warm-up and recording calls after the first compiled call (median across ranks); "
        "zero where the mode records no graphs.",
        "timeseries",
        "s",
        [(f"orchestrate_graph_record_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}} {{gpu}}")],
    ),
    panel(
        "Versions",
        "orchestrate, torch, Triton, CUDA and Python of the last warmup per GPU class (job "
        "orchestrate_warmup) and of each serving replica: a warm cache only serves the versions it was "
        "built with.",
        "table",
        "none",
        [(f"orchestrate_build_info{{{RUN}}}", "")],
        table=True,
        transformations=hide_columns("Time", "Value", "__name__", "endpoint", "container", "namespace"),
    ),
]

CACHE = [
    panel(
        "Cache hit ratio of first calls",
        "FX-graph and AOTAutograd cache hits / lookups of every bucket's first call in the last run. "
        "Near 1 once a run found what an earlier one published; 0 on a cold start.",
        "stat",
        "percentunit",
        [
            (
                f"sum by (model, gpu) (orchestrate_cache_hits{{{SELECTOR}}}) / (sum by (model, gpu) "
                f"(orchestrate_cache_hits{{{SELECTOR}}}) + sum by (model, gpu) (orchestrate_cache_misses{{{SELECTOR}}}))",
                "{{model}} {{gpu}}",
            )
        ],
        options=STAT,
    ),
    panel(
        "Cache size",
        "Size of the model's local cache namespace after the last run: what a replica pulls.",
        "stat",
        "bytes",
        [(f"orchestrate_cache_bytes{{{RUN}}}", "{{model}} {{gpu}}")],
        options=STAT,
    ),
    panel(
        "Store transfers, time",
        "How long the last run took to pull from and publish to the store.",
        "timeseries",
        "s",
        [(f"orchestrate_cache_transfer_seconds{{{RUN}}}", "{{model}} {{direction}} {{gpu}}")],
    ),
    panel(
        "Store transfers, size",
        "Bytes the last run pulled from and published to the store.",
        "timeseries",
        "bytes",
        [(f"orchestrate_cache_transfer_bytes{{{RUN}}}", "{{model}} {{direction}} {{gpu}}")],
    ),
    panel(
        "Compile time p90 of the last run",
        "90th percentile of first compiled calls across every rank and bucket of the last run on each "
        "GPU class (a per-run histogram: each push replaces it).",
        "timeseries",
        "s",
        [
            (
                f"histogram_quantile(0.9, sum by (le, model, gpu) (orchestrate_compile_duration_seconds_bucket{{{RUN}}}))",
                "{{model}} {{gpu}}",
            )
        ],
    ),
]

SERVING = [
    panel(
        "Replica ready time",
        "Seconds from the start of a replica's load to ready: its pull, every bucket loaded from the "
        "cache (or compiled, when it missed) and checked against eager.",
        "timeseries",
        "s",
        [(f"orchestrate_replica_ready_seconds{{{RUN}}}", "{{model}} {{pod}} {{gpu}}")],
    ),
    panel(
        "Cold buckets per replica",
        "Buckets a replica compiled at start because the cache missed: each took a full compile before "
        "the replica was ready (alert OrchestrateReplicaStartedCold).",
        "stat",
        "none",
        [(f"orchestrate_replica_cold_buckets{{{RUN}}}", "{{model}} {{pod}}")],
        OK_BELOW_ONE,
        options=STAT,
        decimals=0,
    ),
    panel(
        "Buckets off warmup's variant",
        "Buckets a replica serves on another variant than warmup chose: no serving plan for the bucket, "
        "or the chosen variant could not load or failed its check here (the replica's /info says why).",
        "stat",
        "none",
        [(f"orchestrate_replica_fallback_buckets{{{RUN}}}", "{{model}} {{pod}}")],
        steps((None, "green"), (1, "orange")),
        options=STAT,
        decimals=0,
    ),
    panel(
        "Variant per bucket",
        "What serves each bucket on each replica: compiled, graphed, eager-graphed, aot or eager.",
        "table",
        "none",
        [(f"orchestrate_replica_variant{{{SELECTOR}}} == 1", "")],
        table=True,
        transformations=hide_columns("Time", "Value", "__name__", "endpoint", "container", "namespace"),
    ),
    panel(
        "Padding waste per bucket",
        "Share of the rows a bucket computed that were padding added to reach its size, over 5 minutes. "
        "High on a bucket: requests of that size are rare enough that a smaller bucket would pay.",
        "timeseries",
        "percentunit",
        [
            (
                f"sum by (model, bucket) (rate(orchestrate_replica_padded_rows_total{{{SELECTOR}}}{WINDOW})) / "
                f"(sum by (model, bucket) (rate(orchestrate_replica_rows_total{{{SELECTOR}}}{WINDOW})) + "
                f"sum by (model, bucket) (rate(orchestrate_replica_padded_rows_total{{{SELECTOR}}}{WINDOW})))",
                "{{model}} b{{bucket}}",
            )
        ],
    ),
    panel(
        "Request sizes",
        "Median and 99th percentile of the requests' size in each bucketed dimension (rows; a grid's seq too), "
        "all replicas, over 5 minutes: what `orchestrate plan --traffic PROMETHEUS_URL` plans buckets from.",
        "timeseries",
        "none",
        [
            (
                f"histogram_quantile({q}, sum by (model, dim, le) "
                f"(rate(orchestrate_replica_request_size_bucket{{{SELECTOR}}}{WINDOW})))",
                f"{{{{model}}}} {{{{dim}}}} p{int(q * 100)}",
            )
            for q in (0.5, 0.99)
        ],
    ),
    panel(
        "Model calls per bucket",
        "Model calls per second on each bucket, all replicas (requests that arrive together are one call).",
        "timeseries",
        "ops",
        [
            (
                f"sum by (model, bucket) (rate(orchestrate_replica_calls_total{{{SELECTOR}}}{WINDOW}))",
                "{{model}} b{{bucket}}",
            )
        ],
    ),
    panel(
        "Cache misses at replica load",
        "Cache misses while a replica loaded each bucket (0 on a warm start).",
        "timeseries",
        "none",
        [(f"orchestrate_replica_cache_misses{{{SELECTOR}}}", "{{model}} {{pod}} b{{bucket}}")],
        decimals=0,
    ),
    panel(
        "Replica pull from the store",
        "Seconds the replica's own pull from the store took at start (the serving runtime's pull, after "
        "any init container's).",
        "timeseries",
        "s",
        [(f"orchestrate_replica_pull_seconds{{{RUN}}}", "{{model}} {{pod}}")],
    ),
]

ROWS = [("Warmup", WARMUP), ("Cache", CACHE), ("Serving replicas", SERVING)]


def variable(name: str, query: str) -> dict:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 3,
    }


def layout() -> list[dict[str, Any]]:
    """Rows, each followed by its panels: stats 6 wide, tables and graphs 12; ids in order."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, members in ROWS:
        panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            }
        )
        y += 1
        x = line = 0  # line: the height of the tallest panel on the current line
        for member in members:
            w, h = (6, 5) if member["type"] == "stat" else (12, 8)
            if x + w > 24:
                x, y, line = 0, y + line, 0
            panels.append({**member, "gridPos": {"x": x, "y": y, "w": w, "h": h}})
            x, line = x + w, max(line, h)
        y += line
    for i, p in enumerate(panels):
        p["id"] = i + 1
    return panels


def dashboard() -> dict:
    return {
        "uid": UID,
        "title": "torch.compile warmup",
        "description": "Warmups (pushed per model and GPU class), their cache, and the serving replicas",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "tags": ["pytorch", "torch.compile", "warmup"],
        "timezone": "",
        "refresh": "1m",
        "time": {"from": "now-7d", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "refresh": 1,
                },
                variable("model", "label_values(orchestrate_last_run_success, model)"),
                variable("bucket", 'label_values(orchestrate_speedup_ratio{model=~"$model"}, bucket)'),
                # last_run_success: it carries every class, gpu="unknown" too
                variable("gpu", 'label_values(orchestrate_last_run_success{model=~"$model"}, gpu)'),
            ]
        },
        "panels": layout(),
    }


def main() -> None:
    out = Path(__file__).with_name("grafana-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n")
    print(out)


if __name__ == "__main__":
    main()
