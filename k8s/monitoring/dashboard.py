"""Generate grafana-dashboard.json from one definition, so queries and metric names cannot drift.

    python k8s/monitoring/dashboard.py            # rewrites grafana-dashboard.json beside this file

Variables: `datasource` (a Prometheus datasource, picked in Grafana; no __inputs to fill on
import), and `model`, `bucket`, `gpu` from label_values of what the warmup pushed.
"""

from __future__ import annotations

import json
from pathlib import Path

UID = "orchestrate-warmup"
SELECTOR = 'model=~"$model",bucket=~"$bucket",gpu=~"$gpu"'
MODEL = 'model=~"$model"'

# (title, unit, [(expr, legend)], panel type)
PANELS = [
    (
        "Compile time per bucket, cold vs warm",
        "s",
        [(f"orchestrate_compile_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}} {{cache}} {{gpu}}")],
        "timeseries",
    ),
    (
        "Speedup over eager per bucket",
        "x",
        [(f"orchestrate_speedup_ratio{{{SELECTOR}}}", "{{model}} b{{bucket}} {{gpu}}")],
        "timeseries",
    ),
    (
        "Latency per call, eager vs compiled",
        "s",
        [(f"orchestrate_latency_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}} {{variant}}")],
        "timeseries",
    ),
    (
        "Cache hit ratio",
        "percentunit",
        [
            (
                f"sum by (model) (orchestrate_cache_hits_total{{{SELECTOR}}}) / (sum by (model) "
                f"(orchestrate_cache_hits_total{{{SELECTOR}}}) + sum by (model) (orchestrate_cache_misses_total{{{SELECTOR}}}))",
                "{{model}}",
            )
        ],
        "stat",
    ),
    (
        "Graph breaks and recompiles",
        "short",
        [
            (f"orchestrate_graph_breaks{{{SELECTOR}}}", "breaks {{model}} b{{bucket}}"),
            (f"orchestrate_recompiles{{{SELECTOR}}}", "recompiles {{model}} b{{bucket}}"),
        ],
        "timeseries",
    ),
    ("Failed buckets in the last run", "short", [(f"orchestrate_bucket_failures{{{MODEL}}}", "{{model}}")], "stat"),
    (
        "Since the last successful warmup",
        "s",
        [(f"time() - orchestrate_last_success_timestamp_seconds{{{MODEL}}}", "{{model}}")],
        "stat",
    ),
    ("Cache size", "bytes", [(f"orchestrate_cache_bytes{{{MODEL}}}", "{{model}}")], "stat"),
    (
        "Compile time p90 across ranks and buckets",
        "s",
        [
            (
                f"histogram_quantile(0.9, sum by (le, model) (orchestrate_compile_duration_seconds_bucket{{{MODEL}}}))",
                "{{model}}",
            )
        ],
        "timeseries",
    ),
    ("Job duration", "s", [(f"orchestrate_job_duration_seconds{{{MODEL}}}", "{{model}}")], "timeseries"),
    (
        "CUDA-graph recording per bucket",
        "s",
        [(f"orchestrate_graph_record_seconds{{{SELECTOR}}}", "{{model}} b{{bucket}}")],
        "timeseries",
    ),
]


def variable(name: str, query: str) -> dict:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "definition": query,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 3,
    }


def dashboard() -> dict:
    panels = []
    for i, (title, unit, targets, kind) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": kind,
                "title": title,
                "gridPos": {"x": (i % 2) * 12, "y": (i // 2) * 8, "w": 12, "h": 8},
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for j, (expr, legend) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": UID,
        "title": "torch.compile warmup",
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
                variable("model", "label_values(orchestrate_job_duration_seconds, model)"),
                variable("bucket", 'label_values(orchestrate_speedup_ratio{model=~"$model"}, bucket)'),
                variable("gpu", 'label_values(orchestrate_speedup_ratio{model=~"$model"}, gpu)'),
            ]
        },
        "panels": panels,
    }


def main() -> None:
    out = Path(__file__).with_name("grafana-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
