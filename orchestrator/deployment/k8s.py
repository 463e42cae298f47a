"""Kubernetes manifests for one model: the warmup (a KubeRay RayJob and the ConfigMap carrying the
model config) and the serving replicas that start from what it published (a Deployment, its own
ConfigMap and a Service). Rendered from a WarmupSpec so the job runs exactly what `warmup` would
here, and both sides run one image, so the replica computes the namespace the warmup published.

Layout inside the pods: the config at /etc/orchestrate/<file>, the compile cache at
/nvme/orchestrate (`--cache-volume`: an emptyDir by default, a PersistentVolumeClaim, or a hostPath
only when asked), store credentials and the signing key from Secrets, never inline; serving pods
hold only the public keys (a ConfigMap).

Every pod meets the Pod Security Standards' "restricted" profile (a hostPath cache volume aside,
which only an explicit `--cache-volume hostPath:...` asks for): non-root, no privilege escalation,
every capability dropped, the runtime's default seccomp profile, a read-only root filesystem with
/tmp (Ray's session files, HOME) and /dev/shm (its object store) as writable emptyDirs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from orchestrator import __version__
from orchestrator.cache.namespace import slug
from orchestrator.config import format_bucket_dims
from orchestrator.errors import UserError
from orchestrator.jobs.errors import first_line
from orchestrator.jobs.spec import WarmupSpec

CONFIG_DIR = "/etc/orchestrate"
KEYS_DIR = "/etc/orchestrate-keys"
CACHE_DIR = "/nvme/orchestrate"
RUN_AS = 1000  # the image's non-root user and group; cache volumes are made writable for the group
SERVE_PORT = 8000
METRICS_PORT = 9400
# The label NVIDIA's GPU feature discovery puts on every GPU node: the product name of its GPUs.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# A replica's start: Ray, the model, then each bucket's load (a precompiled function loads in a
# fraction of a second, Dynamo's first import takes seconds, a cache-hit compile of a large model
# tens of seconds); the startup probe allows this much before Kubernetes restarts the pod.
START_BASE_SECONDS = 180
START_SECONDS_PER_BUCKET = 60
PROBE_PERIOD_SECONDS = 10

POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
# Where the read-only image lets Ray, torch and Triton write their per-user files: an emptyDir.
HOME = {"name": "HOME", "value": "/tmp"}
# Store credentials: each key optional, so a store reached through the node's or pod's own
# identity (IRSA, workload identity) needs none.
STORE_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
_PINNED = re.compile(r"^[^\s@]+(:[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})$")


def cache_volume(choice: str) -> dict[str, Any]:
    """`emptyDir` (the pod's own, gone with it), `pvc:NAME` (a PersistentVolumeClaim that outlives
    pods) or `hostPath:/path` (node-local NVMe shared by every pod of the node; the restricted profile
    refuses it, so only when asked) -> the volume source."""
    kind, _, argument = choice.partition(":")
    if kind == "emptyDir" and not argument:
        return {"emptyDir": {}}
    if kind == "pvc" and argument:
        return {"persistentVolumeClaim": {"claimName": argument}}
    if kind == "hostPath" and argument.startswith("/"):
        return {"hostPath": {"path": argument, "type": "DirectoryOrCreate"}}
    raise ValueError(f"--cache-volume {choice!r}: write emptyDir, pvc:CLAIM-NAME or hostPath:/absolute/path")


def check_image(image: str) -> None:
    """The one image of warmup and serving is pinned: a moving tag lets the two sides run different
    torch builds, and a replica then computes another namespace and misses."""
    if not _PINNED.match(image) or image.endswith(":latest"):
        raise ValueError(
            f"--image {image!r}: pin a version tag or a digest (e.g. ghcr.io/org/orchestrate:0.1.0 or "
            "...@sha256:<64 hex>); a moving tag lets warmup and serving pods run different torch builds"
        )


def gpu_product(gpu_name: str) -> str:
    """The value GPU feature discovery gives `nvidia.com/gpu.product` for a GPU whose CUDA name is
    `gpu_name` (the name in a cache namespace and a report): spaces become '-', and characters a
    label value cannot hold are dropped ("NVIDIA H200" -> "NVIDIA-H200")."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "", "-".join(gpu_name.split()))[:63].strip("-_.")
    if not value:
        raise ValueError(f"--gpu {gpu_name!r}: name the GPU as CUDA does, e.g. 'NVIDIA H200'")
    return value


@dataclass
class ClusterShape:
    image: str
    namespace: str = "default"
    workers: int = 1
    gpus_per_worker: int = 1
    worker_cpu: str = "8"
    worker_memory: str = "64Gi"
    head_cpu: str = "2"
    head_memory: str = "8Gi"
    cache_volume: str = "emptyDir"  # see cache_volume()
    # The GPU class warmup and serving are pinned to (its CUDA name); None schedules on any GPU node.
    gpu: Optional[str] = None
    service_account: Optional[str] = None
    store_secret: str = "orchestrate-store"  # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (optional keys)
    signing_secret: str = "orchestrate-signing-key"  # key: signing-key
    trusted_keys_config_map: str = "orchestrate-trusted-keys"  # key: cache-signing.key.pub
    serving_replicas: int = 2  # 0: render the warmup alone
    # what a serving pod's readiness waits for: every bucket answering (eager until its planned variant
    # is swapped in) or every bucket on its plan (orchestrator.jobs.replica.READY_WHEN)
    ready: str = "answering"
    serve_cpu: str = "4"
    serve_memory: str = "16Gi"
    ttl_seconds: int = 3600
    deadline_seconds: int = 4 * 3600
    tolerations: list[dict[str, Any]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )


def name_for(spec: WarmupSpec) -> str:
    """A DNS-1123 name: lowercase alphanumerics and '-', at most 40 characters (room for suffixes)."""
    return f"warmup-{slug(spec.label, 24, keep='-', fallback='model')}-{spec.identity_hash()[:8]}"


def serving_name_for(spec: WarmupSpec) -> str:
    """The serving side's name stays the same when the config changes, so a new config rolls the
    Deployment's pods instead of creating a second Deployment."""
    return f"serve-{slug(spec.label, 40, keep='-', fallback='model')}"


def entrypoint(
    config_file: str,
    spec: WarmupSpec,
    *,
    remote: Optional[str],
    pushgateway: Optional[str],
    extra: tuple[str, ...] = (),
) -> str:
    args = [
        "orchestrate",
        "warmup",
        "--model",
        config_file,
        "--buckets",
        format_bucket_dims(spec),
        "--ray-address",
        "auto",
        "--cache-dir",
        CACHE_DIR,
    ]
    if remote:
        args += ["--remote", remote]
    if pushgateway:
        args += ["--pushgateway", pushgateway]
    return shlex.join([*args, *extra])


def render(
    spec: WarmupSpec,
    config_text: str,
    config_file: str,
    shape: ClusterShape,
    *,
    remote: Optional[str],
    pushgateway: Optional[str],
) -> list[dict[str, Any]]:
    """The warmup's ConfigMap and RayJob, then (with a store to pull from and serving replicas) the
    serving ConfigMap, Deployment and Service. `config_file` is the config's file name; a factory
    given as a file next to it travels in the same ConfigMap, so `path.py:callable` works in the
    pods as it does here."""
    check_image(shape.image)
    affinity = _gpu_affinity(shape.gpu)  # checks --gpu before anything is built
    data = {config_file: config_text}
    if spec.model.is_file:
        factory = (spec.base_dir / spec.model.target).resolve()
        if factory.parent != (spec.base_dir).resolve():
            raise ValueError(
                f"model.factory {spec.model.target!r}: for Kubernetes, keep the factory file next to "
                "the config (it travels in the ConfigMap) or use an importable module"
            )
        data[factory.name] = factory.read_text()
    documents = _warmup(spec, data, config_file, shape, affinity, remote=remote, pushgateway=pushgateway)
    if remote and shape.serving_replicas > 0:
        documents += _serving(spec, data, config_file, shape, affinity, remote=remote)
    return documents


def _labels(spec: WarmupSpec, instance: str, component: str) -> dict[str, str]:
    """Kubernetes' recommended labels, and the model's name for selecting across components."""
    return {
        "app.kubernetes.io/name": "orchestrate",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/version": __version__,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "orchestrate",
        "app.kubernetes.io/managed-by": "orchestrate",
        "orchestrate/model": re.sub(r"[^A-Za-z0-9_.-]", "-", spec.label)[:63].strip("-_.") or "model",
    }


def _gpu_affinity(gpu: Optional[str]) -> Optional[dict[str, Any]]:
    if gpu is None:
        return None
    term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [gpu_product(gpu)]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _config_map(name: str, shape: ClusterShape, labels: dict[str, str], data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": shape.namespace, "labels": labels},
        "data": data,
    }


def _store_env(shape: ClusterShape) -> list[dict[str, Any]]:
    return [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": shape.store_secret, "key": var, "optional": True}}}
        for var in STORE_VARIABLES
    ]


def _scratch_volumes(shape: ClusterShape) -> list[dict[str, Any]]:
    return [
        {"name": "compile-cache", **cache_volume(shape.cache_volume)},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]


def _scratch_mounts(cache_path: str) -> list[dict[str, Any]]:
    return [
        {"name": "compile-cache", "mountPath": cache_path},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def _pod_spec(
    shape: ClusterShape,
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    *,
    gpu: bool,
    affinity: Optional[dict[str, Any]],
    init: Optional[list[dict[str, Any]]] = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"securityContext": POD_SECURITY}
    if shape.service_account:
        spec["serviceAccountName"] = shape.service_account
    if init:
        spec["initContainers"] = init
    spec["containers"] = containers
    spec["volumes"] = volumes
    if gpu:
        spec["tolerations"] = shape.tolerations
        if affinity:
            spec["affinity"] = affinity
    return spec


def _container(name: str, shape: ClusterShape, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": shape.image, **fields, "securityContext": CONTAINER_SECURITY}


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
    # quantities as strings, as the API server hands them back
    amounts: dict[str, Any] = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": amounts, "limits": dict(amounts)}


def _warmup(
    spec: WarmupSpec,
    data: dict[str, str],
    config_file: str,
    shape: ClusterShape,
    affinity: Optional[dict[str, Any]],
    *,
    remote: Optional[str],
    pushgateway: Optional[str],
) -> list[dict[str, Any]]:
    name = name_for(spec)
    labels = _labels(spec, name, "warmup")
    config_map = _config_map(f"{name}-config", shape, labels, data)
    env = [
        HOME,
        {
            "name": "ORCHESTRATE_CACHE_SIGNING_KEY",
            "valueFrom": {"secretKeyRef": {"name": shape.signing_secret, "key": "signing-key"}},
        },
        *_store_env(shape),
    ]
    mounts = [{"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True}, *_scratch_mounts(CACHE_DIR)]
    volumes = [{"name": "model-config", "configMap": {"name": f"{name}-config"}}, *_scratch_volumes(shape)]

    def pod(role: str, resources: dict[str, Any], gpu: bool) -> dict[str, Any]:
        container = _container(f"ray-{role}", shape, env=env, volumeMounts=mounts, resources=resources)
        return {
            "metadata": {"labels": labels},
            "spec": _pod_spec(shape, [container], volumes, gpu=gpu, affinity=affinity),
        }

    ray_job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": shape.namespace, "labels": labels},
        "spec": {
            "entrypoint": entrypoint(f"{CONFIG_DIR}/{config_file}", spec, remote=remote, pushgateway=pushgateway),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": shape.ttl_seconds,
            "activeDeadlineSeconds": shape.deadline_seconds,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": {
                # the head schedules no work: ranks are the GPU workers
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "num-gpus": "0"},
                    "template": pod("head", _resources(shape.head_cpu, shape.head_memory), gpu=False),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": shape.workers,
                        "minReplicas": shape.workers,
                        "maxReplicas": shape.workers,
                        "rayStartParams": {},
                        "template": pod(
                            "worker",
                            _resources(shape.worker_cpu, shape.worker_memory, shape.gpus_per_worker),
                            gpu=True,
                        ),
                    }
                ],
            },
        },
    }
    return [config_map, ray_job]


def start_budget_seconds(spec: WarmupSpec) -> int:
    return START_BASE_SECONDS + START_SECONDS_PER_BUCKET * len(spec.grid_points())


def _serving(
    spec: WarmupSpec,
    data: dict[str, str],
    config_file: str,
    shape: ClusterShape,
    affinity: Optional[dict[str, Any]],
    *,
    remote: str,
) -> list[dict[str, Any]]:
    """The replicas: an init container pulls the verified namespace (and fails in one line naming
    both platforms when this node's is not the warmed one), then `orchestrate serve` loads every
    bucket from it without tracing and turns ready once it answers."""
    name = serving_name_for(spec)
    labels = _labels(spec, name, "serving")
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    config_path = f"{CONFIG_DIR}/{config_file}"
    # The ConfigMap keeps its name; this digest in the pod template rolls the pods when it changes.
    config_digest = hashlib.sha256(yaml.safe_dump(data, sort_keys=True).encode()).hexdigest()
    config_map = _config_map(f"{name}-config", shape, labels, data)
    env = [
        HOME,
        # public keys only: a serving pod verifies what the warmup signed and can sign nothing
        {"name": "ORCHESTRATE_CACHE_TRUSTED_KEYS", "value": f"{KEYS_DIR}/cache-signing.key.pub"},
        *_store_env(shape),
    ]
    mounts = [
        {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "trusted-keys", "mountPath": KEYS_DIR, "readOnly": True},
        *_scratch_mounts(CACHE_DIR),
    ]
    volumes = [
        {"name": "model-config", "configMap": {"name": f"{name}-config"}},
        {"name": "trusted-keys", "configMap": {"name": shape.trusted_keys_config_map}},
        *_scratch_volumes(shape),
    ]
    cache = ["--cache-dir", CACHE_DIR, "--device", "cuda"]
    # The init container asks for the GPU too: the namespace it pulls names the GPU it runs on, and
    # the kubelet hands the same device on to the server.
    pull = _container(
        "pull-compile-cache",
        shape,
        command=["orchestrate", "pull", "--model", config_path, *cache, "--remote", remote],
        env=env,
        volumeMounts=mounts,
        resources=_resources("1", "2Gi", 1),
    )
    probe = {"httpGet": {"path": "/info", "port": "http"}, "periodSeconds": PROBE_PERIOD_SECONDS}
    server = _container(
        "server",
        shape,
        command=[
            "orchestrate",
            "serve",
            "--model",
            config_path,
            *cache,
            "--require-warm",
            "--host",
            "0.0.0.0",
            "--port",
            str(SERVE_PORT),
            "--metrics-port",
            str(METRICS_PORT),
            "--ready",
            shape.ready,
        ],
        env=env,
        ports=[
            {"name": "http", "containerPort": SERVE_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # /info answers once the replica's constructor has returned, which `--ready` decides: every
        # bucket answering, or every bucket on its plan; until then Serve has no route to it
        startupProbe={**probe, "failureThreshold": math.ceil(start_budget_seconds(spec) / PROBE_PERIOD_SECONDS)},
        readinessProbe={**probe, "failureThreshold": 3},
        livenessProbe={
            "httpGet": {"path": "/-/healthz", "port": "http"},
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "failureThreshold": 6,
        },
        volumeMounts=mounts,
        resources=_resources(shape.serve_cpu, shape.serve_memory, 1),
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": shape.namespace, "labels": labels},
        "spec": {
            "replicas": shape.serving_replicas,
            "selector": {"matchLabels": selector},
            # a new pod is ready (warm) before an old one goes: capacity never drops during a roll
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {"orchestrate/config-sha256": config_digest}},
                "spec": _pod_spec(shape, [server], volumes, gpu=True, affinity=affinity, init=[pull]),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": shape.namespace, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": SERVE_PORT, "targetPort": "http"}],
        },
    }
    return [config_map, deployment, service]


class ApplyFailed(Exception):
    """The cluster could not be reached, or its API server refused a manifest: one line."""


class MissingClient(UserError):
    """--apply without the kubernetes package: a setup problem of this machine (exit 2), not the
    cluster's."""


FIELD_MANAGER = "orchestrate"
APPLY_PATCH = "application/apply-patch+yaml"


def apply_manifests(documents: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """Server-side apply, as `kubectl apply --server-side` does it: each object is sent whole to its
    own path as an apply patch under one field manager, so a re-run changes nothing that is
    already so, and a field another manager owns is a conflict the API server names rather than a
    silent overwrite. Objects go in the order given (ConfigMaps before what mounts them)."""
    try:
        from kubernetes import client
        from kubernetes import config as kube_config
    except ImportError:
        raise MissingClient(
            "--apply needs the kubernetes client: pip install 'torch-warmup-orchestrator[k8s]'"
        ) from None
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):  # in a pod: its service account
            kube_config.load_incluster_config()
        else:
            kube_config.load_kube_config()
    except Exception as exc:  # no kubeconfig and not in a pod: nothing was sent
        raise ApplyFailed(
            f"--apply: no Kubernetes cluster configured ({first_line(exc)}); set KUBECONFIG or run "
            "inside the cluster, or leave out --apply to print the manifests"
        ) from None
    api = client.ApiClient()
    for document in documents:
        meta = document["metadata"]
        where = f"{document['kind']} {meta['namespace']}/{meta['name']}"
        try:
            response: Any
            if document["kind"] == "RayJob":
                group, version = document["apiVersion"].split("/")
                response = client.CustomObjectsApi(api).patch_namespaced_custom_object_with_http_info(
                    group,
                    version,
                    meta["namespace"],
                    "rayjobs",
                    meta["name"],
                    document,
                    field_manager=FIELD_MANAGER,
                    _content_type=APPLY_PATCH,
                )
            else:
                patch: Any = {
                    "ConfigMap": client.CoreV1Api(api).patch_namespaced_config_map_with_http_info,
                    "Service": client.CoreV1Api(api).patch_namespaced_service_with_http_info,
                    "Deployment": client.AppsV1Api(api).patch_namespaced_deployment_with_http_info,
                }[document["kind"]]
                response = patch(
                    meta["name"], meta["namespace"], document, field_manager=FIELD_MANAGER, _content_type=APPLY_PATCH
                )
            # (data, status, headers) up to kubernetes 36; an ApiResponse from 37
            status = response.status_code if hasattr(response, "status_code") else response[1]
        except client.ApiException as exc:
            raise ApplyFailed(f"{where}: the API server refused it: {_api_reason(exc)}") from None
        except Exception as exc:  # urllib3's connection and TLS errors
            raise ApplyFailed(f"{where}: cannot reach the API server: {first_line(exc)}") from None
        log(f"{'created' if status == 201 else 'applied'} {where}")


def _api_reason(exc: Any) -> str:
    """The Status object's message where the server sent one, with a hint for the common causes."""
    try:
        message = json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        message = exc.reason or "no reason given"
    hint = {
        401: "; the kubeconfig's credentials were not accepted",
        403: "; ask for RBAC that lets you patch these kinds in this namespace",
        404: "; is the namespace there, and for a RayJob is the KubeRay operator (ray.io/v1) installed?",
        409: "; another field manager owns these fields: change them there, or delete the object",
    }.get(exc.status, "")
    return f"{exc.status} {(str(message).strip().splitlines() or [''])[0]}{hint}"


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors for shared sub-objects, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def to_yaml(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False)
