"""Kubernetes manifests for a warmup: a KubeRay RayJob (ray.io/v1) and the ConfigMap that carries
the model config. Rendered from a WarmupSpec so the job runs exactly what `warmup` would here.

Layout inside the pods: the config at /etc/orchestrate/<file>, the compile cache at
/nvme/orchestrate (`--cache-volume`: an emptyDir by default, a PersistentVolumeClaim, or a hostPath
only when asked), store credentials and the signing key from Secrets, never inline.

Every pod meets the Pod Security Standards' "restricted" profile (a hostPath cache volume aside,
which only an explicit `--cache-volume hostPath:...` asks for): non-root, no privilege escalation,
every capability dropped, the runtime's default seccomp profile, a read-only root filesystem with
/tmp (Ray's session files) and /dev/shm (its object store) as writable emptyDirs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from orchestrator.cache.namespace import slug
from orchestrator.config import format_buckets
from orchestrator.jobs.spec import WarmupSpec

CONFIG_DIR = "/etc/orchestrate"
CACHE_DIR = "/nvme/orchestrate"
RUN_AS = 1000  # the image's non-root user and group; cache volumes are made writable for the group

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
    store_secret: str = "orchestrate-store"  # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (optional keys)
    signing_secret: str = "orchestrate-signing-key"  # key: signing-key
    ttl_seconds: int = 3600
    deadline_seconds: int = 4 * 3600
    tolerations: list[dict[str, Any]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )


def name_for(spec: WarmupSpec) -> str:
    """A DNS-1123 name: lowercase alphanumerics and '-', at most 40 characters (room for suffixes)."""
    return f"warmup-{slug(spec.label, 24, keep='-', fallback='model')}-{spec.identity_hash()[:8]}"


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
        format_buckets(spec.buckets),
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
    """`config_file` is the config's file name; a factory given as a file next to it travels in
    the same ConfigMap, so `path.py:callable` works in the pods as it does here."""
    name = name_for(spec)
    data = {config_file: config_text}
    if spec.model.is_file:
        factory = (spec.base_dir / spec.model.target).resolve()
        if factory.parent != (spec.base_dir).resolve():
            raise ValueError(
                f"model.factory {spec.model.target!r}: for Kubernetes, keep the factory file next to "
                "the config (it travels in the ConfigMap) or use an importable module"
            )
        data[factory.name] = factory.read_text()
    labels = {
        "app.kubernetes.io/name": "orchestrate",
        "app.kubernetes.io/instance": name,
        "orchestrate/model": re.sub(r"[^A-Za-z0-9_.-]", "-", spec.label)[:63],
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "namespace": shape.namespace, "labels": labels},
        "data": data,
    }
    env = [
        {
            "name": "ORCHESTRATE_CACHE_SIGNING_KEY",
            "valueFrom": {"secretKeyRef": {"name": shape.signing_secret, "key": "signing-key"}},
        },
        *(
            {"name": var, "valueFrom": {"secretKeyRef": {"name": shape.store_secret, "key": var, "optional": True}}}
            for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
        ),
    ]
    mounts = [
        {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "compile-cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes = [
        {"name": "model-config", "configMap": {"name": f"{name}-config"}},
        {"name": "compile-cache", **cache_volume(shape.cache_volume)},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]

    def pod(role: str, resources: dict[str, Any], tolerations: Optional[list] = None) -> dict[str, Any]:
        container = {
            "name": f"ray-{role}",
            "image": shape.image,
            "env": env,
            "volumeMounts": mounts,
            "resources": resources,
            "securityContext": CONTAINER_SECURITY,
        }
        spec_ = {"securityContext": POD_SECURITY, "containers": [container], "volumes": volumes}
        if tolerations:
            spec_["tolerations"] = tolerations
        return {"metadata": {"labels": labels}, "spec": spec_}

    gpu = {"nvidia.com/gpu": shape.gpus_per_worker}
    worker_resources = {
        "requests": {"cpu": shape.worker_cpu, "memory": shape.worker_memory, **gpu},
        "limits": {"cpu": shape.worker_cpu, "memory": shape.worker_memory, **gpu},
    }
    head_resources = {
        "requests": {"cpu": shape.head_cpu, "memory": shape.head_memory},
        "limits": {"cpu": shape.head_cpu, "memory": shape.head_memory},
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
                    "template": pod("head", head_resources),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": shape.workers,
                        "minReplicas": shape.workers,
                        "maxReplicas": shape.workers,
                        "rayStartParams": {},
                        "template": pod("worker", worker_resources, shape.tolerations),
                    }
                ],
            },
        },
    }
    return [config_map, ray_job]


def apply_manifests(documents: list[dict[str, Any]], log: Callable[[str], None]) -> bool:
    """Create the manifests where the kubernetes client and a cluster are available; False (and
    a warning through `log`) where they are not, so that the caller prints them instead."""
    try:
        from kubernetes import client, utils
        from kubernetes import config as kube_config

        kube_config.load_config()
    except Exception as exc:  # no client installed, or no kubeconfig / in-cluster account
        log(
            f"orchestrate: warning: no Kubernetes cluster to apply to ({type(exc).__name__}); printing the manifests instead"
        )
        return False
    api = client.ApiClient()
    for document in documents:
        if document["kind"] == "RayJob":
            group, version = document["apiVersion"].split("/")
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                group, version, document["metadata"]["namespace"], "rayjobs", document
            )
        else:
            utils.create_from_dict(api, document)
        log(f"created {document['kind']} {document['metadata']['name']}")
    return True


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors for shared sub-objects, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def to_yaml(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False)
