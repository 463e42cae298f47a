"""Metrics proven against a real Prometheus and Pushgateway (Debian's packages) on loopback:
a real warmup pushes, Prometheus scrapes, and every dashboard panel's query returns data."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, orchestrate

from orchestrator.jobs.records import BucketResult

pytestmark = pytest.mark.slow
DASHBOARD = ROOT / "k8s" / "monitoring" / "grafana-dashboard.json"
MODEL = "tiny-metrics"


def free_ports(count: int) -> list[int]:
    """Distinct free ports: every socket stays bound until all are chosen, so the kernel cannot
    hand the same port out twice (one released at once can come straight back)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


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
            pytest.fail(f"{binary} is not installed; scripts/install.sh installs Debian's package")
    work = tmp_path_factory.mktemp("monitoring")
    gateway_port, prometheus_port = free_ports(2)
    (work / "prometheus.yml").write_text(
        textwrap.dedent(f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: pushgateway
            honor_labels: true
            static_configs: [{{targets: ["127.0.0.1:{gateway_port}"]}}]
    """)
    )
    gateway = subprocess.Popen(
        ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{gateway_port}"],
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
    urls = {"gateway": f"http://127.0.0.1:{gateway_port}", "prometheus": f"http://127.0.0.1:{prometheus_port}"}
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
        buckets: [1, 2]
        device: cpu
        bench: {{iterations: 5, warmup: 1}}
    """)
    )
    return path


def gateway_value(gateway: str, metric: str) -> float | None:
    for line in get(gateway + "/metrics").splitlines():
        if line.startswith(metric + "{") and f'model="{MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def pushed(monitoring, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    proc = orchestrate(
        "warmup",
        "--no-ray",
        "--model",
        str(write_config(tmp, "tiny")),
        "--json",
        "--pushgateway",
        monitoring["gateway"],
        cache_dir=tmp / "cache",
    )
    assert proc.returncode == 0, proc.stderr
    wait_until(
        lambda: query(monitoring["prometheus"], f'orchestrate_last_success_timestamp_seconds{{model="{MODEL}"}}'),
        "Prometheus to scrape the pushed metrics",
    )
    return {"report": json.loads(proc.stdout), "tmp": tmp}


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_dashboard_panel_returns_data(monitoring, pushed):
    for title, expr in panel_queries():
        concrete = expr.replace("$model", MODEL).replace("$bucket", ".*").replace("$gpu", ".*")
        assert query(monitoring["prometheus"], concrete), f"panel {title!r}: no data for {concrete}"


def test_pushed_values_match_the_report(monitoring, pushed):
    report = pushed["report"]
    speedups = query(monitoring["prometheus"], f'orchestrate_speedup_ratio{{model="{MODEL}"}}')
    by_bucket = {s["metric"]["bucket"]: float(s["value"][1]) for s in speedups}
    assert by_bucket == pytest.approx({str(r["bucket"]): r["speedup"] for r in report["results"]})
    series = speedups[0]["metric"]
    assert series["job"] == "orchestrate_warmup" and "rank" not in series and series.get("instance", "") == ""
    cold = query(monitoring["prometheus"], f'orchestrate_compile_seconds{{model="{MODEL}",cache="cold"}}')
    assert len(cold) == 2
    misses = query(monitoring["prometheus"], f'sum(orchestrate_cache_misses_total{{model="{MODEL}"}})')
    assert float(misses[0]["value"][1]) == report["summary"]["cache_misses"]


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


def test_dashboard_queries_only_exported_metrics(pushed):
    from orchestrator.metrics import WarmupMetrics, exported_names

    metrics = WarmupMetrics(MODEL, "reduce-overhead")
    for record in pushed["report"]["results"]:
        metrics.observe(BucketResult(**record))
    metrics.finish(pushed["report"])
    exported = exported_names(metrics.registry)
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
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in dashboard["panels"])


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
