"""The serving runtime: a replica loads what the fleet warmed and serves every bucket on the
variant warmup chose for it.

    from orchestrator import runtime

    model = runtime.load("model.yaml", remote="s3://bucket/compile-cache")   # answers when it returns
    out = model(x)            # any size along the bucket dimension: padded to its bucket, sliced back
    model.info()              # per bucket: variant serving now, on plan since when, load and capture seconds
    model.wait_loaded()       # every bucket switched from eager to its planned variant (or refused, with why)
    runtime.metrics_registry(model)   # Prometheus metrics of the replica (orchestrator.serving.metrics)

Requests larger than the largest bucket run in chunks of it (`serve.oversize: split`) or are
refused (`error`). A bad request raises `BadRequest` naming the input; the model stays usable.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from orchestrator.jobs.collector import imports_frozen

with imports_frozen():  # torch's, pydantic's and the replica's modules: alive as long as the process
    from orchestrator.cache.manifest import PublicKey, TrustedKeys
    from orchestrator.config import cache_root, embedded_store, load_spec_with_overrides
    from orchestrator.jobs.grid_replica import GridModel, load_grid
    from orchestrator.jobs.padding import BadRequest
    from orchestrator.jobs.records import Remote
    from orchestrator.jobs.replica import BucketedModel, BucketInfo, NotWarm, ReplicaInfo, load_replica
    from orchestrator.jobs.spec import ReadyWhen, WarmupSpec

__all__ = [
    "BadRequest",
    "BucketInfo",
    "BucketedModel",
    "GridModel",
    "NotWarm",
    "ReadyWhen",
    "ReplicaInfo",
    "load",
    "metrics_registry",
]


def metrics_registry(model: BucketedModel | GridModel, name: Optional[str] = None) -> Any:
    """A prometheus_client CollectorRegistry with the replica's metrics, read at every scrape:
    serve it with prometheus_client.start_http_server (needs the `metrics` extra)."""
    from orchestrator.serving.metrics import metrics_registry as registry

    return registry(model, name)


def load(
    config: str | Path | WarmupSpec,
    cache_dir: Optional[str | Path] = None,
    remote: Optional[str] = None,
    buckets: Optional[list[int]] = None,
    *,
    device: Optional[str] = None,
    require_warm: bool = False,
    allow_unsigned: bool = False,
    trust: Iterable[str | Path | PublicKey] = (),
    ready: ReadyWhen = "answering",
) -> BucketedModel | GridModel:
    """Build the config's model and serve every bucket (`buckets`: a subset) on its chosen variant.

    `ready="answering"` (default) returns as soon as the model is built and every bucket answers:
    eager at first, each bucket switched to its chosen variant in the background as soon as that
    is loaded and checked (`wait_loaded()` blocks until all are; `info()` says which are on plan).
    `ready="planned"` returns only once every bucket is on its plan, or refused with a reason.

    `remote`: the store to pull the namespace from first, accepting manifests signed by a key in
    `trust` (public keys, or files holding them) or in $ORCHESTRATE_CACHE_TRUSTED_KEYS. Without
    one, the local store that `orchestrate warmup` keeps beside the cache is pulled from when it
    exists (its own public key trusted), so a replica on the warmup's machine starts from what it
    published. `require_warm`: a compiled variant that misses the cache is refused (NotWarm,
    raised by `wait_loaded()` and by a `ready="planned"` load), and its bucket stays on eager."""
    if isinstance(config, WarmupSpec):
        spec = config
        if device or cache_dir:
            directory = str(Path(cache_dir).resolve()) if cache_dir else None
            spec = spec.replaced(**{k: v for k, v in {"device": device, "cache_dir": directory}.items() if v})
    else:
        spec = load_spec_with_overrides(
            config, device=device, cache_dir=None if cache_dir is None else str(Path(cache_dir).resolve())
        )
    if buckets is not None:
        spec = spec.replaced(buckets=buckets)
    root = cache_root(spec)
    keys = [k for k in trust if isinstance(k, PublicKey)]
    files = [str(f) for f in trust if not isinstance(f, PublicKey)]
    store: Optional[Remote] = None
    if remote is not None:
        store = Remote(remote, allow_unsigned, trusted=TrustedKeys.load(files).plus(*keys).pems())
    elif (root / "store").is_dir():
        store = embedded_store(root, allow_unsigned, files)
        store = Remote(store.url, allow_unsigned, trusted=TrustedKeys.from_pems(store.trusted).plus(*keys).pems())
    if spec.grid:
        return load_grid(spec, root, remote=store, require_warm=require_warm, ready=ready)
    return load_replica(spec, root, remote=store, require_warm=require_warm, ready=ready)
