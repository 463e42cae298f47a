"""Metrics proven against a real Prometheus and Pushgateway (Debian's packages) on loopback:
a real warmup on a local Ray instance pushes and publishes to a signed store, a real replica
(the serving runtime in a subprocess) pulls it and serves its registry over HTTP, Prometheus
scrapes both, and every dashboard panel's query returns data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, free_ports, orchestrate
from test_report_records import STARTED, process_run, spec, store_fleet

from orchestrator.cache.sync import Transfer
from orchestrator.jobs.records import BucketResult
from orchestrator.reports.metrics import UNKNOWN_GPU, WarmupMetrics, exported_names
from orchestrator.reports.report import build_fleet_report, build_report

pytestmark = pytest.mark.slow
DASHBOARD = ROOT / "k8s" / "monitoring" / "grafana-dashboard.json"
MODEL = "tiny-metrics"
SIGNING_KEY = {"ORCHESTRATE_CACHE_SIGNING_KEY": "6b" * 32}  # an Ed25519 private key (seed, hex)


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_until(probe, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory):
    for binary in ("prometheus", "prometheus-pushgateway"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is not installed; scripts/install.sh --tests installs Debian's package")
    work = tmp_path_factory.mktemp("monitoring")
    gateway_port, prometheus_port, replica_port = free_ports(3)
    (work / "prometheus.yml").write_text(
        textwrap.dedent(f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: pushgateway
            honor_labels: true
            static_configs: [{{targets: ["127.0.0.1:{gateway_port}"]}}]
          - job_name: replica
            static_configs: [{{targets: ["127.0.0.1:{replica_port}"]}}]
    """)
    )
    gateway = subprocess.Popen(
        # in memory: Debian's default persistence file would carry groups over from other runs
        ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{gateway_port}", "--persistence.file="],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    urls = {
        "gateway": f"http://127.0.0.1:{gateway_port}",
        "prometheus": f"http://127.0.0.1:{prometheus_port}",
        "replica_port": str(replica_port),
    }
    try:
        wait_until(lambda: get(urls["gateway"] + "/-/ready"), "the Pushgateway")
        wait_until(lambda: get(urls["prometheus"] + "/-/ready"), "Prometheus")
        yield urls
    finally:
        for proc in (gateway, prometheus):
            proc.terminate()
            proc.wait(timeout=30)


def query(prometheus: str, expr: str) -> list:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(get(url))
    assert body["status"] == "success", body
    return body["data"]["result"]


def write_config(tmp_path: Path, factory: str) -> Path:
    (tmp_path / "models.py").write_text(
        textwrap.dedent("""
        from torch import nn

        def tiny():
            return nn.Sequential(nn.Linear(16, 16), nn.GELU())

        class Fails(nn.Module):
            def forward(self, x):
                raise RuntimeError("always fails")

        def fails():
            return Fails()
    """)
    )
    path = tmp_path / f"{factory}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        name: {MODEL}
        model: {{factory: models.py:{factory}}}
        inputs: [{{shape: [batch, 16]}}]
        buckets: [1, 4]
        device: cpu
        bench: {{iterations: 5, warmup: 1}}
    """)
    )
    return path


def gateway_value(gateway: str, metric: str, model: str = MODEL, gpu: str = "cpu") -> float | None:
    for line in get(gateway + "/metrics").splitlines():
        if line.startswith(metric + "{") and f'model="{model}"' in line and f'gpu="{gpu}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def gateway_groups(gateway: str, model: str) -> set[str]:
    """The gpu of every group of `model` on the gateway (its push_time_seconds, one per group)."""
    found = set()
    for line in get(gateway + "/metrics").splitlines():
        if line.startswith("push_time_seconds{") and f'model="{model}"' in line:
            match = re.search(r'gpu="([^"]*)"', line)
            found.add(match.group(1) if match else "")
    return found


@pytest.fixture(scope="module")
def pushed(monitoring, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    (tmp / "store").mkdir()
    # the default path: a fleet on a local Ray instance, its compile units and rank each pulling and
    # publishing, as a production warmup does
    proc = orchestrate(
        "warmup",
        "--model",
        str(write_config(tmp, "tiny")),
        "--json",
        "--pushgateway",
        monitoring["gateway"],
        "--remote",
        f"file://{tmp / 'store'}",  # published, so that the replica below pulls
        cache_dir=tmp / "cache",
        env={**SIGNING_KEY, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    wait_until(
        lambda: query(monitoring["prometheus"], f'orchestrate_last_success_timestamp_seconds{{model="{MODEL}"}}'),
        "Prometheus to scrape the pushed metrics",
    )
    return {"report": json.loads(proc.stdout), "tmp": tmp}


# The replica: the serving runtime loads what the warmup published (pulling it into an empty cache
# directory) and serves its registry, as `orchestrate serve --metrics-port` does in its replica.
REPLICA = """
import json, sys, torch
from prometheus_client import start_http_server
from orchestrator import runtime

config, cache, store, port = sys.argv[1:]
model = runtime.load(config, cache_dir=cache, remote=store, ready="planned")
for rows in (1, 3, 3):  # bucket 1 exactly, then bucket 4 twice with one row of padding each
    model(torch.randn(rows, 16))
start_http_server(int(port), addr="127.0.0.1", registry=runtime.metrics_registry(model))
print(json.dumps(model.info().to_dict(), default=str), flush=True)
sys.stdin.read()  # serves until the test closes stdin
"""


@pytest.fixture(scope="module")
def replica(monitoring, pushed):
    tmp = pushed["tmp"]
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLICA, str(tmp / "tiny.yaml"), str(tmp / "replica-cache")]
        + [f"file://{tmp / 'store'}", monitoring["replica_port"]],
        cwd=ROOT,
        env={**os.environ, **SIGNING_KEY},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        wait_until(
            lambda: query(monitoring["prometheus"], f'orchestrate_replica_ready_seconds{{model="{MODEL}"}}'),
            "Prometheus to scrape the replica",
        )
        yield {"info": json.loads(line), "page": get(f"http://127.0.0.1:{monitoring['replica_port']}/metrics")}
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def values_by(prometheus: str, expr: str, label: str) -> dict[str, float]:
    return {s["metric"][label]: float(s["value"][1]) for s in query(prometheus, expr)}


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def test_every_dashboard_panel_returns_data(monitoring, pushed, replica):
    for title, expr in panel_queries():
        concrete = expr.replace("$model", MODEL).replace("$bucket", ".*").replace("$gpu", ".*")
        # rate() needs two scrapes of the replica: wait for them rather than assume a time
        wait_until(lambda: query(monitoring["prometheus"], concrete), f"panel {title!r} to have data: {concrete}")


def test_plan_reads_the_replicas_request_sizes_from_prometheus(monitoring, pushed, replica):
    """The replica took requests of 1, 3 and 3 rows: its histogram, scraped by Prometheus, is the
    traffic `orchestrate plan --traffic URL` plans from."""
    sizes = f'sum by (le) (orchestrate_replica_request_size_bucket{{model="{MODEL}", dim="batch"}})'
    wait_until(lambda: query(monitoring["prometheus"], sizes), "Prometheus to scrape the request sizes")
    cumulative = {float(s["metric"]["le"]): float(s["value"][1]) for s in query(monitoring["prometheus"], sizes)}
    assert [cumulative[edge] for edge in (1, 2, 3, float("inf"))] == [1, 1, 3, 3]
    config = str(pushed["tmp"] / "tiny.yaml")
    done = orchestrate(
        "plan",
        "--model",
        config,
        "--traffic",
        monitoring["prometheus"],
        "--window",
        "10m",
        "--max-points",
        "2",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["buckets"] == [1, 3]


def test_pushed_values_match_the_report(monitoring, pushed):
    report = pushed["report"]
    speedups = query(monitoring["prometheus"], f'orchestrate_speedup_ratio{{model="{MODEL}"}}')
    by_bucket = {s["metric"]["bucket"]: float(s["value"][1]) for s in speedups}
    assert by_bucket == pytest.approx({str(r["bucket"]): r["speedup"] for r in report["results"]})
    series = speedups[0]["metric"]
    assert series["job"] == "orchestrate_warmup" and "rank" not in series and series.get("instance", "") == ""
    cold = query(monitoring["prometheus"], f'orchestrate_compile_seconds{{model="{MODEL}",cache="cold"}}')
    assert len(cold) == 2
    # every record's first calls: the compile units' misses and the rank's hits
    misses = query(monitoring["prometheus"], f'sum(orchestrate_cache_misses{{model="{MODEL}",gpu="cpu"}})')
    assert float(misses[0]["value"][1]) == sum(r["cache_misses"] or 0 for r in report["results"]) > 0
    for direction in ("pull", "publish"):
        moved = query(
            monitoring["prometheus"], f'orchestrate_cache_transfer_bytes{{model="{MODEL}",direction="{direction}"}}'
        )
        assert float(moved[0]["value"][1]) == report["remote"][direction]["bytes"], direction
    assert report["remote"]["publish"]["bytes"] > 0


def test_build_info_names_the_versions_of_the_run(monitoring, pushed):
    platform = pushed["report"]["platform"]
    [series] = query(monitoring["prometheus"], f'orchestrate_build_info{{model="{MODEL}",job="orchestrate_warmup"}}')
    labels = series["metric"]
    assert float(series["value"][1]) == 1
    assert labels["torch"] == platform["torch_version"] and labels["python"] == platform["python_version"]
    assert labels["gpu"] == "cpu" and labels["cuda"] == (platform["cuda_version"] or "none")
    assert labels["version"] and labels["triton"]


def test_a_failed_run_never_moves_last_success(monitoring, pushed):
    before = gateway_value(monitoring["gateway"], "orchestrate_last_success_timestamp_seconds")
    assert before is not None
    time.sleep(1.1)
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(write_config(pushed["tmp"], "fails")),
        "--pushgateway",
        monitoring["gateway"],
        cache_dir=pushed["tmp"] / "cache",
    )
    assert proc.returncode == 1, proc.stderr
    assert gateway_value(monitoring["gateway"], "orchestrate_last_success_timestamp_seconds") == before
    assert gateway_value(monitoring["gateway"], "orchestrate_last_run_success") == 0
    assert gateway_value(monitoring["gateway"], "orchestrate_bucket_failures") == 2
    wait_until(
        lambda: query(monitoring["prometheus"], f'orchestrate_bucket_failures{{model="{MODEL}"}} == 2'),
        "Prometheus to see the failure",
    )


def test_dashboard_queries_only_exported_metrics(pushed, replica):
    from prometheus_client.parser import text_string_to_metric_families

    metrics = WarmupMetrics(MODEL, "reduce-overhead")
    for record in pushed["report"]["results"]:
        metrics.observe(BucketResult(**record))
    metrics.finish(pushed["report"])
    exported = exported_names(*metrics.registries())
    for family in text_string_to_metric_families(replica["page"]):
        exported |= {family.name, *(sample.name for sample in family.samples)}
    queried = {name for _, expr in panel_queries() for name in re.findall(r"\borchestrate_[a-z_]+", expr)}
    assert queried and queried <= exported, queried - exported


def test_dashboard_is_generated_and_portable():
    generated = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, runpy; m = runpy.run_path("
            f"'{ROOT / 'k8s/monitoring/dashboard.py'}'); print(json.dumps(m['dashboard'](), indent=2))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dashboard = json.loads(DASHBOARD.read_text())
    assert json.loads(generated) == dashboard  # regenerate with: python k8s/monitoring/dashboard.py
    assert dashboard["uid"] == "orchestrate-warmup" and "__inputs" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert all("label_values" in variables[name]["definition"] for name in ("model", "bucket", "gpu"))
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in panels)
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Warmup", "Cache", "Serving replicas"]
    assert all(panel["description"] for panel in panels)
    by_title = {panel["title"]: panel["fieldConfig"]["defaults"] for panel in panels}

    def first_red(title: str) -> float | None:
        colors = by_title[title]["thresholds"]["steps"]
        return next((step["value"] for step in colors if step["color"] == "red"), None)

    assert by_title["Since the last successful warmup"]["unit"] == "s"
    assert first_red("Since the last successful warmup") == 24 * 3600
    assert first_red("Failed buckets in the last run") == 1 and first_red("Cold buckets per replica") == 1
    assert by_title["Cache size"]["unit"] == "bytes" and first_red("Cache size") is None
    speedup = by_title["Speedup over eager per bucket"]
    assert speedup["unit"].startswith("suffix:") and [s["color"] for s in speedup["thresholds"]["steps"]] == [
        "red",
        "green",
    ]
    assert speedup["thresholds"]["steps"][1]["value"] == 1


def test_a_missing_pushgateway_is_only_a_warning(tmp_path):
    [port] = free_ports(1)
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(write_config(tmp_path, "tiny")),
        "--pushgateway",
        f"http://127.0.0.1:{port}",
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: warning:")]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0]


def test_metrics_port_serves_while_running(tmp_path):
    [port] = free_ports(1)
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "warmup",
        "--no-ray",
        "--model",
        str(write_config(tmp_path, "tiny")),
        "--metrics-port",
        str(port),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        sample = f'orchestrate_buckets_done{{model="{MODEL}"}} 1.0'
        page = wait_until(
            lambda: (lambda text: text if sample in text else None)(get(f"http://127.0.0.1:{port}/metrics")),
            "/metrics to count a finished bucket mid-run",
            seconds=120,
        )
        assert "orchestrate_compile_duration_seconds_bucket" in page
    finally:
        assert run.wait(timeout=300) == 0, run.stderr.read()


def as_gpu_class(report: dict, gpu: str, fail_bucket: int | None = None) -> dict:
    """The real report as if its ranks had run on GPU class `gpu` (CI has no GPU, let alone two
    classes); `fail_bucket`: that bucket's records failed."""
    copy = json.loads(json.dumps(report))
    for record in copy["results"]:
        record["gpu"] = gpu
        if record["bucket"] == fail_bucket:
            record["status"] = "failed"
    return copy


def test_two_gpu_classes_of_one_model_keep_their_own_values(monitoring, pushed):
    model = "tiny-metrics-classes"
    for gpu, fail_bucket in (("Test GPU A", None), ("Test GPU B", 4)):
        metrics = WarmupMetrics(model, None)
        metrics.finish(as_gpu_class(pushed["report"], gpu, fail_bucket))
        assert metrics.push(monitoring["gateway"]) is None
    assert gateway_groups(monitoring["gateway"], model) == {"Test GPU A", "Test GPU B"}
    failed_records = sum(1 for r in pushed["report"]["results"] if r["bucket"] == 4)  # a compile unit's and a rank's
    prometheus = monitoring["prometheus"]
    success = wait_until(
        lambda: (lambda v: v if len(v) == 2 else None)(
            values_by(prometheus, f'orchestrate_last_run_success{{model="{model}"}}', "gpu")
        ),
        "both classes in Prometheus",
    )
    assert success == {"Test GPU A": 1, "Test GPU B": 0}
    assert values_by(prometheus, f'orchestrate_bucket_failures{{model="{model}"}}', "gpu") == {
        "Test GPU A": 0,
        "Test GPU B": failed_records,
    }
    # the failed class has no success to show; the other's is its own
    assert set(values_by(prometheus, f'orchestrate_last_success_timestamp_seconds{{model="{model}"}}', "gpu")) == {
        "Test GPU A"
    }
    speedups = query(prometheus, f'orchestrate_speedup_ratio{{model="{model}"}}')
    assert sorted((s["metric"]["gpu"], s["metric"]["bucket"]) for s in speedups) == [
        ("Test GPU A", "1"),
        ("Test GPU A", "4"),
        ("Test GPU B", "1"),  # the failed bucket has no speedup
    ]


def test_a_fleet_report_pushes_its_store_transfers_as_a_process_report_does(monitoring):
    """A Ray report's `remote` sums every task's and rank's pull and publish: the same two gauges
    as a --no-ray report's, which the dashboard's store panels read. Synthetic reports, no Ray."""
    pulled = Transfer(generation=2, files=5, bytes=12_345, shards=1, seconds=0.8)
    reports = {
        "tiny-metrics-process": build_report(spec(), replace(process_run(remote=True), pull=pulled), STARTED),
        "tiny-metrics-fleet": build_fleet_report(spec(), store_fleet(warm=False), "s3://bucket/prefix", STARTED),
    }
    for model, report in reports.items():
        metrics = WarmupMetrics(model, None)
        metrics.finish(report)
        assert metrics.push(monitoring["gateway"]) is None
    prometheus = monitoring["prometheus"]

    def both_directions(model: str, metric: str) -> dict[str, float] | None:
        found = values_by(prometheus, f'{metric}{{model="{model}"}}', "direction")
        return found if len(found) == 2 else None

    for model, report in reports.items():
        assert report["remote"]["pull"]["bytes"] > 0 and report["remote"]["publish"]["bytes"] > 0
        for metric, key in (
            ("orchestrate_cache_transfer_seconds", "seconds"),
            ("orchestrate_cache_transfer_bytes", "bytes"),
        ):
            values = wait_until(lambda: both_directions(model, metric), f"{model}'s {metric} in Prometheus")
            assert values == pytest.approx({d: report["remote"][d][key] for d in ("pull", "publish")})
    for title, expr in panel_queries():
        if title.startswith("Store transfers"):
            concrete = expr.replace("$model", "tiny-metrics-fleet").replace("$gpu", ".*")
            assert {s["metric"]["direction"] for s in query(prometheus, concrete)} == {"pull", "publish"}, title


def test_a_setup_failure_is_unknown_until_a_run_knows_its_class(monitoring, pushed):
    model = "tiny-metrics-setup"
    failed = WarmupMetrics(model, None)
    failed.fail(wall_seconds=2.0)
    assert failed.push(monitoring["gateway"]) is None
    assert gateway_groups(monitoring["gateway"], model) == {UNKNOWN_GPU}
    assert gateway_value(monitoring["gateway"], "orchestrate_last_run_success", model, UNKNOWN_GPU) == 0
    [info] = query(monitoring["prometheus"], f'orchestrate_build_info{{model="{model}"}}') or wait_until(
        lambda: query(monitoring["prometheus"], f'orchestrate_build_info{{model="{model}"}}'), "the unknown group"
    )
    assert info["metric"]["gpu"] == UNKNOWN_GPU and info["metric"]["torch"]
    fixed = WarmupMetrics(model, None)
    fixed.finish(pushed["report"])
    assert fixed.push(monitoring["gateway"]) is None
    assert gateway_groups(monitoring["gateway"], model) == {"cpu"}
    wait_until(
        lambda: not query(monitoring["prometheus"], f'orchestrate_last_run_success{{model="{model}",gpu="unknown"}}'),
        "the unknown group's series to go stale in Prometheus",
    )


def test_the_replica_reports_how_it_started_and_what_it_served(monitoring, replica):
    info, prometheus = replica["info"], monitoring["prometheus"]
    variants = query(prometheus, f'orchestrate_replica_variant{{model="{MODEL}"}} == 1')
    assert {s["metric"]["bucket"]: s["metric"]["variant"] for s in variants} == {
        bucket: row["variant"] for bucket, row in info["buckets"].items()
    }
    ready = query(prometheus, f'orchestrate_replica_ready_seconds{{model="{MODEL}"}}')
    assert float(ready[0]["value"][1]) == pytest.approx(info["ready_seconds"])
    answering = query(prometheus, f'orchestrate_replica_answering_seconds{{model="{MODEL}"}}')
    assert float(answering[0]["value"][1]) == pytest.approx(info["answering_seconds"])
    settled = query(prometheus, f'orchestrate_replica_on_plan_seconds{{model="{MODEL}"}}')
    assert float(settled[0]["value"][1]) == pytest.approx(info["on_plan_seconds"])
    assert info["on_plan_seconds"] >= info["answering_seconds"]
    assert values_by(prometheus, f'orchestrate_replica_bucket_on_plan{{model="{MODEL}"}}', "bucket") == {
        bucket: 1 if row["on_plan"] else 0 for bucket, row in info["buckets"].items()
    }
    assert values_by(prometheus, f'orchestrate_replica_bucket_on_plan_seconds{{model="{MODEL}"}}', "bucket") == {
        bucket: pytest.approx(row["on_plan_seconds"]) for bucket, row in info["buckets"].items()
    }
    assert values_by(prometheus, f'orchestrate_replica_cache_misses{{model="{MODEL}"}}', "bucket") == {
        bucket: row["cache_misses"] for bucket, row in info["buckets"].items()
    }
    cold = sum(1 for row in info["buckets"].values() if row["cache_misses"])
    assert float(query(prometheus, f'orchestrate_replica_cold_buckets{{model="{MODEL}"}}')[0]["value"][1]) == cold
    assert float(query(prometheus, f'orchestrate_replica_pull_hit{{model="{MODEL}"}}')[0]["value"][1]) == 1
    pulled = query(prometheus, f'orchestrate_replica_pull_bytes{{model="{MODEL}"}}')
    assert float(pulled[0]["value"][1]) == info["pull"]["bytes"] > 0
    # one call of 1 row on bucket 1; two calls of 3 rows on bucket 4, one row of padding each
    assert values_by(prometheus, f'orchestrate_replica_calls_total{{model="{MODEL}"}}', "bucket") == {"1": 1, "4": 2}
    assert values_by(prometheus, f'orchestrate_replica_rows_total{{model="{MODEL}"}}', "bucket") == {"1": 1, "4": 6}
    assert values_by(prometheus, f'orchestrate_replica_padded_rows_total{{model="{MODEL}"}}', "bucket") == {
        "1": 0,
        "4": 2,
    }
    [build] = query(prometheus, f'orchestrate_build_info{{model="{MODEL}",job="replica"}}')
    assert build["metric"]["gpu"] == "cpu" and build["metric"]["torch"] == info["platform"]["torch_version"]
