"""`orchestrate report` and the HTML page (orchestrator.reports.html): reports built by the real
report builders from synthetic records, drawn in a real headless Chromium (Debian's `chromium` and
`chromium-driver`) through selenium, and one real `--no-ray` warmup with --html (slow)."""

from __future__ import annotations

import functools
import html
import io
import json
import math
import os
import random
import re
import stat
from dataclasses import asdict
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import orchestrate
from test_report_records import worker_account

from orchestrator.cache.namespace import Platform
from orchestrator.cache.sync import Transfer
from orchestrator.config import load_spec
from orchestrator.fleet.plan import CompileUnit, Node, Target
from orchestrator.fleet.run import FleetRun, TaskRun
from orchestrator.jobs.records import (
    BucketProfile,
    BucketResult,
    KernelTime,
    VariantMeasure,
    VariantProfile,
)
from orchestrator.reports.html import render_html, write_html
from orchestrator.reports.report import build_fleet_report, build_report, write_json

ROOT = Path(__file__).resolve().parents[1]
STARTED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
BREAK_REASON = "call_function <built-in function print>: see https://pytorch.org/docs/main/compile/graph_breaks"
HOSTILE = '<script>alert("x")</script> & <b>bold</b>'
# a warm rank's pull names its store: a long name, with what HTML and mathtext would read as markup
PULLED = "pulled generation 3 from s3://store/<team>/$prefix"
LONG_ERROR = "load: FileNotFoundError: " + "/".join(["", "cache", *["0123456789abcdef"] * 24, "fxgraph.bin"])
LONG_KERNEL = "triton_per_fused_" + "_".join(f"add_{i}_native_layer_norm" for i in range(8)) + "_0"
# what a real record's `cache` holds (jobs/engine.py)
CACHE_COUNTERS = {
    "fx_graph_hits": 3,
    "fx_graph_misses": 0,
    "fx_graph_bypasses": 0,
    "aot_autograd_hits": 3,
    "aot_autograd_misses": 0,
    "autotuned_kernels": 0,
}
CHARTS = {
    "process": ["latency", "speedup", "cache", "profile"],
    "fleet": ["latency", "speedup", "cache", "timeline", "profile"],
    "unprofiled": ["latency", "speedup", "cache"],
}


def spec():
    return load_spec(ROOT / "examples" / "mlp.yaml")


def variants(eager: float, compiled: float, graphed: float | None) -> dict[str, VariantMeasure]:
    out = {
        "eager": VariantMeasure(ok=True, ms=eager, p90_ms=eager * 1.1, spread_ms=eager * 0.05),
        "compiled": VariantMeasure(ok=True, ms=compiled, p90_ms=compiled * 1.1, spread_ms=compiled * 0.08),
    }
    if graphed is None:
        out["graphed"] = VariantMeasure(ok=False, reason="CUDA graphs need a CUDA device; this is the CPU")
    else:
        out["graphed"] = VariantMeasure(ok=True, ms=graphed, p90_ms=graphed * 1.2, spread_ms=graphed * 0.1)
    return out


def record(bucket: int, **kw) -> BucketResult:
    eager, compiled = 0.2 * bucket, 0.08 * bucket
    fields = dict(
        node="n1",
        cache_state="miss",
        compile_seconds=2.0,
        graph_record_seconds=0.5,
        cache_hits=1,
        cache_misses=2,
        cache={"fx_graph_hits": 1, "fx_graph_misses": 2, "aot_autograd_misses": 1},
        eager_ms=eager,
        compiled_ms=compiled,
        speedup=eager / compiled,
        graph_breaks=1,
        graph_break_reasons={BREAK_REASON: 1},
        cudagraphs=False,
        cudagraph_skip_reasons=["CUDA graphs need a CUDA device; this is the CPU"],
        max_abs_error=1e-6,
        variant="compiled",
        variants=variants(eager, compiled, None),
    )
    return BucketResult(bucket=bucket, **{**fields, **kw})


KERNEL = "at::native::vectorized_elementwise_kernel<4, GeluKernel<float>>[grid]"


def profile(bucket: int, served: str, time_kind: str) -> BucketProfile:
    """What `warmup --profile` records: eager all ATen, the compiled variants mostly Inductor."""

    def variant(name: str, per_call: float, inductor: float, aten: float, top: list[KernelTime]) -> VariantProfile:
        return VariantProfile(
            trace=f"/tmp/prof/mlp-b{bucket}-{name}.json.gz",
            time_kind=time_kind,  # type: ignore[arg-type]
            calls=10,
            total_us=per_call * 10,
            per_call_us=per_call,
            inductor_kernels=3 if inductor else 0,
            inductor_share=inductor,
            aten_kernels=2,
            aten_share=aten,
            other_kernels=1,
            other_share=round(1 - inductor - aten, 6),
            top=top,
        )

    eager = variant(
        "eager",
        20.0 * bucket,
        0.0,
        0.9,
        [
            KernelTime("aten::addmm<float>", "aten", 120.0 * bucket, 20, 0.6),
            KernelTime(KERNEL, "aten", 60.0 * bucket, 10, 0.3),
        ],
    )
    variants = {"eager": eager}
    for name in dict.fromkeys(["compiled", served]):
        variants[name] = variant(
            name,
            8.0 * bucket,
            0.7,
            0.25,
            [
                KernelTime("cpp_fused_relu_0", "inductor", 56.0 * bucket, 10, 0.7),
                KernelTime("aten::addmm<float>", "aten", 20.0 * bucket, 10, 0.25),
            ],
        )
    return BucketProfile(served=served, variants=variants)


def newer_fields(report: dict) -> dict:
    """Add the fields newer reports carry (speedup intervals, noisy) where the records on this
    checkout do not have them yet, and a profile as `warmup --profile` records it where the record
    has none: the page uses them when present."""

    def default(d: dict, key: str, value) -> None:
        # records carry these keys as null until measured: set where absent or null
        if d.get(key) is None:
            d[key] = value

    for i, r in enumerate(report["results"]):
        if r["status"] != "ok":
            continue
        served_ms = r["variants"][r["variant"]]["ms"]
        served = r["eager_ms"] / served_ms
        default(r, "served_speedup", served)
        default(r, "served_speedup_interval", [served * 0.9, served * (1.6 if i == 0 else 1.05)])
        default(r, "speedup_interval", [r["speedup"] * 0.95, r["speedup"] * 1.05])
        default(r, "noisy", i == 0)
        for m in r["variants"].values():
            if m["ms"]:
                default(m, "speedup_interval", [r["eager_ms"] / m["ms"] * 0.95, r["eager_ms"] / m["ms"] * 1.05])
        if r.get("profile") is None:
            r["profile"] = asdict(profile(r["bucket"], r["variant"], "cuda" if r["gpu"] else "cpu"))
    return report


def process_report() -> dict:
    from orchestrator.jobs.engine import WarmupRun

    run = WarmupRun(
        platform=Platform("2.13.0+cpu", "abc", None, None, "cpu-x86_64", "3.11.7"),
        namespace="mlp-ns",
        device="cpu",
        cache_dir="/tmp/cache",
        results=[
            record(1),
            record(8, variant="graphed", variants=variants(1.6, 0.64, 0.3)),
            record(32, status="failed", stage="compile", error=f"compile: {HOSTILE}", speedup=None, variant=None),
        ],
        wall_seconds=9.5,
        setup_seconds=1.0,
        process_age_at_start=3.0,
        cache_bytes=100,
        cache_files=4,
        remote="s3://bucket/prefix",
        publish=Transfer(generation=2, files=3, bytes=10, shards=1, seconds=0.25),
    )
    return newer_fields(build_report(spec(), run, STARTED))


def fleet_report() -> dict:
    nodes = [Node("id1", "10.0.0.1", 2, 8, "H200"), Node("id2", "10.0.0.2", 2, 8, "H200")]
    targets = [Target(rank, nodes[rank // 2]) for rank in range(4)]
    compiled = [record(b, rank=None, gpu="H200", node="10.0.0.1") for b in (1, 8)]
    warm = [
        record(
            b, rank=t.rank, gpu="H200", node=t.node.ip, phase="warm", cache_state="hit", cache_hits=3, cache_misses=0
        )
        for t in targets
        for b in (1, 8)
    ]

    runs = [
        TaskRun(
            worker_account(
                "10.0.0.1", 100.5, 108.0, [("worker up", 101.0), ("imported", 102.0), (f"b{b} compiled", 107.5)]
            ),
            "compile",
            None,
            b,
            108.2,
        )
        for b in (1, 8)
    ] + [
        TaskRun(
            worker_account(
                t.node.ip,
                101.0,
                114.0 + t.rank,
                [("imported", 102.5), ("pulled", 108.5), ("b1 loaded", 109.0), ("b8 benchmarked", 113.0 + t.rank)],
            ),
            "warm",
            t.rank,
            None,
            114.5 + t.rank,
        )
        for t in targets
    ]
    fleet = FleetRun(
        nodes=nodes,
        targets=targets,
        units=[CompileUnit("H200", 1, 0.49), CompileUnit("H200", 8, 0.49)],
        results=compiled + warm,
        runs=runs,
        wall_seconds=20.0,
        wave_seconds={"start": 1.0, "compile": 8.0, "warm": 9.0},
        started_at=100.0,
    )
    return newer_fields(build_fleet_report(spec(), fleet, "s3://bucket/prefix", STARTED))


def busy_fleet_report(scale: float = 1.0) -> dict:
    """Sixteen ranks on four nodes warming four buckets from a warm store (the compile wave loads
    from the cache too): some twenty milestones a rank, many a fraction of a second apart, some at
    one instant, and one rank failing with a long error. `scale` stretches the run: 0.03 is under
    a second, 250 over an hour."""
    buckets = (1, 8, 32, 128)
    nodes = [Node(f"id{i}", f"10.0.0.{i + 1}", 4, 8, "H200") for i in range(4)]
    targets = [Target(rank, nodes[rank // 4]) for rank in range(16)]
    hit = dict(gpu="H200", cache_state="hit", cache_hits=3, cache_misses=0, cache=CACHE_COUNTERS)
    compiled = [
        record(b, rank=None, node="10.0.0.1", compile_seconds=2.2 + 0.15 * i, **hit) for i, b in enumerate(buckets)
    ]
    warm = [
        record(b, rank=t.rank, node=t.node.ip, phase="warm", compile_seconds=0.4, **hit)
        for t in targets
        for b in buckets
    ]
    warm[-1] = record(
        128, rank=15, node="10.0.0.4", phase="warm", status="failed", stage="load", error=LONG_ERROR, variant=None
    )

    def clock(seconds: float) -> float:
        return 100.0 + seconds * scale

    def account(node: str, start: float, end: float, events: list[tuple[str, float]]):
        return worker_account(node, clock(start), clock(end), [(what, clock(start + at)) for what, at in events])

    runs = []
    for i, b in enumerate(buckets):
        start = 0.1 * i
        events = [("worker up", 1.9), ("imported", 4.2), ("device ready", 4.2), ("model built", 4.25)]
        events += [(f"loaded bucket {b}", 6.5 + i), ("published", 6.51 + i)]
        runs.append(
            TaskRun(account("10.0.0.1", start, start + 6.6 + i, events), "compile", None, b, clock(start + 6.7 + i))
        )
    for t in targets:
        start = 8 + 0.05 * t.rank
        events = [("worker up", 1.9), ("imported", 4.1), ("device ready", 4.1), ("model built", 4.15)]
        events += [("references done", 6.0), (PULLED, 6.5)]
        for i, b in enumerate(buckets):
            events += [
                (f"loaded bucket {b}", 6.9 + 1.6 * i),
                (f"benchmarked bucket {b}", 7.7 + 1.6 * i + 0.02 * t.rank),
                (f"profiled bucket {b}", 8.2 + 1.6 * i),
            ]
        events.append(("published serving plans", 13.05))
        runs.append(TaskRun(account(t.node.ip, start, start + 13.1, events), "warm", t.rank, None, clock(start + 13.2)))
    fleet = FleetRun(
        nodes=nodes,
        targets=targets,
        units=[CompileUnit("H200", b, 0.49) for b in buckets],
        results=compiled + warm,
        runs=runs,
        wall_seconds=22.0 * scale,
        wave_seconds={"start": 1.0 * scale, "compile": 7.0 * scale, "warm": 14.0 * scale},
        started_at=100.0,
    )
    report = newer_fields(build_fleet_report(spec(), fleet, "s3://bucket/prefix", STARTED))
    report["results"][0]["profile"]["variants"]["compiled"]["top"][0]["name"] = LONG_KERNEL
    return report


REPORTS = {
    "process": process_report,
    "fleet": fleet_report,
    "busy": busy_fleet_report,
    "busy-under-a-second": lambda: busy_fleet_report(0.03),
    "busy-over-an-hour": lambda: busy_fleet_report(250.0),
}


@functools.cache
def page_of(kind: str) -> str:
    """A report's page, drawn once for every test that reads it: a busy fleet's takes seconds."""
    return render_html(REPORTS[kind]())


def old_report() -> dict:
    """A report from before variants, speedup intervals, noisy and profiles: none of those keys."""
    report = process_report()
    newer = {"variant", "variants", "served_speedup", "served_speedup_interval", "speedup_interval", "noisy"}
    for r in report["results"]:
        for key in newer | {"profile", "cache", "graph_break_reasons", "error_detail", "stage_seconds"}:
            r.pop(key, None)
    return report


# ----- the page's text, no browser ------------------------------------------------------------


def resource_urls(page: str) -> list[str]:
    """What a browser would fetch: src/href attributes, CSS url() and @import, that are not in-page."""
    attrs = re.findall(r"""\b(?:src|href|xlink:href)\s*=\s*["']?([^"'\s>]+)""", page, re.IGNORECASE)
    css = re.findall(r"""url\(\s*["']?([^"')]+)""", page) + re.findall(r"""@import\s+["']?([^"';\s]+)""", page)
    return [u for u in attrs + css if not (u.startswith("#") or u.startswith("data:"))]


@pytest.mark.parametrize("make", [process_report, fleet_report, old_report])
def test_the_page_fetches_nothing_and_runs_no_script(make):
    page = render_html(make())
    assert resource_urls(page) == []
    assert "<script" not in page.lower().replace("&lt;script", "")
    # a URL is only ever text (a graph break's reason) or the SVG namespace
    without_text = re.sub(r"""xmlns(:\w+)?="http://www\.w3\.org/[^"]+\"""", "", page)
    assert set(re.findall(r"https?://[^\s<\"']+", without_text)) <= {
        "https://pytorch.org/docs/main/compile/graph_breaks"
    }


def test_user_text_is_escaped():
    page = render_html(process_report())
    assert HOSTILE not in page
    assert "compile: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert "&lt;built-in function print&gt;" in page  # a graph break's reason
    assert "aten::addmm&lt;float&gt;" in page  # a profile's kernel name
    assert html.escape(KERNEL) in page and KERNEL not in page


def test_process_page_shows_every_part():
    page = render_html(process_report())
    for chart in CHARTS["process"]:
        assert f'data-chart="{chart}"' in page
    assert 'data-chart="timeline"' not in page
    text = text_of(page)
    for expected in (
        "mlp warmup report",
        "2.13.0+cpu",
        "reduce-overhead",  # the config's mode
        "2026-01-02 03:04:05 UTC",
        "9.5 s",
        "Failed buckets",
        "CUDA graphs need a CUDA device",  # no CUDA graphs, and graphed unavailable
        "cpp_fused_relu_0",
        "fx_graph_misses",
        "noisy",
        "published generation 2",
    ):
        assert expected in text, expected
    assert re.search(r"2\.25–4\.00", text), "the first bucket's served speedup interval"  # 2.5x * [0.9, 1.6]


def test_old_report_renders_without_the_newer_parts():
    page = render_html(old_report())
    for chart in CHARTS["unprofiled"]:
        assert f'data-chart="{chart}"' in page  # latency from eager_ms/compiled_ms, speedup from `speedup`
    assert "noisy" not in re.sub(r"<[^>]+>", " ", page).replace("Noisy figures", "")
    assert "Where the time goes" not in page and 'data-chart="profile"' not in page


def part(page: str, section: str) -> str:
    return page.split(f'<section id="{section}">')[1].split("</section>")[0]


def profile_part(page: str) -> str:
    return part(page, "profile")


def text_of(html_part: str) -> str:
    """The text a reader sees, tags off (a header's <wbr> break opportunity is not a space)."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", html_part.replace("<wbr>", ""))))


def test_profile_shows_where_the_time_goes():
    page = render_html(process_report())
    part = profile_part(page)
    assert 'data-chart="profile"' in part
    assert "CPU self time" in part and "GPU device time" not in part  # the process report ran on the CPU
    text = re.sub(r"<[^>]+>", " ", part)
    # every profiled variant of every benchmarked bucket, the served one marked; the failed bucket has none
    assert text.count("/tmp/prof/mlp-b1-") == 2 and text.count("/tmp/prof/mlp-b8-") == 3
    assert "mlp-b32" not in text
    assert "/tmp/prof/mlp-b8-graphed.json.gz" in text and "(serves graphed)" in text
    assert "<a " not in part  # trace paths are text on the node that ran them, never links
    assert "cpp_fused_relu_0" in text and "70.0%" in text  # the compiled variant's Inductor kernel and share
    assert len(re.findall(r"<details class=\"profile\" open>", part)) == 2  # few records: open
    # the fleet ran on GPUs: device time
    assert "GPU device time" in profile_part(render_html(fleet_report()))


def test_profile_chart_draws_each_variant_split_by_kind():
    from orchestrator.reports.html import _profile_chart

    report = process_report()
    bars = [
        (f"bucket {r['bucket']}", name, v, name == r["profile"]["served"])
        for r in report["results"]
        if r.get("profile")
        for name, v in r["profile"]["variants"].items()
    ]
    svg = _profile_chart(bars)
    # eager: one ATen and one other segment; compiled variants: Inductor, ATen and other; one bar per kind each
    assert svg.count('<g id="patch_') >= 3 * len(bars)


def test_profile_without_variants_shows_why():
    report = process_report()
    reason = "trace directory /prof: [Errno 13] Permission denied: <'/prof'>"
    for r in report["results"]:
        if r["status"] == "ok":
            r["profile"] = asdict(BucketProfile(served=r["variant"], unavailable={"eager": reason, "compiled": reason}))
    part = profile_part(render_html(report))
    assert 'data-chart="profile"' not in part and "No variant could be profiled" in part
    assert part.count(html.escape(reason)) == 4 and reason not in part


def test_profile_none_and_absent_render_no_section():
    report = process_report()
    report["results"][0]["profile"] = None
    report["results"][1].pop("profile")
    page = render_html(report)
    assert '<section id="profile">' not in page and 'data-chart="profile"' not in page


def test_without_served_speedup_the_served_variant_sets_the_figure():
    """A record that names its served variant but has no `served_speedup`: eager serving is 1.00x,
    whatever compiled measured (`speedup`, eager / compiled, has its own column)."""
    report = process_report()
    first = report["results"][0]
    for key in ("served_speedup", "served_speedup_interval", "noisy"):
        first.pop(key)
    first["variant"] = "eager"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", render_html(report).split("<h2>Buckets</h2>")[1].split("</tr>")[1])
    assert cells[2:6] == ['<span class="served">eager</span>', "0.200", "1.00x", "-"]
    assert cells[6] == "2.50x"  # eager / compiled


def test_a_report_with_nothing_measured_still_renders():
    report = process_report()
    for r in report["results"]:
        r.update(status="failed", stage="device", error="device: no GPU", variants={}, variant=None, profile=None)
        r.update(eager_ms=None, compiled_ms=None, speedup=None, served_speedup=None, cache_hits=None, cache_misses=None)
    page = render_html(report)
    assert "No bucket was benchmarked" in page and "No speedup was measured" in page
    assert "<svg" not in page


def test_write_html_is_atomic(tmp_path):
    out = tmp_path / "deep" / "report.html"
    write_html(process_report(), out)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temporary file left


def test_reports_get_the_mode_of_any_new_file_not_a_private_one(tmp_path):
    old = os.umask(0o022)
    try:
        write_html(process_report(), tmp_path / "report.html")
        write_json(process_report(), tmp_path / "report.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == 0o644


# ----- the fleet timeline's labels and the tables' columns, no browser -----------------------


def test_labels_start_at_their_markers_where_there_is_room():
    from orchestrator.reports.html import _place_labels

    placed = _place_labels([(0.0, [30.0, 20.0]), (50.0, [30.0, 20.0]), (100.0, [30.0])], 0.0, 200.0, lines=4)
    assert placed == [(0, 0, 0.0), (0, 0, 50.0), (0, 0, 100.0)]  # the whole text, the line nearest the bar


def test_a_label_without_room_takes_another_line_then_a_shorter_text_then_none():
    from orchestrator.reports.html import _place_labels

    # five milestones at one instant: one on each of four lines, none for the fifth
    assert _place_labels([(10.0, [40.0, 20.0])] * 5, 0.0, 200.0, lines=4) == [
        (0, 0, 10.0),
        (0, 1, 10.0),
        (0, 2, 10.0),
        (0, 3, 10.0),
        None,
    ]
    # one line: the second label's whole text would run past the edge, its short one fits
    assert _place_labels([(0.0, [50.0, 10.0]), (60.0, [100.0, 30.0])], 0.0, 120.0, lines=1) == [
        (0, 0, 0.0),
        (1, 0, 60.0),
    ]
    # at the right edge a label ends at its marker; wider than the plot, it has no room anywhere
    assert _place_labels([(190.0, [30.0])], 0.0, 200.0, lines=1) == [(0, 0, 160.0)]
    assert _place_labels([(10.0, [500.0, 300.0])], 0.0, 200.0, lines=4) == [None]
    assert _place_labels([(10.0, [5.0])], 0.0, 200.0, lines=0) == [None]


def test_labels_never_overlap_nor_leave_the_plot_nor_their_markers():
    from orchestrator.reports.html import _place_labels

    rng = random.Random(7)
    for _ in range(300):
        lines, gap = rng.randint(0, 4), rng.choice([0.0, 4.0])
        events = [
            (rng.uniform(0, 300), sorted((rng.uniform(5, 120) for _ in range(rng.randint(1, 3))), reverse=True))
            for _ in range(rng.randint(0, 40))
        ]
        placed = _place_labels(events, 0.0, 300.0, lines, gap)
        spans: dict[int, list[tuple[float, float]]] = {}
        for (x, widths), where in zip(events, placed, strict=True):
            if where is None:
                continue
            choice, line, start = where
            end = start + widths[choice]
            assert 0.0 <= start and end <= 300.0 and 0 <= line < lines
            assert start == x or math.isclose(end, x), "a label begins or ends at its marker"
            spans.setdefault(line, []).append((start, end))
        for on_line in spans.values():
            on_line.sort()
            assert all(b[0] - a[1] >= gap - 1e-9 for a, b in pairwise(on_line))
    # milestones far enough apart all get their whole text on the nearest line
    apart = [(i * 130.0, [120.0, 60.0]) for i in range(3)]
    assert _place_labels(apart, 0.0, 400.0, lines=1, gap=4.0) == [(0, 0, i * 130.0) for i in range(3)]


@pytest.mark.parametrize("kind, crowded", [("fleet", False), ("busy", True)])
def test_timeline_marks_and_titles_every_milestone(kind, crowded):
    timeline = REPORTS[kind]()["executor"]["timeline"]
    events = sum(len(row["events"]) for row in timeline)
    page = page_of(kind)
    svg = page.split('<figure id="chart-timeline">')[1].split("</figure>")[0]
    folded = re.search(r"Milestones \((\d+) without a label in the chart\)", page)
    unlabelled = int(folded.group(1)) if folded else 0
    assert svg.count('class="timeline-event"><title>') == events
    assert svg.count('class="timeline-label"><title>') == events - unlabelled
    assert svg.count('class="timeline-row"') == svg.count('class="timeline-task"><title>') == len(timeline)
    assert 'id="timeline-plot"' in svg
    # the sparse timeline has room for every label; the crowded one leaves some off (and hollow)
    assert (unlabelled > 0) == crowded and unlabelled < events / 2
    if crowded:
        assert f"{html.escape(PULLED)} at " in svg and PULLED not in svg  # the whole name in its tooltip
    milestones = text_of(part(page, "fleet").split("Milestones")[1])
    for row in timeline:
        for what, at in row["events"]:
            assert f"{what} {at:.2f}" in milestones


def headers(page: str, section: str) -> list[str]:
    return [text_of(h).strip() for h in re.findall(r"<th>(.*?)</th>", part(page, section))]


def test_columns_say_what_they_hold():
    page = page_of("busy")
    buckets = headers(page, "buckets")
    assert "first call s compile or cache load" in buckets and "compile s" not in buckets
    assert "next 2 calls s CUDA-graph warm-up and capture" in buckets
    assert "served ms median per call" in buckets and "compiled speedup eager / compiled" in buckets
    fleet = headers(page, "fleet")
    assert "compile wave: first call s the slowest unit's compile or cache load" in fleet
    assert "warm ranks: first call cache load, or compile on a miss" in fleet
    # the compile wave of a run on a warm store loaded from the cache: its seconds say so
    per_bucket = text_of(part(page, "fleet").split("Per bucket across ranks")[1])
    assert "1 2.20 cache load" in per_bucket and "128 2.65 cache load" in per_bucket
    # the compile wave of fleet_report compiled: its cache missed
    assert "1 2.00 compile" in text_of(part(page_of("fleet"), "fleet").split("Per bucket across ranks")[1])
    # a counter's name may break after its underscores, and reads whole
    assert "fx_<wbr>graph_<wbr>bypasses" in part(page, "cache") and "fx_graph_bypasses" in headers(page, "cache")


# ----- the CLI --------------------------------------------------------------------------------


def test_report_command_prints_the_table_and_writes_the_page(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(fleet_report()))
    table = orchestrate("report", str(path))
    assert table.returncode == 0, table.stderr
    assert "bucket" in table.stdout and "cache warm" in table.stdout
    html_out = tmp_path / "out" / "report.html"
    written = orchestrate("report", str(path), "--html", str(html_out))
    assert written.returncode == 0, written.stderr
    assert written.stdout == ""  # the page is the output; the line saying where went to stderr
    assert str(html_out) in written.stderr
    assert 'data-chart="timeline"' in html_out.read_text()


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"hello": 1}', "not a warmup report"),
        ("[1, 2]", "not a warmup report"),
        ('{"schema_version": 9, "results": [], "summary": {}, "executor": {}}', "schema_version 9"),
    ],
)
def test_report_command_refuses_what_is_not_a_report(tmp_path, content, expected):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    out = orchestrate("report", str(path), "--html", str(tmp_path / "page.html"))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrate: error:") and expected in lines[0], out.stderr
    assert not (tmp_path / "page.html").exists()


def test_report_command_refuses_an_unwritable_page(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(process_report()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = orchestrate("report", str(path), "--html", str(blocker / "page.html"))
    assert out.returncode == 2
    assert out.stderr.startswith("orchestrate: error: --html") and "cannot create its directory" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_old_report_renders_through_the_command(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old_report()))
    page = tmp_path / "old.html"
    out = orchestrate("report", str(path), "--html", str(page))
    assert out.returncode == 0, out.stderr
    assert 'data-chart="latency"' in page.read_text()


# ----- in a real browser ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs Debian's headless Chromium: apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def look(driver, page: Path, screenshot: Path, charts: list[str]) -> None:
    """Open the page, as a user would from disk, and check every chart is drawn and is not blank."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    driver.set_window_size(1280, 800)
    driver.get(page.as_uri())
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, height + 200)  # the whole page in the viewport: one screenshot holds it
    errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    png = driver.get_screenshot_as_png()
    screenshot.write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("L")
    found = driver.find_elements(By.CSS_SELECTOR, "figure svg[data-chart]")
    assert sorted(e.get_attribute("data-chart") for e in found) == sorted(charts)
    for element in found:
        name = element.get_attribute("data-chart")
        rect = element.rect
        assert rect["width"] > 200 and rect["height"] > 80, (name, rect)
        box = image.crop(
            (int(rect["x"]), int(rect["y"]), int(rect["x"] + rect["width"]), int(rect["y"] + rect["height"]))
        )
        pixels = box.width * box.height
        inked = sum(1 for value in box.getdata() if value < 200)
        assert inked > pixels * 0.01, (name, inked, pixels)  # bars, axes and labels, not an empty box
        assert element.find_element(By.TAG_NAME, "title").get_attribute("textContent")  # its text alternative


@pytest.mark.parametrize("kind", ["process", "fleet"])
def test_page_in_a_real_browser(browser, tmp_path, kind):
    page = tmp_path / f"{kind}.html"
    write_html(process_report() if kind == "process" else fleet_report(), page)
    look(browser, page, tmp_path / f"{kind}.png", CHARTS[kind])


def test_old_report_in_a_real_browser(browser, tmp_path):
    page = tmp_path / "old.html"
    write_html(old_report(), page)
    look(browser, page, tmp_path / "old.png", CHARTS["unprofiled"])


TIMELINE_BOXES = """
const svg = document.querySelector('svg[data-chart="timeline"]');
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
const all = selector => Object.fromEntries(Array.from(svg.querySelectorAll(selector), e => [e.id, box(e)]));
return {plot: box(svg.querySelector('#timeline-plot')), rows: all('.timeline-row'), labels: all('.timeline-label')};
"""
TABLE_BOXES = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
return Array.from(document.querySelectorAll('table'), t => {
  const section = t.closest('section'), wrap = t.closest('.table-wrap');
  return [section ? section.id : null, box(t), section ? box(section) : null, wrap.scrollWidth > wrap.clientWidth];
});
"""


def inside(inner: list[float], outer: list[float]) -> bool:
    return (
        inner[0] >= outer[0] - 0.01
        and inner[1] >= outer[1] - 0.01
        and inner[2] <= outer[2] + 0.01
        and inner[3] <= outer[3] + 0.01
    )


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def open_page(driver, page: Path, width: int = 1280) -> None:
    driver.set_window_size(width, 900)
    driver.get(page.as_uri())
    errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]
    assert errors == []


@pytest.mark.parametrize("kind", ["fleet", "busy-under-a-second", "busy", "busy-over-an-hour"])
def test_timeline_labels_never_overlap_in_a_real_browser(browser, tmp_path, kind):
    """As the browser lays the page out: every milestone label clear of every other, inside the
    plot and inside its own row's band."""
    page = tmp_path / f"{kind}.html"
    page.write_text(page_of(kind))
    open_page(browser, page)
    boxes = browser.execute_script(TIMELINE_BOXES)
    labels, rows, plot = boxes["labels"], boxes["rows"], boxes["plot"]
    assert len(rows) == len(REPORTS[kind]()["executor"]["timeline"]) and len(labels) >= 2 * len(rows)
    for name, box in labels.items():
        assert box[2] - box[0] > 5 and box[3] - box[1] > 3, (name, box)  # drawn, not an empty group
        assert inside(box, plot), (name, box, plot)
        lane = name.split("-")[2]
        assert inside(box, rows[f"timeline-row-{lane}"]), (name, box, rows[f"timeline-row-{lane}"])
    named = sorted(labels.items(), key=lambda item: item[1][0])
    for i, (name, box) in enumerate(named):
        for other, other_box in named[i + 1 :]:
            if other_box[0] >= box[2]:
                break  # sorted by their left edge: no later label can reach back over this one
            assert not overlap(box, other_box), (name, box, other, other_box)


@pytest.mark.parametrize("kind", ["process", "fleet", "busy"])
def test_tables_stay_inside_their_sections_in_a_real_browser(browser, tmp_path, kind):
    page = tmp_path / f"{kind}.html"
    page.write_text(page_of(kind))
    open_page(browser, page)
    tables = browser.execute_script(TABLE_BOXES)  # every folded table unfolded first
    assert len(tables) >= 5
    for section, box, section_box, scrolls in tables:
        assert section is not None, box
        assert box[2] > box[0], (section, box)
        assert inside(box, section_box), (section, box, section_box)
        assert not scrolls, (section, box)  # nothing in it (a header's long word) sticks out either
    # a window too narrow for a table: the table scrolls inside its section, the page never sideways
    browser.set_window_size(760, 900)
    assert browser.execute_script("return document.documentElement.scrollWidth <= document.documentElement.clientWidth")


@pytest.mark.slow
def test_real_warmup_writes_the_page(browser, profiled_warmup, tmp_path):
    page, written = profiled_warmup.page, profiled_warmup.report
    text = page.read_text()
    assert resource_urls(text) == []
    assert written["model"] in text
    for r in written["results"]:
        for v in r["profile"]["variants"].values():
            assert html.escape(v["trace"]) in text
    look(browser, page, tmp_path / "mlp.png", CHARTS["process"])


def test_warmup_refuses_an_unwritable_page_before_running(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = orchestrate(
        "warmup", "--no-ray", "--model", "examples/mlp.yaml", "--html", str(blocker / "page.html"), timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.startswith("orchestrate: error: --html") and "bucket" not in out.stderr


PHONE = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
const wide = e => e.scrollWidth > e.clientWidth + 1;
return {
  viewport: document.documentElement.clientWidth,
  page_scrolls: document.documentElement.scrollWidth > document.documentElement.clientWidth,
  charts: Array.from(document.querySelectorAll('figure svg'), s => [
    s.closest('figure').id, s.getBoundingClientRect().width, wide(s.closest('figure'))]),
  cues: Array.from(document.querySelectorAll('.table-wrap, figure'), e =>
    [wide(e), getComputedStyle(e).backgroundAttachment, getComputedStyle(e).backgroundImage]),
};
"""


@pytest.mark.parametrize("kind", ["process", "fleet"])
def test_on_a_phone_charts_keep_a_legible_size_and_what_scrolls_shows_it(browser, tmp_path, kind):
    """At 390 px a chart scaled to the window would draw its text 2-3 px high: it keeps 560 px and
    scrolls inside its figure, the page never sideways; a box that scrolls shows a shadow."""
    page = tmp_path / f"{kind}.html"
    page.write_text(page_of(kind))
    open_page(browser, page, width=390)
    seen = browser.execute_script(PHONE)
    assert seen["viewport"] <= 390 and not seen["page_scrolls"], seen["viewport"]
    assert len(seen["charts"]) >= 2
    for name, width, scrolls in seen["charts"]:
        assert width >= 559.5 and scrolls, (name, width)
    assert any(scrolls for scrolls, _, _ in seen["cues"])  # some table is wider than a phone too
    for _, attachment, image in seen["cues"]:
        assert attachment == "local, local, scroll, scroll" and image.count("gradient(") == 4, (attachment, image)
