"""A warmup report as one self-contained HTML page: charts drawn by matplotlib as inline SVG,
tables beside them, no script, no stylesheet or font fetched from anywhere, so the file opens the
same offline, from a laptop's downloads folder or as a CI artifact.

Reads the JSON report (orchestrator.reports.records) as a dict, and reads every field with
`.get`: a report written before a field existed still renders, without that part. Torch-free (the
driver of a Ray run writes it) and matplotlib-only: imported when a page is asked for, so the
`report` extra stays optional.
"""

from __future__ import annotations

import functools
import html
import io
import math
import re
import statistics
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.cache.files import write_whole
from orchestrator.jobs.records import point_label
from orchestrator.reports.report import as_record, cache_outcome, served_speedup

EAGER_COLOR = "#8c8c8c"
# the other variants in order of first appearance; colour-blind-safe (Okabe-Ito)
PALETTE = ["#0072b2", "#009e73", "#e69f00", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"]
HIT_COLOR, MISS_COLOR = "#009e73", "#d55e00"
WAVE_COLORS = {"compile": "#0072b2", "warm": "#009e73"}
# jobs/profiling.py's classes of kernel: Inductor's in the colour of a compiled variant, ATen's in orange
KIND_COLORS = {"inductor": "#0072b2", "aten": "#e69f00", "other": "#bbbbbb"}
# a linear latency axis stops being readable once the slowest bar is this many times the fastest
LOG_SCALE_RATIO = 20.0
# The fleet timeline, in points: its labels' font size, the pitch of their lines and the bar's half
# height; a row of TIMELINE_ROW_INCHES holds the bar and two lines of labels above it and two below
TIMELINE_FONT, TIMELINE_PITCH, TIMELINE_BAR = 6.5, 8.5, 4.5
TIMELINE_ROW_INCHES = 0.66
LABEL_GAP = 4.0  # between two labels on one line, and between a label and the plot's edge
LABEL_SHORT = 12  # characters of a milestone's name kept where the whole name has no room
LABEL_LONG = 28  # characters of a milestone's name shown at most

# a table's column header: its name, or its name and a note on what the column holds
Header = str | tuple[str, str]

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; --ok: #1a7f37; --bad: #cf222e;
        --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 10px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.sub { color: var(--muted); margin: 0 0 18px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.card { background: var(--bg); border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 17px; font-weight: 600; overflow-wrap: anywhere; }
/* a chart shrinks with its window down to 560 px, where its smallest text is still about 7 px;
   below that (a phone) it keeps that size and scrolls sideways inside its figure */
figure { margin: 12px 0; overflow-x: auto; }
figure svg { max-width: 100%; min-width: 560px; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; position: sticky; left: 0; }
/* a table wider than its section (a narrow window) scrolls inside it: the page never does */
.table-wrap { max-width: 100%; overflow-x: auto; }
/* what scrolls shows it: a shadow on each side that has more to see, gone at the end (the white
   covers scroll with the content, the shadows stay with the box) */
.table-wrap, figure {
  background: linear-gradient(to right, #fff 40%, rgba(255, 255, 255, 0)) left center / 28px 100% no-repeat local,
              linear-gradient(to left, #fff 40%, rgba(255, 255, 255, 0)) right center / 28px 100% no-repeat local,
              radial-gradient(farthest-side at 0 50%, rgba(0, 0, 0, .22), rgba(0, 0, 0, 0)) left center / 12px 100%
                no-repeat scroll,
              radial-gradient(farthest-side at 100% 50%, rgba(0, 0, 0, .22), rgba(0, 0, 0, 0)) right center / 12px 100%
                no-repeat scroll;
}
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; vertical-align: bottom; }
/* a note wraps to its column's width and widens it no more than its longest word: a header stays
   about as narrow as its name */
th .note { display: block; width: min-content; min-width: 100%; font-weight: 400; font-size: 11.5px;
           line-height: 1.3; color: var(--muted); }
/* a kernel name, a path or a token in an error can be one long word: it breaks anywhere rather than
   widen its table; other cells break between words only */
td.text, td code, td pre { overflow-wrap: anywhere; }
td:first-child { white-space: nowrap; }
td.n { white-space: nowrap; text-align: right; font-variant-numeric: tabular-nums; }
td.text { white-space: normal; }
p { overflow-wrap: break-word; }
td .what { color: var(--muted); font-size: 12px; }
.ok { color: var(--ok); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
.warn { color: var(--warn); font-weight: 600; }
.served { font-weight: 700; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px; white-space: pre-wrap;
      overflow-wrap: anywhere; font-size: 12.5px; }
code { font-size: 12.5px; }
details > summary { cursor: pointer; color: var(--muted); }
details.fold > summary h3 { display: inline; color: var(--ink); }
.kind-inductor { color: #0072b2; font-weight: 600; }
.kind-aten { color: #9a6700; font-weight: 600; }
details.profile { border: 1px solid var(--line); border-radius: 8px; padding: 6px 12px; margin: 8px 0; }
details.profile > summary { font-weight: 600; color: var(--ink); }
details.profile h4 { font-size: 13px; margin: 8px 0 2px; color: var(--muted); }
details.profile table { font-size: 12.5px; margin: 4px 0; }
.none { color: var(--muted); font-style: italic; }
"""


def write_html(report: dict[str, Any], path: Path) -> None:
    write_whole(path, render_html(report))


def render_html(report: dict[str, Any]) -> str:
    fleet = (report.get("executor") or {}).get("kind") == "ray"
    # a bucket's records together: its compile record, then its ranks in order
    results = sorted(
        report.get("results") or [],
        key=lambda r: (_place(r), r.get("rank") is not None, r.get("rank") or 0),
    )
    labels = [_label(r, fleet) for r in results]
    body = [
        _header(report),
        _section("failures", _failures_section(results, labels)),
        _section("latency", _latency_section(results, labels)),
        _section("speedup", _speedup_section(results, labels)),
        _section("grid", _grid_section(report, results)),
        # a Ray run's timeline is where its time went: above the per-record tables
        _section("fleet", _fleet_section(report)) if fleet else "",
        _section("buckets", _buckets_section(results, labels)),
        _section("cache", _cache_section(results, labels)),
        _section("compile", _compile_section(results, labels)),
        _profile_section(results, labels),
        _section("store", _store_section(report, fleet)),
    ]
    title = f"warmup report: {report.get('model', '?')}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # no favicon request: the page fetches nothing
        '<link rel="icon" href="data:,">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(part for part in body if part)
        + "\n</main>\n</body>\n</html>\n"
    )


# ----- sections -------------------------------------------------------------------------------


def _header(report: dict[str, Any]) -> str:
    s = report.get("summary") or {}
    executor = report.get("executor") or {}
    compile_cfg = report.get("compile") or {}
    ok, failed = s.get("buckets_ok"), s.get("buckets_failed")
    run_on = "Ray" if executor.get("kind") == "ray" else "one process"
    if executor.get("kind") == "ray":
        run_on += f" ({executor.get('nodes', '?')} nodes, {executor.get('ranks', '?')} ranks)"
    cards = [
        ("model", report.get("model")),
        ("GPU / device", " / ".join(str(x) for x in (report.get("gpu"), report.get("device")) if x)),
        ("torch", report.get("torch_version")),
        ("mode", compile_cfg.get("mode")),
        ("ran on", run_on),
        ("started", _when(report.get("started_at"))),
        ("wall time", _num(s.get("wall_seconds"), ".1f", " s")),
        ("ready in", _num(s.get("ready_seconds"), ".1f", " s")),
        (
            "cache",
            f"{s.get('cache_state', '-')} ({_num(s.get('cache_hits'), 'd')} hits, "
            f"{_num(s.get('cache_misses'), 'd')} misses)",
        ),
        ("buckets", None),
        ("eager/compiled median", _num(s.get("speedup_median"), ".2f", "x")),
    ]
    html_cards = []
    for key, value in cards:
        if key == "buckets":
            shown = f'<span class="ok">{_e(_num(ok, "d"))} ok</span>, ' + (
                f'<span class="bad">{_e(_num(failed, "d"))} failed</span>'
                if failed
                else f"{_e(_num(failed, 'd'))} failed"
            )
        else:
            shown = _e("-" if value in (None, "") else str(value))
        html_cards.append(f'<div class="card"><div class="k">{_e(key)}</div><div class="v">{shown}</div></div>')
    sub = f"namespace {report.get('namespace') or '-'}; config {report.get('config_hash') or '-'}; " + (
        f"buckets {', '.join(str(b) for b in report.get('buckets') or [])}"
    )
    return (
        f"<header><h1>{_e(report.get('model', 'warmup'))} warmup report</h1>"
        f'<p class="sub">{_e(sub)}</p><div class="cards">{"".join(html_cards)}</div></header>'
    )


def _latency_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    rows = [(label, _variants(r), r.get("variant")) for r, label in zip(results, labels, strict=True)]
    rows = [row for row in rows if any(m.get("ms") is not None for m in row[1].values())]
    head = "<h2>Latency per bucket</h2>"
    if not rows:
        return head + '<p class="none">No bucket was benchmarked.</p>'
    return head + _figure(
        "latency",
        _latency_chart(rows),
        "Median per-call latency of every variant, per bucket; the whisker is the spread (half the "
        "interquartile range). The served variant is drawn solid with a black edge and marked ★.",
    )


def _speedup_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    rows = []
    for r, label in zip(results, labels, strict=True):
        value, interval = _served_speedup(r)
        if value is not None:
            rows.append((label, value, interval, bool(r.get("noisy")), r.get("variant")))
    head = "<h2>Speedup of the served variant</h2>"
    if not rows:
        return head + '<p class="none">No speedup was measured.</p>'
    return head + _figure(
        "speedup",
        _speedup_chart(rows),
        "Eager latency divided by the served variant's, per bucket, with its confidence interval where "
        "the report has one. Left of the dashed line is slower than eager. Noisy figures are hatched "
        "and labelled: their interval is too wide to trust the figure.",
    )


def _grid_section(report: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """A grid of two dimensions: the served speedup at every point, as a heat map."""
    grid = report.get("grid") or {}
    if len(grid) != 2:
        return ""
    (rows_dim, row_sizes), (cols_dim, col_sizes) = grid.items()
    speedups: dict[tuple[int, int], list[float]] = {}
    for r in results:
        point = r.get("point") or {}
        if r.get("status") != "ok" or r.get("phase") == "compile" and r.get("rank") is None:
            continue
        value, _ = _served_speedup(r)
        if value is not None and rows_dim in point and cols_dim in point:
            speedups.setdefault((point[rows_dim], point[cols_dim]), []).append(value)
    head = "<h2>Served speedup over the grid</h2>"
    if not speedups:
        return head + '<p class="none">No point of the grid was benchmarked.</p>'
    cells = {at: statistics.median(values) for at, values in speedups.items()}
    return head + _figure(
        "grid",
        _grid_chart(rows_dim, row_sizes, cols_dim, col_sizes, cells),
        f"Eager latency divided by the served variant's at every point of the grid ({rows_dim} by {cols_dim}); "
        "across ranks, the median. Green is faster than eager, orange slower; a blank cell was not "
        "benchmarked (left out of the grid, or failed).",
    )


def _grid_chart(
    rows_dim: str, rows: list[int], cols_dim: str, cols: list[int], cells: dict[tuple[int, int], float]
) -> str:
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    values = np.full((len(rows), len(cols)), np.nan)
    for (row, col), value in cells.items():
        if row in rows and col in cols:
            values[rows.index(row), cols.index(col)] = value
    finite = values[np.isfinite(values)]
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(0.5, float(finite.min())), vmax=max(2.0, float(finite.max())))
    fig = Figure(figsize=(max(4.0, 1.2 + 1.1 * len(cols)), max(2.4, 1.0 + 0.6 * len(rows))))
    ax = fig.add_subplot()
    ax.imshow(values, cmap="RdYlGn", norm=norm, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if np.isfinite(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.2f}x", ha="center", va="center", fontsize=10, color="#1f2328")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    ax.set_xlabel(cols_dim)
    ax.set_ylabel(rows_dim)
    return _svg(fig, "grid")


def _buckets_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    header: list[Header] = [
        "bucket",
        "status",
        "served variant",
        ("served ms", "median per call"),
        ("served speedup", "eager / served"),
        ("95% interval", "of the served speedup"),
        ("compiled speedup", "eager / compiled"),
        ("first call s", "compile or cache load"),
        ("next 2 calls s", "CUDA-graph warm-up and capture"),
        ("cache lookups", "hits / misses"),
        "graph breaks",
        ("recompiles", "in the next 2 calls"),
        ("max |error|", "compiled vs eager"),
    ]
    rows = []
    for r, label in zip(results, labels, strict=True):
        value, interval = _served_speedup(r)
        served = r.get("variant")
        served_ms = r.get("served_ms") or ((_variants(r).get(served) or {}).get("ms") if served else None)
        speedup = _e(_num(value, ".2f", "x")) + (' <span class="warn">noisy</span>' if r.get("noisy") else "")
        rows.append(
            [
                _e(label),
                _status(r),
                f'<span class="served">{_e(served)}</span>' if served else "-",
                _n(served_ms, ".3f"),
                speedup,
                _e(_interval(interval)),
                _e(_num(r.get("speedup"), ".2f", "x")),
                _n(r.get("compile_seconds"), ".2f"),
                _n(r.get("graph_record_seconds"), ".3f"),
                _e(f"{_num(r.get('cache_hits'), 'd')}/{_num(r.get('cache_misses'), 'd')}"),
                _n(r.get("graph_breaks"), "d"),
                _n(r.get("recompiles"), "d"),
                _n(r.get("max_abs_error"), ".1e"),
            ]
        )
    variant_rows = []
    for r, label in zip(results, labels, strict=True):
        for name, m in _variants(r).items():
            is_served = name == r.get("variant")
            variant_rows.append(
                [
                    _e(label),
                    f'<span class="served">{_e(name)}&nbsp;★</span>' if is_served else _e(name),
                    '<span class="ok">ok</span>' if m.get("ok") else '<span class="bad">no</span>',
                    _n(m.get("ms"), ".3f"),
                    _n(m.get("p90_ms"), ".3f"),
                    _n(m.get("spread_ms"), ".3f"),
                    _e(_interval(m.get("speedup_interval"))),
                    _n(m.get("build_seconds"), ".2f"),
                    _e(m.get("reason") or (r.get("choice_reason") if is_served else None) or ""),
                ]
            )
    out = "<h2>Buckets</h2>" + _table(header, rows, numeric={3, 5, 6, 7, 8, 10, 11, 12})
    if variant_rows:
        # a fleet's ranks times variants runs long: folded until asked for
        opened = " open" if len(variant_rows) <= 12 else ""
        out += f'<details class="fold"{opened}><summary><h3>Variants</h3></summary>' + _table(
            [
                "bucket",
                "variant",
                ("usable", "built and correct"),
                ("median ms", "per call"),
                ("p90 ms", "per call"),
                ("spread ms", "half the IQR"),
                ("speedup 95% interval", "eager / this variant"),
                ("build s", "compile or cache load, and capture"),
                ("why", "not usable; or why it serves over a faster median"),
            ],
            variant_rows,
            numeric={3, 4, 5, 6, 7},
            text={8},
        )
        out += "</details>"
    return out


def _cache_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    rows = [
        (label, r.get("cache_hits") or 0, r.get("cache_misses") or 0)
        for r, label in zip(results, labels, strict=True)
        if r.get("cache_hits") is not None or r.get("cache_misses") is not None
    ]
    out = "<h2>Compile cache</h2>"
    if rows:
        out += _figure(
            "cache",
            _cache_chart(rows),
            "Compile-cache lookups per bucket: hits (loaded) and misses (compiled).",
        )
    else:
        out += '<p class="none">The report has no cache counts.</p>'
    counters = sorted({key for r in results for key in (r.get("cache") or {})})
    if counters:
        table_rows = [
            [_e(label), _e(r.get("cache_state") or "-"), *(_n((r.get("cache") or {}).get(c), "d") for c in counters)]
            for r, label in zip(results, labels, strict=True)
        ]
        out += _table(
            ["bucket", ("cache state", "hit, miss or mixed"), *counters],
            table_rows,
            numeric=set(range(2, 2 + len(counters))),
        )
    return out


def _compile_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    breaks: dict[str, list[tuple[str, int]]] = {}
    skips: dict[str, list[str]] = {}
    unavailable: dict[tuple[str, str], list[str]] = {}
    for r, label in zip(results, labels, strict=True):
        for reason, count in (r.get("graph_break_reasons") or {}).items():
            breaks.setdefault(reason, []).append((label, count))
        for reason in r.get("cudagraph_skip_reasons") or []:
            skips.setdefault(reason, []).append(label)
        for name, m in _variants(r).items():
            if not m.get("ok") and m.get("reason"):
                unavailable.setdefault((name, m["reason"]), []).append(label)
    out = "<h2>Graph breaks, CUDA graphs, unavailable variants</h2>"
    total = sum(r.get("graph_breaks") or 0 for r in results)
    out += f"<p>{_e(str(total))} graph break(s) across the report.</p>"
    if breaks:
        out += "<h3>Graph breaks by reason</h3>" + _table(
            ["reason", "count", "buckets"],
            [
                [f"<code>{_e(reason)}</code>", _n(sum(c for _, c in where), "d"), _e(_where([lb for lb, _ in where]))]
                for reason, where in breaks.items()
            ],
            numeric={1},
            text={0},
        )
    if skips:
        out += "<h3>No CUDA graphs</h3>" + _table(
            ["reason", "buckets"], [[_e(reason), _e(_where(where))] for reason, where in skips.items()], text={0}
        )
    if unavailable:
        out += "<h3>Variants not served</h3>" + _table(
            ["variant", "reason", "buckets"],
            [[_e(name), _e(reason), _e(_where(where))] for (name, reason), where in unavailable.items()],
            text={1},
        )
    return out


def _failures_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    failed = [(r, label) for r, label in zip(results, labels, strict=True) if r.get("status", "ok") != "ok"]
    if not failed:
        return ""
    rows = []
    for r, label in failed:
        detail = r.get("error_detail")
        error = _e(r.get("error") or "-")
        if detail and detail != r.get("error"):
            error += f"<details><summary>whole message</summary><pre>{_e(detail)}</pre></details>"
        rows.append([_e(label), _e(r.get("stage") or "-"), error])
    return '<h2 class="bad">Failed buckets</h2>' + _table(["bucket", "failed at stage", "error"], rows, text={2})


def _fleet_section(report: dict[str, Any]) -> str:
    executor = report.get("executor") or {}
    fleet = (report.get("summary") or {}).get("fleet") or {}
    out = "<h2>Fleet</h2>"
    waves = executor.get("wave_seconds") or {}
    if waves:
        out += "<p>" + _e("; ".join(f"{wave} wave {seconds:.1f} s" for wave, seconds in waves.items())) + "</p>"
    timeline = executor.get("timeline") or []
    if timeline:
        svg, unlabelled = _timeline_chart(timeline)
        out += _figure(
            "timeline",
            svg,
            "Every task's process from its start to its answer (bar), then until the driver had it (thin "
            "line); milestones marked and labelled with seconds from the start of the waves. A label "
            "without room is shortened; a hollow marker's label had none at all: hover a marker, or "
            "read the table below, for its whole name.",
        )
        out += _milestones(timeline, unlabelled)
    buckets = fleet.get("buckets") or {}
    if buckets:
        rows = [
            [
                _e(bucket),
                _n(row.get("cold_compile_seconds"), ".2f") + _first_call(report, bucket),
                _e(_spread(row.get("warm_load_seconds"), ".2f", " s")),
                _e(_spread(row.get("served_speedup") or row.get("speedup"), ".2f", "x")),
                _n(row.get("ranks_ok"), "d"),
                _n(row.get("ranks_failed"), "d"),
            ]
            for bucket, row in sorted(buckets.items(), key=lambda kv: _int_or(kv[0]))
        ]
        out += "<h3>Per bucket across ranks (min / median / max)</h3>" + _table(
            [
                "bucket",
                ("compile wave: first call s", "the slowest unit's compile or cache load"),
                ("warm ranks: first call", "cache load, or compile on a miss"),
                ("served speedup", "eager / served"),
                "ranks ok",
                "ranks failed",
            ],
            rows,
            numeric={1, 4, 5},
        )
    if fleet.get("pull_seconds"):
        out += f"<p>Warm ranks' pulls: {_e(_spread(fleet['pull_seconds'], '.2f', ' s'))} (min / median / max).</p>"
    deviating = fleet.get("deviating_ranks") or []
    if deviating:
        out += "<h3>Deviating ranks</h3>" + _table(
            ["rank", "bucket", "why"],
            [[_e(_num(d.get("rank"), "d")), _e(str(d.get("bucket"))), _e(d.get("why") or "-")] for d in deviating],
            text={2},
        )
    return out


def _first_call(report: dict[str, Any], bucket: str) -> str:
    """What the compile wave's first call of a bucket was: with a warm store it loads from the
    cache what an earlier run compiled, and the column's seconds are that load, not a compile."""
    outcome = cache_outcome(
        r.get("cache_state")
        for r in report.get("results") or []
        if str(r.get("bucket")) == bucket and r.get("rank") is None and r.get("status", "ok") == "ok"
    )
    if outcome is None:
        return ""
    what = {"hit": "cache load", "miss": "compile"}.get(outcome, "partly cached")
    return f' <span class="what">{_e(what)}</span>'


def _milestones(timeline: list[dict[str, Any]], unlabelled: int) -> str:
    """Every task's milestones in full, under its chart: where a label had no room, it is here."""
    rows = [
        [
            _e(_task_name(row)),
            _e(row.get("node", "?")),
            _n(row.get("started_s"), ".2f"),
            _n(row.get("ended_s"), ".2f"),
            _n(row.get("answered_s"), ".2f"),
            " · ".join(f"{_e(what)}&nbsp;{_e(f'{at:.2f}')}" for what, at in _events(row)) or "-",
        ]
        for row in timeline
    ]
    summary = "Milestones" + (f" ({unlabelled} without a label in the chart)" if unlabelled else "")
    # the chart holds them at a glance; the table is for a label left off or a second to read exactly
    return (
        f'<details class="fold"><summary><h3>{_e(summary)}</h3></summary>'
        + _table(
            [
                ("task", "wave: compile unit or rank"),
                "node",
                ("started s", "the process"),
                ("answered s", "the process had its answer"),
                "driver had it s",
                ("milestones", "seconds from the start of the waves"),
            ],
            rows,
            numeric={2, 3, 4},
            text={5},
        )
        + "</details>"
    )


def _profile_section(results: list[dict[str, Any]], labels: list[str]) -> str:
    """`warmup --profile`: per profiled variant, its time per call split into Inductor's kernels,
    ATen's and the rest (the chart), then per record its costliest kernels and trace files."""
    profiled = [(r["profile"], label) for r, label in zip(results, labels, strict=True) if r.get("profile")]
    if not profiled:
        return ""
    out = '<section id="profile"><h2>Where the time goes</h2>'
    bars = [
        (label, name, v, name == profile.get("served"))
        for profile, label in profiled
        for name in _variant_order((profile.get("variants") or {}).keys())
        for v in [profile["variants"][name]]
        if v.get("per_call_us") is not None
    ]
    if bars:
        kinds = sorted({v.get("time_kind") for _, _, v, _ in bars}, key=str)
        out += _figure(
            "profile",
            _profile_chart(bars),
            f"Profiled time per call of each variant ({_time_kinds(kinds)}), split into the kernels "
            "Inductor generated, ATen's ops and kernels (and the vendor libraries it calls), and the "
            "rest; each bar names how many distinct kernels of each kind ran. The served variant is "
            "marked ★. A compiled variant should be mostly Inductor; eager is all ATen.",
        )
    else:
        out += '<p class="none">No variant could be profiled; the reasons are below.</p>'
    # a few records open at once; a fleet's many records stay folded until asked for
    opened = " open" if len(profiled) <= 4 else ""
    for profile, label in profiled:
        out += f'<details class="profile"{opened}><summary>{_e(label)}'
        if profile.get("served"):
            out += f" (serves {_e(profile['served'])})"
        out += f"</summary>{_profile_tables(profile)}</details>"
    return out + "</section>"


def _profile_tables(profile: dict[str, Any]) -> str:
    variants = profile.get("variants") or {}
    names = _variant_order(variants.keys())
    out = ""
    if names:
        rows = []
        for name in names:
            v = variants[name]
            rows.append(
                [
                    f'<span class="served">{_e(name)}&nbsp;★</span>' if name == profile.get("served") else _e(name),
                    _e(_time_kinds([v.get("time_kind")])),
                    _n(v.get("calls"), "d"),
                    _n(v.get("per_call_us"), ".1f"),
                    *(
                        _e(f"{_num(v.get(f'{kind}_kernels'), 'd')} ({_percent(v.get(f'{kind}_share'))})")
                        for kind in ("inductor", "aten", "other")
                    ),
                    f"<code>{_e(v.get('trace') or '-')}</code>",
                ]
            )
        out += _table(
            [
                "variant",
                "time measured",
                ("calls", "profiled"),
                "µs per call",
                ("Inductor kernels", "distinct (share of time)"),
                ("ATen kernels", "distinct (share of time)"),
                ("other kernels", "distinct (share of time)"),
                ("trace", "on the node that ran it"),
            ],
            rows,
            numeric={2, 3, 4, 5, 6},
        )
        top = [
            [
                _e(name),
                f'<span class="kind-{_e(k.get("kind"))}">{_e(k.get("kind") or "-")}</span>',
                f"<code>{_e(k.get('name') or '-')}</code>",
                _n(k.get("total_us"), ".1f"),
                _n(k.get("calls"), "d"),
                _e(_percent(k.get("share"))),
            ]
            for name in names
            for k in variants[name].get("top") or []
        ]
        if top:
            out += "<h4>Costliest kernels</h4>" + _table(
                [
                    "variant",
                    "kind",
                    "kernel",
                    ("total µs", "in the profiled calls"),
                    "calls",
                    ("share", "of the variant's time"),
                ],
                top,
                numeric={3, 4, 5},
            )
    unavailable = profile.get("unavailable") or {}
    if unavailable:
        out += "<h4>Not profiled</h4>" + _table(
            ["variant", "why not"], [[_e(name), _e(reason)] for name, reason in unavailable.items()], text={1}
        )
    return out or '<p class="none">Nothing was profiled.</p>'


def _store_section(report: dict[str, Any], fleet: bool) -> str:
    remote = report.get("remote")
    if not remote:
        return ""
    lines = [f"store <code>{_e(remote.get('url', '-'))}</code>"]
    if fleet:
        lines.append(f"published generations {_e(str(remote.get('published_generations') or []))}")
        lines += [f'<span class="bad">publish error: {_e(e)}</span>' for e in remote.get("publish_errors") or []]
    else:
        pulled, published = remote.get("pull"), remote.get("publish")
        lines.append(
            "pulled "
            + (_e(f"generation {pulled.get('generation')}, {pulled.get('files')} files") if pulled else "nothing")
        )
        lines.append(
            "published "
            + (
                _e(f"generation {published.get('generation')}, {published.get('files')} new files")
                if published
                else "nothing"
            )
        )
        if remote.get("publish_error"):
            lines.append(f'<span class="bad">publish error: {_e(remote["publish_error"])}</span>')
    return "<h2>Store</h2><p>" + "; ".join(lines) + "</p>"


# ----- charts ---------------------------------------------------------------------------------


def _latency_chart(rows: list[tuple[str, dict[str, dict[str, Any]], Optional[str]]]) -> str:
    from matplotlib.figure import Figure

    # a variant measured nowhere (unavailable on this platform) gets no slot: the tables say why
    names = _variant_order(name for _, variants, _ in rows for name, m in variants.items() if m.get("ms") is not None)
    colors = _colors(names)
    per_group = len(names)
    bar = 0.8 / per_group
    fig = Figure(figsize=(10, max(2.2, 0.6 + len(rows) * (0.26 * per_group + 0.3))))
    ax = fig.add_subplot()
    values = [m["ms"] for _, variants, _ in rows for m in variants.values() if m.get("ms")]
    log = bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SCALE_RATIO
    for i, (_, variants, served) in enumerate(rows):
        for j, name in enumerate(names):
            m = variants.get(name)
            if not m or m.get("ms") is None:
                continue
            y = i + (j - (per_group - 1) / 2) * bar
            is_served = name == served
            spread = m.get("spread_ms")
            ax.barh(
                y,
                m["ms"],
                height=bar * 0.9,
                color=colors[name],
                alpha=1.0 if is_served else 0.55,
                edgecolor="black" if is_served else "none",
                linewidth=1.6 if is_served else 0,
                # clipped at zero: a noisy run's spread can exceed its median, and no latency is negative
                xerr=[[min(spread, m["ms"])], [spread]] if spread else None,
                error_kw={"ecolor": "#333", "capsize": 2, "elinewidth": 1},
            )
            ax.text(
                m["ms"] + (spread or 0),
                y,
                f"  {m['ms']:.3g} ms" + ("  ★ served" if is_served else ""),
                va="center",
                fontsize=7.5,
                fontweight="bold" if is_served else "normal",
            )
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("ms per call (median)" + (", log scale" if log else ""))
    ax.margins(x=0.2)
    if not log:
        ax.set_xlim(left=0)
    _legend(ax, [(name, colors[name]) for name in names])
    _tidy(ax)
    return _svg(fig, "latency")


def _speedup_chart(rows: list[tuple[str, float, Optional[list[float]], bool, Optional[str]]]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, max(1.8, 0.7 + 0.42 * len(rows))))
    ax = fig.add_subplot()
    for i, (_, value, interval, noisy, served) in enumerate(rows):
        # eager serving is exactly 1.0: neither a win nor a loss
        color = "#8c8c8c" if abs(value - 1) < 0.005 else "#009e73" if value > 1 else "#d55e00"
        xerr = None
        if interval and len(interval) == 2 and None not in interval:
            low, high = sorted(interval)
            xerr = [[max(0.0, value - low)], [max(0.0, high - value)]]
        ax.barh(
            i,
            value,
            height=0.6,
            color="white" if noisy else color,
            edgecolor=color,
            hatch="///" if noisy else None,
            linewidth=1.4,
            xerr=xerr,
            error_kw={"ecolor": "#333", "capsize": 3, "elinewidth": 1.2},
        )
        text = f"  {value:.2f}x" + (f" ({_interval(interval)})" if xerr else "") + (f"  {served}" if served else "")
        right = value + (xerr[1][0] if xerr else 0)
        ax.text(
            right,
            i,
            text + ("  NOISY" if noisy else ""),
            va="center",
            fontsize=8,
            color="#9a6700" if noisy else "#1f2328",
        )
    ax.axvline(1.0, color="#59636e", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [label for label, *_ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("speedup over eager (x)")
    ax.set_xlim(
        0,
        max(1.2, max(value + (max(iv) - value if iv and None not in iv else 0) for _, value, iv, _, _ in rows)) * 1.35,
    )
    _tidy(ax)
    return _svg(fig, "speedup")


def _cache_chart(rows: list[tuple[str, int, int]]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, max(1.6, 0.7 + 0.34 * len(rows))))
    ax = fig.add_subplot()
    ys = range(len(rows))
    hits = [h for _, h, _ in rows]
    misses = [m for _, _, m in rows]
    ax.barh(ys, hits, height=0.6, color=HIT_COLOR, label="hits")
    ax.barh(ys, misses, left=hits, height=0.6, color=MISS_COLOR, label="misses")
    for y, h, m in zip(ys, hits, misses, strict=True):
        ax.text(h + m, y, f"  {h} hit, {m} miss", va="center", fontsize=8)
    ax.set_yticks(list(ys), [label for label, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("compile-cache lookups")
    ax.set_xlim(0, max(1, max(h + m for _, h, m in rows)) * 1.3)
    _legend(ax, [("hits", HIT_COLOR), ("misses", MISS_COLOR)])
    _tidy(ax)
    return _svg(fig, "cache")


def _profile_chart(bars: list[tuple[str, str, dict[str, Any], bool]]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, max(1.8, 0.8 + 0.34 * len(bars))))
    ax = fig.add_subplot()
    mixed = len({v.get("time_kind") for _, _, v, _ in bars}) > 1
    ends = []
    for y, (_, _, v, served) in enumerate(bars):
        per_call = v["per_call_us"]
        left = 0.0
        for kind, color in KIND_COLORS.items():
            width = per_call * (v.get(f"{kind}_share") or 0.0)
            ax.barh(
                y,
                width,
                left=left,
                height=0.62,
                color=color,
                edgecolor="black" if served else "none",
                linewidth=1.2 if served else 0,
            )
            left += width
        counts = ", ".join(
            f"{v.get(f'{kind}_kernels') or 0} {kind}"
            for kind in KIND_COLORS
            if kind != "other" or v.get("other_kernels")
        )
        text = f"  {per_call:.3g} µs · {counts} kernels"
        if mixed:
            text += f" ({_time_kinds([v.get('time_kind')])})"
        ax.text(max(left, per_call), y, text, va="center", fontsize=7.5, fontweight="bold" if served else "normal")
        ends.append(max(left, per_call))
    ax.set_yticks(range(len(bars)), [f"{label} · {name}" + (" ★" if served else "") for label, name, _, served in bars])
    ax.invert_yaxis()
    kinds = sorted({v.get("time_kind") for _, _, v, _ in bars}, key=str)
    ax.set_xlabel(f"µs per call: {_time_kinds(kinds)}")
    ax.set_xlim(0, max(ends + [1e-9]) * 1.55)
    _legend(ax, [(f"{kind} kernels", color) for kind, color in KIND_COLORS.items()])
    _tidy(ax)
    return _svg(fig, "profile")


def _timeline_chart(timeline: list[dict[str, Any]]) -> tuple[str, int]:
    """The fleet's timeline, and how many milestones have no label on it. One row per task: its
    process a bar, its milestones marked on the bar; each milestone's label on one of the lines
    above and below the bar (_place_labels), inside the row and the plot. Every bar, marker and
    label has its full text as an SVG <title>: the tooltip of a label shortened or left off."""
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    names = [_task_name(row) for row in timeline]
    events = [_events(row) for row in timeline]
    times = [at for row in events for _, at in row] + [
        float(row[key])
        for row in timeline
        for key in ("started_s", "ended_s", "answered_s")
        if isinstance(row.get(key), (int, float))
    ]
    low, end = min(times + [0.0]), max(times + [1.0])
    span = end - low
    digits = 2 if span < 10 else 1 if span < 1000 else 0
    fig = Figure(figsize=(11, 1.1 + TIMELINE_ROW_INCHES * len(timeline)))
    ax = fig.add_subplot()
    ax.patch.set_gid("timeline-plot")
    for lane in range(len(timeline)):
        # every row its band, the odd ones shaded: a label belongs to the band it is in
        ax.axhspan(lane - 0.5, lane + 0.5, color="#f6f8fa" if lane % 2 else "#ffffff", lw=0, gid=f"timeline-row-{lane}")
    ax.set_yticks(range(len(timeline)), names)
    ax.set_ylim(len(timeline) - 0.5, -0.5)
    ax.set_xlim(low, end + span * 0.02)
    ax.set_xlabel("seconds from the start of the waves")
    _legend(ax, [(f"{wave} wave", color) for wave, color in WAVE_COLORS.items()])
    _tidy(ax)
    ax.grid(axis="x", color="#e6e6e6", linewidth=0.6)
    # the layout first, then frozen: the labels are laid out in the points of the plot it leaves
    fig.set_layout_engine("tight")
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    box = ax.get_window_extent()
    width, band = box.width * 72 / fig.dpi, box.height * 72 / fig.dpi / len(timeline)
    per_side = max(0, min(2, int((band / 2 - TIMELINE_BAR - 1) // TIMELINE_PITCH)))
    # nearest the bar first, above then below
    offsets = [
        side * (TIMELINE_BAR + TIMELINE_PITCH * (level - 0.5)) for level in range(1, per_side + 1) for side in (1, -1)
    ]
    font = FontProperties(size=TIMELINE_FONT)
    measure = TextToPath()

    # the ranks' milestones share their names and often their seconds: each text is measured once
    @functools.cache
    def text_width(text: str) -> float:
        return float(measure.get_text_width_height_descent(text, font, ismath=False)[0])

    def points(at: float) -> float:
        return (at - low) / (span * 1.02) * width

    titles: dict[str, tuple[str, str]] = {}
    unlabelled = 0
    for lane, row in enumerate(timeline):
        start, ended = float(row.get("started_s") or 0.0), float(row.get("ended_s") or 0.0)
        answered = row.get("answered_s")
        color = WAVE_COLORS.get(row.get("wave", "?"), "#999999")
        gid = f"timeline-task-{lane}"
        ax.barh(
            lane,
            max(ended - start, span / 500),
            left=start,
            height=2 * TIMELINE_BAR / band,
            color=color,
            alpha=0.45,
            gid=gid,
        )
        titles[gid] = (
            "timeline-task",
            f"{names[lane]}: process {start:.2f}–{ended:.2f} s"
            + (f", the driver had its answer at {answered:.2f} s" if isinstance(answered, (int, float)) else ""),
        )
        if isinstance(answered, (int, float)) and answered > ended:
            ax.plot([ended, answered], [lane, lane], color=color, linewidth=1.5)
        texts = [_label_texts(what, at, digits) for what, at in events[lane]]
        widths = [[text_width(text) for text in options] for options in texts]
        placed = _place_labels(
            [(points(at), w) for (_, at), w in zip(events[lane], widths, strict=True)],
            LABEL_GAP,
            width - LABEL_GAP,
            len(offsets),
        )
        for k, ((what, at), where) in enumerate(zip(events[lane], placed, strict=True)):
            full = f"{names[lane]}: {what} at {at:.{max(digits, 2)}f} s"
            gid = f"timeline-event-{lane}-{k}"
            # hollow: a milestone whose label had no room, so that no label nearby is read as its
            ax.plot(
                [at],
                [lane],
                marker="D",
                markersize=4.5,
                color=color,
                markerfacecolor=color if where else "white",
                markeredgecolor="black" if where else color,
                markeredgewidth=0.5 if where else 1.0,
                gid=gid,
            )
            titles[gid] = ("timeline-event", full)
            if where is None:
                unlabelled += 1
                continue
            choice, line, left = where
            gid = f"timeline-label-{lane}-{k}"
            ax.annotate(
                texts[k][choice],
                (at, lane),
                xytext=(left - points(at), offsets[line]),
                textcoords="offset points",
                ha="left",
                va="center",
                fontsize=TIMELINE_FONT,
                color="#1f2328",
                parse_math=False,  # a milestone's name is text: a "$" in it is a dollar sign
                in_layout=False,
                gid=gid,
            )
            titles[gid] = ("timeline-label", full)
    svg = _svg(fig, "timeline", layout=False)

    def tag(match: re.Match[str]) -> str:
        css, title = titles.get(match.group(1), ("timeline-row", ""))
        return f'<g id="{match.group(1)}" class="{css}">' + (f"<title>{_e(title)}</title>" if title else "")

    return re.sub(r'<g id="(timeline-(?:row|task|event|label)-[0-9-]+)">', tag, svg), unlabelled


def _place_labels(
    events: list[tuple[float, list[float]]], left: float, right: float, lines: int, gap: float = LABEL_GAP
) -> list[Optional[tuple[int, int, float]]]:
    """Where each milestone's label goes in its row: (which of its texts, which line, its left
    edge), or None where none of its texts has room.

    A milestone is its marker's x and the widths of its texts, longest first, all in one unit. A
    label starts at its marker, or ends at it where starting there would run past `right`: it never
    drifts from the marker it names. Left to right, each label takes the first line, nearest the
    bar first, with room for its longest text; on one line labels keep `gap` apart, and all stay
    within [left, right]."""
    placed: list[Optional[tuple[int, int, float]]] = [None] * len(events)
    ends = [-math.inf] * lines  # where the last label on each line ends
    for i in sorted(range(len(events)), key=lambda i: events[i][0]):
        x, widths = events[i]
        where = next(
            (
                (choice, line, start)
                for choice, width in enumerate(widths)
                for line in range(lines)
                for start in (x, x - width)
                if start >= max(left, ends[line] + gap) and start + width <= right
            ),
            None,
        )
        if where is not None:
            ends[where[1]] = where[2] + widths[where[0]]
        placed[i] = where
    return placed


def _label_texts(what: str, at: float, digits: int) -> list[str]:
    """A milestone's label, longest first: with its second, without, cut short."""
    short = what[:LABEL_SHORT].rstrip() + "…"
    # a name too long to read at a glance (a pull's whole store URL) is cut short even where it fits
    name = what if len(what) <= LABEL_LONG else what[: LABEL_LONG - 1].rstrip() + "…"
    texts = [f"{name} {at:.{digits}f}s", name]
    return texts + [short] if len(what) > LABEL_SHORT + 1 else texts


def _svg(fig: Any, salt: str, layout: bool = True) -> str:
    """The figure as an <svg> element to inline: no XML prolog, text drawn as paths (the page looks
    the same whatever fonts the reader's machine has), ids salted per chart so that two charts on
    one page never share an id. `layout=False`: the figure was laid out already and is kept so."""
    import matplotlib as mpl

    if layout:
        fig.set_layout_engine("tight")
    buf = io.StringIO()
    with mpl.rc_context({"svg.fonttype": "path", "svg.hashsalt": salt}):
        # transparent: on the page's white it looks the same, and the figure's scroll shadows show through
        fig.savefig(
            buf,
            format="svg",
            transparent=True,
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _figure(name: str, svg: str, caption: str) -> str:
    """A chart with its text alternative: the caption, also the SVG's <title> and aria-label."""
    tag_end = svg.index(">")
    svg = (
        svg[:tag_end]
        + f' role="img" aria-label="{_e(caption)}" data-chart="{_e(name)}"'
        + svg[tag_end : tag_end + 1]
        + f"<title>{_e(caption)}</title>"
        + svg[tag_end + 1 :]
    )
    return f'<figure id="chart-{_e(name)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>'


def _legend(ax: Any, entries: list[tuple[str, str]]) -> None:
    from matplotlib.patches import Patch

    ax.legend(
        handles=[Patch(color=color, label=label) for label, color in entries],
        # above the plot: below it, the legend would collide with the axis label however tall the chart
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=min(len(entries), 6),
        fontsize=8,
        frameon=False,
    )


def _tidy(ax: Any) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8.5)


# ----- reading records ------------------------------------------------------------------------


def _task_name(row: dict[str, Any]) -> str:
    """A timeline row's task: its wave, its compile unit's bucket or its rank, and its node."""
    who = f"b{row.get('bucket')}" if row.get("rank") is None else f"rank {row.get('rank')}"
    return f"{row.get('wave', '?')}: {who} @ {row.get('node', '?')}"


def _events(row: dict[str, Any]) -> list[tuple[str, float]]:
    """A timeline row's milestones, [what, seconds] each; anything else in the list is skipped."""
    return [
        (str(event[0]), float(event[1]))
        for event in row.get("events") or []
        if isinstance(event, (list, tuple))
        and len(event) == 2
        and isinstance(event[1], (int, float))
        and math.isfinite(event[1])
    ]


def _place(r: dict[str, Any]) -> tuple[float, ...]:
    """Where a record sorts: by its bucket, or its grid point's sizes."""
    point = r.get("point")
    return tuple(point.values()) if point else (_int_or(str(r.get("bucket"))),)


def _label(r: dict[str, Any], fleet: bool) -> str:
    label = f"bucket {point_label(r)}"
    if fleet:
        label += " compile" if r.get("rank") is None else f" {r.get('phase', '')} r{r.get('rank')}".rstrip()
    return label


def _variants(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every variant measured; for a report older than `variants`, eager and compiled from their fields."""
    variants = r.get("variants")
    if variants:
        return dict(variants)
    old = {}
    if r.get("eager_ms") is not None:
        old["eager"] = {"ok": True, "ms": r["eager_ms"], "p90_ms": r.get("eager_p90_ms")}
    if r.get("compiled_ms") is not None:
        old["compiled"] = {"ok": True, "ms": r["compiled_ms"], "p90_ms": r.get("compiled_p90_ms")}
    return old


def _served_speedup(r: dict[str, Any]) -> tuple[Optional[float], Optional[list[float]]]:
    """Eager / served (orchestrator.reports.report.served_speedup) with its interval, which a report from
    before intervals lacks."""
    return served_speedup(as_record(r)), r.get("served_speedup_interval")


def _variant_order(names: Iterable[str]) -> list[str]:
    seen = list(dict.fromkeys(names))
    return (["eager"] if "eager" in seen else []) + [n for n in seen if n != "eager"]


def _colors(names: list[str]) -> dict[str, str]:
    others = iter(PALETTE * (1 + len(names) // len(PALETTE)))
    return {name: EAGER_COLOR if name == "eager" else next(others) for name in names}


# ----- HTML helpers ---------------------------------------------------------------------------


def _when(iso: Any) -> Any:
    try:
        return datetime.fromisoformat(str(iso)).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso


def _where(labels: list[str]) -> str:
    """The buckets a reason applies to; a fleet's many records of one bucket named once."""
    buckets = list(dict.fromkeys(label.split()[1] if label.startswith("bucket ") else label for label in labels))
    text = ", ".join(buckets)
    return text + (f" ({len(labels)} records)" if len(labels) > len(buckets) else "")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, fmt: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None else f"{value}{suffix}"
    return f"{value:{fmt}}{suffix}"


def _n(value: Any, fmt: str) -> str:
    return _e(_num(value, fmt))


def _interval(interval: Any) -> str:
    if not interval or len(interval) != 2 or None in interval:
        return "-"
    low, high = sorted(interval)
    return f"{low:.2f}–{high:.2f}"


def _spread(spread: Optional[dict[str, float]], fmt: str, suffix: str) -> str:
    if not spread:
        return "-"
    return f"{spread['min']:{fmt}} / {spread['median']:{fmt}} / {spread['max']:{fmt}}{suffix}"


def _time_kinds(kinds: Iterable[Any]) -> str:
    """What a profile's time is: the GPU kernels' device time, or (no GPU) each op's self CPU time."""
    words = {"cuda": "GPU device time", "cpu": "CPU self time"}
    return " and ".join(words.get(kind, str(kind or "?")) for kind in kinds)


def _percent(share: Any) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _status(r: dict[str, Any]) -> str:
    if r.get("status", "ok") == "ok":
        return '<span class="ok">ok</span>'
    return f'<span class="bad">failed at {_e(r.get("stage") or "?")}</span>'


def _int_or(text: str) -> float:
    return int(text) if re.fullmatch(r"-?\d+", text) else math.inf


def _table(
    header: list[Header], rows: list[list[str]], numeric: Optional[set[int]] = None, text: Optional[set[int]] = None
) -> str:
    """Cells arrive as HTML (escaped by the caller); header names are escaped here. A header is its
    name, or its name and a note on what the column holds (unit, ratio, which call), set under it.
    `numeric` columns align right and never wrap; `text` columns (free text: errors, reasons) may
    break inside a word."""
    numeric, text = numeric or set(), text or set()
    css = {i: ' class="n"' for i in numeric} | {i: ' class="text"' for i in text}
    head = "".join(_th(h) for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{css.get(i, '')}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _th(header: Header) -> str:
    name, note = (header, "") if isinstance(header, str) else header
    # a counter's name (fx_graph_misses) may break after its underscores: it never widens a column
    # alone; a unit (s, ms, µs) stays on the line of the word before it
    text = re.sub(r" (\S{1,2})$", r"&nbsp;\1", _e(name).replace("_", "_<wbr>"))
    return f"<th>{text}" + (f'<span class="note">{_e(note)}</span>' if note else "") + "</th>"


def _section(name: str, part: str) -> str:
    """A part of the page as its own box, which its tables stay inside."""
    return f'<section id="{_e(name)}">{part}</section>' if part else ""
