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
    return f"{_slug(model_name)}-torch{torch}-{_slug(platform.gpu_name)}-{digest}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")[:32] or "x"
