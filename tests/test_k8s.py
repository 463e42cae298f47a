"""Every rendered and shipped manifest validates offline: RayJob against KubeRay's CRD and the
monitoring resources against prometheus-operator's, unknown fields rejected; core kinds with
kubernetes-validate --strict; `kubectl kustomize k8s/` builds; the shipped alerts pass
`promtool check rules` and fire (and stay quiet) on the series their unit tests feed them."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import ROOT, orchestrate

SCHEMAS = ROOT / "tests" / "schemas" / "kuberay"  # vendored: see its README.md
OPERATOR_SCHEMAS = ROOT / "tests" / "schemas" / "prometheus-operator"  # vendored: see its README.md
OPERATOR_KINDS = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml.gz",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml.gz",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml.gz",
}
K8S_VERSION = "1.32"


def crd_schema(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def k8s_like(s, strict=True):
    """What the API server accepts: required-with-default becomes optional, unknown fields rejected."""
    s = dict(s)
    if "properties" in s:
        s["properties"] = {k: k8s_like(v, strict) for k, v in s["properties"].items()}
        required = [r for r in s.get("required", []) if "default" not in s["properties"].get(r, {})]
        s.pop("required", None)
        if required:
            s["required"] = required
        if strict and not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            s[key] = k8s_like(s[key], strict)
    for key in ("anyOf", "allOf", "oneOf"):
        if key in s:
            s[key] = [k8s_like(x, strict) for x in s[key]]
    return s


@pytest.fixture(scope="module")
def rayjob_validator():
    return jsonschema.Draft4Validator(k8s_like(crd_schema(SCHEMAS / "ray.io_rayjobs.yaml.gz")))


def validate(document, rayjob_validator):
    if document["kind"] in OPERATOR_KINDS:
        assert document["apiVersion"] == "monitoring.coreos.com/v1"
        validator = jsonschema.Draft4Validator(
            k8s_like(crd_schema(OPERATOR_SCHEMAS / OPERATOR_KINDS[document["kind"]]))
        )
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    elif document["kind"] == "RayJob":
        assert document["apiVersion"] == "ray.io/v1"
        errors = sorted(rayjob_validator.iter_errors(document), key=lambda e: list(e.path))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    else:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def render_mlp(*extra, env=None):
    return orchestrate(
        "render", "k8s", "--model", "examples/mlp.yaml", "--image", "example.com/orchestrate:1", *extra, env=env
    )


def rendered(*extra):
    proc = render_mlp(*extra)
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def test_rendered_rayjob_and_configmap_validate(rayjob_validator):
    documents = rendered(
        "--remote",
        "s3://bucket/cache",
        "--pushgateway",
        "http://pg:9091",
        "--workers",
        "2",
        "--gpus-per-worker",
        "4",
        "--namespace",
        "ml",
    )
    assert [d["kind"] for d in documents] == ["ConfigMap", "RayJob", "ConfigMap", "Deployment", "Service"]
    for document in documents:
        validate(document, rayjob_validator)
        assert document["metadata"]["namespace"] == "ml"
    config_map, job = documents[:2]
    # the config and the factory file next to it travel together
    assert set(config_map["data"]) == {"mlp.yaml", "models.py"}
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    assert "--remote s3://bucket/cache" in spec["entrypoint"] and "--pushgateway http://pg:9091" in spec["entrypoint"]
    [workers] = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert workers["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"name": "compile-cache", "mountPath": "/nvme/orchestrate"} in container["volumeMounts"]
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"orchestrate-signing-key", "orchestrate-store"}  # credentials only by reference


@pytest.mark.parametrize("command", [("render", "k8s"), ("submit", "--k8s")])
def test_the_job_runs_the_buckets_of_the_command_line(command):
    proc = orchestrate(
        *command, "--model", "examples/mlp.yaml", "--image", "example.com/orchestrate:1", "--buckets", "8,2"
    )
    assert proc.returncode == 0, proc.stderr
    job = list(yaml.safe_load_all(proc.stdout))[1]
    assert " --buckets 2,8 " in job["spec"]["entrypoint"]


def test_a_typo_in_a_rayjob_is_caught(rayjob_validator):
    job = rendered()[1]
    job["spec"]["entrypiont"] = job["spec"].pop("entrypoint")
    assert list(rayjob_validator.iter_errors(job))


SHIPPED_RENDER = (
    "--image",
    "ghcr.io/your-org/orchestrate:0.1.0",
    "--remote",
    "s3://your-bucket/compile-cache",
    "--pushgateway",
    "http://prometheus-pushgateway.monitoring.svc:9091",
    "--namespace",
    "ml-serving",
    "--gpu",
    "NVIDIA H200",
)


def shipped(*names):
    return [document for name in names for document in yaml.safe_load_all((ROOT / "k8s" / name).read_text())]


def test_shipped_manifests_are_what_render_writes():
    proc = orchestrate("render", "k8s", "--model", "examples/mlp.yaml", *SHIPPED_RENDER)
    assert proc.returncode == 0, proc.stderr
    # re-render k8s/warmup/ and k8s/serving/ (their kustomization.yaml has the command) after
    # changing examples/mlp.yaml or what render writes
    assert list(yaml.safe_load_all(proc.stdout)) == shipped("warmup/warmup-mlp.yaml", "serving/serving-mlp.yaml")


def kustomized(*path):
    """`kubectl kustomize` of a directory under the repository, which must build: its documents."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(ROOT.joinpath(*path))], capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr
    return list(yaml.safe_load_all(built.stdout))


def test_kustomize_builds_and_everything_validates(rayjob_validator):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with kustomize) is not installed")
    documents = kustomized("k8s")
    assert {d["kind"] for d in documents} == {"ConfigMap", "Deployment", "RayJob", "Service"}  # no CRD but KubeRay's
    operator_documents = kustomized("k8s", "monitoring", "operator")
    assert sorted(d["kind"] for d in operator_documents) == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    assert all(d["metadata"]["namespace"] == "monitoring" for d in operator_documents)
    for document in [*documents, *operator_documents]:
        validate(document, rayjob_validator)
    for document in yaml.safe_load_all((ROOT / "k8s" / "secrets.example.yaml").read_text()):
        validate(document, rayjob_validator)
        assert all("REPLACE" in v or v == "us-east-1" for v in document["stringData"].values())


def _serving_pod(documents):
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    return deployment["spec"]["template"]


def _argument(command, option):
    return command[command.index(option) + 1]


def test_serving_pod_pulls_into_the_cache_its_server_loads_from_on_the_one_image():
    documents = shipped("warmup/warmup-mlp.yaml", "serving/serving-mlp.yaml")
    pod = _serving_pod(documents)["spec"]
    [init], [server] = pod["initContainers"], pod["containers"]
    assert init["command"][:2] == ["orchestrate", "pull"] and server["command"][:2] == ["orchestrate", "serve"]
    for option in ("--model", "--cache-dir", "--device"):
        assert _argument(init["command"], option) == _argument(server["command"], option)
    assert _argument(init["command"], "--remote") == "s3://your-bucket/compile-cache"
    assert "--require-warm" in server["command"]  # a miss fails the pod instead of compiling in it
    root = _argument(init["command"], "--cache-dir")
    assert {"name": "compile-cache", "mountPath": root} in init["volumeMounts"]
    assert {"name": "compile-cache", "mountPath": root} in server["volumeMounts"]
    # one pinned image for every container of warmup and serving
    assert {c["image"] for c in _containers(documents)} == {"ghcr.io/your-org/orchestrate:0.1.0"}


def test_serving_has_its_own_config_and_rolls_when_it_changes(tmp_path):
    for name in ("mlp.yaml", "models.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)

    def render_copy():
        proc = orchestrate("render", "k8s", "--model", str(tmp_path / "mlp.yaml"), *SHIPPED_RENDER)
        assert proc.returncode == 0, proc.stderr
        return list(yaml.safe_load_all(proc.stdout))

    before = render_copy()
    config = (tmp_path / "mlp.yaml").read_text()
    (tmp_path / "mlp.yaml").write_text(config.replace("layers: 24", "layers: 12"))
    after = render_copy()
    warmup_config, serving_config = (before[0], before[2])
    assert serving_config["metadata"]["name"] != warmup_config["metadata"]["name"]
    assert serving_config["data"] == warmup_config["data"]
    pod = _serving_pod(before)
    assert {"name": "model-config", "configMap": {"name": serving_config["metadata"]["name"]}} in pod["spec"]["volumes"]
    # a new config: a new warmup (its name is the config's hash), the same Deployment with new pods
    assert after[1]["metadata"]["name"] != before[1]["metadata"]["name"]
    assert [d["metadata"]["name"] for d in after[2:]] == [d["metadata"]["name"] for d in before[2:]]
    key = "orchestrate/config-sha256"
    assert _serving_pod(after)["metadata"]["annotations"][key] != pod["metadata"]["annotations"][key]


def test_serving_is_ready_when_the_runtime_is_and_has_time_to_load_every_bucket():
    from orchestrator.deployment.k8s import START_SECONDS_PER_BUCKET

    documents = shipped("serving/serving-mlp.yaml")
    [server] = _serving_pod(documents)["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports["http"] == int(_argument(server["command"], "--port"))
    assert ports["metrics"] == int(_argument(server["command"], "--metrics-port"))
    # /info answers only once the replica's constructor returned (every bucket answering, as --ready
    # answering asks by default); the proxy's health is liveness
    assert _argument(server["command"], "--ready") == "answering"
    for probe in ("startupProbe", "readinessProbe"):
        assert server[probe]["httpGet"] == {"path": "/info", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/-/healthz", "port": "http"}
    startup = server["startupProbe"]
    buckets = len(yaml.safe_load((ROOT / "examples" / "mlp.yaml").read_text())["buckets"])
    assert startup["periodSeconds"] * startup["failureThreshold"] >= START_SECONDS_PER_BUCKET * buckets
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    recommended = ("name", "instance", "version", "component", "part-of", "managed-by")
    for document in shipped("warmup/warmup-mlp.yaml", "serving/serving-mlp.yaml"):
        assert all(f"app.kubernetes.io/{key}" in document["metadata"]["labels"] for key in recommended)


def test_the_readiness_probe_follows_ready():
    """`--ready planned` makes the server's load, and so the route its probes ask, wait for every
    bucket on its plan; the probes themselves are the same route."""
    proc = orchestrate("render", "k8s", "--model", "examples/mlp.yaml", *SHIPPED_RENDER, "--ready", "planned")
    assert proc.returncode == 0, proc.stderr
    [server] = _serving_pod(list(yaml.safe_load_all(proc.stdout)))["spec"]["containers"]
    assert _argument(server["command"], "--ready") == "planned"
    assert server["readinessProbe"]["httpGet"] == {"path": "/info", "port": "http"}
    refused = orchestrate("render", "k8s", "--model", "examples/mlp.yaml", *SHIPPED_RENDER, "--ready", "soon")
    assert refused.returncode == 2 and "'soon' is not one of 'answering', 'planned'" in refused.stderr


def test_warmup_workers_and_serving_pods_are_pinned_to_the_warmed_gpu_class():
    documents = rendered("--remote", "s3://b/c", "--gpu", "NVIDIA A100-SXM4-80GB", "--service-account", "warm")
    pods = list(_pod_specs(documents))
    assert len(pods) == 3  # RayJob head and worker, serving
    head, worker, serving = pods
    term = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}
    for pod in (worker, serving):
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [term]}]
    assert "affinity" not in head  # the head runs no GPU work
    assert all(pod["serviceAccountName"] == "warm" for pod in pods)
    assert not any("affinity" in pod for pod in _pod_specs(rendered("--remote", "s3://b/c")))


@pytest.mark.parametrize(
    ("cuda_name", "label"),
    [
        ("NVIDIA H200", "NVIDIA-H200"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA  GeForce RTX 4090 (x)", "NVIDIA-GeForce-RTX-4090-x"),
    ],
)
def test_gpu_names_become_the_labels_gpu_feature_discovery_sets(cuda_name, label):
    from orchestrator.deployment.k8s import gpu_product

    assert gpu_product(cuda_name) == label


@pytest.mark.parametrize("image", ["example.com/orchestrate", "example.com/orchestrate:latest", "orch@sha256:12"])
@pytest.mark.parametrize("command", [("render", "k8s"), ("submit", "--k8s")])
def test_an_image_that_is_not_pinned_is_refused_in_one_line(command, image):
    proc = orchestrate(*command, "--model", "examples/mlp.yaml", "--image", image)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"orchestrate: error: --image {image!r}: pin a version tag or a digest")


def test_without_a_store_render_writes_the_warmup_alone_and_says_why():
    proc = render_mlp()
    assert proc.returncode == 0, proc.stderr
    assert [d["kind"] for d in yaml.safe_load_all(proc.stdout)] == ["ConfigMap", "RayJob"]
    assert "no serving Deployment" in proc.stderr and "--remote" in proc.stderr
    alone = rendered("--remote", "s3://b/c", "--serving-replicas", "0")
    assert [d["kind"] for d in alone] == ["ConfigMap", "RayJob"]


def _containers(document):
    """Every container spec in a manifest, wherever it sits (pod templates, init containers)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key in ("containers", "initContainers"):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(document, list):
        for item in document:
            yield from _containers(item)


def test_no_secret_is_inline_in_any_manifest():
    """A manifest is read by anyone who can read the RayJob or Deployment: a credential comes from
    a Secret by reference, and an inline value is only ever one that job_env would pass to Ray."""
    from orchestrator.fleet.job_env import is_passed

    secrets = {"ORCHESTRATE_CACHE_SIGNING_KEY": "marker-signing-5a1d", "AWS_SECRET_ACCESS_KEY": "marker-aws-77c0"}
    proc = render_mlp(env=secrets)
    assert proc.returncode == 0, proc.stderr
    assert not any(value in proc.stdout for value in secrets.values())
    shipped = [
        document
        for path in [*(ROOT / "k8s" / "warmup").glob("*.yaml"), *(ROOT / "k8s" / "serving").glob("*.yaml")]
        for document in yaml.safe_load_all(path.read_text())
    ]
    containers = list(_containers([*yaml.safe_load_all(proc.stdout), *shipped]))
    assert containers
    for container in containers:
        for entry in container.get("env", []):
            if "value" in entry:  # HOME: where the read-only image lets Ray and torch write
                assert is_passed(entry["name"]) or entry["name"] == "HOME", entry
            else:
                assert set(entry["valueFrom"]) == {"secretKeyRef"}, entry


def test_a_typo_in_a_prometheus_rule_is_caught(rayjob_validator):
    rule = yaml.safe_load((ROOT / "k8s" / "monitoring" / "operator" / "prometheus-rules.yaml").read_text())
    rule["spec"]["groups"][0]["rules"][0]["expresion"] = rule["spec"]["groups"][0]["rules"][0].pop("expr")
    with pytest.raises(AssertionError, match="expresion"):
        validate(rule, rayjob_validator)


# Each alert against series as the Pushgateway serves them (job, model and gpu labels kept), and
# the replicas' as the PodMonitor scrapes them (namespace and pod added).
ALERT_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'orchestrate_last_run_success{job="orchestrate_warmup", model="mlp", gpu="NVIDIA H200"}'
        values: '1 1 0 0 0'
      # the same model on another class stays ok: its group is its own
      - series: 'orchestrate_last_run_success{job="orchestrate_warmup", model="mlp", gpu="NVIDIA L4"}'
        values: '1 1 1 1 1'
      - series: 'orchestrate_last_run_success{job="orchestrate_warmup", model="resnet18", gpu="NVIDIA H200"}'
        values: '1 1 1 1 1'
      # a setup failure before any class was known, deleted by the next run that knows its classes
      - series: 'orchestrate_last_run_success{job="orchestrate_warmup", model="resnet18", gpu="unknown"}'
        values: '_ 0 0 stale'
      - series: 'orchestrate_bucket_failures{job="orchestrate_warmup", model="mlp", gpu="NVIDIA H200"}'
        values: '0 0 2 2 2'
      - series: 'orchestrate_bucket_failures{job="orchestrate_warmup", model="mlp", gpu="NVIDIA L4"}'
        values: '0 0 0 0 0'
      - series: 'orchestrate_speedup_ratio{job="orchestrate_warmup", model="mlp", bucket="32", mode="reduce-overhead", gpu="NVIDIA H200"}'
        values: '1.5 1.5 0.8 0.8 0.8'
      - series: 'orchestrate_speedup_ratio{job="orchestrate_warmup", model="mlp", bucket="1", mode="reduce-overhead", gpu="NVIDIA H200"}'
        values: '3 3 3 3 3'
      - series: 'orchestrate_replica_cold_buckets{namespace="serving", pod="mlp-server-a", model="mlp", gpu="NVIDIA H200"}'
        values: '0 0 2 2 2'
      - series: 'orchestrate_replica_cold_buckets{namespace="serving", pod="mlp-server-b", model="mlp", gpu="NVIDIA H200"}'
        values: '0 0 0 0 0'
    alert_rule_test:
      - {eval_time: 0m, alertname: OrchestrateWarmupFailed, exp_alerts: []}
      - eval_time: 1m
        alertname: OrchestrateWarmupFailed
        exp_alerts:
          - exp_labels: {severity: warning, job: orchestrate_warmup, model: resnet18, gpu: unknown}
            exp_annotations:
              summary: The last warmup of resnet18 on unknown did not finish every bucket
              description: @OrchestrateWarmupFailed@
      - eval_time: 3m
        alertname: OrchestrateWarmupFailed
        exp_alerts:
          - exp_labels: {severity: warning, job: orchestrate_warmup, model: mlp, gpu: NVIDIA H200}
            exp_annotations:
              summary: The last warmup of mlp on NVIDIA H200 did not finish every bucket
              description: @OrchestrateWarmupFailed@
      - eval_time: 3m
        alertname: OrchestrateBucketsFailing
        exp_alerts:
          - exp_labels: {severity: warning, job: orchestrate_warmup, model: mlp, gpu: NVIDIA H200}
            exp_annotations:
              summary: 2 bucket record(s) of mlp on NVIDIA H200 failed in the last warmup
              description: @OrchestrateBucketsFailing@
      - {eval_time: 1m, alertname: OrchestrateBucketSlowerThanEager, exp_alerts: []}
      - eval_time: 3m
        alertname: OrchestrateBucketSlowerThanEager
        exp_alerts:
          - exp_labels: {severity: info, job: orchestrate_warmup, model: mlp, bucket: "32", mode: reduce-overhead, gpu: NVIDIA H200}
            exp_annotations:
              summary: "mlp bucket 32 on NVIDIA H200: compiled is slower than eager (speedup 0.80x)"
              description: @OrchestrateBucketSlowerThanEager@
      - {eval_time: 1m, alertname: OrchestrateReplicaStartedCold, exp_alerts: []}
      - eval_time: 3m
        alertname: OrchestrateReplicaStartedCold
        exp_alerts:
          - exp_labels: {severity: warning, namespace: serving, pod: mlp-server-a, model: mlp, gpu: NVIDIA H200}
            exp_annotations:
              summary: Replica mlp-server-a of mlp on NVIDIA H200 compiled 2 bucket(s) at start
              description: @OrchestrateReplicaStartedCold@
  - interval: 10m
    input_series:
      # mlp's replicas pad 3 rows for every real one (75%), resnet18's 1 for 9 (10%)
      - series: 'orchestrate_replica_rows_total{namespace="serving", pod="mlp-server-a", model="mlp", gpu="NVIDIA H200", bucket="8"}'
        values: '0+100x60'
      - series: 'orchestrate_replica_padded_rows_total{namespace="serving", pod="mlp-server-a", model="mlp", gpu="NVIDIA H200", bucket="8"}'
        values: '0+300x60'
      - series: 'orchestrate_replica_rows_total{namespace="serving", pod="resnet-a", model="resnet18", gpu="NVIDIA H200", bucket="8"}'
        values: '0+900x60'
      - series: 'orchestrate_replica_padded_rows_total{namespace="serving", pod="resnet-a", model="resnet18", gpu="NVIDIA H200", bucket="8"}'
        values: '0+100x60'
    alert_rule_test:
      - {eval_time: 5h, alertname: OrchestrateReplicaPaddingWaste, exp_alerts: []}  # pending: `for: 6h`
      - eval_time: 8h
        alertname: OrchestrateReplicaPaddingWaste
        exp_alerts:
          - exp_labels: {severity: info, model: mlp}
            exp_annotations:
              summary: mlp's replicas computed 75% padding rows for 6 hours
              description: @OrchestrateReplicaPaddingWaste@
  - interval: 1m
    input_series:
      # on one class a success at the start of time and none since; on another class of the same
      # model, and on another model, a success every minute
      - series: 'orchestrate_last_success_timestamp_seconds{job="orchestrate_warmup", model="mlp", gpu="NVIDIA H200"}'
        values: '0x1600'
      - series: 'orchestrate_last_success_timestamp_seconds{job="orchestrate_warmup", model="mlp", gpu="NVIDIA L4"}'
        values: '0+60x1600'
      - series: 'orchestrate_last_success_timestamp_seconds{job="orchestrate_warmup", model="resnet18", gpu="NVIDIA H200"}'
        values: '0+60x1600'
    alert_rule_test:
      - {eval_time: 23h, alertname: OrchestrateNoRecentSuccess, exp_alerts: []}
      - {eval_time: 24h10m, alertname: OrchestrateNoRecentSuccess, exp_alerts: []}  # pending: `for: 15m`
      - eval_time: 26h
        alertname: OrchestrateNoRecentSuccess
        exp_alerts:
          - exp_labels: {severity: warning, job: orchestrate_warmup, model: mlp, gpu: NVIDIA H200}
            exp_annotations:
              summary: No successful warmup of mlp on NVIDIA H200 for 1d 2h 0m 0s
              description: @OrchestrateNoRecentSuccess@
"""


def test_the_shipped_alerts_check_and_fire_on_what_they_are_about(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    rule = yaml.safe_load((ROOT / "k8s" / "monitoring" / "operator" / "prometheus-rules.yaml").read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the descriptions are fixed text: the expected ones are the file's own, quoted for YAML
    descriptions = {
        r["alert"]: json.dumps(r["annotations"]["description"]) for g in rule["spec"]["groups"] for r in g["rules"]
    }
    tests = ALERT_TESTS
    for alert, description in descriptions.items():
        tests = tests.replace(f"@{alert}@", description)
    (tmp_path / "alerts_test.yaml").write_text(tests)
    tested = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


# --- the Pod Security Standards' "restricted" profile (Kubernetes 1.32), checked on every pod ----

ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _pod_specs(document):
    """Every pod spec in a manifest: a Deployment's template, a RayJob's head and worker templates."""
    if isinstance(document, dict):
        if isinstance(document.get("spec"), dict) and "containers" in document["spec"]:
            yield document["spec"]
        for value in document.values():
            yield from _pod_specs(value)
    elif isinstance(document, list):
        for item in document:
            yield from _pod_specs(item)


def restricted_violations(pod):
    """What the restricted profile refuses in one pod spec, as readable lines (empty: admitted)."""
    found = []
    pod_context = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"{key} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']} is {sorted(kinds - ALLOWED_VOLUMES)}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container.get("securityContext", {})
        where = f"container {container['name']}"
        if context.get("privileged"):
            found.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{where}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{where}: runs as user 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccompProfile is {seccomp!r}")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{where}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: adds capabilities {capabilities['add']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{where}: a hostPort")
        if not context.get("readOnlyRootFilesystem"):  # beyond the profile: what these images need
            found.append(f"{where}: root filesystem writable")
    return found


def test_every_pod_render_and_kustomize_emit_meets_the_restricted_profile():
    claimed = rendered("--cache-volume", "pvc:warm-cache", "--remote", "s3://b/c")
    documents = [*rendered(), *claimed]
    if shutil.which("kubectl") is not None:
        documents += kustomized("k8s")
    pods = list(_pod_specs(documents))
    assert len(pods) >= 8  # head and worker of two renders, one's serving pod, the shipped RayJob's two and serving
    for pod in pods:
        assert restricted_violations(pod) == [], [c["name"] for c in pod["containers"]]
    volumes = [v for pod in _pod_specs(claimed) for v in pod["volumes"]]
    assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "warm-cache"}} in volumes


def test_a_hostpath_cache_is_only_there_when_asked_and_the_profile_check_names_it():
    pods = list(_pod_specs(rendered("--cache-volume", "hostPath:/mnt/nvme/orchestrate", "--remote", "s3://b/c")))
    assert len(pods) == 3
    assert all(restricted_violations(pod) == ["volume compile-cache is ['hostPath']"] for pod in pods)
    assert not any("hostPath" in volume for pod in _pod_specs(rendered()) for volume in pod["volumes"])
    # the checker itself refuses what the profile refuses
    bad = {"hostNetwork": True, "containers": [{"name": "c", "securityContext": {"privileged": True}}]}
    assert {"hostNetwork is set", "container c: privileged", "container c: runAsNonRoot is not true"} <= set(
        restricted_violations(bad)
    )


@pytest.mark.parametrize("choice", ["pvc:", "hostPath:relative/path", "nfs:server", "emptyDir:x"])
def test_a_cache_volume_that_is_not_one_of_the_three_is_one_line(choice):
    proc = render_mlp("--cache-volume", choice)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"orchestrate: error: --cache-volume {choice!r}: write emptyDir, pvc:CLAIM-NAME or hostPath:/absolute/path"
    ]


# --- the serving replicas' scrape -------------------------------------------------------------


def test_the_pod_monitor_selects_serving_pods_by_their_contract_labels_and_port(rayjob_validator):
    """Serving pods carry app.kubernetes.io/part-of: orchestrate and component: serving, and expose
    `orchestrate serve --metrics-port` as the container port named `metrics`."""
    monitor = yaml.safe_load((ROOT / "k8s" / "monitoring" / "operator" / "podmonitor.yaml").read_text())
    validate(monitor, rayjob_validator)
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/part-of": "orchestrate",
        "app.kubernetes.io/component": "serving",
    }
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    monitor["spec"]["podMetricsEndpoints"][0]["targetport"] = 9400
    with pytest.raises(AssertionError, match="targetport"):
        validate(monitor, rayjob_validator)
