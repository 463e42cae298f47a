"""The warmup table (orchestrator.reports.report.render_table) and the speedup intervals behind it
(orchestrator.jobs.stats): reports built from synthetic records, rendered into a recording
console 80 columns wide, as a terminal shows them; no torch compile."""

from __future__ import annotations

import io
import random
from dataclasses import replace

import pytest
from rich.console import Console
from test_report_records import STARTED, fleet_run, process_run, spec, store_fleet

from orchestrator.cache.sync import Transfer
from orchestrator.fleet.plan import Target
from orchestrator.fleet.run import TaskRun
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.stats import MIN_SAMPLES, NOISY_RELATIVE_HALF_WIDTH, is_noisy, ratio_interval
from orchestrator.reports.report import build_fleet_report, build_report, render_table

ALL_VARIANTS = ("eager", "compiled", "graphed", "eager-graphed", "aot")
ALLOC_ERROR = (
    "benchmark: RuntimeError: [enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: not enough memory"
)


def measured(bucket: int, *, eager_ms: float, served: str = "eager-graphed", noisy: bool = False, **kw) -> BucketResult:
    """A bucket every variant was measured for, as the engine records one."""
    ms = {"eager": eager_ms, "compiled": eager_ms / 3, "graphed": eager_ms / 3.9, "eager-graphed": eager_ms / 4.1}
    ms["aot"] = eager_ms / 3.2
    variants = {
        name: VariantMeasure(
            ok=True,
            ms=value,
            p90_ms=value * 1.1,
            spread_ms=value / 50,
            speedup_interval=[eager_ms / value * 0.95, eager_ms / value * 1.05],
        )
        for name, value in ms.items()
    }
    speedup = eager_ms / ms[served]
    fields = dict(
        node="gpu-node-with-a-long-name-1",
        phase="compile",
        cache_state="miss",
        stage="done",
        compile_seconds=12.5,
        graph_record_seconds=0.04,
        cache_hits=0,
        cache_misses=2,
        eager_ms=eager_ms,
        compiled_ms=ms["compiled"],
        speedup=3.0,
        speedup_interval=[2.9, 3.1],
        throughput_speedup=4.5,
        graph_breaks=0,
        recompiles=0,
        max_abs_error=2e-6,
        variant=served,
        variants=variants,
        served_ms=ms[served],
        served_speedup=speedup,
        served_speedup_interval=[speedup * 0.3, speedup * 3] if noisy else [speedup * 0.95, speedup * 1.05],
        noisy=noisy,
    )
    return BucketResult(bucket=bucket, **{**fields, **kw})


def failed(bucket: int, **kw) -> BucketResult:
    fields = dict(node="gpu-node-with-a-long-name-1", status="failed", stage="benchmark", error=ALLOC_ERROR)
    return BucketResult(bucket=bucket, **{**fields, **kw})


def rendered(report: dict, *, wide: bool = False, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    render_table(report, console, wide=wide)
    return console.export_text()


def process_report(results: list[BucketResult]) -> dict:
    return build_report(spec(), replace(process_run(remote=False), results=results), STARTED)


def prose(text: str) -> str:
    """The text with the console's line wrapping undone: notes below the table wrap at 80 columns."""
    return " ".join(text.split())


def rows(text: str) -> dict[str, str]:
    """The table's rows by their first cell (the bucket), lines of notes below left out."""
    found = {}
    for line in text.splitlines():
        first = line.split()[0] if line.split() else ""
        if first.isdigit() and not line.startswith("bucket"):
            found[first] = line
    return found


# --- the bootstrap ---------------------------------------------------------------------------


def test_interval_contains_the_ratio_of_medians():
    rng = random.Random(7)
    eager = [4.0 + rng.gauss(0, 0.2) for _ in range(100)]
    compiled = [1.0 + rng.gauss(0, 0.05) for _ in range(100)]
    low, high = ratio_interval(eager, compiled)
    point = sorted(eager)[49:51][0] / sorted(compiled)[49:51][0]
    assert low < 4.0 < high and low <= point <= high
    assert high - low < 0.4  # a quiet machine: a narrow interval
    assert not is_noisy(4.0, [low, high], samples=100)


def test_identical_samples_give_a_zero_width_interval():
    assert ratio_interval([2.0] * 50, [0.5] * 50) == [4.0, 4.0]
    # eager against itself, sample by sample: exactly 1, however the samples vary
    rng = random.Random(3)
    eager = [rng.uniform(1, 9) for _ in range(40)]
    assert ratio_interval(eager, eager) == [1.0, 1.0]


def test_the_interval_is_deterministic():
    rng = random.Random(11)
    eager = [rng.uniform(1, 2) for _ in range(60)]
    compiled = [rng.uniform(0.2, 0.6) for _ in range(60)]
    assert ratio_interval(eager, compiled) == ratio_interval(list(eager), list(compiled))
    assert ratio_interval(eager, compiled, seed=1) != ratio_interval(eager, compiled, seed=2)


def test_one_slow_eager_sample_does_not_make_a_clean_huge_figure():
    # a hundred samples: the median ignores the outlier, the figure stays honest and clean
    eager = [1.0 + 0.001 * (i % 7) for i in range(100)]
    compiled = [0.25 + 0.0001 * (i % 5) for i in range(100)]
    eager[17] = 51.0
    low, high = ratio_interval(eager, compiled)
    assert 3.9 < low <= high < 4.1
    # two samples, one of them slow: the median is their mean, 26x; the figure is flagged noisy
    few_eager, few_compiled = [1.0, 51.0], [1.0, 1.0]
    interval = ratio_interval(few_eager, few_compiled)
    assert interval is not None and interval[1] > 20
    assert is_noisy(26.0, interval, samples=2)
    # the interval alone is enough to flag it where the count is unknown (a fleet's median)
    assert is_noisy(26.0, interval, samples=None)


def test_noisy_rule():
    assert is_noisy(4.0, [3.9, 4.1], samples=MIN_SAMPLES - 1)
    assert not is_noisy(4.0, [3.9, 4.1], samples=MIN_SAMPLES)
    edge = 4.0 * NOISY_RELATIVE_HALF_WIDTH
    assert not is_noisy(4.0, [4.0 - edge, 4.0], samples=100)
    assert is_noisy(4.0, [4.0 - edge * 1.01, 4.0], samples=100)
    assert is_noisy(4.0, [3.9, 4.0 + edge * 1.01], samples=100)  # the larger side counts
    assert not is_noisy(None, None, samples=1)  # nothing claimed
    assert not is_noisy(4.0, None, samples=100)  # a report from before intervals: nothing to judge by
    assert ratio_interval([], []) is None
    assert ratio_interval([1.0, 1.0], [0.0, 0.0]) is None


# --- the process table -----------------------------------------------------------------------


def test_a_realistic_report_fits_80_columns_sorted_by_bucket():
    report = process_report(
        [
            measured(32, eager_ms=1707.123),
            measured(1, eager_ms=1.78, served="graphed", cache_state="hit", compile_seconds=2.61),
            measured(8, eager_ms=11.61, served="compiled", cache_state="mixed"),
        ]
    )
    text = rendered(report)
    assert "…" not in text
    assert max(map(len, text.splitlines())) <= 80
    table = rows(text)
    assert list(table) == ["1", "8", "32"]  # by bucket, not by the order they finished
    assert table["1"].split() == ["1", "ok", "2.61", "hit", "1.780", "0.456", "graphed", "3.90x", "±0.20"]
    assert table["8"].split()[3:8] == ["mixed", "11.610", "3.870", "compiled", "3.00x"]
    assert "eager-graphed" in table["32"] and "1707.123" in table["32"] and "4.10x ±0.21" in table["32"]
    assert "None" not in text
    assert "3 buckets: 3 ok, 0 failed" in prose(text)


def test_a_failure_row_names_the_stage_and_keeps_bracketed_text():
    report = process_report([measured(1, eager_ms=1.0), failed(8), failed(2, stage="pending", error="not loaded: x")])
    text = rendered(report)
    assert "…" not in text and "None" not in text
    assert rows(text)["8"].split() == ["8", "failed", "-", "-", "-", "-", "-", "-"]
    assert f"bucket 8 failed at {ALLOC_ERROR}" in prose(text)  # the stage, and the brackets kept
    assert "bucket 2 failed: not loaded: x" in prose(text)  # no stage entered: none claimed
    assert "3 buckets: 1 ok, 2 failed" in prose(text)


def test_a_fleet_where_no_worker_answered_names_no_torch_and_no_namespace():
    """Every task failed before it could say its platform: the table says what is known, no None."""
    fleet = replace(fleet_run(), runs=[], results=[failed(8, rank=None, phase="compile", stage="pending")])
    text = rendered(build_fleet_report(spec(), fleet, "s3://bucket/prefix", STARTED))
    assert "None" not in text and "torch" not in text.splitlines()[0]
    assert "cache partial (0 hits, 0 misses); 1 bucket: 0 ok, 1 failed" in prose(text)


def test_an_error_that_does_not_name_its_stage_gets_it_and_only_its_first_line():
    report = process_report([failed(4, stage="compile", error="boom [red]not markup[/red]\nsecond line")])
    text = rendered(report)
    assert "bucket 4 failed at compile: boom [red]not markup[/red]" in prose(text)
    assert "second line" not in text


def test_a_noisy_speedup_is_marked_not_printed_clean():
    report = process_report([measured(1, eager_ms=51.0, noisy=True), measured(2, eager_ms=1.0)])
    text = rendered(report)
    one, two = rows(text)["1"], rows(text)["2"]
    assert "noisy" in one and "4.10x" not in one  # the interval, not a clean figure
    assert "noisy 1.2-12x" in one
    assert "noisy" not in two and "4.10x ±0.21" in two
    assert f"wider than ±{NOISY_RELATIVE_HALF_WIDTH:.0%}" in prose(text)
    # --wide judges the compiled speedup by the same rule (here eager serves: 1.00x, clean)
    report = process_report([measured(1, eager_ms=1.2, served="eager", speedup=1.83, speedup_interval=[1.64, 7.12])])
    (one,) = [line for line in rendered(report, wide=True, width=250).splitlines() if line.startswith("compile")]
    assert "noisy 1.6-7.1x" in one and "1.00x ±0.05" in one


def test_eager_served_on_noisy_timings_of_the_others_is_said_so():
    quiet = measured(2, eager_ms=1.0, served="eager")
    busy = measured(1, eager_ms=9.0, served="eager")
    busy.variants["compiled"].speedup_interval = [0.11, 9.4]  # a busy machine: eager may not be fastest
    text = prose(rendered(process_report([busy, quiet])))
    assert rows(rendered(process_report([busy, quiet])))["1"].split()[-2:] == ["1.00x", "±0.05"]
    assert "bucket 1: other variants' speedups are noisy" in text
    assert "bucket 1, 2:" not in text  # bucket 2's timings were quiet
    assert "other variants" not in prose(rendered(process_report([quiet])))


def test_rounds_timed_on_a_slowed_host_are_said_so():
    retaken = measured(1, eager_ms=4.7, bench_rounds=7, host_slowed_rounds=2, host_steady=True)
    slowed = measured(8, eager_ms=9.4, noisy=True, bench_rounds=20, host_slowed_rounds=19, host_steady=False)
    quiet = measured(32, eager_ms=5.0, bench_rounds=5, host_slowed_rounds=0, host_steady=True)
    text = prose(rendered(process_report([retaken, slowed, quiet])))
    assert "bucket 1: the host ran slowed in 2 of 7 benchmark rounds; they were timed again and left out" in text
    assert "bucket 8: the host ran slowed in 19 of 20 benchmark rounds, most of them: every round kept" in text
    assert "bucket 32: the host" not in text
    assert "noisy" in rows(rendered(process_report([slowed])))["8"]


def test_a_report_from_before_intervals_still_renders():
    report = process_report([measured(1, eager_ms=1.0)])
    for record in report["results"]:
        for key in ("speedup_interval", "served_ms", "served_speedup", "served_speedup_interval", "noisy"):
            del record[key]
        for measure in record["variants"].values():
            del measure["speedup_interval"]
    row = rows(rendered(report))["1"].split()
    assert row[5:] == ["0.244", "eager-graphed", "4.10x"]  # served from its variant's latency


def test_wide_shows_every_field_and_every_variant():
    report = process_report([measured(8, eager_ms=11.61), measured(1, eager_ms=1.78), failed(2)])
    text = rendered(report, wide=True, width=250)
    assert "…" not in text and "None" not in text
    header = " ".join(line for line in text.splitlines() if "bucket" in line and "status" in line)
    for column in ("phase", "stage", "compile s", "record s", "hit/miss", "compiled ms", "b2b speedup", "breaks"):
        assert column in header
    for column in ("recompiles", "max |err|", "graphed ms", "eager-graphed ms", "aot ms"):
        assert column in header
    records = [line.split() for line in text.splitlines() if line.split()[:1] == ["compile"]]
    assert [cells[1] for cells in records] == ["1", "2", "8"]
    one = records[0]
    assert one[:7] == ["compile", "1", "ok", "-", "12.50", "0.040", "0/2"]
    assert one[7:11] == ["1.780", "0.593", "3.00x", "±0.10"]  # eager, compiled, speedup and its interval
    assert one[11:14] == ["eager-graphed", "4.10x", "±0.21"]  # what serves, how much faster
    assert one[14:] == ["4.50x", "0", "0", "2.0e-06", "0.456", "0.434", "0.556"]  # b2b .. each variant's ms
    assert records[1][:4] == ["compile", "2", "failed", "benchmark"]
    assert f"bucket 2 failed at {ALLOC_ERROR}" in prose(text)


# --- on Ray ----------------------------------------------------------------------------------


def ray_report(warm: list[BucketResult], compiled: list[BucketResult]) -> dict:
    base = fleet_run()
    ranks = sorted({r.rank for r in warm if r.rank is not None})
    node = base.nodes[0]
    process = base.runs[1].process
    return build_fleet_report(
        spec(),
        replace(
            base,
            targets=[Target(rank, node) for rank in ranks],
            results=compiled + warm,
            runs=[base.runs[0], *(TaskRun(process, "warm", rank, None, 112.0) for rank in ranks)],
        ),
        "s3://bucket/prefix",
        STARTED,
    )


def test_one_cache_rule_for_a_bucket_a_wave_and_a_run():
    """Records that disagree read "mixed" wherever they are summed up: the bucket's compile
    wave cell, the wave's line and the run's summary (there: partial), never one side of it."""
    hit, partly = (
        dict(cache_state="hit", cache_hits=2, cache_misses=0),
        dict(cache_state="mixed", cache_hits=1, cache_misses=1),
    )
    warm = [
        measured(1, eager_ms=1, rank=0, phase="warm", compile_seconds=0.5, **hit),
        measured(8, eager_ms=8, rank=0, phase="warm", compile_seconds=0.5, **partly),
    ]
    compiled = [
        measured(1, eager_ms=1, rank=None, gpu="H200"),
        measured(1, eager_ms=1, rank=None, gpu="A10G", **hit),
        measured(8, eager_ms=8, rank=None, gpu="H200"),
    ]
    report = ray_report(warm, compiled)
    text = rendered(report)
    table = rows(text)
    assert table["1"].split()[3:5] == ["12.50", "mixed"]  # one class compiled it, one loaded it
    assert table["8"].split()[3:5] == ["12.50", "miss"]
    assert "compile wave partial (2 hits, 4 misses); ranks' cache partial (3 hits, 1 misses)" in prose(text)
    assert report["summary"]["cache_state"] == "partial"
    buckets = report["summary"]["fleet"]["buckets"]
    assert (buckets["1"]["cache_state"], buckets["8"]["cache_state"]) == ("hit", "mixed")


def test_ray_one_row_per_bucket_from_the_warm_wave():
    eager = {0: 1.0, 1: 1.1, 2: 0.9, 3: 1.05}
    warm = [
        measured(b, eager_ms=eager[rank] * b, rank=rank, phase="warm", cache_state="hit", compile_seconds=0.5 + rank)
        for b in (8, 1)
        for rank in range(4)
    ]
    warm[0] = failed(8, rank=0, phase="warm", node="unknown", stage="pending", error="not loaded: compile: [x] boom")
    warm[1] = replace(warm[1], served_speedup=1.5, served_speedup_interval=[1.4, 1.6])  # far off the others
    compiled = [measured(b, eager_ms=b, rank=None) for b in (1, 8)]
    report = ray_report(warm, compiled)
    text = rendered(report)
    assert "…" not in text and "None" not in text and "unknown" not in text
    table = rows(text)
    assert list(table) == ["1", "8"]
    # the compile wave's first call and its cache outcome, then the ranks' median load
    assert table["1"].split()[:6] == ["1", "4/4", "ok", "12.50", "miss", "2.00"]  # median of 0.5, 1.5, 2.5, 3.5
    assert table["8"].split()[:3] == ["8", "3/4", "ok*"]  # one failed, one deviates
    assert table["8"].split()[3:6] == ["12.50", "miss", "2.50"]  # the three ok ranks' median
    # a cold run reads cold: the compile wave compiled, the ranks loaded what it published
    assert "compile wave cold (0 hits, 4 misses); ranks' cache " in prose(text)
    assert "every rank ready in" in prose(text) and "(compile or load, and CUDA graphs, of every bucket)" in prose(text)
    assert "bucket 8 rank 0 failed: not loaded: compile: [x] boom" in prose(text)
    assert "* bucket 8 rank 1 deviates: speedup 1.50x vs median 4.10x" in prose(text)
    assert "2 buckets: 1 ok, 1 failed" in prose(text)  # buckets, not records (3 would be rows)
    assert (report["summary"]["buckets_ok"], report["summary"]["buckets_failed"]) == (1, 1)
    fleet = report["summary"]["fleet"]["buckets"]["8"]
    assert fleet["served_variants"] == ["eager-graphed"] and fleet["cache_state"] == "hit"
    assert (fleet["ranks_ok"], fleet["ranks_failed"], fleet["ranks_noisy"], fleet["noisy"]) == (3, 1, 0, False)
    assert fleet["served_speedup"]["median"] == pytest.approx(4.1)
    assert fleet["served_speedup_interval"] == pytest.approx([4.1 * 0.95, 4.1 * 1.05])
    wide = rendered(report, wide=True, width=250)
    assert "…" not in wide and "None" not in wide
    # every record has its row in --wide: two compile tasks and eight ranks, the failed one's node unknown
    records = [line for line in wide.splitlines() if line.split()[:1] in (["compile"], ["warm"])]
    assert len([line for line in records if not line.startswith("compile wave ")]) == 10  # the summary is no row
    assert "unknown" not in wide


def test_ray_noisy_when_half_the_ranks_are():
    warm = [measured(1, eager_ms=1.0, rank=rank, phase="warm", noisy=rank < 2) for rank in range(4)]
    report = ray_report(warm, [measured(1, eager_ms=1.0, rank=None)])
    fleet = report["summary"]["fleet"]["buckets"]["1"]
    assert (fleet["ranks_noisy"], fleet["noisy"]) == (2, True)
    assert "noisy" in rows(rendered(report))["1"]
    warm = [measured(1, eager_ms=1.0, rank=rank, phase="warm", noisy=rank < 1) for rank in range(4)]
    text = rendered(ray_report(warm, [measured(1, eager_ms=1.0, rank=None)]))
    assert "noisy" not in text  # one rank of four: the median stands, and no note explains a mark not shown
    assert "noisy" in rendered(ray_report(warm, [measured(1, eager_ms=1.0, rank=None)]), wide=True, width=250)


# --- the store -------------------------------------------------------------------------------


URL = "s3://bucket/prefix"


def facts(text: str, *sentences: str) -> bool:
    """Each sentence is in the text, beginning a line of its own (the console may wrap its end)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return all(
        sentence in prose(text) and any(line.startswith(sentence) or sentence.startswith(line) for line in lines)
        for sentence in sentences
    )


def test_ray_store_lines_say_what_the_fleet_pulled_and_published():
    cold = rendered(build_fleet_report(spec(), store_fleet(warm=False), URL, STARTED))
    assert facts(
        cold,
        f"store {URL}: pulled 600 files (0.6 MB, 0.50 s) over 2 ranks",
        "published 4 generations, 303 files (0.3 MB, 3.20 s): one per compiled bucket and one of serving plans",
    )
    assert "[" not in cold and "nothing new" not in cold  # generations counted, not listed as a Python list
    # a warm rerun: the compile tasks pulled too, and each publish found the store holding it all
    warm = rendered(build_fleet_report(spec(), store_fleet(warm=True), URL, STARTED))
    assert facts(
        warm,
        f"store {URL}: pulled 300 files (0.3 MB, 2.00 s) over 3 compile tasks and 2 ranks",
        "nothing new to publish (generation 4 stands)",
    )
    assert "published" not in warm


def test_ray_store_lines_name_each_publish_error_and_every_namespace():
    fleet = store_fleet(warm=False)
    # the second GPU class's rank: a namespace of its own, whose publish the store refused
    other = replace(fleet.runs[-1].process, namespace="mlp-other", publish=None, publish_error="AccessDenied [x]")
    fleet.runs[-1] = replace(fleet.runs[-1], process=other)
    text = rendered(build_fleet_report(spec(), fleet, URL, STARTED))
    assert facts(
        text,
        "published generations 1, 2, 3, 4 of 2 namespaces, 303 files (0.3 MB, 3.20 s)",
        "publish error: AccessDenied [x]",
    )
    # a fleet report from before the fleet's transfers were summed still says what it published
    report = build_fleet_report(spec(), store_fleet(warm=False), URL, STARTED)
    del report["remote"]["pull"], report["remote"]["publish"]
    assert facts(rendered(report), f"store {URL}: published generations 1, 2, 3, 4")


def test_no_ray_store_lines_use_the_same_words():
    pulled = Transfer(generation=2, files=5, bytes=12_345_678, shards=1, seconds=0.8)
    published = Transfer(generation=3, files=3, bytes=2_500_000, shards=1, seconds=0.25)
    cold = rendered(build_report(spec(), replace(process_run(remote=True), pull=None, publish=published), STARTED))
    assert facts(cold, f"store {URL}: pulled nothing", "published generation 3, 3 files (2.5 MB, 0.25 s)")
    warm = rendered(
        build_report(spec(), replace(process_run(remote=True), pull=pulled, publish=Transfer(generation=2)), STARTED)
    )
    assert facts(
        warm,
        f"store {URL}: pulled generation 2, 5 files (12.3 MB, 0.80 s)",
        "nothing new to publish (generation 2 stands)",
    )
    refused = replace(process_run(remote=True), pull=pulled, publish=None, publish_error="AccessDenied")
    text = rendered(build_report(spec(), refused, STARTED))
    assert facts(text, "publish error: AccessDenied") and "published" not in text


def test_each_built_variants_build_seconds_are_summed_and_a_twin_left_out_is_no_warning():
    def bucket(n: int) -> BucketResult:
        record = measured(n, eager_ms=2.0, served="aot")
        record.variants["aot"] = replace(record.variants["aot"], build_seconds=4.25)
        record.variants["eager-graphed"] = replace(record.variants["eager-graphed"], build_seconds=0.5)
        record.variants["graphed"] = VariantMeasure(ok=False, reason="not built: aot is the same compiled code")
        return record

    console = Console(width=80, record=True, file=io.StringIO(), force_terminal=True)
    render_table(process_report([bucket(1), bucket(8)]), console)
    text = prose(console.export_text())
    assert "serving variants built in (all buckets): eager-graphed 1.0 s, aot 8.5 s" in text
    assert "not built" not in text  # a choice that needs nothing of the reader: --wide and the report
    render_table(process_report([bucket(1), bucket(8)]), console, wide=True)
    text = prose(console.export_text(clear=False))
    assert "variant graphed not served for bucket 1, 8: not built: aot is the same compiled code" in text
    styled = console.export_text(styles=True)
    twin_line = next(line for line in styled.splitlines() if "not built" in line)
    assert "\x1b[33m" not in twin_line  # yellow is for what went wrong


def test_the_wide_fleet_lines_call_a_compile_wave_that_hit_the_cache_a_load():
    for state, word in (("miss", "compile"), ("hit", "cache load")):
        fleet = store_fleet(warm=False)
        fleet.results = [replace(r, cache_state=state) if r.phase == "compile" else r for r in fleet.results]
        text = prose(rendered(build_fleet_report(spec(), fleet, URL, STARTED), wide=True, width=200))
        assert f"bucket 8: compile wave 2.00 s ({word}); warm load across 2 ranks" in text, text
        assert "cold compile" not in text


def in_a_terminal(args: list[str], columns: int = 80) -> list[str]:
    """`orchestrate ARGS` in a real pseudo-terminal of `columns` columns: its lines as the window
    shows them before folding (escape sequences removed)."""
    import fcntl
    import os
    import pty
    import re
    import select
    import struct
    import sys
    import termios

    from conftest import ROOT

    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's size is read from the pty, not from COLUMNS
        os.environ.pop("COLUMNS", None)
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "orchestrator", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    out = b""
    while select.select([fd], [], [], 120)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode()).replace("\r", "").splitlines()


def test_in_an_80_column_terminal_the_table_fits_and_wide_keeps_each_record_on_one_line(tmp_path):
    import json

    report = process_report([measured(1, eager_ms=2.0, noisy=True), measured(8, eager_ms=3.0)])
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    lines = in_a_terminal(["report", str(saved)])
    assert lines and all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert any(line.startswith("noisy:") for line in lines)  # the footer folds inside the window
    wide = in_a_terminal(["report", str(saved), "--wide"])
    # every header and value whole on one line: the window folds lines, never a value over several
    header = next(line for line in wide if line.startswith("phase"))
    assert all(name in header for name in ("compile s", "cache hit/miss", "compiled ms", "served speedup", "max |err|"))
    records = [line.split() for line in wide if line.startswith("compile ")]
    assert [row[:3] for row in records] == [["compile", "1", "ok"], ["compile", "8", "ok"]]
    assert all({"0/2", "eager-graphed", "12.50"} <= set(row) for row in records), records
