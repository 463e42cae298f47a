"""Cache identity: which compiled artifacts may be shared, named so that incompatible ones never mix.

PyTorch keys Inductor artifacts on the torch build, the Triton and CUDA versions and the GPU
*name*; reusing a directory across any of those is a miss at best and a crash at worst. The
namespace folds them together with the model config's identity hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class Platform:
    """The software and hardware a compiled artifact is only valid on."""

    torch_version: str
    torch_git: str
    triton_version: Optional[str]
    cuda_version: Optional[str]
    gpu_name: str  # "cpu-<arch>" where artifacts were compiled for the host CPU
    python_version: str


def namespace(model_name: str, platform: Platform, config_hash: str) -> str:
    """A readable, collision-resistant directory name: `<model>-<torch>-<gpu>-<hash12>`."""
    identity = json.dumps({"platform": asdict(platform), "config": config_hash}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    torch = platform.torch_version.split("+")[0]
    model, gpu = (slug(part, 32, keep=".", fallback="x") for part in (model_name, platform.gpu_name))
    return f"{model}-torch{torch}-{gpu}-{digest}"


# what `namespace` makes: <model>-torch<version>-<gpu>-<16 hex>
_NAMESPACE = re.compile(r"^[a-z0-9.][a-z0-9.-]*-torch[0-9][^/]*-[a-z0-9.][a-z0-9.-]*-[0-9a-f]{16}$")


def is_namespace(name: str) -> bool:
    """Whether a directory or store entry name is one `namespace` makes (the store beside a local
    cache, node directories and scratch are not)."""
    return bool(_NAMESPACE.match(name))


def slug(text: str, max_length: int, *, keep: str, fallback: str = "") -> str:
    """`text` as a name part: lowercased; every run of characters other than a-z, 0-9 and those in
    `keep` becomes one '-'; no '-' at either end; cut to `max_length`; `fallback` if nothing is left.

    The one rule for names derived from a model name: cache namespaces keep '.' (`keep="."`); Ray
    submission ids and Kubernetes object names keep '-' (`keep="-"`: the characters of a DNS-1123
    label). The names already in stores and clusters were made by exactly this, so a change here
    renames them."""
    return re.sub(f"[^a-z0-9{re.escape(keep)}]+", "-", text.lower()).strip("-")[:max_length] or fallback
