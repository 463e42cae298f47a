"""Warm torch.compile caches for a fleet, and start serving replicas from them.

The public API for serving code is this package's top level:

    from orchestrator import prepare_replica

Everything else (`orchestrator.cli`, `orchestrator.jobs`, `orchestrator.cache`, ...) is the tool's
own and may change. Names are loaded on first use: `import orchestrator` alone does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["prepare_replica"]

if TYPE_CHECKING:
    from orchestrator.jobs.serving import prepare_replica

# public name -> the module that defines it
_PUBLIC = {"prepare_replica": "orchestrator.jobs.serving"}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value
