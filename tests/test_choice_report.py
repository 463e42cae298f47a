"""The reports' line on why a bucket does not serve its fastest variant (BucketResult.choice_reason),
in the text table and in the HTML page; reports built from synthetic records."""

from __future__ import annotations

import html

from test_report_table import measured as bucket
from test_report_table import process_report, prose, rendered

from orchestrator.reports.html import render_html


def test_the_reports_say_why_a_bucket_does_not_serve_its_fastest_variant():
    why = "compiled measured 1.04x faster than eager (95% interval 0.97-1.12 on 100 paired samples, ...): eager serves"
    report = process_report([bucket(1, eager_ms=1.0, served="eager", choice_reason=why), bucket(2, eager_ms=1.0)])
    text = prose(rendered(report))
    assert f"bucket 1: {why}" in text and "bucket 2:" not in text
    assert html.escape(why) in render_html(report)  # beside the served variant, in its reason column
