"""Cache identity: which compiled artifacts may be shared, named so that incompatible ones never mix.

PyTorch keys Inductor artifacts on the torch build, the Triton and CUDA versions and the GPU
*name*; reusing a directory across any of those is a miss at best and a crash at worst. The
namespace folds them together with the model config's identity hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional


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
    gpu = slug(platform.gpu_name, 32, keep=".", fallback="x")
    return f"{model_prefix(model_name)}{torch}-{gpu}-{digest}"


def model_prefix(model_name: str) -> str:
    """How every namespace of `model_name` begins, whatever its platform: `<model>-torch`. Another
    model's namespaces may begin so too (`mlp` and `mlp-torchvision`): the manifest says whose it is."""
    return f"{slug(model_name, 32, keep='.', fallback='x')}-torch"


# Platform fields in the order a person tells two platforms apart: the GPU class first
_FIELDS = ("gpu_name", "torch_version", "torch_git", "triton_version", "cuda_version", "python_version")


def describe(platform: dict[str, Any], fields: Sequence[str] = _FIELDS) -> str:
    """`fields` of a platform (Platform's fields, as a manifest's meta records them) for people:
    `NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, CUDA 13.0, Python 3.12.3`."""
    words = []
    for name in fields:
        value = platform.get(name)
        if name == "gpu_name":
            words.append(f"CPU {value[4:]}" if isinstance(value, str) and value.startswith("cpu-") else str(value))
        elif name == "torch_git":
            words.append(f"torch commit {str(value)[:12]}")
        else:
            label = {"torch_version": "torch", "triton_version": "Triton", "cuda_version": "CUDA"}.get(name, "Python")
            words.append(f"{label} {value}" if value else f"no {label}")
    return ", ".join(words)


def differing(here: Platform, others: Sequence[dict[str, Any]]) -> list[str]:
    """The Platform fields in which any of `others` differs from `here`, in _FIELDS' order; the
    torch commit only where the torch versions agree (a version names its commit). Every field
    where none differs: the names then differ by something a person cannot see here."""
    mine = asdict(here)
    found = [name for name in _FIELDS if any(other.get(name) != mine[name] for other in others)]
    if "torch_version" in found and "torch_git" in found:
        found.remove("torch_git")
    return found or list(_FIELDS)


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
